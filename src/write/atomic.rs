//! Atomic files: every final name appears by rename of a temporary file in
//! the same folder, flushed first; temporary names are recognisable so a
//! rerun removes what a killed run left.

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use super::error::WriteError;
use super::failpoint;

/// The temporary name a final file is written under: hidden, in the same
/// folder (so the rename is atomic), unique to this run (the pid and a
/// random token, so two runs never share or delete each other's temps), and
/// recognisable for cleanup by its suffix.
pub fn temp_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!(".{name}.{}{TEMP_SUFFIX}", run_token()))
}

/// `PID-TOKEN`: the same for every temp file of one process.
fn run_token() -> &'static str {
    static TOKEN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TOKEN.get_or_init(|| {
        use std::hash::{BuildHasher, Hasher};
        // std's RandomState is seeded from the OS's random source.
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        format!("{}-{:08x}", std::process::id(), h.finish() as u32)
    })
}

/// Suffix of every temporary file reshard writes.
pub const TEMP_SUFFIX: &str = ".reshard-tmp";

/// Whether `name` is one [`temp_path`] makes: `.NAME.PID-TOKEN.reshard-tmp`
/// (a decimal pid, an 8-digit hex token). A user's `.notes.reshard-tmp`
/// is not: only names of this exact shape are ever removed as temps.
pub fn is_temp_name(name: &str) -> bool {
    let Some(stem) = name
        .strip_prefix('.')
        .and_then(|n| n.strip_suffix(TEMP_SUFFIX))
    else {
        return false;
    };
    let Some((file, token)) = stem.rsplit_once('.') else {
        return false;
    };
    let Some((pid, hex)) = token.split_once('-') else {
        return false;
    };
    !file.is_empty()
        && !pid.is_empty()
        && pid.bytes().all(|b| b.is_ascii_digit())
        && hex.len() == 8
        && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Creates a temporary file that must not exist yet: never opens (and so
/// never truncates) a file or a symlink's target someone left at the name.
pub fn create_temp(tmp: &Path) -> io::Result<File> {
    // Readable too: a shard copied in the kernel is hashed from a read-only
    // mapping of what was written.
    File::options()
        .read(true)
        .write(true)
        .create_new(true)
        .open(tmp)
}

/// How a finished temporary file takes its final name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Publish {
    /// Over whatever is there: a name the run checked it may replace (see
    /// [`super::owned::may_replace`]), or reshard's own bookkeeping.
    Replace,
    /// Only while the name is free ([`crate::platform::rename_no_replace`]):
    /// for a name that was free when the run checked DST, so a file someone
    /// put there since is kept and the run fails naming it.
    New,
}

impl Publish {
    /// [`Publish::Replace`] if `present` (the name held something when the
    /// run checked it), else [`Publish::New`].
    pub fn after_check(present: bool) -> Publish {
        if present {
            Publish::Replace
        } else {
            Publish::New
        }
    }
}

/// Gives the finished temporary file `tmp` its final name `dst`, as `how`
/// says. [`WriteError::Appeared`] when a [`Publish::New`] name was taken.
pub fn publish(tmp: &Path, dst: &Path, how: Publish) -> Result<(), WriteError> {
    let moved = match how {
        Publish::Replace => std::fs::rename(tmp, dst),
        Publish::New => crate::platform::rename_no_replace(tmp, dst),
    };
    match moved {
        Ok(()) => Ok(()),
        Err(e) if how == Publish::New && e.kind() == io::ErrorKind::AlreadyExists => {
            Err(WriteError::Appeared {
                path: dst.to_path_buf(),
            })
        }
        Err(e) => Err(WriteError::io(dst, e)),
    }
}

/// Writes `bytes` to `dir/name` atomically: temp file, fsync, rename over
/// what is there (reshard's manifests and what the run checked).
pub fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), WriteError> {
    write_atomic_as(dir, name, bytes, Publish::Replace)
}

/// [`write_atomic`], publishing as `how` says.
pub fn write_atomic_as(
    dir: &Path,
    name: &str,
    bytes: &[u8],
    how: Publish,
) -> Result<(), WriteError> {
    let tmp = temp_path(dir, name);
    let result = (|| {
        let mut f = create_temp(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()
    })();
    commit_temp(result, &tmp, &dir.join(name), how)
}

/// Bytes [`copy_atomic`] copies between two looks at the cancel flag: a
/// mirrored file can be many GB (a data sample, training logs), and
/// Ctrl-C must not wait for the whole of it. Large enough that the look
/// costs nothing beside the copy (done in the kernel where it can be).
pub const COPY_CHUNK: u64 = 16 << 20;

/// Copies `src` to `dir/name` atomically, [`COPY_CHUNK`] bytes at a time,
/// publishing as `how` says. Returns false, with nothing left behind, when
/// `cancel` was set between two chunks (Ctrl-C).
pub fn copy_atomic(
    src: &Path,
    dir: &Path,
    name: &str,
    cancel: &AtomicBool,
    how: Publish,
) -> Result<bool, WriteError> {
    let tmp = temp_path(dir, name);
    let mut input = File::open(src).map_err(|e| WriteError::io(src, e))?;
    let result = (|| {
        let mut f = create_temp(&tmp)?;
        loop {
            // `Take<&mut File>` into a `File` still copies in the kernel.
            let n = io::copy(&mut (&mut input).take(COPY_CHUNK), &mut f)?;
            if n < COPY_CHUNK {
                break;
            }
            // A full chunk: more may follow (a test pauses here).
            failpoint::named("copy-chunk");
            if cancel.load(Ordering::Relaxed) {
                return Ok(false);
            }
        }
        f.sync_all().map(|()| true)
    })();
    match result {
        Ok(false) => {
            let _ = std::fs::remove_file(&tmp);
            Ok(false)
        }
        other => commit_temp(other.map(|_| ()), &tmp, &dir.join(name), how).map(|()| true),
    }
}

/// Publishes `tmp` as `dst` if `result` is Ok; removes `tmp` otherwise
/// (also when the publish fails).
fn commit_temp(
    result: io::Result<()>,
    tmp: &Path,
    dst: &Path,
    how: Publish,
) -> Result<(), WriteError> {
    failpoint::step();
    let done = result
        .map_err(|e| WriteError::io(dst, e))
        .and_then(|()| publish(tmp, dst, how));
    if done.is_err() {
        let _ = std::fs::remove_file(tmp);
    }
    done
}

/// Flushes a folder's entries (the renames) to disk.
pub fn sync_dir(dir: &Path) -> Result<(), WriteError> {
    crate::platform::sync_dir(dir).map_err(|e| WriteError::io(dir, e))
}

/// Removes temporary files a killed run left in `dir`. Only a run holding
/// `dir`'s lock may do this (no other run can be writing there then); a
/// symlink with a temp name is removed itself, never its target.
pub fn remove_stale_temps(dir: &Path, _held: &super::lock::DstLock) -> Result<usize, WriteError> {
    let mut removed = 0;
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(WriteError::io(dir, e)),
    };
    for entry in entries {
        let entry = entry.map_err(|e| WriteError::io(dir, e))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        if is_temp_name(&name) && !is_dir {
            std::fs::remove_file(entry.path()).map_err(|e| WriteError::io(&entry.path(), e))?;
            removed += 1;
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_names_of_the_temp_shape_are_temps() {
        let made = temp_path(Path::new("d"), "model-00001-of-00002.safetensors");
        let made = made.file_name().unwrap().to_str().unwrap();
        assert!(is_temp_name(made), "{made}");
        assert!(is_temp_name(".config.json.123-0000abcd.reshard-tmp"));
        for foreign in [
            ".notes.reshard-tmp",
            ".x.1-2.reshard-tmp",
            ".x.abc-0000abcd.reshard-tmp",
            "..123-0000abcd.reshard-tmp",
            "x.123-0000abcd.reshard-tmp",
            ".x.123-0000abcg.reshard-tmp",
            ".x.123-0000ABCD.reshard-tmp",
            ".x.123-0000abcd.reshard-tmp.txt",
        ] {
            assert!(!is_temp_name(foreign), "{foreign}");
        }
    }
}
