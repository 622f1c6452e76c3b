//! A test hook for crash-consistency tests: with `RESHARD_PAUSE_AT=N` in the
//! environment, the Nth write step (a chunk written, a file renamed) prints
//! `reshard: paused at write step N` on stderr and waits, so a test can
//! SIGKILL the process at a known point, or change the source under it and
//! let it go on by creating the file named by `RESHARD_PAUSE_UNTIL`.
//! Without the variables this is one cached lookup per step.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

static STEPS: AtomicU64 = AtomicU64::new(0);

fn pause_at() -> Option<u64> {
    static AT: OnceLock<Option<u64>> = OnceLock::new();
    *AT.get_or_init(|| {
        std::env::var("RESHARD_PAUSE_AT")
            .ok()
            .and_then(|v| v.parse().ok())
    })
}

/// Marks one write step.
pub fn step() {
    let Some(at) = pause_at() else { return };
    let n = STEPS.fetch_add(1, Ordering::Relaxed) + 1;
    if n == at {
        eprintln!("reshard: paused at write step {n}");
        let release = std::env::var_os("RESHARD_PAUSE_UNTIL").map(std::path::PathBuf::from);
        loop {
            if release.as_ref().is_some_and(|p| p.exists()) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}
