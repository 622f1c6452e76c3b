//! Windows behind [`super`]'s portable API: Win32 calls through
//! `windows-sys`. Measured under Wine 8 (the CI's Windows runner), which
//! differs from real Windows in places each function notes.

#![allow(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::io;
use std::os::windows::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;

use std::os::windows::io::AsRawHandle;
use windows_sys::Win32::Foundation::{CloseHandle, ERROR_IO_PENDING, ERROR_LOCK_VIOLATION, HANDLE};
use windows_sys::Win32::Storage::FileSystem::{
    GetFileInformationByHandle, LockFileEx, UnlockFileEx, BY_HANDLE_FILE_INFORMATION,
    FILE_FLAG_BACKUP_SEMANTICS, FILE_FLAG_OPEN_REPARSE_POINT, LOCKFILE_EXCLUSIVE_LOCK,
    LOCKFILE_FAIL_IMMEDIATELY,
};
use windows_sys::Win32::System::JobObjects::{
    AssignProcessToJobObject, CreateJobObjectW, JobObjectExtendedLimitInformation,
    SetInformationJobObject, TerminateJobObject, JOBOBJECT_EXTENDED_LIMIT_INFORMATION,
    JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE, JOB_OBJECT_LIMIT_PROCESS_MEMORY,
};
use windows_sys::Win32::System::Memory::{
    VirtualAlloc, VirtualFree, MEM_COMMIT, MEM_RELEASE, MEM_RESERVE, PAGE_READWRITE,
};
use windows_sys::Win32::System::ProcessStatus::{
    GetPerformanceInfo, GetProcessMemoryInfo, PERFORMANCE_INFORMATION, PROCESS_MEMORY_COUNTERS,
};
use windows_sys::Win32::System::SystemInformation::{GlobalMemoryStatusEx, MEMORYSTATUSEX};
use windows_sys::Win32::System::Threading::GetCurrentProcess;
use windows_sys::Win32::System::IO::OVERLAPPED;

use super::MemoryStatus;

/// Nothing to register: Windows refuses to truncate a file with a mapped
/// view, so a mapping cannot fault that way (Unix's `sigbus`).
pub struct MapGuard;

impl MapGuard {
    pub fn register(_mapped: &[u8], _file_offset: u64, _path: &Path) -> MapGuard {
        MapGuard
    }
}

const ERROR_NOT_ENOUGH_MEMORY: i32 = 8;
const ERROR_OUTOFMEMORY: i32 = 14;
const ERROR_COMMITMENT_LIMIT: i32 = 1455;
const ERROR_CANT_RESOLVE_FILENAME: i32 = 1921;
const ERROR_ACCESS_DENIED: i32 = 5;
const ERROR_INVALID_FUNCTION: i32 = 1;
const ERROR_MORE_DATA: i32 = 234;

pub fn read_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    std::os::windows::fs::FileExt::seek_read(file, buf, offset)
}

/// `std::fs::canonicalize` asks `GetFinalPathNameByHandleW`, which Wine 8
/// answers with ERROR_MORE_DATA for any path past MAX_PATH (its buffer is
/// fixed). There, and only on that error, the path is made absolute
/// lexically (`GetFullPathNameW`) in the same verbatim form: what
/// canonicalize returns for a path without links, and Wine makes none.
pub fn canonicalize(path: &Path) -> io::Result<PathBuf> {
    match std::fs::canonicalize(path) {
        Err(e) if e.raw_os_error() == Some(ERROR_MORE_DATA) => {
            std::fs::metadata(path)?;
            Ok(verbatim(&std::path::absolute(path)?))
        }
        other => other,
    }
}

/// `C:\x` as `\\?\C:\x` and `\\server\share\x` as `\\?\UNC\server\share\x`.
fn verbatim(abs: &Path) -> PathBuf {
    use std::path::{Component, Prefix};
    let text = abs.as_os_str().to_string_lossy();
    match abs.components().next() {
        Some(Component::Prefix(p)) => match p.kind() {
            Prefix::Disk(_) => PathBuf::from(format!(r"\\?\{text}")),
            Prefix::UNC(..) => PathBuf::from(format!(r"\\?\UNC\{}", &text[2..])),
            _ => abs.to_path_buf(),
        },
        _ => abs.to_path_buf(),
    }
}

/// A folder can only be opened with `FILE_FLAG_BACKUP_SEMANTICS`;
/// `FlushFileBuffers` on that handle (with write access) flushes its
/// entries on NTFS. Where the file system or the runner refuses it (FAT,
/// some network shares, Wine), the renames are still ordered by the file
/// system's own journal and there is nothing more a program can ask for, so
/// "access denied" and "invalid function" count as done.
pub fn create_private_dir(path: &Path) -> io::Result<()> {
    std::fs::create_dir(path)
}

pub fn sync_dir(dir: &Path) -> io::Result<()> {
    let result = OpenOptions::new()
        .write(true)
        .custom_flags(FILE_FLAG_BACKUP_SEMANTICS)
        .open(dir)
        .and_then(|d| d.sync_all());
    match result {
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(ERROR_ACCESS_DENIED) | Some(ERROR_INVALID_FUNCTION)
            ) =>
        {
            Ok(())
        }
        other => other,
    }
}

/// Windows has no call that starts writeback of a range without waiting.
pub fn start_writeback(_file: &File, _offset: u64, _len: u64) {}

/// Windows reads a mapped view ahead by itself (its cache manager detects
/// sequential access); there is no per-range advice for a file handle.
pub fn will_need(_file: &File, _offset: u64, _len: u64) {}

/// `GlobalMemoryStatusEx` for physical memory; `GetPerformanceInfo` for the
/// system commit limit (RAM plus the pagefiles as they are now: a
/// system-managed pagefile can still grow, up to 3x RAM) and charge.
pub fn memory_status() -> MemoryStatus {
    let mut m = MemoryStatus::default();
    // SAFETY: an all-zero MEMORYSTATUSEX is valid; dwLength is set to its
    // size, which is all GlobalMemoryStatusEx requires of the pointer.
    let mut status: MEMORYSTATUSEX = unsafe { std::mem::zeroed() };
    status.dwLength = std::mem::size_of::<MEMORYSTATUSEX>() as u32;
    // SAFETY: `status` is live and writable for the call.
    if unsafe { GlobalMemoryStatusEx(&mut status) } != 0 {
        m.ram = Some(status.ullTotalPhys);
        m.available = Some(status.ullAvailPhys);
        m.commit_limit = Some(status.ullTotalPageFile);
        m.committed = Some(
            status
                .ullTotalPageFile
                .saturating_sub(status.ullAvailPageFile),
        );
    }
    // SAFETY: as above; `cb` carries the struct's size.
    let mut perf: PERFORMANCE_INFORMATION = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<PERFORMANCE_INFORMATION>() as u32;
    perf.cb = size;
    // SAFETY: `perf` is live and writable and `size` is its size.
    if unsafe { GetPerformanceInfo(&mut perf, size) } != 0 {
        let page = perf.PageSize as u64;
        m.commit_limit = Some((perf.CommitLimit as u64).saturating_mul(page));
        m.committed = Some((perf.CommitTotal as u64).saturating_mul(page));
    }
    if let (Some(limit), Some(ram)) = (m.commit_limit, m.ram) {
        m.swap = Some(limit.saturating_sub(ram));
    }
    m
}

/// `PagefileUsage` is the process's commit charge on Windows (equal to
/// `PrivateUsage` there). Wine 8 reports `PrivateUsage` as a constant and
/// keeps `PagefileUsage` in step with touched private memory, so this one
/// is read on both.
pub const COMMIT_SOURCE: &str = "PagefileUsage";

pub fn commit_usage() -> Option<u64> {
    // SAFETY: an all-zero PROCESS_MEMORY_COUNTERS is a valid value.
    let mut counters: PROCESS_MEMORY_COUNTERS = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<PROCESS_MEMORY_COUNTERS>() as u32;
    counters.cb = size;
    // SAFETY: GetCurrentProcess returns a pseudo-handle that needs no
    // closing; the pointer is to a live struct of `size` bytes.
    let ok = unsafe { GetProcessMemoryInfo(GetCurrentProcess(), &mut counters, size) };
    (ok != 0).then_some(counters.PagefileUsage as u64)
}

/// A Job Object this process assigned itself to, limiting its committed
/// memory. Dropping it lifts the limit (a process cannot leave a job).
/// Wine 8 accepts the limit but does not enforce it.
pub struct CommitLimit {
    job: HANDLE,
}

impl CommitLimit {
    pub fn set(bytes: u64) -> io::Result<CommitLimit> {
        // SAFETY: both arguments may be null (default security, no name).
        let job = unsafe { CreateJobObjectW(std::ptr::null(), std::ptr::null()) };
        if job.is_null() {
            return Err(io::Error::last_os_error());
        }
        let limit = CommitLimit { job };
        limit.apply(Some(usize::try_from(bytes).unwrap_or(usize::MAX)))?;
        // SAFETY: `job` is a job handle we own; the process pseudo-handle
        // needs no closing.
        if unsafe { AssignProcessToJobObject(job, GetCurrentProcess()) } == 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(limit)
    }

    fn apply(&self, bytes: Option<usize>) -> io::Result<()> {
        set_job_limits(self.job, 0, bytes)
    }
}

/// Sets `job`'s limits to `flags`, plus a per-process memory limit of
/// `bytes` when given (`None`: no memory limit).
fn set_job_limits(job: HANDLE, flags: u32, bytes: Option<usize>) -> io::Result<()> {
    // SAFETY: an all-zero limit structure is valid (no limits).
    let mut info: JOBOBJECT_EXTENDED_LIMIT_INFORMATION = unsafe { std::mem::zeroed() };
    info.BasicLimitInformation.LimitFlags = flags;
    if let Some(b) = bytes {
        info.BasicLimitInformation.LimitFlags |= JOB_OBJECT_LIMIT_PROCESS_MEMORY;
        info.ProcessMemoryLimit = b;
    }
    // SAFETY: `info` is live for the call and the length is its size.
    let ok = unsafe {
        SetInformationJobObject(
            job,
            JobObjectExtendedLimitInformation,
            (&info as *const JOBOBJECT_EXTENDED_LIMIT_INFORMATION).cast(),
            std::mem::size_of::<JOBOBJECT_EXTENDED_LIMIT_INFORMATION>() as u32,
        )
    };
    if ok == 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

impl Drop for CommitLimit {
    fn drop(&mut self) {
        let _ = self.apply(None);
        // SAFETY: the handle is ours and closed once; the job lives on
        // while this process is in it.
        unsafe { CloseHandle(self.job) };
    }
}

/// Another process's `PagefileUsage`, working set and the peaks Windows
/// keeps of both.
pub fn process_memory(child: &std::process::Child) -> super::ProcessMemory {
    use std::os::windows::io::AsRawHandle;
    // SAFETY: an all-zero PROCESS_MEMORY_COUNTERS is a valid value.
    let mut c: PROCESS_MEMORY_COUNTERS = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<PROCESS_MEMORY_COUNTERS>() as u32;
    c.cb = size;
    // SAFETY: the child's handle is open while `child` lives; the pointer
    // is to a live struct of `size` bytes.
    let ok = unsafe { GetProcessMemoryInfo(child.as_raw_handle() as HANDLE, &mut c, size) };
    if ok == 0 {
        return super::ProcessMemory::default();
    }
    super::ProcessMemory {
        commit: Some(c.PagefileUsage as u64),
        rss: Some(c.WorkingSetSize as u64),
        peak_commit: Some(c.PeakPagefileUsage as u64),
        peak_rss: Some(c.PeakWorkingSetSize as u64),
    }
}

/// A Job Object a child was assigned to right after it started, which
/// every process it starts joins, and which kills them all when closed
/// (`JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE`) or terminated. A process the
/// child starts in the moment before the assignment is outside it.
pub struct ProcessTree {
    job: HANDLE,
}

impl ProcessTree {
    pub fn spawn(
        cmd: &mut std::process::Command,
    ) -> io::Result<(std::process::Child, io::Result<ProcessTree>)> {
        let child = cmd.spawn()?;
        let tree = ProcessTree::adopt(&child);
        Ok((child, tree))
    }

    fn adopt(child: &std::process::Child) -> io::Result<ProcessTree> {
        // SAFETY: both arguments may be null (default security, no name).
        let job = unsafe { CreateJobObjectW(std::ptr::null(), std::ptr::null()) };
        if job.is_null() {
            return Err(io::Error::last_os_error());
        }
        let tree = ProcessTree { job };
        tree.apply(None)?;
        // SAFETY: `job` is a job handle we own; the child's handle is open
        // while `child` lives.
        if unsafe { AssignProcessToJobObject(job, child.as_raw_handle() as HANDLE) } == 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(tree)
    }

    /// The job's per-process memory limit (accepted but not enforced by
    /// Wine 8).
    pub fn limit_commit(&self, bytes: u64) -> io::Result<()> {
        self.apply(Some(usize::try_from(bytes).unwrap_or(usize::MAX)))
    }

    fn apply(&self, bytes: Option<usize>) -> io::Result<()> {
        set_job_limits(self.job, JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE, bytes)
    }

    pub fn kill(&self) -> io::Result<()> {
        // SAFETY: the handle is ours and open until Drop.
        if unsafe { TerminateJobObject(self.job, 1) } == 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

impl Drop for ProcessTree {
    fn drop(&mut self) {
        // SAFETY: the handle is ours and closed once; closing the last
        // handle kills what is left in the job.
        unsafe { CloseHandle(self.job) };
    }
}

/// `VirtualAlloc`ed pages: private commit, in `PagefileUsage` and under a
/// Job Object's process memory limit (on Windows at once; under Wine 8 as
/// pages are touched, since Wine's `PagefileUsage` is resident anonymous
/// memory).
pub struct PrivateMemory {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: the pages belong to this value alone (no other pointer to them
// escapes except through borrows of it), so it may move between threads.
unsafe impl Send for PrivateMemory {}
// SAFETY: shared access only hands out `&[u8]`.
unsafe impl Sync for PrivateMemory {}

impl PrivateMemory {
    pub fn new(len: usize) -> io::Result<PrivateMemory> {
        // SAFETY: a fresh allocation at an address of the system's choosing;
        // no memory of ours is touched. Committed pages read as zero.
        let ptr = unsafe {
            VirtualAlloc(
                std::ptr::null(),
                len.max(1),
                MEM_COMMIT | MEM_RESERVE,
                PAGE_READWRITE,
            )
        };
        match std::ptr::NonNull::new(ptr.cast::<u8>()) {
            Some(ptr) => Ok(PrivateMemory { ptr, len }),
            None => Err(io::Error::last_os_error()),
        }
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` points to `len` committed, initialised (zeroed or
        // written) bytes that live until drop; `&self` forbids writes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for PrivateMemory {
    fn drop(&mut self) {
        // SAFETY: `ptr` is the base VirtualAlloc returned, released once;
        // MEM_RELEASE requires a size of 0.
        unsafe { VirtualFree(self.ptr.as_ptr().cast(), 0, MEM_RELEASE) };
    }
}

/// A Windows path cannot hold `"`, so double quotes need no escaping.
/// The lock is one byte at offset 2^32 (`OffsetHigh` 1): a range past the
/// end of a file may be locked, and the file's own bytes stay readable.
const LOCK_OFFSET_HIGH: u32 = 1;

fn lock_overlapped() -> OVERLAPPED {
    // SAFETY: an all-zero OVERLAPPED is a valid value (offset 0, no event).
    let mut overlapped: OVERLAPPED = unsafe { std::mem::zeroed() };
    overlapped.Anonymous.Anonymous.OffsetHigh = LOCK_OFFSET_HIGH;
    overlapped
}

pub fn try_lock_exclusive(file: &File) -> io::Result<bool> {
    let mut overlapped = lock_overlapped();
    let flags = LOCKFILE_EXCLUSIVE_LOCK | LOCKFILE_FAIL_IMMEDIATELY;
    // SAFETY: the handle is the open file's; `overlapped` outlives the call,
    // which completes at once (a synchronous handle, FAIL_IMMEDIATELY).
    let ok = unsafe { LockFileEx(file.as_raw_handle(), flags, 0, 1, 0, &mut overlapped) };
    if ok != 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error().map(|c| c as u32) {
        Some(ERROR_LOCK_VIOLATION) | Some(ERROR_IO_PENDING) => Ok(false),
        _ => Err(e),
    }
}

pub fn unlock(file: &File) -> io::Result<()> {
    let mut overlapped = lock_overlapped();
    // SAFETY: as in try_lock_exclusive.
    let ok = unsafe { UnlockFileEx(file.as_raw_handle(), 0, 1, 0, &mut overlapped) };
    if ok == 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

pub fn open_no_follow(options: &mut OpenOptions, path: &Path) -> io::Result<File> {
    options
        .custom_flags(FILE_FLAG_OPEN_REPARSE_POINT)
        .open(path)
}

pub fn link_count(file: &File) -> io::Result<u64> {
    Ok(u64::from(file_info(file)?.nNumberOfLinks))
}

/// Opens `path` itself (not a link's target) for its metadata only, with
/// std's default sharing (read, write and delete), and compares the two
/// handles' volume and file index. A name whose file waits to be deleted
/// (a holder removed it while another handle was open) refuses every open
/// with "access denied": nothing usable is there.
pub fn same_file(file: &File, path: &Path) -> io::Result<bool> {
    let named = match OpenOptions::new()
        .access_mode(0)
        .custom_flags(FILE_FLAG_OPEN_REPARSE_POINT | FILE_FLAG_BACKUP_SEMANTICS)
        .open(path)
    {
        Ok(f) => f,
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::PermissionDenied
            ) =>
        {
            return Ok(false)
        }
        Err(e) => return Err(e),
    };
    let (a, b) = (file_info(file)?, file_info(&named)?);
    Ok(a.dwVolumeSerialNumber == b.dwVolumeSerialNumber
        && a.nFileIndexHigh == b.nFileIndexHigh
        && a.nFileIndexLow == b.nFileIndexLow)
}

fn file_info(file: &File) -> io::Result<BY_HANDLE_FILE_INFORMATION> {
    // SAFETY: an all-zero BY_HANDLE_FILE_INFORMATION is a valid value of
    // that plain C struct.
    let mut info: BY_HANDLE_FILE_INFORMATION = unsafe { std::mem::zeroed() };
    // SAFETY: the handle is `file`'s, open for the whole call, and `info`
    // is a valid, writable struct of the type the call fills.
    let ok = unsafe { GetFileInformationByHandle(file.as_raw_handle(), &mut info) };
    if ok == 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(info)
}

/// STATUS_DELETE_PENDING reaches Win32 callers as ERROR_ACCESS_DENIED.
pub fn rename_no_replace(from: &Path, to: &Path) -> io::Result<()> {
    use std::os::windows::ffi::OsStrExt;
    use windows_sys::Win32::Storage::FileSystem::{MoveFileExW, MOVEFILE_WRITE_THROUGH};
    let wide = |p: &Path| -> Vec<u16> { p.as_os_str().encode_wide().chain([0]).collect() };
    let (f, t) = (wide(from), wide(to));
    // No MOVEFILE_REPLACE_EXISTING: an existing `to` fails with
    // ERROR_ALREADY_EXISTS (or ERROR_FILE_EXISTS), which std maps to
    // AlreadyExists.
    // SAFETY: both are NUL-terminated wide strings that outlive the call.
    if unsafe { MoveFileExW(f.as_ptr(), t.as_ptr(), MOVEFILE_WRITE_THROUGH) } != 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

pub fn may_be_delete_pending(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::PermissionDenied
}

pub fn shell_quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./\\:=@+,".contains(&b));
    if plain {
        s.to_string()
    } else {
        format!("\"{s}\"")
    }
}

pub fn is_out_of_memory(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(ERROR_NOT_ENOUGH_MEMORY) | Some(ERROR_OUTOFMEMORY) | Some(ERROR_COMMITMENT_LIMIT)
    )
}

pub fn is_symlink_loop(e: &io::Error) -> bool {
    e.raw_os_error() == Some(ERROR_CANT_RESOLVE_FILENAME)
}

/// NTSTATUS exception codes (0xC0000005 access violation, 0xC0000017 no
/// memory, 0xC0000409 abort) are how Windows reports a crash.
pub fn abnormal_exit(status: &ExitStatus) -> Option<String> {
    let code = status.code()? as u32;
    (code >= 0xC000_0000).then(|| format!("status {code:#010X}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_paths_for_cmd_and_powershell() {
        // Regression: fit's suggested command quoted C:\... POSIX-style
        // ('C:\x'), which cmd.exe does not understand.
        assert_eq!(shell_quote(r"C:\Users\me\llama-3"), r"C:\Users\me\llama-3");
        assert_eq!(
            shell_quote(r"C:\Users\Jürgen\my model's"),
            r#""C:\Users\Jürgen\my model's""#
        );
        assert_eq!(shell_quote(r"\\server\share\m"), r"\\server\share\m");
    }

    #[test]
    fn reads_this_process_commit_and_the_machine() {
        assert!(commit_usage().is_some_and(|v| v > 0));
        let m = memory_status();
        assert!(m.ram.is_some_and(|r| r > 0), "{m:?}");
        assert!(m.commit_limit >= m.ram, "{m:?}");
    }

    #[test]
    fn commit_rises_with_touched_private_memory() {
        let before = commit_usage().unwrap();
        let v = vec![1u8; 64 << 20];
        let after = commit_usage().unwrap();
        assert!(after >= before + (60 << 20), "{before} -> {after}");
        drop(v);
    }

    #[test]
    fn verbatim_forms_match_canonicalize() {
        assert_eq!(verbatim(Path::new(r"C:\a\b")), Path::new(r"\\?\C:\a\b"));
        assert_eq!(
            verbatim(Path::new(r"\\srv\share\m")),
            Path::new(r"\\?\UNC\srv\share\m")
        );
        let tmp = std::env::temp_dir();
        assert_eq!(
            canonicalize(&tmp).unwrap(),
            std::fs::canonicalize(&tmp).unwrap()
        );
    }

    #[test]
    fn canonicalizes_paths_past_max_path() {
        // Regression: under Wine 8 this failed with "More data available
        // (os error 234)", so convert refused any DST past 260 characters.
        let base = std::env::temp_dir().join(format!("reshard-long-{}", std::process::id()));
        let mut deep = base.clone();
        while deep.as_os_str().len() < 300 {
            deep.push("nested-folder-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa");
        }
        std::fs::create_dir_all(&deep).unwrap();
        let canon = canonicalize(&deep);
        let _ = std::fs::remove_dir_all(&base);
        let canon = canon.unwrap();
        assert!(
            canon.starts_with(canonicalize(&std::env::temp_dir()).unwrap()),
            "{canon:?}"
        );
        assert!(canon.ends_with("nested-folder-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"));
    }

    #[test]
    fn syncs_a_folder() {
        let dir = std::env::temp_dir();
        sync_dir(&dir).unwrap();
    }
}
