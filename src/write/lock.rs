//! One run at a time per output folder: `DST/.reshard.lock`, held with an
//! exclusive OS lock ([`crate::platform::try_lock_exclusive`]: `flock` on
//! Unix, a `LockFileEx` byte range past the content on Windows, so the pid
//! stays readable there too) for the whole run. The holder writes its pid into the file and
//! empties it again when it lets go; a second run fails at once naming that
//! pid. The OS drops the lock when the process dies, however it dies, so a
//! killed run never leaves DST locked.
//!
//! The file itself stays in DST (removing it would let two runs lock two
//! different files under one name). It is reshard's own: hidden, never listed
//! in the index or the manifest, never copied, and not named in the "not
//! copied" notes when an output is converted again. It is opened without
//! following a symlink at its name ([`crate::platform::open_no_follow`]) and
//! checked through the open handle before a byte is written: a name that is
//! taken by anything but a small regular file with exactly one link (a
//! symlink, a folder, a hard link to a file elsewhere, the shared lock of an
//! output copied with `cp -al`) is refused, its target untouched.

use std::fs::File;
use std::io::{self, Read, Seek, Write};
use std::path::{Path, PathBuf};

/// File name of the lock inside DST.
pub const LOCK: &str = ".reshard.lock";

/// A lock file never holds more than `pid\n`; anything larger is not ours.
const MAX_LOCK_LEN: u64 = 64;

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("{} is being written by another reshard ({})", .dst.display(), match .pid { Some(p) => format!("pid {p}"), None => "pid unknown".to_string() })]
    Busy { dst: PathBuf, pid: Option<u32> },
    #[error("{}: is not reshard's lock file (a symlink, a folder or a file with other content); remove it or choose another output folder", .path.display())]
    NotOurs { path: PathBuf },
    #[error("{}: the lock file has {links} links (a hard link to a file elsewhere, or an output copied with `cp -al`); reshard would write into the other file; remove it or choose another output folder", .path.display())]
    Linked { path: PathBuf, links: u64 },
    #[error("cannot lock {}", .path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// The held lock of one output folder; dropping it empties the file and
/// releases the lock.
#[derive(Debug)]
pub struct DstLock {
    file: File,
    dir: PathBuf,
}

impl DstLock {
    /// Takes `dir`'s lock or fails at once; `dir` must exist.
    pub fn acquire(dir: &Path) -> Result<DstLock, LockError> {
        let path = dir.join(LOCK);
        let io_err = |source| LockError::Io {
            path: path.clone(),
            source,
        };
        let mut file = open_lock_file(&path)?;
        if !crate::platform::try_lock_exclusive(&file).map_err(io_err)? {
            return Err(LockError::Busy {
                dst: dir.to_path_buf(),
                pid: read_pid(&mut file),
            });
        }
        // Ours now: anything already in it was left by a run that died.
        file.set_len(0).map_err(io_err)?;
        file.rewind().map_err(io_err)?;
        writeln!(file, "{}", std::process::id()).map_err(io_err)?;
        file.flush().map_err(io_err)?;
        Ok(DstLock {
            file,
            dir: dir.to_path_buf(),
        })
    }

    /// The folder this lock holds.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for DstLock {
    fn drop(&mut self) {
        // An empty lock file means nobody holds it; the OS releases the lock
        // when the file is closed.
        let _ = self.file.set_len(0);
        let _ = crate::platform::unlock(&self.file);
    }
}

/// Opens (creating it if missing) the lock file for reading and writing,
/// without truncating it, without following a symlink at its name, and
/// only if what was opened is a small regular file with one link.
fn open_lock_file(path: &Path) -> Result<File, LockError> {
    let io_err = |source| LockError::Io {
        path: path.to_path_buf(),
        source,
    };
    let not_ours = || LockError::NotOurs {
        path: path.to_path_buf(),
    };
    let mut create = File::options();
    create.read(true).write(true).create_new(true);
    let mut file = match crate::platform::open_no_follow(&mut create, path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            // Looked at first by name, so a FIFO or a device is never opened.
            let meta = std::fs::symlink_metadata(path).map_err(io_err)?;
            if !meta.file_type().is_file() || meta.len() > MAX_LOCK_LEN {
                return Err(not_ours());
            }
            let mut existing = File::options();
            existing.read(true).write(true);
            match crate::platform::open_no_follow(&mut existing, path) {
                Ok(f) => f,
                // A symlink swapped in after the first look.
                Err(e) if crate::platform::is_symlink_loop(&e) => return Err(not_ours()),
                Err(e) => return Err(io_err(e)),
            }
        }
        Err(e) if crate::platform::is_symlink_loop(&e) => return Err(not_ours()),
        Err(e) => return Err(io_err(e)),
    };
    // The name may have changed between the looks: check what was opened.
    let opened = file.metadata().map_err(io_err)?;
    if !opened.file_type().is_file() || opened.len() > MAX_LOCK_LEN {
        return Err(not_ours());
    }
    let links = crate::platform::link_count(&file).map_err(io_err)?;
    if links != 1 {
        return Err(LockError::Linked {
            path: path.to_path_buf(),
            links,
        });
    }
    let mut text = String::new();
    let readable = (&mut file)
        .take(MAX_LOCK_LEN)
        .read_to_string(&mut text)
        .is_ok();
    // Empty, a pid, or unreadable for a moment: anything else is someone's
    // file.
    if readable && !text.is_empty() && text.trim().parse::<u32>().is_err() {
        return Err(not_ours());
    }
    Ok(file)
}

/// The holder's pid, if it can be read (not in the moment before the holder
/// writes it).
fn read_pid(file: &mut File) -> Option<u32> {
    let mut text = String::new();
    file.rewind().ok()?;
    file.take(MAX_LOCK_LEN).read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_lock_on_one_folder_fails_naming_the_holder() {
        let tmp = tempfile::tempdir().unwrap();
        let held = DstLock::acquire(tmp.path()).unwrap();
        let text = std::fs::read_to_string(tmp.path().join(LOCK)).unwrap();
        assert_eq!(text.trim(), std::process::id().to_string());
        let err = DstLock::acquire(tmp.path()).unwrap_err();
        assert!(
            matches!(err, LockError::Busy { pid: Some(p), .. } if p == std::process::id()),
            "{err:?}"
        );
        assert!(err
            .to_string()
            .contains("is being written by another reshard (pid "));
        drop(held);
        assert_eq!(std::fs::read(tmp.path().join(LOCK)).unwrap(), b"");
        DstLock::acquire(tmp.path()).unwrap();
    }

    #[test]
    fn a_lock_name_holding_someone_elses_file_is_refused_and_left_alone() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join(LOCK);
        std::fs::write(&path, b"weights, not a pid").unwrap();
        assert!(matches!(
            DstLock::acquire(tmp.path()),
            Err(LockError::NotOurs { .. })
        ));
        assert_eq!(std::fs::read(&path).unwrap(), b"weights, not a pid");
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        assert!(matches!(
            DstLock::acquire(tmp.path()),
            Err(LockError::NotOurs { .. })
        ));
    }

    #[cfg(unix)]
    #[test]
    fn a_symlink_at_the_lock_name_is_refused_and_its_target_untouched() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("model.safetensors");
        std::fs::write(&target, b"").unwrap();
        let dst = tmp.path().join("dst");
        std::fs::create_dir(&dst).unwrap();
        std::os::unix::fs::symlink(&target, dst.join(LOCK)).unwrap();
        assert!(matches!(
            DstLock::acquire(&dst),
            Err(LockError::NotOurs { .. })
        ));
        assert_eq!(std::fs::read(&target).unwrap(), b"");
    }

    /// A hard link at the lock name (or an output copied with `cp -al`,
    /// which shares its lock with the original): refused, the other file
    /// neither truncated nor given a pid.
    #[test]
    fn a_hard_linked_lock_file_is_refused_and_the_other_file_untouched() {
        let tmp = tempfile::tempdir().unwrap();
        let elsewhere = tmp.path().join("notes.txt");
        std::fs::write(&elsewhere, b"12\n").unwrap();
        let dst = tmp.path().join("dst");
        std::fs::create_dir(&dst).unwrap();
        std::fs::hard_link(&elsewhere, dst.join(LOCK)).unwrap();
        let err = DstLock::acquire(&dst).unwrap_err();
        assert!(matches!(err, LockError::Linked { links: 2, .. }), "{err:?}");
        assert!(err.to_string().contains(LOCK), "{err}");
        assert_eq!(std::fs::read(&elsewhere).unwrap(), b"12\n");
    }

    #[test]
    fn a_stale_pid_from_a_dead_run_is_taken_over() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join(LOCK), "4000000000\n").unwrap();
        let _held = DstLock::acquire(tmp.path()).unwrap();
        let text = std::fs::read_to_string(tmp.path().join(LOCK)).unwrap();
        assert_eq!(text.trim(), std::process::id().to_string());
    }
}
