//! Unix (Linux first; macOS and other Unixes best effort) behind
//! [`super`]'s portable API. Linux reads `/proc` for memory figures and the
//! commit charge (`VmData`, the quantity `RLIMIT_DATA` limits); [`sigbus`]
//! turns a fault in a mapping of a file that shrank into a clear error.

#![allow(unsafe_code)]

use std::fs::File;
use std::io;
use std::path::Path;
use std::process::ExitStatus;

use super::MemoryStatus;

mod sigbus;
#[cfg(target_os = "linux")]
mod tree;
pub use sigbus::MapGuard;

pub fn read_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    std::os::unix::fs::FileExt::read_at(file, buf, offset)
}

pub fn canonicalize(path: &Path) -> io::Result<std::path::PathBuf> {
    std::fs::canonicalize(path)
}

pub fn create_private_dir(path: &Path) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().mode(0o700).create(path)
}

pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

#[cfg(target_os = "linux")]
pub fn start_writeback(file: &File, offset: u64, len: u64) {
    use std::os::fd::AsRawFd;
    let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
        return;
    };
    // SAFETY: sync_file_range reads no memory of ours; the descriptor is
    // owned by `file` and open for the duration of the call. A failure only
    // means the kernel will write the pages later, at fsync, so it is ignored.
    unsafe {
        libc::sync_file_range(file.as_raw_fd(), offset, len, libc::SYNC_FILE_RANGE_WRITE);
    }
}

#[cfg(not(target_os = "linux"))]
pub fn start_writeback(_file: &File, _offset: u64, _len: u64) {}

#[cfg(target_os = "linux")]
pub fn will_need(file: &File, offset: u64, len: u64) {
    use std::os::fd::AsRawFd;
    let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
        return;
    };
    // SAFETY: posix_fadvise reads no memory of ours; the descriptor is owned
    // by `file` and open for the call. It is advice: a failure changes
    // nothing but speed, so it is ignored.
    unsafe {
        libc::posix_fadvise(file.as_raw_fd(), offset, len, libc::POSIX_FADV_WILLNEED);
    }
}

#[cfg(not(target_os = "linux"))]
pub fn will_need(_file: &File, _offset: u64, _len: u64) {}

#[cfg(target_os = "linux")]
pub fn memory_status() -> MemoryStatus {
    let mut m = std::fs::read_to_string("/proc/meminfo")
        .map(|t| parse_meminfo(&t))
        .unwrap_or_default();
    m.overcommit_memory = std::fs::read_to_string("/proc/sys/vm/overcommit_memory")
        .ok()
        .and_then(|s| s.trim().parse().ok());
    m
}

#[cfg(target_os = "macos")]
pub fn memory_status() -> MemoryStatus {
    // Best effort: macOS grows swap on demand and has no commit limit.
    let ram = std::process::Command::new("sysctl")
        .args(["-n", "hw.memsize"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok());
    MemoryStatus {
        ram,
        ..MemoryStatus::default()
    }
}

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
pub fn memory_status() -> MemoryStatus {
    MemoryStatus::default()
}

/// Parses /proc/meminfo (values in kB).
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
fn parse_meminfo(text: &str) -> MemoryStatus {
    let field = |key: &str| {
        text.lines().find_map(|line| {
            let rest = line.strip_prefix(key)?.strip_prefix(':')?;
            let kb: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
            kb.checked_mul(1024)
        })
    };
    MemoryStatus {
        ram: field("MemTotal"),
        available: field("MemAvailable"),
        swap: field("SwapTotal"),
        commit_limit: field("CommitLimit"),
        committed: field("Committed_AS"),
        overcommit_memory: None,
    }
}

#[cfg(target_os = "linux")]
pub const COMMIT_SOURCE: &str = "VmData";
#[cfg(not(target_os = "linux"))]
pub const COMMIT_SOURCE: &str = "unavailable";

/// `VmData` in bytes, read into a stack buffer.
#[cfg(target_os = "linux")]
pub fn commit_usage() -> Option<u64> {
    use std::io::Read;
    let mut buf = [0u8; 16 * 1024];
    let mut file = File::open("/proc/self/status").ok()?;
    let mut len = 0;
    while len < buf.len() {
        match file.read(&mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    parse_vm_data(&buf[..len])
}

#[cfg(not(target_os = "linux"))]
pub fn commit_usage() -> Option<u64> {
    None
}

/// The `VmData:` line of a /proc/PID/status text, in bytes.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
fn parse_vm_data(status: &[u8]) -> Option<u64> {
    parse_status_field(status, b"VmData:")
}

/// A `Field:  N kB` line of a /proc/PID/status text, in bytes.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
fn parse_status_field(status: &[u8], field: &[u8]) -> Option<u64> {
    let line = status
        .split(|&b| b == b'\n')
        .find(|l| l.starts_with(field))?;
    let rest = std::str::from_utf8(&line[field.len()..]).ok()?;
    let mut parts = rest.split_whitespace();
    let n: u64 = parts.next()?.parse().ok()?;
    let unit = match parts.next() {
        Some("kB") | Some("KB") => 1024,
        Some("mB") | Some("MB") => 1024 * 1024,
        None | Some("B") => 1,
        Some(_) => return None,
    };
    n.checked_mul(unit)
}

/// `RLIMIT_DATA` lowered for as long as this lives; the previous limit is
/// restored on drop.
pub struct CommitLimit {
    previous: (libc::rlim_t, libc::rlim_t),
}

impl CommitLimit {
    pub fn set(bytes: u64) -> io::Result<CommitLimit> {
        use nix::sys::resource::{getrlimit, setrlimit, Resource};
        let previous = getrlimit(Resource::RLIMIT_DATA).map_err(io::Error::from)?;
        let soft = (bytes as libc::rlim_t).min(previous.1);
        setrlimit(Resource::RLIMIT_DATA, soft, previous.1).map_err(io::Error::from)?;
        Ok(CommitLimit { previous })
    }
}

impl Drop for CommitLimit {
    fn drop(&mut self) {
        let _ = nix::sys::resource::setrlimit(
            nix::sys::resource::Resource::RLIMIT_DATA,
            self.previous.0,
            self.previous.1,
        );
    }
}

/// `VmData`, `VmRSS` and `VmHWM` of another process, from
/// /proc/PID/status.
#[cfg(target_os = "linux")]
pub fn process_memory(child: &std::process::Child) -> super::ProcessMemory {
    let Ok(status) = std::fs::read(format!("/proc/{}/status", child.id())) else {
        return super::ProcessMemory::default();
    };
    super::ProcessMemory {
        commit: parse_status_field(&status, b"VmData:"),
        rss: parse_status_field(&status, b"VmRSS:"),
        peak_commit: None,
        peak_rss: parse_status_field(&status, b"VmHWM:"),
    }
}

#[cfg(not(target_os = "linux"))]
pub fn process_memory(_child: &std::process::Child) -> super::ProcessMemory {
    super::ProcessMemory::default()
}

/// A child heading its own process group: a signal to the group reaches
/// every process it started that did not leave the group (torch's workers
/// stay in it). On Linux the tree also holds what left the group, even in a
/// session of its own ([`tree`]).
pub struct ProcessTree {
    pgid: libc::pid_t,
    #[cfg(target_os = "linux")]
    mark: String,
}

impl ProcessTree {
    pub fn spawn(
        cmd: &mut std::process::Command,
    ) -> io::Result<(std::process::Child, io::Result<ProcessTree>)> {
        use std::os::unix::process::CommandExt;
        cmd.process_group(0);
        #[cfg(target_os = "linux")]
        let mark = tree::new_mark();
        // Out of the terminal's process group, the child would outlive a
        // parent killed outright; on Linux it is killed with it.
        #[cfg(target_os = "linux")]
        {
            cmd.env(tree::MARK_ENV, &mark);
            let parent = std::process::id();
            // SAFETY: the closure runs in the forked child before exec and
            // calls only prctl and getppid, both async-signal-safe; it
            // allocates nothing.
            unsafe {
                cmd.pre_exec(move || {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                    // The parent died before the prctl: do not run orphaned.
                    if u32::try_from(libc::getppid()).ok() != Some(parent) {
                        return Err(io::Error::from(io::ErrorKind::Interrupted));
                    }
                    Ok(())
                })
            };
        }
        let child = cmd.spawn()?;
        let tree = libc::pid_t::try_from(child.id())
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
            .map(|pgid| ProcessTree {
                pgid,
                #[cfg(target_os = "linux")]
                mark,
            });
        Ok((child, tree))
    }

    /// `RLIMIT_DATA` of the group's leader, set with `prlimit`; processes
    /// it starts later inherit it. Nothing to undo: it dies with them.
    #[cfg(target_os = "linux")]
    pub fn limit_commit(&self, bytes: u64) -> io::Result<()> {
        let mut old = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: a null new limit only reads; `old` is a live struct.
        if unsafe { libc::prlimit(self.pgid, libc::RLIMIT_DATA, std::ptr::null(), &mut old) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let new = libc::rlimit {
            rlim_cur: (bytes as libc::rlim_t).min(old.rlim_max),
            rlim_max: old.rlim_max,
        };
        // SAFETY: `new` is a live struct; a null old limit is allowed.
        if unsafe { libc::prlimit(self.pgid, libc::RLIMIT_DATA, &new, std::ptr::null_mut()) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    #[cfg(not(target_os = "linux"))]
    pub fn limit_commit(&self, _bytes: u64) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "limiting another process's commit needs prlimit (Linux)",
        ))
    }

    pub fn kill(&self) -> io::Result<()> {
        // SAFETY: kill takes plain integers; a negative pid names the
        // group, which exists while any member (or the unreaped leader)
        // does. ESRCH (all gone) is ignored.
        unsafe { libc::kill(-self.pgid, libc::SIGKILL) };
        #[cfg(target_os = "linux")]
        return tree::kill(&self.mark, self.pgid);
        #[cfg(not(target_os = "linux"))]
        Ok(())
    }
}

/// A private anonymous mapping (memmap2 `map_anon`): charged to `VmData`
/// and `RLIMIT_DATA` when made.
pub struct PrivateMemory(memmap2::MmapMut);

impl PrivateMemory {
    pub fn new(len: usize) -> io::Result<PrivateMemory> {
        let map = memmap2::MmapMut::map_anon(len)?;
        // Large blocks in transparent huge pages where the kernel offers
        // them on request (`madvise` mode, the common default): one fault
        // per 2 MiB instead of per 4 KiB when the block is first written.
        // The commit charge is the mapping's length either way.
        #[cfg(target_os = "linux")]
        if len >= 2 << 20 {
            let _ = map.advise(memmap2::Advice::HugePage);
        }
        Ok(PrivateMemory(map))
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.0
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.0
    }
}

pub fn try_lock_exclusive(file: &File) -> io::Result<bool> {
    match file.try_lock() {
        Ok(()) => Ok(true),
        Err(std::fs::TryLockError::WouldBlock) => Ok(false),
        Err(std::fs::TryLockError::Error(e)) => Err(e),
    }
}

pub fn unlock(file: &File) -> io::Result<()> {
    file.unlock()
}

pub fn open_no_follow(options: &mut std::fs::OpenOptions, path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    options.custom_flags(libc::O_NOFOLLOW).open(path)
}

pub fn link_count(file: &File) -> io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    Ok(file.metadata()?.nlink())
}

pub fn same_file(file: &File, path: &Path) -> io::Result<bool> {
    use std::os::unix::fs::MetadataExt;
    let open = file.metadata()?;
    match std::fs::symlink_metadata(path) {
        Ok(named) => Ok(named.dev() == open.dev() && named.ino() == open.ino()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

pub fn rename_no_replace(from: &Path, to: &Path) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        use std::ffi::CString;
        use std::os::unix::ffi::OsStrExt;
        let cstr = |p: &Path| {
            CString::new(p.as_os_str().as_bytes())
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in the path"))
        };
        let (f, t) = (cstr(from)?, cstr(to)?);
        // The raw syscall: glibc gained a wrapper only in 2.28, musl later.
        // SAFETY: both pointers are NUL-terminated strings that outlive
        // the call.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_renameat2,
                libc::AT_FDCWD,
                f.as_ptr(),
                libc::AT_FDCWD,
                t.as_ptr(),
                libc::RENAME_NOREPLACE,
            )
        };
        if rc == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        // EINVAL: this file system cannot rename without replacing;
        // ENOSYS: a kernel older than 3.15. Both fall back to the link.
        if !matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOSYS)) {
            return Err(e);
        }
    }
    match std::fs::hard_link(from, to) {
        Ok(()) => std::fs::remove_file(from),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Err(e),
        // No hard links here either (FAT, some FUSE file systems): the
        // best left is to look, then rename; the window is this call.
        Err(_) => match std::fs::symlink_metadata(to) {
            Ok(_) => Err(io::Error::from(io::ErrorKind::AlreadyExists)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => std::fs::rename(from, to),
            Err(e) => Err(e),
        },
    }
}

pub fn may_be_delete_pending(_e: &io::Error) -> bool {
    false
}

pub fn shell_quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./:=@+,".contains(&b));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

pub fn is_out_of_memory(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::ENOMEM)
}

pub fn is_symlink_loop(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::ELOOP)
}

pub fn abnormal_exit(status: &ExitStatus) -> Option<String> {
    use std::os::unix::process::ExitStatusExt;
    status.signal().map(|s| format!("signal {s}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_paths_for_the_shell() {
        assert_eq!(shell_quote("models/llama-3"), "models/llama-3");
        assert_eq!(shell_quote("my model's"), r"'my model'\''s'");
    }

    const GIB: u64 = 1 << 30;

    #[test]
    fn parses_meminfo_in_kib() {
        let text = "MemTotal:       65536000 kB\nMemFree:         1000 kB\nMemAvailable:   32768000 kB\nSwapTotal:       8388608 kB\nCommitLimit:    41156608 kB\nCommitted_AS:   10240000 kB\n";
        let m = parse_meminfo(text);
        assert_eq!(m.ram, Some(65_536_000 * 1024));
        assert_eq!(m.available, Some(32_768_000 * 1024));
        assert_eq!(m.swap, Some(8 * GIB));
        assert_eq!(m.commit_limit, Some(41_156_608 * 1024));
        assert_eq!(m.committed, Some(10_240_000 * 1024));
        assert_eq!(
            parse_meminfo("garbage\nMemTotal: x kB\n"),
            MemoryStatus::default()
        );
    }

    #[test]
    fn parses_vm_data_lines() {
        let status = b"Name:\tx\nVmPeak:\t  9999 kB\nVmData:\t    1234 kB\nVmStk:\t 132 kB\n";
        assert_eq!(parse_vm_data(status), Some(1234 * 1024));
        assert_eq!(parse_vm_data(b"Name:\tx\n"), None);
        assert_eq!(parse_vm_data(b"VmData:\tlots kB\n"), None);
        assert_eq!(parse_status_field(status, b"VmPeak:"), Some(9999 * 1024));
    }

    #[test]
    fn a_signal_is_an_abnormal_exit() {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            abnormal_exit(&ExitStatus::from_raw(6)).as_deref(),
            Some("signal 6")
        );
        assert_eq!(abnormal_exit(&ExitStatus::from_raw(1 << 8)), None);
    }
}
