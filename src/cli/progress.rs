//! Progress bars: indicatif behind the executor's [`Reporter`] trait and
//! batch's [`BatchReporter`]. Drawn on stderr only when it is a terminal and
//! not silenced.

use std::io::IsTerminal;
use std::sync::Arc;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressFinish, ProgressStyle};
use reshard::batch::{BatchReporter, Model, ModelResult};
use reshard::exec::Reporter;
use reshard::names::escape;

// Every template fits 80 columns: a fixed-width bar, and the one
// variable-length part (a shard or model name) last as `{wide_msg}`, which
// indicatif cuts to the room left. A `{wide_bar}` beside a long `{msg}`
// overflowed the line, so the terminal wrapped it and each redraw left a
// padded 161-character line behind.
const BYTES_TEMPLATE: &str =
    "{spinner} {elapsed:>3} {bar:16} {bytes}/{total_bytes} {bytes_per_sec} eta {eta} {wide_msg}";
const JOB_TEMPLATE: &str =
    "  {prefix:24!} {bar:12} {bytes}/{total_bytes} {bytes_per_sec} {wide_msg}";
/// A job's bar before its size is known: a full bar over "0 B/0 B" read
/// as done.
const JOB_PENDING_TEMPLATE: &str = "  {prefix:24!} {spinner} planning {wide_msg}";
const OVERALL_TEMPLATE: &str = "{spinner} {elapsed:>3} {bar:16} {pos}/{len} models {wide_msg}";

fn style(template: &str) -> ProgressStyle {
    ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar())
}

fn visible(show: bool) -> bool {
    show && std::io::stderr().is_terminal()
}

pub struct Bar {
    bar: ProgressBar,
    /// The style to take at [`Reporter::start`], when the bar was made
    /// before its size was known.
    sized: Option<ProgressStyle>,
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
        Bar { bar, sized: None }
    }
}

impl Reporter for Bar {
    fn start(&self, bytes: u64) {
        if let Some(sized) = &self.sized {
            self.bar.set_style(sized.clone());
        }
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
    fn model_started(&self, model: &Model) -> Arc<dyn Reporter + Send> {
        // Cleared however the job ends, as a lone bar is.
        let bar = self
            .multi
            .add(ProgressBar::new(0).with_finish(ProgressFinish::AndClear));
        bar.set_style(style(JOB_PENDING_TEMPLATE));
        bar.set_prefix(escape(&model.name).into_owned());
        bar.enable_steady_tick(std::time::Duration::from_millis(200));
        Arc::new(Bar {
            bar,
            sized: Some(style(JOB_TEMPLATE)),
        })
    }

    fn model_done(&self, result: &ModelResult) {
        self.overall.inc(1);
        // "last done", not a bare name: with several jobs the model named
        // is not the one running.
        self.overall.set_message(format!(
            "last done: {} {}",
            escape(&result.name),
            result.status
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A terminal of 80 columns that records what is drawn on it.
    #[derive(Debug, Clone, Default)]
    struct Term80(Arc<Mutex<Vec<String>>>);

    impl indicatif::TermLike for Term80 {
        fn width(&self) -> u16 {
            80
        }
        fn move_cursor_up(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_down(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_right(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_left(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn write_line(&self, s: &str) -> std::io::Result<()> {
            self.0.lock().unwrap().push(s.to_string());
            Ok(())
        }
        fn write_str(&self, s: &str) -> std::io::Result<()> {
            self.write_line(s)
        }
        fn clear_line(&self) -> std::io::Result<()> {
            Ok(())
        }
        fn flush(&self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn drawn(term: &Term80) -> Vec<String> {
        term.0.lock().unwrap().clone()
    }

    const LONG: &str =
        "model-00001-of-00002-with-a-name-long-enough-to-need-two-lines-of-a-terminal-\
                        that-is-only-eighty-columns-wide.safetensors";

    /// At 80 columns the bar vanished and each redraw left a line padded to
    /// 161 characters: a wide bar and a long shard name did not fit.
    #[test]
    fn every_line_fits_eighty_columns_and_keeps_its_bar() {
        let term = Term80::default();
        let bar = ProgressBar::with_draw_target(
            None,
            ProgressDrawTarget::term_like(Box::new(term.clone())),
        );
        bar.set_style(style(BYTES_TEMPLATE));
        let bar = Bar { bar, sized: None };
        bar.start(4_400_000_000);
        bar.shard_started(LONG);
        bar.advance(1_100_000_000);
        bar.bar.tick();
        let lines = drawn(&term);
        let last = lines.iter().rev().find(|l| !l.trim().is_empty()).unwrap();
        for l in &lines {
            assert!(
                l.chars().count() <= 80,
                "{} columns: {l:?}",
                l.chars().count()
            );
        }
        assert!(last.contains("1.02 GiB/4.10 GiB"), "{last:?}");
        assert!(
            last.contains("model-00001"),
            "the name is cut, not dropped: {last:?}"
        );
    }

    /// batch's job bars started full over "0 B/0 B" before the size was
    /// known, which read as done.
    #[test]
    fn a_job_bar_is_not_full_before_its_size_is_known() {
        let term = Term80::default();
        let multi = MultiBar {
            multi: MultiProgress::with_draw_target(ProgressDrawTarget::term_like(Box::new(
                term.clone(),
            ))),
            overall: ProgressBar::hidden(),
        };
        let model = Model {
            name: "sdxl-base".into(),
            source: "in/sdxl-base".into(),
            output: "out/sdxl-base".into(),
            hf_cache: false,
        };
        let job = multi.model_started(&model);
        multi.multi.println("").ok();
        let before = drawn(&term).join("\n");
        assert!(before.contains("planning"), "{before}");
        assert!(!before.contains("0 B/0 B"), "{before}");
        job.start(1 << 30);
        job.advance(1 << 29);
        // Redraws are rate limited: wait past one frame.
        std::thread::sleep(std::time::Duration::from_millis(300));
        multi.multi.println("").ok();
        let after = drawn(&term).join("\n");
        assert!(after.contains("512.00 MiB/1.00 GiB"), "{after}");
    }
}
