//! Progress bars: indicatif behind the executor's [`Reporter`] trait and
//! batch's [`BatchReporter`]. Drawn on stderr only when it is a terminal and
//! not silenced.

use std::io::IsTerminal;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressFinish, ProgressStyle};
use reshard::batch::{BatchReporter, Model, ModelResult};
use reshard::exec::Reporter;
use reshard::names::escape;

const BYTES_TEMPLATE: &str = "{spinner} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} {bytes_per_sec} eta {eta} {msg}";
const JOB_TEMPLATE: &str = "  {prefix:24!} {wide_bar} {bytes}/{total_bytes} {bytes_per_sec} {msg}";
const OVERALL_TEMPLATE: &str = "{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} models {msg}";

fn style(template: &str) -> ProgressStyle {
    ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar())
}

fn visible(show: bool) -> bool {
    show && std::io::stderr().is_terminal()
}

pub struct Bar {
    bar: ProgressBar,
}

impl Bar {
    /// A bar that draws only when `show` and stderr is a terminal.
    pub fn new(show: bool) -> Bar {
        // Cleared however the run ends: an error leaves no stale bar above
        // its message.
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::hidden())
            .with_finish(ProgressFinish::AndClear);
        if visible(show) {
            bar.set_draw_target(ProgressDrawTarget::stderr());
        }
        bar.set_style(style(BYTES_TEMPLATE));
        Bar { bar }
    }
}

impl Reporter for Bar {
    fn start(&self, bytes: u64) {
        // A new run on the same bar (validate's weight sets, one after
        // another) starts from zero, visible again after the last finish.
        self.bar.set_length(bytes);
        self.bar.reset();
    }
    fn advance(&self, bytes: u64) {
        self.bar.inc(bytes);
    }
    fn shard_started(&self, file: &str) {
        self.bar.set_message(escape(file).into_owned());
    }
    fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

/// `batch`'s bars: one for the whole batch (models done of all) and one per
/// running job, removed when the job ends.
pub struct MultiBar {
    multi: MultiProgress,
    overall: ProgressBar,
}

impl MultiBar {
    /// Bars that draw only when `show` and stderr is a terminal.
    pub fn new(show: bool, models: u64) -> MultiBar {
        let target = if visible(show) {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        };
        let multi = MultiProgress::with_draw_target(target);
        let overall = multi.add(ProgressBar::new(models));
        overall.set_style(style(OVERALL_TEMPLATE));
        MultiBar { multi, overall }
    }

    pub fn finish(&self) {
        self.overall.finish_and_clear();
    }
}

impl BatchReporter for MultiBar {
    fn model_started(&self, model: &Model) -> Box<dyn Reporter + '_> {
        let bar = self.multi.add(ProgressBar::new(0));
        bar.set_style(style(JOB_TEMPLATE));
        bar.set_prefix(escape(&model.name).into_owned());
        Box::new(Bar { bar })
    }

    fn model_done(&self, result: &ModelResult) {
        self.overall.inc(1);
        self.overall
            .set_message(format!("{}: {}", escape(&result.name), result.status));
    }
}
