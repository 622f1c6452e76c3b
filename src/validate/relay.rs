//! The budget child's progress, relayed to the parent's bar: the child
//! ([`super::budget`]) runs the load in another process, so its
//! [`Reporter`] calls become lines on its stderr, which the parent reads
//! apart from the rest of what the child prints and replays on its own
//! [`Progress`]. Without this a load under `--commit-budget` showed no bar.
//!
//! A line is [`LINE_PREFIX`] and one JSON [`Event`]; names travel as JSON
//! strings, so a newline in a file name cannot break a line. Advances are
//! coalesced to [`ADVANCE_STEP`] so a model of many small tensors does not
//! print a line per tensor.

use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender};

use serde::{Deserialize, Serialize};

use super::options::Progress;
use crate::exec::Reporter;

/// What starts a relayed line on the child's stderr.
pub const LINE_PREFIX: &str = "\u{1}reshard-progress ";

/// Bytes the child accumulates before it writes an advance line.
const ADVANCE_STEP: u64 = 8 << 20;

/// One [`Reporter`] call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Event {
    Start(u64),
    Advance(u64),
    Shard(String),
    Finish,
}

impl Event {
    /// Calls the [`Progress`] method this event stands for.
    pub fn replay(&self, progress: &Progress) {
        match self {
            Event::Start(n) => progress.start(*n),
            Event::Advance(n) => progress.advance(*n),
            Event::Shard(f) => progress.shard_started(f),
            Event::Finish => progress.finish(),
        }
    }
}

/// The child's [`Reporter`]: writes each call as a line on stderr.
#[derive(Default)]
pub struct StderrReporter {
    pending: AtomicU64,
}

impl StderrReporter {
    fn send(&self, event: &Event) {
        if let Ok(json) = serde_json::to_string(event) {
            // A closed stderr only loses the bar, never the load.
            let _ = writeln!(std::io::stderr().lock(), "{LINE_PREFIX}{json}");
        }
    }

    fn flush_pending(&self) {
        let n = self.pending.swap(0, Ordering::Relaxed);
        if n > 0 {
            self.send(&Event::Advance(n));
        }
    }
}

impl Reporter for StderrReporter {
    fn start(&self, bytes: u64) {
        self.flush_pending();
        self.send(&Event::Start(bytes));
    }
    fn advance(&self, bytes: u64) {
        let before = self.pending.fetch_add(bytes, Ordering::Relaxed);
        if before + bytes >= ADVANCE_STEP {
            self.flush_pending();
        }
    }
    fn shard_started(&self, file: &str) {
        self.flush_pending();
        self.send(&Event::Shard(file.to_string()));
    }
    fn finish(&self) {
        self.flush_pending();
        self.send(&Event::Finish);
    }
}

/// Reads the child's stderr to its end: relayed lines become events on
/// `events`, every other line is returned as it was printed.
pub fn split_stderr(pipe: impl std::io::Read, events: Sender<Event>) -> Vec<u8> {
    let mut reader = std::io::BufReader::new(pipe);
    let mut rest = Vec::new();
    let mut line = Vec::new();
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let event = std::str::from_utf8(&line)
            .ok()
            .and_then(|l| l.strip_prefix(LINE_PREFIX))
            .and_then(|json| serde_json::from_str::<Event>(json.trim_end()).ok());
        match event {
            Some(e) => {
                let _ = events.send(e);
            }
            None => rest.extend_from_slice(&line),
        }
    }
    rest
}

/// Replays every event received so far on `progress`.
pub fn replay_pending(events: &Receiver<Event>, progress: &Progress) {
    while let Ok(e) = events.try_recv() {
        e.replay(progress);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Default)]
    struct Record(Mutex<Vec<String>>);

    impl Reporter for Record {
        fn start(&self, bytes: u64) {
            self.0.lock().unwrap().push(format!("start {bytes}"));
        }
        fn advance(&self, bytes: u64) {
            self.0.lock().unwrap().push(format!("advance {bytes}"));
        }
        fn shard_started(&self, file: &str) {
            self.0.lock().unwrap().push(format!("shard {file}"));
        }
        fn finish(&self) {
            self.0.lock().unwrap().push("finish".into());
        }
    }

    #[test]
    fn relayed_lines_are_replayed_and_the_rest_is_kept() {
        let events = [
            Event::Start(100),
            Event::Shard("a\nb.safetensors".into()),
            Event::Advance(60),
            Event::Finish,
        ];
        let mut stderr = String::from("warning: one\n");
        for e in &events {
            stderr.push_str(&format!(
                "{LINE_PREFIX}{}\n",
                serde_json::to_string(e).unwrap()
            ));
        }
        stderr.push_str("memory allocation of 4096 bytes failed\n");
        let (tx, rx) = std::sync::mpsc::channel();
        let rest = split_stderr(stderr.as_bytes(), tx);
        assert_eq!(
            String::from_utf8(rest).unwrap(),
            "warning: one\nmemory allocation of 4096 bytes failed\n"
        );
        let record = Arc::new(Record::default());
        replay_pending(&rx, &Progress::new(record.clone()));
        assert_eq!(
            *record.0.lock().unwrap(),
            [
                "start 100",
                "shard a\nb.safetensors",
                "advance 60",
                "finish"
            ]
        );
    }
}
