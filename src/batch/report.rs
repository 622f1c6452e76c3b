//! What a batch did, model by model: the data behind the end-of-run table
//! and `--report FILE.json`. Rendering as text is the CLI's job.

use std::fmt;
use std::path::Path;

use serde::Serialize;

use super::part::Part;
use super::Mode;
use crate::write::{write_atomic, WriteError};

/// How one model ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Written (or finished, when an interrupted run was resumed).
    Converted,
    /// The output already held this exact conversion: nothing written.
    UpToDate,
    /// The check (`--mode fit` or `validate`) ran and passed.
    Passed,
    /// The job ran and failed; `reason` says why.
    Failed,
    /// The job did not run (symlink loop, duplicate, --fail-fast, Ctrl-C).
    Skipped,
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Status::Converted => "converted",
            Status::UpToDate => "up to date",
            Status::Passed => "passed",
            Status::Failed => "failed",
            Status::Skipped => "skipped",
        })
    }
}

/// One model's line in the report.
#[derive(Debug, Clone, Serialize)]
pub struct ModelResult {
    /// Path under OUT (see [`super::Model::name`]).
    pub name: String,
    pub source: String,
    /// Empty for entries discovery skipped.
    pub output: String,
    /// The part (of `--part`'s N) the model belongs to.
    pub part: u64,
    pub status: Status,
    /// Why it failed or was skipped: the whole error chain, `: `-joined.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Bytes written by this run (0 when up to date).
    pub bytes: u64,
    /// Shards an interrupted earlier run had finished and this run kept.
    pub resumed_shards: usize,
    /// Files checked against their HF blob names (`--verify-source`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verified_files: Option<usize>,
    /// What the job wants the user to know (files not copied, and why).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    pub seconds: f64,
}

/// Counts by status.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Totals {
    pub converted: usize,
    pub up_to_date: usize,
    pub passed: usize,
    pub failed: usize,
    pub skipped: usize,
    pub bytes: u64,
}

/// The whole batch.
#[derive(Debug, Clone, Serialize)]
pub struct BatchReport {
    pub reshard_version: String,
    pub root: String,
    pub out: String,
    pub mode: Mode,
    pub part: Part,
    pub jobs: usize,
    /// The `--window` budget all jobs shared.
    pub window: u64,
    /// Most bytes of window buffers held at once, over all jobs together
    /// (the pool's own accounting; never above `window`).
    pub peak_buffer_bytes: u64,
    pub seconds: f64,
    pub totals: Totals,
    pub models: Vec<ModelResult>,
}

impl BatchReport {
    /// Counts `models` into `totals`.
    pub fn count(models: &[ModelResult]) -> Totals {
        let mut t = Totals::default();
        for m in models {
            match m.status {
                Status::Converted => t.converted += 1,
                Status::UpToDate => t.up_to_date += 1,
                Status::Passed => t.passed += 1,
                Status::Failed => t.failed += 1,
                Status::Skipped => t.skipped += 1,
            }
            t.bytes += m.bytes;
        }
        t
    }

    /// True if any model failed (the CLI exits 1).
    pub fn any_failed(&self) -> bool {
        self.totals.failed > 0
    }

    pub fn to_json(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec_pretty(self).unwrap_or_default();
        v.push(b'\n');
        v
    }

    /// Writes the report as JSON to `path` atomically (temp file, fsync,
    /// rename), creating its folder if needed.
    pub fn write(&self, path: &Path) -> Result<(), WriteError> {
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        std::fs::create_dir_all(dir).map_err(|e| WriteError::io(dir, e))?;
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "report.json".into());
        write_atomic(dir, &name, &self.to_json())
    }
}

/// An error and its causes on one line: `a: b: c`.
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut s = err.to_string();
    let mut cause = err.source();
    while let Some(c) = cause {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cause = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_is_written_atomically_and_reads_back() {
        let tmp = tempfile::tempdir().unwrap();
        let report = BatchReport {
            reshard_version: "0".into(),
            root: "r".into(),
            out: "o".into(),
            mode: Mode::Convert,
            part: Part::ALL,
            jobs: 1,
            window: 10,
            peak_buffer_bytes: 5,
            seconds: 0.0,
            totals: Totals::default(),
            models: Vec::new(),
        };
        let path = tmp.path().join("sub/report.json");
        report.write(&path).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(v["peak_buffer_bytes"], 5);
        assert_eq!(v["mode"], "convert");
        let names: Vec<_> = std::fs::read_dir(tmp.path().join("sub"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["report.json"]);
    }

    #[test]
    fn chains_join_causes() {
        let io = std::io::Error::other("disk full");
        let err = WriteError::io(Path::new("x"), io);
        assert!(
            error_chain(&err).ends_with(": disk full"),
            "{}",
            error_chain(&err)
        );
    }
}
