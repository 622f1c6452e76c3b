//! The commit ledger: what this process has committed, measured the way
//! Windows charges it, sampled at every allocation and mapping step.
//!
//! The figure is [`crate::platform::commit_usage`]:
//!
//! * Linux: `VmData` from `/proc/self/status`: private anonymous memory and
//!   writable private (copy-on-write) file mappings, the same things
//!   `RLIMIT_DATA` limits. Read-only file views and device memory are not in
//!   it.
//! * Windows: `PagefileUsage` from `GetProcessMemoryInfo`, the process's
//!   commit charge.
//!
//! Neither OS keeps a peak of it, so the ledger keeps the maximum of its
//! samples.
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
    /// `VmData`, `PagefileUsage`, or `unavailable` ([`crate::platform::COMMIT_SOURCE`]).
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
                crate::platform::COMMIT_SOURCE
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

fn read_commit() -> Option<u64> {
    crate::platform::commit_usage()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sees_an_allocation_and_keeps_the_peak() {
        if crate::platform::commit_usage().is_none() {
            eprintln!("skipped: this OS reports no commit charge");
            return;
        }
        let mut ledger = CommitLedger::start();
        let mut v: Vec<u8> = Vec::new();
        v.try_reserve_exact(128 << 20).unwrap();
        // Touch it: Windows charges commit at reservation, Wine only when
        // pages are touched.
        v.resize(128 << 20, 1);
        let above = ledger.sample();
        drop(v);
        ledger.sample();
        let f = ledger.figures();
        // Other tests in this process allocate and free meanwhile: allow
        // their noise (seen under Wine: up to 9 MiB less than allocated).
        assert!(above >= 96 << 20, "{above}");
        assert!(f.peak_above_baseline >= 96 << 20);
        assert_eq!(f.source, crate::platform::COMMIT_SOURCE);
    }
}
