//! A test hook for crash-consistency tests: with `RESHARD_PAUSE_AT=N` in the
//! environment, the Nth write step (a chunk written, a file renamed) prints
//! `reshard: paused at write step N` on stderr and waits, so a test can
//! SIGKILL the process at a known point, or change the source under it and
//! let it go on by creating the file named by `RESHARD_PAUSE_UNTIL`.
//! A named step (`RESHARD_PAUSE_AT=validate`) pauses outside the writes.
//! Without the variables this is one cached lookup per step.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;

static STEPS: AtomicU64 = AtomicU64::new(0);

fn pause_at() -> Option<&'static str> {
    static AT: OnceLock<Option<String>> = OnceLock::new();
    AT.get_or_init(|| std::env::var("RESHARD_PAUSE_AT").ok())
        .as_deref()
}

/// Marks one write step.
pub fn step() {
    let Some(at) = pause_at().and_then(|v| v.parse::<u64>().ok()) else {
        return;
    };
    let n = STEPS.fetch_add(1, Ordering::Relaxed) + 1;
    if n == at {
        pause(&n.to_string());
    }
}

/// Marks a named step that is not a write (`RESHARD_PAUSE_AT=validate`:
/// the first tensor `validate` loads); it pauses the first time only.
pub fn named(name: &str) {
    static FIRED: AtomicBool = AtomicBool::new(false);
    if pause_at() == Some(name) && !FIRED.swap(true, Ordering::Relaxed) {
        pause(name);
    }
}

fn pause(at: &str) {
    eprintln!("reshard: paused at write step {at}");
    let release = std::env::var_os("RESHARD_PAUSE_UNTIL").map(std::path::PathBuf::from);
    loop {
        if release.as_ref().is_some_and(|p| p.exists()) {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}
