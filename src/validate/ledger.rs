//! The commit ledger: what this process has committed, measured the way
//! Windows charges it, sampled at every allocation and mapping step.
//!
//! * Linux: `VmData` from `/proc/self/status`: private anonymous memory and
//!   writable private (copy-on-write) file mappings, the same things
//!   `RLIMIT_DATA` limits. Read-only file views and device memory are not in
//!   it. The kernel keeps no peak of it, so the ledger keeps the maximum of
//!   its samples.
//! * Windows: `PrivateUsage` from `GetProcessMemoryInfo` (compiled there,
//!   never run in our CI).
//!
//! Thread stacks are charged in full by Linux but committed lazily by
//! Windows; the ledger subtracts the stack reservations the caller tells it
//! about ([`CommitLedger::add_thread_stacks`]) from the absolute figures.
//! Figures above the baseline are unaffected when the threads exist before
//! the baseline is taken, which is how `validate` arranges it.
//!
//! Reading a sample allocates nothing on the heap, so sampling works close
//! to a limit.

use serde::{Deserialize, Serialize};

/// What the ledger measured. Bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitFigures {
    /// `VmData`, `PrivateUsage`, or `unavailable`.
    pub source: String,
    /// Commit when loading began (thread stacks subtracted).
    pub baseline: u64,
    /// Largest sample (thread stacks subtracted).
    pub peak: u64,
    /// `peak - baseline`: what the load itself committed at most.
    pub peak_above_baseline: u64,
    /// Stack reservations subtracted from the absolute figures.
    pub thread_stacks: u64,
    pub samples: u64,
}

/// Running commit measurement of this process.
#[derive(Debug, Clone)]
pub struct CommitLedger {
    baseline: u64,
    peak: u64,
    last: u64,
    stacks: u64,
    samples: u64,
    available: bool,
}

impl CommitLedger {
    /// A ledger whose baseline is the commit now.
    pub fn start() -> CommitLedger {
        let now = read_commit();
        let v = now.unwrap_or(0);
        CommitLedger {
            baseline: v,
            peak: v,
            last: v,
            stacks: 0,
            samples: 1,
            available: now.is_some(),
        }
    }

    /// Takes the baseline again, now, and forgets the peak.
    pub fn rebase(&mut self) {
        let v = read_commit().unwrap_or(0);
        self.baseline = v;
        self.peak = v;
        self.last = v;
    }

    /// The commit now, in absolute bytes (stacks not subtracted).
    pub fn current() -> Option<u64> {
        read_commit()
    }

    /// Samples the commit now, keeps the peak and returns the commit above
    /// the baseline.
    pub fn sample(&mut self) -> u64 {
        if let Some(v) = read_commit() {
            self.last = v;
            self.peak = self.peak.max(v);
            self.samples += 1;
        }
        self.last.saturating_sub(self.baseline)
    }

    /// The absolute commit at the baseline (stacks not subtracted).
    pub fn baseline(&self) -> u64 {
        self.baseline
    }

    /// Records `bytes` of thread stack reservations to subtract.
    pub fn add_thread_stacks(&mut self, bytes: u64) {
        self.stacks += bytes;
    }

    pub fn figures(&self) -> CommitFigures {
        CommitFigures {
            source: if self.available {
                SOURCE
            } else {
                "unavailable"
            }
            .to_string(),
            baseline: self.baseline.saturating_sub(self.stacks),
            peak: self.peak.saturating_sub(self.stacks),
            peak_above_baseline: self.peak.saturating_sub(self.baseline),
            thread_stacks: self.stacks,
            samples: self.samples,
        }
    }
}

#[cfg(target_os = "linux")]
const SOURCE: &str = "VmData";
#[cfg(windows)]
const SOURCE: &str = "PrivateUsage";
#[cfg(not(any(target_os = "linux", windows)))]
const SOURCE: &str = "unavailable";

/// `VmData` in bytes, read into a stack buffer.
#[cfg(target_os = "linux")]
fn read_commit() -> Option<u64> {
    use std::io::Read;
    let mut buf = [0u8; 16 * 1024];
    let mut file = std::fs::File::open("/proc/self/status").ok()?;
    let mut len = 0;
    while len < buf.len() {
        match file.read(&mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    parse_vm_data(&buf[..len])
}

/// The `VmData:` line of a /proc/PID/status text, in bytes.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
fn parse_vm_data(status: &[u8]) -> Option<u64> {
    let line = status
        .split(|&b| b == b'\n')
        .find(|l| l.starts_with(b"VmData:"))?;
    let rest = std::str::from_utf8(&line[b"VmData:".len()..]).ok()?;
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

/// `PrivateUsage` of this process, in bytes.
#[cfg(windows)]
#[allow(unsafe_code)]
fn read_commit() -> Option<u64> {
    use windows_sys::Win32::System::ProcessStatus::{
        GetProcessMemoryInfo, PROCESS_MEMORY_COUNTERS, PROCESS_MEMORY_COUNTERS_EX,
    };
    use windows_sys::Win32::System::Threading::GetCurrentProcess;
    let mut counters: PROCESS_MEMORY_COUNTERS_EX = unsafe {
        // SAFETY: PROCESS_MEMORY_COUNTERS_EX is a plain C struct of integers;
        // all-zero is a valid value.
        std::mem::zeroed()
    };
    let size = std::mem::size_of::<PROCESS_MEMORY_COUNTERS_EX>() as u32;
    counters.cb = size;
    // SAFETY: GetCurrentProcess returns a pseudo-handle that needs no
    // closing; the pointer is to a live, correctly sized struct whose `cb`
    // says its size, as the API requires for the _EX variant.
    let ok = unsafe {
        GetProcessMemoryInfo(
            GetCurrentProcess(),
            (&mut counters as *mut PROCESS_MEMORY_COUNTERS_EX).cast::<PROCESS_MEMORY_COUNTERS>(),
            size,
        )
    };
    (ok != 0).then_some(counters.PrivateUsage as u64)
}

#[cfg(not(any(target_os = "linux", windows)))]
fn read_commit() -> Option<u64> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_vm_data_lines() {
        let status = b"Name:\tx\nVmPeak:\t  9999 kB\nVmData:\t    1234 kB\nVmStk:\t 132 kB\n";
        assert_eq!(parse_vm_data(status), Some(1234 * 1024));
        assert_eq!(parse_vm_data(b"Name:\tx\n"), None);
        assert_eq!(parse_vm_data(b"VmData:\tlots kB\n"), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn sees_an_allocation_and_keeps_the_peak() {
        let mut ledger = CommitLedger::start();
        let mut v: Vec<u8> = Vec::new();
        v.try_reserve_exact(64 << 20).unwrap();
        let above = ledger.sample();
        drop(v);
        ledger.sample();
        let f = ledger.figures();
        assert!(above >= 64 << 20, "{above}");
        assert!(f.peak_above_baseline >= 64 << 20);
        assert_eq!(f.source, "VmData");
    }
}
