//! The machine a checkpoint should fit: RAM, swap or pagefile, commit limit,
//! what is committed now, and VRAM, each either detected on the running
//! machine or given by the user.
//!
//! This module merges what [`crate::platform::memory_status`] reads off the
//! running machine with given figures into a [`Machine`]. It does no fit
//! arithmetic ([`super::fit`] does) and prints nothing.

use serde::{Deserialize, Serialize};

pub use crate::platform::{MemoryStatus, Os};

/// Where a figure came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// Read from the running machine.
    Detected,
    /// Given on the command line.
    Given,
    /// Computed from other figures (commit limit = RAM + pagefile).
    Derived,
}

/// One figure in bytes, and where it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Figure {
    pub bytes: u64,
    pub source: Source,
}

impl Figure {
    pub fn given(bytes: u64) -> Figure {
        Figure {
            bytes,
            source: Source::Given,
        }
    }
    pub fn detected(bytes: u64) -> Figure {
        Figure {
            bytes,
            source: Source::Detected,
        }
    }
    pub fn derived(bytes: u64) -> Figure {
        Figure {
            bytes,
            source: Source::Derived,
        }
    }
}

/// What the running machine reports; `None` where it cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Detected {
    /// RAM, swap or pagefile, commit limit and charge, as the OS reports them.
    pub memory: MemoryStatus,
    /// Dedicated memory of GPU 0.
    pub vram: Option<u64>,
}

/// Figures the user gave; `None` means "detect it".
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Given {
    pub os: Option<Os>,
    pub ram: Option<u64>,
    /// Pagefile on Windows, swap on Linux.
    pub pagefile: Option<u64>,
    pub commit_limit: Option<u64>,
    pub vram: Option<u64>,
}

/// The machine a fit is judged against.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Machine {
    pub os: Os,
    pub os_source: Source,
    pub ram: Option<Figure>,
    /// RAM free for a new process (Linux MemAvailable), or the given RAM.
    pub available: Option<Figure>,
    /// Pagefile (Windows) or swap (Linux).
    pub pagefile: Option<Figure>,
    pub commit_limit: Option<Figure>,
    /// Commit charged now by every process (same machine only).
    pub committed: Option<Figure>,
    /// Commit limit minus committed.
    pub free_commit: Option<Figure>,
    /// Linux `vm.overcommit_memory=2`: allocations fail past the commit
    /// limit. `None` when unknown (not Linux, or another machine).
    pub overcommit_strict: Option<bool>,
    pub vram: Option<Figure>,
}

impl Machine {
    /// Merges given figures over detected ones.
    ///
    /// Figures about the state of the running machine (available RAM,
    /// committed, the detected commit limit, the overcommit mode) are used
    /// only when the target OS is the running one and neither RAM nor
    /// pagefile was given, since they describe this machine as it is now. RAM,
    /// swap and VRAM are taken from this machine whenever they are not given.
    pub fn resolve(given: &Given, detected: &Detected, running: Os) -> Machine {
        let os = given.os.unwrap_or(running);
        let os_source = if given.os.is_some() {
            Source::Given
        } else {
            Source::Detected
        };
        let this_machine = os == running && given.ram.is_none() && given.pagefile.is_none();
        let ram = given
            .ram
            .map(Figure::given)
            .or(detected.memory.ram.map(Figure::detected));
        let pagefile = given
            .pagefile
            .map(Figure::given)
            .or(detected.memory.swap.map(Figure::detected));
        let here = |v: Option<u64>| {
            if this_machine {
                v.map(Figure::detected)
            } else {
                None
            }
        };
        let available = match given.ram {
            Some(r) => Some(Figure::given(r)),
            None => here(detected.memory.available).or(ram),
        };
        let commit_limit = given.commit_limit.map(Figure::given).or_else(|| match os {
            Os::Windows => here(detected.memory.commit_limit).or_else(|| {
                let (r, p) = (ram?, pagefile.map_or(0, |p| p.bytes));
                Some(Figure::derived(r.bytes.saturating_add(p)))
            }),
            Os::Linux => here(detected.memory.commit_limit),
            Os::Macos => None,
        });
        let committed = here(detected.memory.committed);
        let free_commit = match (commit_limit, committed) {
            (Some(l), Some(c)) => Some(Figure::derived(l.bytes.saturating_sub(c.bytes))),
            _ => None,
        };
        let overcommit_strict = match os {
            Os::Linux if os == running => detected.memory.overcommit_memory.map(|m| m == 2),
            _ => None,
        };
        let vram = given
            .vram
            .map(Figure::given)
            .or(detected.vram.map(Figure::detected));
        Machine {
            os,
            os_source,
            ram,
            available,
            pagefile,
            commit_limit,
            committed,
            free_commit,
            overcommit_strict,
            vram,
        }
    }
}

/// Reads what the running machine's OS reports. Never fails: unreadable
/// figures are `None`. VRAM is left to the caller: reading it opens a CUDA
/// context, which only `validate::device::cuda::dedicated_memory` may do
/// (it is the crate's one CUDA module), and only when `--vram` was not given.
pub fn detect() -> Detected {
    Detected {
        memory: crate::platform::memory_status(),
        vram: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn detected() -> Detected {
        Detected {
            memory: MemoryStatus {
                ram: Some(64 * GIB),
                available: Some(40 * GIB),
                swap: Some(8 * GIB),
                commit_limit: Some(70 * GIB),
                committed: Some(20 * GIB),
                overcommit_memory: Some(2),
            },
            vram: None,
        }
    }

    #[test]
    fn given_windows_figures_derive_the_commit_limit() {
        let given = Given {
            os: Some(Os::Windows),
            ram: Some(32 * GIB),
            pagefile: Some(8 * GIB),
            ..Given::default()
        };
        let m = Machine::resolve(&given, &detected(), Os::Linux);
        assert_eq!(m.commit_limit, Some(Figure::derived(40 * GIB)));
        assert_eq!(m.ram, Some(Figure::given(32 * GIB)));
        // Another machine: nothing about this one's current state.
        assert_eq!(
            (m.committed, m.free_commit, m.overcommit_strict),
            (None, None, None)
        );
    }

    #[test]
    fn this_linux_machine_uses_what_it_reports() {
        let m = Machine::resolve(&Given::default(), &detected(), Os::Linux);
        assert_eq!(m.os_source, Source::Detected);
        assert_eq!(m.available, Some(Figure::detected(40 * GIB)));
        assert_eq!(m.commit_limit, Some(Figure::detected(70 * GIB)));
        assert_eq!(m.free_commit, Some(Figure::derived(50 * GIB)));
        assert_eq!(m.overcommit_strict, Some(true));
    }

    #[test]
    fn given_ram_is_the_available_ram() {
        let given = Given {
            ram: Some(16 * GIB),
            vram: Some(24 * GIB),
            ..Given::default()
        };
        let m = Machine::resolve(&given, &detected(), Os::Linux);
        assert_eq!(m.available, Some(Figure::given(16 * GIB)));
        assert_eq!(m.vram, Some(Figure::given(24 * GIB)));
        assert_eq!(m.commit_limit, None);
    }

    #[test]
    fn given_commit_limit_wins() {
        let given = Given {
            os: Some(Os::Windows),
            commit_limit: Some(50 * GIB),
            ..Given::default()
        };
        let m = Machine::resolve(&given, &detected(), Os::Windows);
        assert_eq!(m.commit_limit, Some(Figure::given(50 * GIB)));
        assert_eq!(m.free_commit, Some(Figure::derived(30 * GIB)));
    }
}
