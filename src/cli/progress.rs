//! The progress bar: indicatif behind the executor's [`Reporter`] trait.
//! Drawn on stderr only when it is a terminal and not silenced.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use reshard::exec::Reporter;

pub struct Bar {
    bar: ProgressBar,
}

impl Bar {
    /// A bar that draws only when `show` and stderr is a terminal.
    pub fn new(show: bool) -> Bar {
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::hidden());
        if show && std::io::stderr().is_terminal() {
            bar.set_draw_target(ProgressDrawTarget::stderr());
        }
        let style = ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} {bytes_per_sec} eta {eta} {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style);
        Bar { bar }
    }
}

impl Reporter for Bar {
    fn start(&self, bytes: u64) {
        self.bar.set_length(bytes);
    }
    fn advance(&self, bytes: u64) {
        self.bar.inc(bytes);
    }
    fn shard_started(&self, file: &str) {
        self.bar.set_message(file.to_string());
    }
    fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
