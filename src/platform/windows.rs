//! Windows behind [`super`]'s portable API: Win32 calls through
//! `windows-sys`. Measured under Wine 8 (the CI's Windows runner), which
//! differs from real Windows in places each function notes.

#![allow(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::io;
use std::os::windows::fs::OpenOptionsExt;
use std::path::Path;
use std::process::ExitStatus;

use windows_sys::Win32::Foundation::{CloseHandle, HANDLE};
use windows_sys::Win32::Storage::FileSystem::FILE_FLAG_BACKUP_SEMANTICS;
use windows_sys::Win32::System::JobObjects::{
    AssignProcessToJobObject, CreateJobObjectW, JobObjectExtendedLimitInformation,
    SetInformationJobObject, JOBOBJECT_EXTENDED_LIMIT_INFORMATION, JOB_OBJECT_LIMIT_PROCESS_MEMORY,
};
use windows_sys::Win32::System::ProcessStatus::{
    GetPerformanceInfo, GetProcessMemoryInfo, PERFORMANCE_INFORMATION, PROCESS_MEMORY_COUNTERS,
};
use windows_sys::Win32::System::SystemInformation::{GlobalMemoryStatusEx, MEMORYSTATUSEX};
use windows_sys::Win32::System::Threading::GetCurrentProcess;

use super::MemoryStatus;

const ERROR_NOT_ENOUGH_MEMORY: i32 = 8;
const ERROR_OUTOFMEMORY: i32 = 14;
const ERROR_COMMITMENT_LIMIT: i32 = 1455;
const ERROR_CANT_RESOLVE_FILENAME: i32 = 1921;
const ERROR_ACCESS_DENIED: i32 = 5;
const ERROR_INVALID_FUNCTION: i32 = 1;

pub fn read_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    std::os::windows::fs::FileExt::seek_read(file, buf, offset)
}

/// A folder can only be opened with `FILE_FLAG_BACKUP_SEMANTICS`;
/// `FlushFileBuffers` on that handle (with write access) flushes its
/// entries on NTFS. Where the file system or the runner refuses it (FAT,
/// some network shares, Wine), the renames are still ordered by the file
/// system's own journal and there is nothing more a program can ask for, so
/// "access denied" and "invalid function" count as done.
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
        // SAFETY: an all-zero limit structure is valid (no limits).
        let mut info: JOBOBJECT_EXTENDED_LIMIT_INFORMATION = unsafe { std::mem::zeroed() };
        if let Some(b) = bytes {
            info.BasicLimitInformation.LimitFlags = JOB_OBJECT_LIMIT_PROCESS_MEMORY;
            info.ProcessMemoryLimit = b;
        }
        // SAFETY: `info` is live for the call and the length is its size.
        let ok = unsafe {
            SetInformationJobObject(
                self.job,
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
}

impl Drop for CommitLimit {
    fn drop(&mut self) {
        let _ = self.apply(None);
        // SAFETY: the handle is ours and closed once; the job lives on
        // while this process is in it.
        unsafe { CloseHandle(self.job) };
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
    fn syncs_a_folder() {
        let dir = std::env::temp_dir();
        sync_dir(&dir).unwrap();
    }
}
