//! Memory figures as every platform reports them: the machine's
//! ([`MemoryStatus`]) and a child process's ([`ProcessMemory`]).

/// What the running machine reports about its memory; `None` where it
/// cannot be read. Bytes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MemoryStatus {
    pub ram: Option<u64>,
    /// Linux MemAvailable; Windows available physical memory.
    pub available: Option<u64>,
    /// Linux SwapTotal; Windows pagefile (commit limit minus RAM).
    pub swap: Option<u64>,
    /// Linux CommitLimit; Windows commit limit (RAM + current pagefile).
    pub commit_limit: Option<u64>,
    /// Linux Committed_AS; Windows commit charge now.
    pub committed: Option<u64>,
    /// Linux `vm.overcommit_memory` (2 is strict).
    pub overcommit_memory: Option<u8>,
}

/// Another process's memory figures, in bytes; `None` where the OS does not
/// tell. Linux keeps no peak of `VmData`, so `peak_commit` is `None` there
/// and a caller samples `commit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProcessMemory {
    /// The commit charge [`commit_usage`] reads for this process:
    /// `VmData` (Linux), `PagefileUsage` (Windows).
    pub commit: Option<u64>,
    /// Resident memory now (`VmRSS`, working set).
    pub rss: Option<u64>,
    /// The commit peak the OS keeps (`PeakPagefileUsage` on Windows).
    pub peak_commit: Option<u64>,
    /// The resident peak the OS keeps (`VmHWM`, peak working set).
    pub peak_rss: Option<u64>,
}
