//! What a batch did, model by model: the data behind the end-of-run table
//! and `--report FILE.json`, and [`merge`], which joins the reports of the
//! parts of a `--part I/N` run into one. Rendering as text is the CLI's job.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::part::{Balance, Part};
use super::Mode;
use crate::write::{write_atomic, WriteError};

/// How one model ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
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
#[derive(Debug, Clone, Serialize, Deserialize)]
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
    /// Seconds the `--verify-source` hash took, on its own threads while
    /// the job ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify_seconds: Option<f64>,
    /// Of those, the seconds the job waited for it after its own work (a
    /// conversion before its commit): about `verify_seconds` minus the
    /// job's own time when the hash is the longer, 0 when it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify_waited_seconds: Option<f64>,
    /// What the job wants the user to know (files not copied, and why).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    pub seconds: f64,
}

/// Counts by status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Totals {
    pub converted: usize,
    pub up_to_date: usize,
    pub passed: usize,
    pub failed: usize,
    pub skipped: usize,
    pub bytes: u64,
}

/// The whole batch.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BatchReport {
    pub reshard_version: String,
    pub root: String,
    pub out: String,
    pub mode: Mode,
    pub part: Part,
    /// How the parts were split (reports from before it was recorded were
    /// all split by name).
    #[serde(default = "Balance::legacy")]
    pub balance: Balance,
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
        to_json(self)
    }

    /// Writes the report as JSON to `path` atomically (temp file, fsync,
    /// rename), creating its folder if needed.
    pub fn write(&self, path: &Path) -> Result<(), WriteError> {
        write_json(path, &self.to_json())
    }

    /// Reads a report `--report` wrote.
    pub fn read(path: &Path) -> Result<BatchReport, MergeError> {
        let bytes = read_capped(path)?;
        serde_json::from_slice(&bytes).map_err(|source| MergeError::Parse {
            path: path.to_path_buf(),
            source,
        })
    }
}

fn to_json<T: Serialize>(value: &T) -> Vec<u8> {
    let mut v = serde_json::to_vec_pretty(value).unwrap_or_default();
    v.push(b'\n');
    v
}

fn write_json(path: &Path, json: &[u8]) -> Result<(), WriteError> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    std::fs::create_dir_all(dir).map_err(|e| WriteError::io(dir, e))?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "report.json".into());
    write_atomic(dir, &name, json)
}

/// Reports larger than this are refused (a report line is ~300 bytes, so
/// this is about a million models).
pub const MAX_REPORT_BYTES: u64 = 512 << 20;

fn read_capped(path: &Path) -> Result<Vec<u8>, MergeError> {
    use std::io::Read;
    let io = |source| MergeError::Read {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    if !meta.is_file() {
        return Err(MergeError::NotAFile {
            path: path.to_path_buf(),
        });
    }
    if meta.len() > MAX_REPORT_BYTES {
        return Err(MergeError::TooLarge {
            path: path.to_path_buf(),
            len: meta.len(),
            max: MAX_REPORT_BYTES,
        });
    }
    let mut bytes = Vec::new();
    file.take(MAX_REPORT_BYTES)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    Ok(bytes)
}

/// The reports of the parts of one `--part I/N` run, joined: what
/// `reshard batch-report merge` writes.
#[derive(Debug, Clone, Serialize)]
pub struct MergedReport {
    pub reshard_version: String,
    pub root: String,
    pub out: String,
    pub mode: Mode,
    pub balance: Balance,
    /// N of `--part I/N`.
    pub count: u64,
    /// One line per part merged, by part.
    pub parts: Vec<PartSummary>,
    /// How many of the N parts no report was given for.
    pub missing_count: u64,
    /// The first [`MAX_LISTED_MISSING`] of them (0-based).
    pub missing_parts: Vec<u64>,
    /// The longest part's `seconds` (parts run side by side).
    pub seconds: f64,
    pub totals: Totals,
    /// Every model of every part, by name.
    pub models: Vec<ModelResult>,
}

/// Missing parts listed by name in a [`MergedReport`].
pub const MAX_LISTED_MISSING: usize = 1000;

/// One part in a [`MergedReport`].
#[derive(Debug, Clone, Serialize)]
pub struct PartSummary {
    pub part: Part,
    /// The file it was read from.
    pub report: String,
    pub jobs: usize,
    pub window: u64,
    pub peak_buffer_bytes: u64,
    pub seconds: f64,
    pub totals: Totals,
}

impl MergedReport {
    /// True if a model failed or a part is missing (the CLI exits 1).
    pub fn incomplete(&self) -> bool {
        self.totals.failed > 0 || self.missing_count > 0
    }

    pub fn to_json(&self) -> Vec<u8> {
        to_json(self)
    }

    /// Writes the merged report atomically, like [`BatchReport::write`],
    /// after the output-path guard of `batch --report`
    /// ([`crate::write::scope::check_report`]): never onto one of the
    /// reports merged, nor onto or into a model folder they name.
    pub fn write(&self, path: &Path) -> Result<(), MergeError> {
        let mut sources = crate::write::scope::SourceSet::default();
        for part in &self.parts {
            sources.add_input(Path::new(&part.report));
        }
        for m in self.models.iter().filter(|m| !m.source.is_empty()) {
            sources.add_model(Path::new(&m.source));
        }
        crate::write::scope::check_report(path, &sources).map_err(|source| {
            MergeError::OutputPath {
                path: path.to_path_buf(),
                source,
            }
        })?;
        write_json(path, &self.to_json()).map_err(|source| MergeError::Write {
            path: path.to_path_buf(),
            source,
        })
    }
}

/// Why reports do not merge.
#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    #[error("{}: cannot read the report", .path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: not a file", .path.display())]
    NotAFile { path: PathBuf },
    #[error("{}: the report is {len} bytes, more than the {max} allowed", .path.display())]
    TooLarge { path: PathBuf, len: u64, max: u64 },
    #[error("{}: not a batch report", .path.display())]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("no reports to merge")]
    NoReports,
    #[error("refusing to write the merged report {}", .path.display())]
    OutputPath {
        path: PathBuf,
        #[source]
        source: crate::write::scope::ScopeError,
    },
    #[error("cannot write the merged report {}", .path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: WriteError,
    },
    #[error("{}: {field} is {found} but {} has {expected}: not parts of one run", .path.display(), .first.display())]
    Differ {
        path: PathBuf,
        first: PathBuf,
        field: &'static str,
        expected: String,
        found: String,
    },
    #[error("{}: part {part} is also in {}", .path.display(), .first.display())]
    SamePart {
        path: PathBuf,
        first: PathBuf,
        part: Part,
    },
    #[error("{}: model {name:?} is also in {} (part {first_part})", .path.display(), .first.display())]
    ModelInTwoParts {
        path: PathBuf,
        first: PathBuf,
        name: String,
        first_part: Part,
    },
}

/// Joins the reports of the parts of one run. They must agree on ROOT, OUT,
/// mode, balance and N, hold distinct parts, and no model may be in two of
/// them; parts without a report are listed as missing.
pub fn merge(reports: Vec<(PathBuf, BatchReport)>) -> Result<MergedReport, MergeError> {
    let mut reports = reports.into_iter();
    let Some((first_path, first)) = reports.next() else {
        return Err(MergeError::NoReports);
    };
    let mut parts: BTreeMap<u64, (PathBuf, BatchReport)> = BTreeMap::new();
    let mut owner: BTreeMap<String, (PathBuf, Part)> = BTreeMap::new();
    for (path, report) in std::iter::once((first_path.clone(), first.clone())).chain(reports) {
        let differ = |field, expected: String, found: String| MergeError::Differ {
            path: path.clone(),
            first: first_path.clone(),
            field,
            expected,
            found,
        };
        let checks = [
            ("root", &first.root, &report.root),
            ("out", &first.out, &report.out),
        ];
        for (field, expected, found) in checks {
            if expected != found {
                return Err(differ(field, format!("{expected:?}"), format!("{found:?}")));
            }
        }
        if report.mode != first.mode {
            return Err(differ(
                "mode",
                first.mode.to_string(),
                report.mode.to_string(),
            ));
        }
        if report.balance != first.balance {
            return Err(differ(
                "balance",
                first.balance.to_string(),
                report.balance.to_string(),
            ));
        }
        if report.part.count != first.part.count {
            return Err(differ(
                "the part count",
                first.part.count.to_string(),
                report.part.count.to_string(),
            ));
        }
        if let Some((earlier, _)) = parts.get(&report.part.index) {
            return Err(MergeError::SamePart {
                path,
                first: earlier.clone(),
                part: report.part,
            });
        }
        for m in &report.models {
            if let Some((earlier, part)) = owner.get(&m.name) {
                return Err(MergeError::ModelInTwoParts {
                    path,
                    first: earlier.clone(),
                    name: m.name.clone(),
                    first_part: *part,
                });
            }
            owner.insert(m.name.clone(), (path.clone(), report.part));
        }
        parts.insert(report.part.index, (path, report));
    }
    let count = first.part.count;
    let present = parts.len() as u64;
    let missing_count = count.saturating_sub(present);
    let missing_parts: Vec<u64> = (0..count)
        .filter(|i| !parts.contains_key(i))
        .take(MAX_LISTED_MISSING)
        .collect();
    let mut models: Vec<ModelResult> = Vec::with_capacity(owner.len());
    let mut summaries = Vec::with_capacity(parts.len());
    let mut seconds: f64 = 0.0;
    for (path, report) in parts.into_values() {
        seconds = seconds.max(report.seconds);
        summaries.push(PartSummary {
            part: report.part,
            report: path.display().to_string(),
            jobs: report.jobs,
            window: report.window,
            peak_buffer_bytes: report.peak_buffer_bytes,
            seconds: report.seconds,
            totals: report.totals,
        });
        models.extend(report.models);
    }
    models.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(MergedReport {
        reshard_version: first.reshard_version,
        root: first.root,
        out: first.out,
        mode: first.mode,
        balance: first.balance,
        count,
        parts: summaries,
        missing_count,
        missing_parts,
        seconds,
        totals: BatchReport::count(&models),
        models,
    })
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
            balance: Balance::Bytes,
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

    fn result(name: &str, part: u64, status: Status, bytes: u64) -> ModelResult {
        ModelResult {
            name: name.into(),
            source: format!("root/{name}"),
            output: format!("out/{name}"),
            part,
            status,
            reason: (status == Status::Failed).then(|| "broken".into()),
            bytes,
            resumed_shards: 0,
            verified_files: None,
            verify_seconds: None,
            verify_waited_seconds: None,
            notes: Vec::new(),
            seconds: 0.5,
        }
    }

    fn part_report(index: u64, count: u64, models: Vec<ModelResult>) -> (PathBuf, BatchReport) {
        let report = BatchReport {
            reshard_version: "0.1.0".into(),
            root: "root".into(),
            out: "out".into(),
            mode: Mode::Convert,
            part: Part { index, count },
            balance: Balance::Bytes,
            jobs: 1,
            window: 1 << 20,
            peak_buffer_bytes: 100,
            seconds: index as f64 + 1.0,
            totals: BatchReport::count(&models),
            models,
        };
        (PathBuf::from(format!("part-{index}.json")), report)
    }

    #[test]
    fn merge_joins_parts_and_reads_back_what_batch_wrote() {
        let tmp = tempfile::tempdir().unwrap();
        let (path1, r1) = part_report(1, 3, vec![result("b", 1, Status::Converted, 10)]);
        let (path0, r0) = part_report(
            0,
            3,
            vec![
                result("c", 0, Status::UpToDate, 0),
                result("a", 0, Status::Failed, 0),
            ],
        );
        // Through the file format, as `--report` writes it.
        let mut inputs = Vec::new();
        for (path, report) in [(path1, r1), (path0, r0)] {
            let on_disk = tmp.path().join(&path);
            report.write(&on_disk).unwrap();
            inputs.push((on_disk.clone(), BatchReport::read(&on_disk).unwrap()));
        }
        let m = merge(inputs).unwrap();
        let names: Vec<&str> = m.models.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c"]);
        assert_eq!(
            (
                m.totals.converted,
                m.totals.up_to_date,
                m.totals.failed,
                m.totals.bytes
            ),
            (1, 1, 1, 10)
        );
        assert_eq!(
            m.parts.iter().map(|p| p.part.index).collect::<Vec<_>>(),
            [0, 1]
        );
        assert_eq!((m.missing_count, m.missing_parts.clone()), (1, vec![2]));
        assert_eq!(m.seconds, 2.0, "the longest part");
        assert!(m.incomplete());
        assert_eq!(m.models[0].reason.as_deref(), Some("broken"));
    }

    #[test]
    fn merge_refuses_reports_of_different_runs() {
        let base = || part_report(0, 2, vec![result("a", 0, Status::Converted, 1)]);
        let other = |f: &dyn Fn(&mut BatchReport)| {
            let (p, mut r) = part_report(1, 2, vec![result("b", 1, Status::Converted, 1)]);
            f(&mut r);
            (p, r)
        };
        let err = |second| merge(vec![base(), second]).unwrap_err().to_string();
        assert!(err(other(&|r| r.out = "elsewhere".into())).contains("out is \"elsewhere\""));
        assert!(err(other(&|r| r.mode = Mode::Fit)).contains("mode is fit"));
        assert!(err(other(&|r| r.balance = Balance::Name)).contains("balance is name"));
        assert!(err(other(&|r| r.part = Part { index: 1, count: 3 })).contains("part count is 3"));
        assert_eq!(
            err(other(&|r| r.part = Part { index: 0, count: 2 })),
            "part-1.json: part 0/2 is also in part-0.json"
        );
        assert!(err(other(&|r| r.models[0].name = "a".into()))
            .starts_with("part-1.json: model \"a\" is also in part-0.json"));
        assert!(matches!(merge(Vec::new()), Err(MergeError::NoReports)));
        let (_, whole) = part_report(0, 1, vec![result("a", 0, Status::Converted, 1)]);
        let one = merge(vec![(PathBuf::from("r.json"), whole)]).unwrap();
        assert!(!one.incomplete() && one.missing_parts.is_empty());
    }

    #[test]
    fn reading_a_report_names_the_file() {
        let tmp = tempfile::tempdir().unwrap();
        let bad = tmp.path().join("bad.json");
        std::fs::write(&bad, "{\"models\": 3}").unwrap();
        let e = BatchReport::read(&bad).unwrap_err();
        assert!(matches!(e, MergeError::Parse { .. }));
        assert!(
            e.to_string().ends_with("bad.json: not a batch report"),
            "{e}"
        );
        let e = BatchReport::read(tmp.path()).unwrap_err();
        assert!(
            matches!(e, MergeError::NotAFile { .. } | MergeError::Read { .. }),
            "{e}"
        );
        // A report of 0.1.0, before `balance` was recorded, was split by name.
        let old = r#"{"reshard_version":"0.1.0","root":"r","out":"o","mode":"convert",
            "part":"1/2","jobs":1,"window":1,"peak_buffer_bytes":0,"seconds":0.1,
            "totals":{"converted":0,"up_to_date":0,"passed":0,"failed":0,"skipped":0,"bytes":0},
            "models":[]}"#;
        let old_path = tmp.path().join("old.json");
        std::fs::write(&old_path, old).unwrap();
        let r = BatchReport::read(&old_path).unwrap();
        assert_eq!(
            (r.balance, r.part),
            (Balance::Name, Part { index: 1, count: 2 })
        );
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
