//! Ctrl-C for every subcommand: one flag, set by one handler. The work
//! (the executor between chunks, batch between models, a Python loader's
//! watchdog) polls it and stops cleanly instead of dying mid-write.

use std::sync::atomic::{AtomicBool, Ordering};

static CANCEL: AtomicBool = AtomicBool::new(false);

/// Installs the Ctrl-C handler (once per process; a second call keeps the
/// first) and returns the flag it sets.
pub fn on_ctrl_c() -> &'static AtomicBool {
    let _ = ctrlc::set_handler(|| CANCEL.store(true, Ordering::SeqCst));
    &CANCEL
}
