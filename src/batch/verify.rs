//! `--verify-source`: checking a Hugging Face cache download while it is
//! converted.
//!
//! In the HF cache, `snapshots/<rev>/<file>` is a symlink into `blobs/`, and
//! an LFS blob (every weight file) is named by the sha256 of its content. A
//! truncated or corrupted download therefore shows as a blob whose content no
//! longer hashes to its name. Blobs of small git-tracked files (config.json)
//! are named by a git sha1 (40 hex digits) and are not checked; neither are
//! files outside an HF cache, which carry no expected hash.
//!
//! The check runs beside the model's job, not before it: [`verify_snapshot`]
//! hashes on its own threads (one file each, a fixed buffer each) and
//! reports to a [`Gate`], which the job waits on before it commits (see
//! [`crate::convert::convert_gated`]). Both read the same page cache.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

/// Bytes read at a time while hashing: memory stays fixed whatever the file.
const HASH_BUFFER: usize = 1 << 20;
/// Deepest folder below the snapshot that is looked into.
const MAX_DEPTH: usize = 8;

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
    #[error("{}: verification interrupted", .path.display())]
    Interrupted { path: PathBuf },
}

/// Checks every file of `snapshot` that links to a sha256-named blob, on
/// up to `threads` threads (one file each). The error is the first failing
/// file in name order, whatever order the threads finish in. `cancel` stops
/// it between reads.
pub fn verify_snapshot(
    snapshot: &Path,
    threads: usize,
    cancel: &AtomicBool,
) -> Result<Verified, VerifyError> {
    let files = blob_links(snapshot)?;
    let next = AtomicUsize::new(0);
    // Files after the first failure found so far need not be read.
    let first_failure = AtomicUsize::new(usize::MAX);
    let results: Vec<Mutex<Option<Result<u64, VerifyError>>>> =
        files.iter().map(|_| Mutex::new(None)).collect();
    let worker = || {
        let mut buf = vec![0u8; HASH_BUFFER];
        loop {
            let i = next.fetch_add(1, Ordering::SeqCst);
            let Some((path, expected)) = files.get(i) else {
                break;
            };
            if i > first_failure.load(Ordering::SeqCst) {
                continue;
            }
            let result = check_file(path, expected, &mut buf, cancel);
            if result.is_err() {
                first_failure.fetch_min(i, Ordering::SeqCst);
            }
            *results[i].lock().unwrap_or_else(PoisonError::into_inner) = Some(result);
        }
    };
    std::thread::scope(|s| {
        for _ in 0..threads.clamp(1, files.len().max(1)) {
            s.spawn(worker);
        }
    });
    let mut done = Verified::default();
    for result in results {
        let result = result.into_inner().unwrap_or_else(PoisonError::into_inner);
        // None: not read, after an earlier failure (returned below).
        let Some(result) = result else { continue };
        done.files += 1;
        done.bytes += result?;
    }
    Ok(done)
}

/// The files of `snapshot` that link to a sha256-named blob, in name order,
/// with that name.
fn blob_links(snapshot: &Path) -> Result<Vec<(PathBuf, String)>, VerifyError> {
    let mut files = Vec::new();
    // A pipeline's components (`unet/`, `vae/`) link into the same blobs.
    let mut todo = vec![(snapshot.to_path_buf(), 0usize)];
    while let Some((dir, depth)) = todo.pop() {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(&dir)
            .map_err(io(&dir))?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .collect();
        entries.sort();
        for path in entries {
            let Ok(target) = std::fs::read_link(&path) else {
                // A real folder (never a symlinked one) is walked into.
                let real_dir = std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir());
                if real_dir && depth < MAX_DEPTH {
                    todo.push((path, depth + 1));
                }
                continue;
            };
            let Some(expected) = target
                .file_name()
                .and_then(|n| n.to_str())
                .filter(|n| is_sha256(n))
                .map(str::to_string)
            else {
                continue;
            };
            if !std::fs::metadata(&path).map_err(io(&path))?.is_file() {
                continue;
            }
            files.push((path, expected));
        }
    }
    files.sort();
    Ok(files)
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> VerifyError {
    let path = path.to_path_buf();
    move |source| VerifyError::Io { path, source }
}

/// The length of `path` if its content hashes to `expected`.
fn check_file(
    path: &Path,
    expected: &str,
    buf: &mut [u8],
    cancel: &AtomicBool,
) -> Result<u64, VerifyError> {
    let (actual, bytes) = sha256_stream(path, buf, cancel).map_err(|e| {
        if e.kind() == std::io::ErrorKind::Interrupted {
            VerifyError::Interrupted {
                path: path.to_path_buf(),
            }
        } else {
            io(path)(e)
        }
    })?;
    if actual != expected {
        return Err(VerifyError::Mismatch {
            path: path.to_path_buf(),
            expected: expected.to_string(),
            actual,
        });
    }
    Ok(bytes)
}

fn is_sha256(name: &str) -> bool {
    name.len() == 64
        && name
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// sha256 (lower-case hex) and length of a file, read through `buf`. A set
/// `cancel` ends it with [`std::io::ErrorKind::Interrupted`].
fn sha256_stream(
    path: &Path,
    buf: &mut [u8],
    cancel: &AtomicBool,
) -> std::io::Result<(String, u64)> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut total = 0u64;
    loop {
        if cancel.load(Ordering::Relaxed) {
            return Err(std::io::ErrorKind::Interrupted.into());
        }
        let n = match file.read(buf) {
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

/// Where a check running on other threads reports whether it passed, and
/// where the job waits for that before it commits. Waiting is idempotent:
/// every wait after the first returns at once with the same answer.
#[derive(Debug, Default)]
pub struct Gate {
    state: Mutex<GateState>,
    ready: Condvar,
}

#[derive(Debug, Default)]
struct GateState {
    passed: Option<bool>,
    waited: Duration,
}

impl Gate {
    /// Records the outcome (the first one counts) and wakes every waiter.
    pub fn open(&self, passed: bool) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.passed.get_or_insert(passed);
        self.ready.notify_all();
    }

    /// Blocks until the outcome is recorded; true if the check passed.
    pub fn wait(&self) -> bool {
        let started = Instant::now();
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let passed = loop {
            match state.passed {
                Some(passed) => break passed,
                None => {
                    state = self
                        .ready
                        .wait(state)
                        .unwrap_or_else(PoisonError::into_inner)
                }
            }
        };
        state.waited += started.elapsed();
        passed
    }

    /// How long [`Gate::wait`] blocked, all calls together: the time the
    /// job spent on the check beyond its own work.
    pub fn waited(&self) -> Duration {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .waited
    }

    /// A guard that records a failure when dropped before [`Gate::open`]
    /// (a checker that panicked never leaves the job waiting).
    pub fn fail_on_drop(&self) -> FailOnDrop<'_> {
        FailOnDrop(self)
    }
}

/// See [`Gate::fail_on_drop`].
pub struct FailOnDrop<'a>(&'a Gate);

impl Drop for FailOnDrop<'_> {
    fn drop(&mut self) {
        self.0.open(false);
    }
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
    fn a_pipelines_component_blobs_are_checked_too() {
        let tmp = tempfile::tempdir().unwrap();
        let snap = tmp.path().join("snapshots/rev");
        std::fs::create_dir_all(snap.join("unet")).unwrap();
        let weights = blob(tmp.path(), &[3u8; 1000]);
        if let Err(e) = symlink(
            &weights,
            snap.join("unet/diffusion_pytorch_model.safetensors"),
        ) {
            eprintln!("skipped: cannot make a symlink here: {e}");
            return;
        }
        let ok = verify_snapshot(&snap, 1, &AtomicBool::new(false)).unwrap();
        assert_eq!(ok.files, 1);
        std::fs::write(&weights, [4u8; 1000]).unwrap();
        let err = verify_snapshot(&snap, 1, &AtomicBool::new(false)).unwrap_err();
        assert!(err.to_string().contains("unet"), "{err}");
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
            verify_snapshot(&snap, 2, &AtomicBool::new(false)).unwrap(),
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
        let err = verify_snapshot(&snap, 2, &AtomicBool::new(false)).unwrap_err();
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
        assert_eq!(
            verify_snapshot(&snap, 2, &AtomicBool::new(false)).unwrap(),
            Verified::default()
        );
    }

    #[test]
    fn reports_the_first_bad_file_in_name_order_whatever_the_threads() {
        let tmp = tempfile::tempdir().unwrap();
        let snap = tmp.path().join("snapshots/rev");
        std::fs::create_dir_all(&snap).unwrap();
        for i in 0..6u8 {
            let blob = blob(tmp.path(), &vec![i; (i as usize + 1) << 16]);
            if let Err(e) = symlink(&blob, snap.join(format!("model-{i}.safetensors"))) {
                eprintln!("skipped: cannot make a symlink here: {e}");
                return;
            }
            if i == 2 || i == 4 {
                std::fs::write(&blob, b"changed").unwrap();
            }
        }
        for threads in [1, 2, 4, 8] {
            let err = verify_snapshot(&snap, threads, &AtomicBool::new(false)).unwrap_err();
            assert!(
                err.to_string().contains("model-2.safetensors"),
                "{threads} threads: {err}"
            );
        }
        let cancelled = verify_snapshot(&snap, 2, &AtomicBool::new(true)).unwrap_err();
        assert!(
            matches!(cancelled, VerifyError::Interrupted { .. }),
            "{cancelled}"
        );
        assert!(cancelled.to_string().contains("model-0.safetensors"));
    }

    #[test]
    fn gate_blocks_waiters_until_opened_and_keeps_the_first_outcome() {
        let gate = Gate::default();
        let returned = AtomicBool::new(false);
        std::thread::scope(|s| {
            let waiter = s.spawn(|| {
                let passed = gate.wait();
                returned.store(true, Ordering::SeqCst);
                passed
            });
            std::thread::sleep(Duration::from_millis(30));
            assert!(
                !returned.load(Ordering::SeqCst),
                "wait returned before the gate opened"
            );
            let _fail = gate.fail_on_drop();
            gate.open(true);
            assert!(waiter.join().unwrap());
        });
        gate.open(false);
        assert!(gate.wait(), "the first outcome counts, a guard included");
        assert!(gate.waited() > Duration::ZERO);
    }

    #[test]
    fn a_checker_that_never_opens_the_gate_fails_it() {
        let gate = Gate::default();
        std::thread::scope(|s| {
            let checker = s.spawn(|| {
                let _fail = gate.fail_on_drop();
                panic!("a bug in the checker");
            });
            assert!(!gate.wait());
            assert!(checker.join().is_err());
        });
    }

    #[test]
    fn sha256_names() {
        assert!(is_sha256(&"a".repeat(64)));
        assert!(!is_sha256(&"A".repeat(64)));
        assert!(!is_sha256(&"a".repeat(40)));
    }
}
