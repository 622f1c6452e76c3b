//! The one module that knows which operating system reshard runs on.
//!
//! Everything that differs between Unix and Windows lives here, behind one
//! `cfg` per implementation file ([`unix`] or `windows`), in the style of
//! std's `sys`: the rest of the crate calls the plain functions below and
//! never branches on the OS. This module owns
//!
//! * positioned reads ([`read_at`], [`read_exact_at`]) and canonical paths
//!   ([`canonicalize`]),
//! * durability of a folder's entries ([`sync_dir`]), early writeback of
//!   written pages ([`start_writeback`]) and early reads of pages about to
//!   be mapped ([`will_need`]),
//! * read-only shared mappings of a file range ([`MappedRange`]); on Unix a
//!   fault in one, when another process truncates the file, ends the
//!   process with an error naming the file and exit status 2, not a death
//!   by SIGBUS, and copy-on-write views of a whole file for the emulated
//!   loaders ([`CopyOnWriteView`]), registered the same way,
//! * the machine's memory and commit figures ([`memory_status`]),
//! * private memory charged to this process ([`PrivateMemory`]),
//! * this process's commit charge ([`commit_usage`], [`COMMIT_SOURCE`]) and
//!   a commit limit a process puts on itself ([`CommitLimit`]: `RLIMIT_DATA`
//!   on Unix, a Job Object on Windows),
//! * an exclusive lock on a file that leaves its content readable
//!   ([`try_lock_exclusive`]), opening a file without following a symlink
//!   at its name ([`open_no_follow`]) and counting its hard links
//!   ([`link_count`]),
//! * another process's memory, and a child's whole process tree, limited
//!   and killed together ([`process_memory`], [`ProcessTree`]), to run a
//!   foreign loader under a budget and a timeout and measure it from
//!   outside,
//! * a fresh private working folder for a foreign process ([`PrivateDir`]),
//! * quoting a path for the shell in suggested commands ([`shell_quote`]),
//! * reading OS errors and exit statuses portably ([`is_out_of_memory`],
//!   [`is_symlink_loop`], [`abnormal_exit`]).
//!
//! It holds no policy: what to do with a figure or an error is the caller's.

use std::fs::File;
use std::io;
use std::path::Path;
use std::process::ExitStatus;

use serde::{Deserialize, Serialize};

mod memory;
pub use self::memory::{MemoryStatus, ProcessMemory};

#[cfg(unix)]
mod unix;
#[cfg(unix)]
use unix as imp;

#[cfg(windows)]
mod windows;
#[cfg(windows)]
use windows as imp;

/// An operating system, as far as memory accounting goes: it decides what
/// is charged against the commit limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Os {
    Windows,
    Linux,
    Macos,
}

impl Os {
    /// The OS this binary runs on (any Unix but macOS counts as Linux).
    pub fn current() -> Os {
        if cfg!(windows) {
            Os::Windows
        } else if cfg!(target_os = "macos") {
            Os::Macos
        } else {
            Os::Linux
        }
    }
}

impl std::fmt::Display for Os {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Os::Windows => "windows",
            Os::Linux => "linux",
            Os::Macos => "macos",
        })
    }
}

/// Reads up to `buf.len()` bytes at `offset` without moving a shared file
/// cursor, so workers can read one file at once; 0 means end of file.
pub fn read_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    imp::read_at(file, buf, offset)
}

/// Reads exactly `buf.len()` bytes at `offset`, or fails with
/// `UnexpectedEof`: a short file is never padded.
pub fn read_exact_at(file: &File, mut buf: &mut [u8], mut offset: u64) -> io::Result<()> {
    while !buf.is_empty() {
        match read_at(file, buf, offset) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => {
                buf = &mut buf[n..];
                offset += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The absolute form of `path` with every link resolved, as
/// `std::fs::canonicalize` gives it (`\\?\C:\...` on Windows).
pub fn canonicalize(path: &Path) -> io::Result<std::path::PathBuf> {
    imp::canonicalize(path)
}

/// Makes the entries of folder `dir` (creations, renames) durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    imp::sync_dir(dir)
}

/// Starts (does not wait for) writeback of `len` bytes at `offset` of a
/// file being written, so the disk works while the next chunk is computed
/// and the final `sync_all` has little left. Best effort: where the OS has
/// no such call, or it fails, the pages are written at `sync_all`.
pub fn start_writeback(file: &File, offset: u64, len: u64) {
    imp::start_writeback(file, offset, len)
}

/// Asks the OS to start reading `len` bytes at `offset` of `file` into the
/// page cache now (does not wait), so a mapping read soon after finds them
/// there instead of faulting them in one readahead window at a time. Best
/// effort: where the OS has no such call, nothing happens.
pub fn will_need(file: &File, offset: u64, len: u64) {
    imp::will_need(file, offset, len)
}

/// A read-only, shared mapping of `len` bytes of a file from `offset`:
/// its pages are the page cache's, nothing is copied and nothing is charged
/// as commit (never copy-on-write). Resident pages count in the process's
/// RSS while it lives, so callers keep it as short as their window allows.
///
/// If another process truncates the file while it is mapped, a read of a
/// page past the new end faults. On Unix the mapping is registered (with
/// its path) for as long as it lives, and such a fault ends the process
/// with `error: PATH: the file was truncated or changed while it was being
/// read ...` on stderr and exit status 2, instead of a death by SIGBUS.
/// Windows refuses to truncate a file with a mapped view.
pub struct MappedRange {
    // Declared first, so dropped first: the range leaves the registry
    // before its pages are unmapped and the address can be reused.
    _fault: Option<imp::MapGuard>,
    map: Option<memmap2::Mmap>,
}

impl MappedRange {
    /// Maps `[offset, offset + len)` of `file`, which must be open for
    /// reading; `path` is its name, for the message if the file shrinks
    /// while mapped. `len == 0` maps nothing.
    #[allow(unsafe_code)]
    pub fn map(file: &File, path: &Path, offset: u64, len: usize) -> io::Result<MappedRange> {
        if len == 0 {
            return Ok(MappedRange {
                _fault: None,
                map: None,
            });
        }
        let mut options = memmap2::MmapOptions::new();
        options.offset(offset).len(len);
        // SAFETY: a read-only shared mapping: reshard never writes through
        // it, so no reference into it is invalidated by a write of ours.
        // Callers map ranges of their own output file (a temporary name no
        // other process writes), or one chunk of a source file
        // (`exec::mapped`), checked against the length its header claims
        // right before mapping. Another process can still change the bytes
        // (a wrong result, as on any read path) or truncate the file while
        // the chunk is mapped: a read past the new end then faults, and on
        // Unix the registration below turns that fault into a clear error
        // and exit status 2 (`unix::sigbus`), never a read of bad memory
        // that returns; Windows refuses the truncation.
        let map = unsafe { options.map(file) }?;
        Ok(MappedRange {
            _fault: Some(imp::MapGuard::register(&map, offset, path)),
            map: Some(map),
        })
    }
}

impl std::ops::Deref for MappedRange {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }
}

/// A private writable (copy-on-write) view of a whole file, as PyTorch's
/// `from_file` and the safetensors loader make: charged against the commit
/// limit for its whole size (Windows) or to `VmData` (Linux) when mapped.
/// `validate --emulate` holds shards this way to measure what those
/// loaders commit; it is only read. Registered like [`MappedRange`], so a
/// read of a page the file lost to a truncation ends the process with an
/// error naming the file and exit status 2, not a death by SIGBUS.
pub struct CopyOnWriteView {
    // Dropped first, as in MappedRange.
    _fault: Option<imp::MapGuard>,
    map: Option<memmap2::MmapMut>,
}

impl CopyOnWriteView {
    /// Maps the whole of `file` (open for reading) as it is now; `path` is
    /// its name for the message. An empty file maps nothing.
    #[allow(unsafe_code)]
    pub fn map(file: &File, path: &Path) -> io::Result<CopyOnWriteView> {
        if file.metadata()?.len() == 0 {
            return Ok(CopyOnWriteView {
                _fault: None,
                map: None,
            });
        }
        // SAFETY: a private mapping: writes through it would never reach
        // the file, and callers only read it (`Deref` hands out `&[u8]`).
        // Another process may truncate the file while it is mapped; a read
        // of a lost page then faults, and the registration below turns the
        // fault into a clear error and exit status 2 on Unix; Windows
        // refuses the truncation.
        let map = unsafe { memmap2::MmapOptions::new().map_copy(file) }?;
        Ok(CopyOnWriteView {
            _fault: Some(imp::MapGuard::register(&map, 0, path)),
            map: Some(map),
        })
    }
}

impl std::ops::Deref for CopyOnWriteView {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }
}

/// Reads the machine's memory figures. Never fails: unreadable figures are
/// `None`.
pub fn memory_status() -> MemoryStatus {
    imp::memory_status()
}

/// Where [`commit_usage`] reads this process's commit charge: `VmData`
/// (Linux), `PagefileUsage` (Windows), or `unavailable`.
pub const COMMIT_SOURCE: &str = imp::COMMIT_SOURCE;

/// This process's commit charge now, in bytes, read without allocating on
/// the heap (so it can be sampled close to a limit).
pub fn commit_usage() -> Option<u64> {
    imp::commit_usage()
}

/// A limit on this process's total commit charge, held for as long as the
/// value lives: an allocation or copy-on-write mapping past it fails (the
/// call returns an error) instead of swapping or killing the process.
/// `RLIMIT_DATA` on Unix; on Windows a Job Object with
/// `JOB_OBJECT_LIMIT_PROCESS_MEMORY` the process assigns itself to.
pub struct CommitLimit {
    // Held for its Drop, which lifts the limit.
    _limit: imp::CommitLimit,
}

impl CommitLimit {
    /// Limits this process's commit to `bytes` in total (not above now).
    pub fn set(bytes: u64) -> io::Result<CommitLimit> {
        imp::CommitLimit::set(bytes).map(|l| CommitLimit { _limit: l })
    }

    /// True if the system refuses to commit `probe` more bytes in this
    /// process now. Asked right after [`CommitLimit::set`] with a probe that
    /// would pass the limit, it says whether the limit is really enforced:
    /// Wine accepts a Job Object limit and then ignores it. The probe is
    /// committed (or refused) and released at once; no page is touched, so
    /// it costs neither memory nor time.
    pub fn refuses(&self, probe: usize) -> bool {
        PrivateMemory::new(probe.max(1)).is_err()
    }
}

/// The memory figures of a running `child`; all `None` once it has gone
/// or where they cannot be read.
pub fn process_memory(child: &std::process::Child) -> ProcessMemory {
    imp::process_memory(child)
}

/// A child process and every process it starts, to be limited and ended
/// together, so a loader's worker processes (torch's) neither escape a
/// commit budget nor outlive a timeout. On Unix the child heads a new
/// process group; on Linux reshard is also a child subreaper
/// (`PR_SET_CHILD_SUBREAPER`) and the tree's processes carry a mark in
/// their environment, so a worker that left the group and the session
/// (`setsid`) is still found and killed. On Windows the child is put in a
/// Job Object, which every process it starts joins and which kills them
/// all when closed.
pub struct ProcessTree(imp::ProcessTree);

impl ProcessTree {
    /// Spawns `cmd` heading its own tree. The tree is an error when it
    /// could not be made (a Windows that refuses the job): then only the
    /// child can be killed, and no budget set.
    pub fn spawn(
        cmd: &mut std::process::Command,
    ) -> io::Result<(std::process::Child, io::Result<ProcessTree>)> {
        let (child, tree) = imp::ProcessTree::spawn(cmd)?;
        Ok((child, tree.map(ProcessTree)))
    }

    /// Limits the commit of the child, from outside, once it has started
    /// (imported its libraries), so the limit can sit on a measured
    /// baseline: `prlimit(RLIMIT_DATA)` on Linux (inherited by processes it
    /// starts later), the job's `JOB_OBJECT_LIMIT_PROCESS_MEMORY` on
    /// Windows (accepted but not enforced by Wine 8). Unsupported on other
    /// Unix systems.
    pub fn limit_commit(&self, bytes: u64) -> io::Result<()> {
        self.0.limit_commit(bytes)
    }

    /// Kills every process of the tree still running, and on Linux waits
    /// until none is left (an error if one will not end, stuck in the
    /// kernel). Not reached: on macOS a process that left the group; on
    /// Linux one that left the group and cleared its environment after its
    /// parent died. The caller still waits for the child to reap it.
    pub fn kill(&self) -> io::Result<()> {
        self.0.kill()
    }
}

/// A zeroed block of private memory, committed (charged to this process)
/// when made and returned to the system exactly when dropped, so a measured
/// peak does not depend on an allocator's heuristics, and refused with an
/// error, not an abort, past a [`CommitLimit`]. A private anonymous mapping
/// on Unix; `VirtualAlloc` on Windows, where an anonymous file mapping
/// (what memmap2's `map_anon` makes) is a pagefile-backed section, charged
/// to the system but neither to the process's `PagefileUsage` nor to its
/// Job Object limit.
pub struct PrivateMemory(imp::PrivateMemory);

impl PrivateMemory {
    /// Commits `len` (> 0) bytes, zeroed.
    pub fn new(len: usize) -> io::Result<PrivateMemory> {
        imp::PrivateMemory::new(len).map(PrivateMemory)
    }
}

impl std::ops::Deref for PrivateMemory {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.0.as_slice()
    }
}

impl std::ops::DerefMut for PrivateMemory {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.0.as_mut_slice()
    }
}

/// A fresh, empty folder under the temp folder that only this user may
/// enter (mode 0700 on Unix; on Windows the per-user temp folder's own
/// access list), removed with what it holds when dropped. It is the working
/// directory of a foreign Python (`validate --loader python:NAME`), so no
/// file of the folder reshard was started in is on its import path.
pub struct PrivateDir(std::path::PathBuf);

impl PrivateDir {
    /// Makes `<temp>/<prefix>-<pid>-<n>`, taking the next `n` while the name
    /// is taken (a planted folder of that name is never entered).
    pub fn new(prefix: &str) -> io::Result<PrivateDir> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let base = std::env::temp_dir();
        let mut last = io::Error::from(io::ErrorKind::AlreadyExists);
        for _ in 0..1000 {
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let path = base.join(format!("{prefix}-{}-{n}", std::process::id()));
            match imp::create_private_dir(&path) {
                Ok(()) => return Ok(PrivateDir(path)),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = e,
                Err(e) => return Err(e),
            }
        }
        Err(last)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        // Best effort: std's remove_dir_all does not follow symlinks.
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Takes an exclusive lock on `file` without waiting: `Ok(true)` if taken,
/// `Ok(false)` if another handle holds it. The OS drops the lock when the
/// file is closed or the process dies. On Unix a `flock` of the whole file
/// (std's `File::try_lock`). On Windows a byte-range lock on one byte at
/// offset 2^32, past anything the file holds: Windows locks are mandatory,
/// and a whole-file lock would stop other processes reading what the holder
/// wrote into the file (its pid).
pub fn try_lock_exclusive(file: &File) -> io::Result<bool> {
    imp::try_lock_exclusive(file)
}

/// Releases a lock [`try_lock_exclusive`] took on `file`.
pub fn unlock(file: &File) -> io::Result<()> {
    imp::unlock(file)
}

/// Opens `path` with `options` without following a symlink at its last
/// component: on Unix `O_NOFOLLOW` (a symlink there fails to open); on
/// Windows `FILE_FLAG_OPEN_REPARSE_POINT` (the link itself is opened, and
/// the handle's metadata says so). Either way the caller checks what the
/// handle is before writing through it.
pub fn open_no_follow(options: &mut std::fs::OpenOptions, path: &Path) -> io::Result<File> {
    imp::open_no_follow(options, path)
}

/// How many names (hard links) the file open as `file` has: 1 for a file
/// that only this name reaches. From the handle, so it is the opened
/// file's count, whatever its name points to now.
pub fn link_count(file: &File) -> io::Result<u64> {
    imp::link_count(file)
}

/// Whether `path` names the very file open as `file` (the same device and
/// inode on Unix, the same volume and file index on Windows), looked at
/// without following a symlink at its last component. `Ok(false)` when
/// nothing is at `path` any more (or, on Windows, a file there is waiting
/// to be deleted).
pub fn same_file(file: &File, path: &Path) -> io::Result<bool> {
    imp::same_file(file, path)
}

/// Renames `from` to `to` only if nothing is at `to`: an existing `to`
/// fails with [`io::ErrorKind::AlreadyExists`] and both names stay as they
/// were. Linux: `renameat2(RENAME_NOREPLACE)`; where the file system lacks
/// it, and on other Unix systems, a hard link (which never replaces) then
/// the unlink of `from` (where there are no hard links either, a look then
/// a rename, which leaves only this call's window). Windows: `MoveFileExW` without
/// `MOVEFILE_REPLACE_EXISTING`. One atomic step either way, so a file that
/// appears at `to` after a caller checked it is never replaced.
pub fn rename_no_replace(from: &Path, to: &Path) -> io::Result<()> {
    imp::rename_no_replace(from, to)
}

/// Whether opening a name failed maybe only because the file there waits
/// to be deleted (Windows, where a file removed while another handle is
/// open keeps its name until that handle closes, and refuses every open
/// with "access denied" meanwhile). Never on Unix, where a removed name is
/// gone at once.
pub fn may_be_delete_pending(e: &io::Error) -> bool {
    imp::may_be_delete_pending(e)
}

/// Quotes a path for this platform's shell when it needs it, for commands
/// reshard suggests: POSIX single quotes on Unix; on Windows double quotes,
/// which cmd.exe and PowerShell both read, and no quoting of `\` or `:`.
pub fn shell_quote(s: &str) -> String {
    imp::shell_quote(s)
}

/// Whether `e` means the system refused memory (ENOMEM, or Windows'
/// "not enough memory" / "commitment limit" errors).
pub fn is_out_of_memory(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::OutOfMemory || imp::is_out_of_memory(e)
}

/// The error an allocation that the system refused is reported as.
pub fn out_of_memory() -> io::Error {
    io::Error::from(io::ErrorKind::OutOfMemory)
}

/// Whether `e` means a chain of symbolic links loops (or is too long).
pub fn is_symlink_loop(e: &io::Error) -> bool {
    imp::is_symlink_loop(e)
}

/// How a child process ended when it did not exit by itself: `signal 6`
/// on Unix, `status 0xC0000017` (an NTSTATUS exception) on Windows.
/// `None` for an ordinary exit.
pub fn abnormal_exit(status: &ExitStatus) -> Option<String> {
    imp::abnormal_exit(status)
}
