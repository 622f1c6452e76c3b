//! One run at a time per output folder: `DST/.reshard.lock`, held with an
//! exclusive OS lock ([`crate::platform::try_lock_exclusive`]: `flock` on
//! Unix, a `LockFileEx` byte range past the content on Windows, so the pid
//! stays readable there too) for the whole run. The holder writes its pid
//! into the file; a second run fails at once naming that pid. The OS drops
//! the lock when the process dies, however it dies, so a killed run never
//! leaves DST locked (only the file, with the dead run's pid, which the
//! next run takes over).
//!
//! When the holder lets go (a finished run, a refused one, an error) it
//! removes the file, so no output and no folder of someone else's files is
//! left holding it. Removing a lock file is safe only with both halves of
//! one protocol, else two runs could lock two different files under one
//! name: the holder removes the name while it still holds the lock, and
//! only if the name still reaches the file it locked
//! ([`crate::platform::same_file`]); a run that takes the lock then checks
//! that the name still reaches the file it locked, and if not (it opened
//! the name just before the holder removed it, and so locked a file no name
//! reaches) it closes it and opens the name again. On Windows a file that
//! is removed while another handle is open stays "delete pending" until
//! that handle closes (on file systems without POSIX delete semantics, and
//! under Wine), and opening its name fails with "access denied" meanwhile:
//! a run that meets that error waits a millisecond and opens the name
//! again, up to [`MAX_OPENS`] times (about 0.1 s) before it reports it.
//!
//! The file is reshard's own: hidden, never listed in the index or the
//! manifest, never copied, and not named in the "not copied" notes when an
//! output is converted again. It is opened without following a symlink at
//! its name ([`crate::platform::open_no_follow`]) and checked through the
//! open handle before a byte is written: a name that is taken by anything
//! but a small regular file with exactly one link (a symlink, a folder, a
//! hard link to a file elsewhere, a killed run's left-over lock shared by
//! an output copied with `cp -al`) is refused, its target untouched.

use std::fs::File;
use std::io::{self, Read, Seek, Write};
use std::path::{Path, PathBuf};

/// File name of the lock inside DST.
pub const LOCK: &str = ".reshard.lock";

/// A lock file never holds more than `pid\n`; anything larger is not ours.
const MAX_LOCK_LEN: u64 = 64;

/// How often [`DstLock::acquire`] opens the name again after locking a file
/// its holder had just removed (or, on Windows, after finding it waiting to
/// be deleted).
const MAX_OPENS: usize = 100;

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

/// The held lock of one output folder; dropping it removes the file (see
/// the module doc) and releases the lock.
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
        for left in (1..=MAX_OPENS).rev() {
            let mut file = match open_lock_file(&path) {
                Ok(Some(file)) => file,
                Ok(None) => continue,
                Err(LockError::Io { source, .. })
                    if crate::platform::may_be_delete_pending(&source) && left > 1 =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                    continue;
                }
                Err(e) => return Err(e),
            };
            #[cfg(test)]
            tests::between_open_and_lock();
            if !crate::platform::try_lock_exclusive(&file).map_err(io_err)? {
                return Err(LockError::Busy {
                    dst: dir.to_path_buf(),
                    pid: read_pid(&mut file),
                });
            }
            // The holder before us removed the name after we opened it: the
            // file we locked is no one's lock any more (see the module doc).
            if !crate::platform::same_file(&file, &path).map_err(io_err)? {
                continue;
            }
            // Ours now: anything already in it was left by a run that died.
            file.set_len(0).map_err(io_err)?;
            file.rewind().map_err(io_err)?;
            writeln!(file, "{}", std::process::id()).map_err(io_err)?;
            file.flush().map_err(io_err)?;
            return Ok(DstLock {
                file,
                dir: dir.to_path_buf(),
            });
        }
        // Runs that each finish between our open and our lock, again and
        // again: another reshard is busy here.
        Err(LockError::Busy {
            dst: dir.to_path_buf(),
            pid: None,
        })
    }

    /// The folder this lock holds.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for DstLock {
    fn drop(&mut self) {
        // Removed while still held, and only if the name still reaches the
        // file we hold (see the module doc); otherwise emptied, which says
        // nobody holds it. The OS releases the lock when the file is closed.
        let path = self.dir.join(LOCK);
        let removed = crate::platform::same_file(&self.file, &path).unwrap_or(false)
            && std::fs::remove_file(&path).is_ok();
        if !removed {
            let _ = self.file.set_len(0);
        }
        let _ = crate::platform::unlock(&self.file);
    }
}

/// Opens (creating it if missing) the lock file for reading and writing,
/// without truncating it, without following a symlink at its name, and
/// only if what was opened is a small regular file with one link. `None`
/// when the name went away while we looked (a holder removed it as it let
/// go): the caller opens it again.
fn open_lock_file(path: &Path) -> Result<Option<File>, LockError> {
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
            let meta = match std::fs::symlink_metadata(path) {
                Ok(meta) => meta,
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(io_err(e)),
            };
            if !meta.file_type().is_file() || meta.len() > MAX_LOCK_LEN {
                return Err(not_ours());
            }
            let mut existing = File::options();
            existing.read(true).write(true);
            match crate::platform::open_no_follow(&mut existing, path) {
                Ok(f) => f,
                // A symlink swapped in after the first look.
                Err(e) if crate::platform::is_symlink_loop(&e) => return Err(not_ours()),
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
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
    if links == 0 {
        // Removed since it was opened.
        return Ok(None);
    }
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
    Ok(Some(file))
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
    use std::cell::Cell;

    thread_local! {
        /// Set by a test that widens the moment between opening the name
        /// and locking it, where a holder may remove the name.
        static SLOW_TO_LOCK: Cell<bool> = const { Cell::new(false) };
    }

    pub(super) fn between_open_and_lock() {
        if SLOW_TO_LOCK.get() {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

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
        assert!(
            !tmp.path().join(LOCK).exists(),
            "removed when let go: nothing is left in DST"
        );
        DstLock::acquire(tmp.path()).unwrap();
    }

    /// Whatever took the lock's name while the lock was held (here a file
    /// of someone's, renamed over it) is not the holder's to remove: it
    /// stays, untouched.
    #[test]
    fn a_name_that_no_longer_reaches_the_held_file_is_left_alone() {
        let tmp = tempfile::tempdir().unwrap();
        let held = DstLock::acquire(tmp.path()).unwrap();
        let theirs = tmp.path().join("theirs");
        std::fs::write(&theirs, b"7\n").unwrap();
        match std::fs::rename(&theirs, tmp.path().join(LOCK)) {
            Ok(()) => {}
            // Windows (and Wine) refuse to rename onto a file held open:
            // there the name cannot be taken while the lock is held.
            Err(e) if cfg!(windows) && e.kind() == std::io::ErrorKind::PermissionDenied => {
                drop(held);
                assert!(!tmp.path().join(LOCK).exists());
                return;
            }
            Err(e) => panic!("{e}"),
        }
        drop(held);
        assert_eq!(std::fs::read(tmp.path().join(LOCK)).unwrap(), b"7\n");
    }

    /// Runs that remove the lock file when they let go must never hold the
    /// lock two at a time: one that opened the name just before the holder
    /// removed it locks a file no name reaches, and must notice. Threads
    /// contend as processes do (each open is its own lock owner), each
    /// pausing between its open and its lock so that moment is hit often.
    #[test]
    fn runs_that_remove_the_lock_file_never_hold_it_two_at_a_time() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let tmp = tempfile::tempdir().unwrap();
        let holders = AtomicUsize::new(0);
        let taken = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    SLOW_TO_LOCK.set(true);
                    for _ in 0..300 {
                        let lock = match DstLock::acquire(tmp.path()) {
                            Ok(l) => l,
                            Err(LockError::Busy { .. }) => continue,
                            Err(e) => panic!("{e:?}"),
                        };
                        let before = holders.fetch_add(1, Ordering::SeqCst);
                        assert_eq!(before, 0, "two runs hold the lock at once");
                        taken.fetch_add(1, Ordering::SeqCst);
                        std::thread::yield_now();
                        holders.fetch_sub(1, Ordering::SeqCst);
                        drop(lock);
                    }
                });
            }
        });
        assert!(taken.load(Ordering::SeqCst) > 0);
        assert!(!tmp.path().join(LOCK).exists());
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
