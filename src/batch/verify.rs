//! `--verify-source`: checking a Hugging Face cache download before
//! converting it.
//!
//! In the HF cache, `snapshots/<rev>/<file>` is a symlink into `blobs/`, and
//! an LFS blob (every weight file) is named by the sha256 of its content. A
//! truncated or corrupted download therefore shows as a blob whose content no
//! longer hashes to its name. Blobs of small git-tracked files (config.json)
//! are named by a git sha1 (40 hex digits) and are not checked; neither are
//! files outside an HF cache, which carry no expected hash.

use std::io::Read;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// Bytes read at a time while hashing: memory stays fixed whatever the file.
const HASH_BUFFER: usize = 1 << 20;

/// What a verification covered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Verified {
    pub files: usize,
    pub bytes: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error("{}: content hashes to sha256 {actual} but its blob is named {expected}: corrupted or truncated download (delete the blob and download again)", .path.display())]
    Mismatch {
        path: PathBuf,
        expected: String,
        actual: String,
    },
    #[error("cannot read {}", .path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Checks every file of `snapshot` that links to a sha256-named blob.
pub fn verify_snapshot(snapshot: &Path) -> Result<Verified, VerifyError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| VerifyError::Io { path, source }
    };
    let mut entries: Vec<PathBuf> = std::fs::read_dir(snapshot)
        .map_err(io(snapshot))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .collect();
    entries.sort();
    let mut done = Verified::default();
    for path in entries {
        let Ok(target) = std::fs::read_link(&path) else {
            continue;
        };
        let Some(expected) = target
            .file_name()
            .and_then(|n| n.to_str())
            .filter(|n| is_sha256(n))
        else {
            continue;
        };
        if !std::fs::metadata(&path).map_err(io(&path))?.is_file() {
            continue;
        }
        let (actual, bytes) = sha256_stream(&path).map_err(io(&path))?;
        if actual != expected {
            return Err(VerifyError::Mismatch {
                path,
                expected: expected.to_string(),
                actual,
            });
        }
        done.files += 1;
        done.bytes += bytes;
    }
    Ok(done)
}

fn is_sha256(name: &str) -> bool {
    name.len() == 64
        && name
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// sha256 (lower-case hex) and length of a file, read through a fixed buffer.
fn sha256_stream(path: &Path) -> std::io::Result<(String, u64)> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; HASH_BUFFER];
    let mut total = 0u64;
    loop {
        let n = match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        hasher.update(&buf[..n]);
        total += n as u64;
    }
    Ok((crate::write::shard::hex(&hasher.finalize()), total))
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(unix)]
    use std::os::unix::fs::symlink;

    /// A symlink, or Err where the platform makes none: Windows without the
    /// privilege, and Wine 8, whose CreateSymbolicLinkW reports success and
    /// makes nothing.
    #[cfg(windows)]
    fn symlink(target: impl AsRef<Path>, link: impl AsRef<Path>) -> std::io::Result<()> {
        let (target, link) = (target.as_ref(), link.as_ref());
        let target = PathBuf::from(target.to_string_lossy().replace('/', "\\"));
        if link.parent().unwrap().join(&target).is_dir() {
            std::os::windows::fs::symlink_dir(&target, link)?;
        } else {
            std::os::windows::fs::symlink_file(&target, link)?;
        }
        match link.symlink_metadata() {
            Ok(m) if m.file_type().is_symlink() => Ok(()),
            _ => Err(std::io::Error::other("no symlink was made")),
        }
    }

    fn blob(repo: &Path, content: &[u8]) -> PathBuf {
        let name = crate::write::shard::hex(&Sha256::digest(content));
        let path = repo.join("blobs").join(name);
        std::fs::create_dir_all(repo.join("blobs")).unwrap();
        std::fs::write(&path, content).unwrap();
        path
    }

    #[test]
    fn accepts_intact_blobs_and_catches_changed_ones() {
        let tmp = tempfile::tempdir().unwrap();
        let snap = tmp.path().join("snapshots/rev");
        std::fs::create_dir_all(&snap).unwrap();
        let weights = blob(tmp.path(), &[7u8; 3 << 20]);
        if let Err(e) = symlink(&weights, snap.join("model.safetensors")) {
            eprintln!("skipped: cannot make a symlink here: {e}");
            return;
        }
        // A git blob (sha1 name) and a plain file are not checked.
        std::fs::write(
            tmp.path()
                .join("blobs/0123456789012345678901234567890123456789"),
            "{}",
        )
        .unwrap();
        symlink(
            tmp.path()
                .join("blobs/0123456789012345678901234567890123456789"),
            snap.join("config.json"),
        )
        .unwrap();
        std::fs::write(snap.join("notes.txt"), "x").unwrap();
        assert_eq!(
            verify_snapshot(&snap).unwrap(),
            Verified {
                files: 1,
                bytes: 3 << 20
            }
        );

        let truncated = std::fs::OpenOptions::new()
            .write(true)
            .open(&weights)
            .unwrap();
        truncated.set_len(1 << 20).unwrap();
        let err = verify_snapshot(&snap).unwrap_err();
        assert!(matches!(err, VerifyError::Mismatch { .. }), "{err}");
        assert!(err.to_string().contains("model.safetensors"), "{err}");
    }

    #[test]
    fn real_copies_without_symlinks_are_not_checked() {
        // huggingface_hub on Windows without symlinks moves each download
        // into the snapshot as a real file: no sha256 name to check it by.
        let tmp = tempfile::tempdir().unwrap();
        let snap = tmp.path().join("snapshots/rev");
        std::fs::create_dir_all(&snap).unwrap();
        std::fs::create_dir_all(tmp.path().join("blobs")).unwrap();
        std::fs::write(snap.join("model.safetensors"), [7u8; 1024]).unwrap();
        assert_eq!(verify_snapshot(&snap).unwrap(), Verified::default());
    }

    #[test]
    fn sha256_names() {
        assert!(is_sha256(&"a".repeat(64)));
        assert!(!is_sha256(&"A".repeat(64)));
        assert!(!is_sha256(&"a".repeat(40)));
    }
}
