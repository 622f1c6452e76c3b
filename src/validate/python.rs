//! Running a real loader in the user's own Python (`validate --loader
//! python:NAME`), under the enforced commit budget, and measuring it from
//! outside.
//!
//! The loader scripts ship inside reshard (`python/*.py`, prepended with
//! `python/harness.py`); nothing is installed. The child imports its
//! libraries, says `RESHARD-READY` on stderr and waits; the parent samples
//! its commit then (the baseline: Python plus torch and the loader's
//! library), puts a commit limit on it at baseline + budget
//! ([`crate::platform::ProcessTree::limit_commit`]: `RLIMIT_DATA` through
//! `prlimit` on Linux, a Job Object on Windows), lets it load, and samples
//! its commit and RSS every millisecond until it exits
//! ([`crate::platform::process_memory`]). The child prints one JSON line on
//! stdout: what it loaded and the library versions, or why not.
//!
//! The child heads its own process tree (a process group, and on Linux
//! every descendant, even one in a session of its own, through a child
//! subreaper; a Job Object on Windows), so when it outlives
//! [`PythonOptions::timeout`] it is killed with every worker it started,
//! and the run is an error naming the loader and the timeout: a loader
//! that never exits cannot hang `validate`, nor can a worker that holds
//! its pipes open (they are read until the same deadline). The same
//! happens when the caller's cancel flag is set (Ctrl-C: the child's own
//! process group no longer gets the terminal's signal). The child runs in
//! a private empty working folder with absolute paths, and the harness
//! drops `sys.path[0]`, so no file of the folder reshard was started in
//! (a model folder) is imported.
//!
//! Next to the measurement stands fit's prediction for the same checkpoint
//! ([`crate::fit::loader::peak`]), so a user sees both. Nothing here
//! prints.

use std::collections::BTreeMap;
use std::fmt;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::options::DeviceSpec;
use crate::fit::loader::{self as model, LoadParams, Os, Sizes};
use crate::format::{self, FormatError};
use crate::platform::ProcessTree;
use crate::units::TimeSpan;

const HARNESS: &str = include_str!("python/harness.py");
/// The line the harness writes on stderr once its imports are done.
const READY: &str = "RESHARD-READY";
/// How often the child's memory is sampled.
const SAMPLE_EVERY: Duration = Duration::from_millis(1);
/// How long a loader may run, imports included, before it is killed
/// (`validate --loader-timeout`): far above a 70B model in transformers
/// (140 GB of bf16 is about 25 minutes from a 100 MB/s disk, more where
/// the loader casts or swaps), yet a hung loader still ends.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2 * 3600);

/// A real loader `validate --loader python:NAME` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PythonLoader {
    /// `from_pretrained` (mmap backend on Linux and macOS, pread on Windows).
    Transformers,
    /// `from_pretrained` with safetensors' pread backend, as on Windows.
    TransformersPread,
    /// `from_pretrained(disable_mmap=True)`: each shard read whole and
    /// parsed with `safetensors.torch.load(bytes)`.
    TransformersDisableMmap,
    /// Empty model + per-shard `safetensors.torch.load_file` + `load_state_dict`.
    Safetensors,
    /// `DiffusionPipeline.from_pretrained` or one model class.
    Diffusers,
    /// `SentenceTransformer(path)`.
    SentenceTransformers,
}

impl PythonLoader {
    pub const ALL: [PythonLoader; 6] = [
        PythonLoader::Transformers,
        PythonLoader::TransformersPread,
        PythonLoader::TransformersDisableMmap,
        PythonLoader::Safetensors,
        PythonLoader::Diffusers,
        PythonLoader::SentenceTransformers,
    ];

    /// The NAME in `python:NAME`.
    pub fn name(self) -> &'static str {
        match self {
            PythonLoader::Transformers => "transformers",
            PythonLoader::TransformersPread => "transformers-pread",
            PythonLoader::TransformersDisableMmap => "transformers-disable-mmap",
            PythonLoader::Safetensors => "safetensors",
            PythonLoader::Diffusers => "diffusers",
            PythonLoader::SentenceTransformers => "sentence-transformers",
        }
    }

    /// The loader's script, harness first.
    pub fn script(self) -> String {
        let body = match self {
            PythonLoader::Transformers
            | PythonLoader::TransformersPread
            | PythonLoader::TransformersDisableMmap => {
                include_str!("python/transformers.py")
            }
            PythonLoader::Safetensors => include_str!("python/safetensors.py"),
            PythonLoader::Diffusers => include_str!("python/diffusers.py"),
            PythonLoader::SentenceTransformers => include_str!("python/sentence_transformers.py"),
        };
        format!("{HARNESS}\n{body}")
    }

    /// The row of fit's model this loader is, on `os`.
    pub fn model(self, os: Os) -> model::Loader {
        match self {
            PythonLoader::Transformers | PythonLoader::SentenceTransformers => {
                if os == Os::Windows {
                    model::Loader::TransformersV5Pread
                } else {
                    model::Loader::TransformersV5Mmap
                }
            }
            PythonLoader::TransformersPread => model::Loader::TransformersV5Pread,
            PythonLoader::TransformersDisableMmap => model::Loader::FullRead,
            PythonLoader::Safetensors => model::Loader::PerShardMmap,
            PythonLoader::Diffusers => model::Loader::Diffusers,
        }
    }
}

impl fmt::Display for PythonLoader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "python:{}", self.name())
    }
}

impl FromStr for PythonLoader {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let names = || {
            let n: Vec<String> = PythonLoader::ALL.iter().map(|l| l.to_string()).collect();
            n.join(", ")
        };
        let Some(name) = s.strip_prefix("python:") else {
            return Err(format!("unknown loader {s:?}: use one of {}", names()));
        };
        PythonLoader::ALL
            .into_iter()
            .find(|l| l.name() == name)
            .ok_or_else(|| format!("unknown loader {s:?}: use one of {}", names()))
    }
}

/// What to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PythonOptions {
    pub loader: PythonLoader,
    /// The interpreter (`--python`, `RESHARD_PYTHON`, or `python`).
    pub python: PathBuf,
    pub device: DeviceSpec,
    /// Commit the load may add above the baseline (enforced).
    pub commit_budget: Option<u64>,
    /// fit's baseline term to show with the prediction.
    pub baseline: u64,
    /// How long the child may run in all, imports included, before it and
    /// every process it started are killed.
    pub timeout: Duration,
}

/// Why a real loader could not be run (exit 2), as opposed to a load that
/// went over budget (a failed check in the report).
#[derive(Debug, thiserror::Error)]
pub enum PythonError {
    #[error("cannot run python {}: install Python 3 or give --python PATH", .python.display())]
    NoPython {
        python: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} cannot import {module}: install it (pip install {install}) or give --python PATH", .python.display())]
    Missing {
        python: PathBuf,
        module: String,
        install: String,
    },
    #[error("{loader} failed to {stage} {}: {error}", .path.display())]
    Failed {
        loader: PythonLoader,
        stage: String,
        path: PathBuf,
        error: String,
    },
    #[error("{loader} on {}: {reason}", .path.display())]
    Protocol {
        loader: PythonLoader,
        path: PathBuf,
        reason: String,
    },
    #[error("{loader} on {}: no result after {} (--loader-timeout): the loader and the processes it started were killed", .path.display(), TimeSpan(*.timeout))]
    TimedOut {
        loader: PythonLoader,
        path: PathBuf,
        timeout: Duration,
    },
    #[error("{loader} on {}: interrupted: the loader and the processes it started were killed", .path.display())]
    Interrupted { loader: PythonLoader, path: PathBuf },
    #[error("cannot make a private working folder for python")]
    WorkDir {
        #[source]
        source: std::io::Error,
    },
    #[error("cannot limit the commit of the python process to {bytes} bytes")]
    Limit {
        bytes: u64,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Format(#[from] FormatError),
}

/// fit's prediction for the same load.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Prediction {
    /// The row of fit's model (`transformers-v5-mmap`, ...).
    pub loader: model::Loader,
    /// Peak commit above the baseline.
    pub peak_commit: u64,
    /// fit's baseline term (`fit --baseline`).
    pub baseline: u64,
}

/// What the real loader did, measured from outside.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PythonReport {
    pub path: String,
    /// `python:NAME`.
    pub loader: String,
    pub python: String,
    pub device: String,
    /// The library versions the child imported.
    pub versions: BTreeMap<String, String>,
    /// `VmData` or `PagefileUsage`.
    pub commit_source: String,
    /// Commit once the libraries were imported, before the load.
    pub baseline: u64,
    /// The largest commit sampled.
    pub peak_commit: u64,
    pub peak_above_baseline: u64,
    /// Resident memory at the baseline and its peak (the OS's own peak
    /// where it keeps one).
    pub baseline_rss: u64,
    pub peak_rss: u64,
    pub samples: u64,
    pub commit_budget: Option<u64>,
    /// Tensors and bytes the loaded model holds (each storage once).
    pub tensors: Option<u64>,
    pub bytes: Option<u64>,
    pub load_seconds: Option<f64>,
    pub prediction: Prediction,
    /// Why the check failed (over budget, out of memory).
    pub failure: Option<String>,
    pub passed: bool,
}

/// The line the child prints.
#[derive(Debug, Deserialize)]
struct Outcome {
    outcome: String,
    #[serde(default)]
    module: String,
    #[serde(default)]
    install: String,
    #[serde(default)]
    stage: String,
    #[serde(default)]
    error: String,
    tensors: Option<u64>,
    bytes: Option<u64>,
    seconds: Option<f64>,
    #[serde(default)]
    versions: BTreeMap<String, String>,
}

/// Runs `options.loader` on the checkpoint at `path` and measures it.
/// `cancel` (Ctrl-C) stops it as the timeout does, within a few ms.
pub fn run(
    path: &Path,
    options: &PythonOptions,
    cancel: &AtomicBool,
) -> Result<PythonReport, PythonError> {
    // What the loader will hold: a pipeline or sentence-transformers folder
    // as all its weight sets together (the same sizes fit judges), so the
    // prediction covers the whole load and such a folder is not refused as
    // holding no checkpoint of its own.
    let (ck, _) = format::layout::open_as_loaded(path)?;
    let shards: Vec<u64> = ck.files.iter().map(|f| f.size).collect();
    let sizes = Sizes::new(&shards, ck.tensors.iter().map(|t| t.len));
    let os = Os::current();
    let row = options.loader.model(os);
    let params = LoadParams {
        gpu: options.device != DeviceSpec::Cpu,
        ..LoadParams::calibrated(os)
    };
    let prediction = Prediction {
        loader: row,
        peak_commit: model::peak(row, &sizes, &params).open_commit,
        baseline: options.baseline,
    };
    let device = match options.device {
        DeviceSpec::Cpu => "cpu".to_string(),
        DeviceSpec::Cuda(n) => format!("cuda:{n}"),
    };
    // The user's Python runs in a private empty folder, with every path
    // made absolute, so nothing of the folder reshard was started in (a
    // model folder holding a `safetensors.py`) is on its import path; the
    // harness drops `sys.path[0]` too.
    let workdir = crate::platform::PrivateDir::new("reshard-python")
        .map_err(|e| PythonError::WorkDir { source: e })?;
    let absolute = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    // A bare name (`python`) is looked up on PATH; a path is taken from
    // here, not from the working folder.
    let python = if options.python.components().count() > 1 {
        absolute(&options.python)
    } else {
        options.python.clone()
    };
    let mut command = Command::new(&python);
    command
        .current_dir(workdir.path())
        .arg("-c")
        .arg(options.loader.script())
        .arg(absolute(path))
        .arg(&device)
        .arg(options.loader.name())
        .env("HF_HUB_OFFLINE", "1")
        .envs(python_path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let started = Instant::now();
    // Without a tree (a Windows that refuses the job) only the child can
    // be killed, and a budget cannot be set.
    let (mut child, tree) =
        ProcessTree::spawn(&mut command).map_err(|e| PythonError::NoPython {
            python: options.python.clone(),
            source: e,
        })?;
    // A timeout past what an Instant holds (`--loader-timeout 9999999999h`)
    // is no deadline.
    let deadline = started.checked_add(options.timeout);
    let stop = Stop { deadline, cancel };
    let measured = supervise(&mut child, tree.as_ref(), options.commit_budget, &stop);
    // Workers the loader left behind go with it, even one in a session of
    // its own that holds the pipes open. One that would not end is caught
    // by the deadline on the pipes below.
    if let Ok(t) = &tree {
        let _ = t.kill();
    }
    let _ = child.kill();
    let status = child.wait().ok();
    let stopped = |why: Stopped| match why {
        Stopped::Timeout => PythonError::TimedOut {
            loader: options.loader,
            path: path.to_path_buf(),
            timeout: options.timeout,
        },
        Stopped::Cancelled => PythonError::Interrupted {
            loader: options.loader,
            path: path.to_path_buf(),
        },
    };
    if let Some(why) = measured.stopped {
        return Err(stopped(why));
    }
    // The pipes are read until they close, the deadline or Ctrl-C: a
    // process that escaped the tree may hold them open, and the readers
    // are then left behind.
    let stdout = collect(&measured.stdout, &stop).map_err(stopped)?;
    let stderr_tail: Vec<String> = collect(&measured.stderr, &stop).map_err(stopped)?;
    let protocol = |reason: String| PythonError::Protocol {
        loader: options.loader,
        path: path.to_path_buf(),
        reason,
    };
    if let Some(e) = measured.limit_error {
        return Err(e);
    }
    let outcome = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .and_then(|l| serde_json::from_str::<Outcome>(l).ok());
    let last_err = stderr_tail.last().cloned().unwrap_or_default();
    let abnormal = status.as_ref().and_then(crate::platform::abnormal_exit);
    let mut report = PythonReport {
        path: path.display().to_string(),
        loader: options.loader.to_string(),
        python: options.python.display().to_string(),
        device,
        versions: BTreeMap::new(),
        commit_source: crate::platform::COMMIT_SOURCE.to_string(),
        baseline: measured.baseline,
        peak_commit: measured.peak_commit,
        peak_above_baseline: measured.peak_commit.saturating_sub(measured.baseline),
        baseline_rss: measured.baseline_rss,
        peak_rss: measured.peak_rss,
        samples: measured.samples,
        commit_budget: options.commit_budget,
        tensors: None,
        bytes: None,
        load_seconds: None,
        prediction,
        failure: None,
        passed: false,
    };
    let Some(o) = outcome else {
        return match (abnormal, options.commit_budget, measured.ready) {
            (Some(how), Some(b), true) => {
                report.failure = Some(format!(
                    "over budget: the loader was stopped ({how}) under a {} commit budget: {last_err}",
                    crate::units::human(b)
                ));
                Ok(report)
            }
            _ => Err(protocol(format!(
                "the python process ended ({}) without a result: {last_err}",
                status.map_or("unknown status".into(), |s| s.to_string())
            ))),
        };
    };
    report.versions = o.versions;
    match o.outcome.as_str() {
        "missing" => Err(PythonError::Missing {
            python: options.python.clone(),
            module: o.module,
            install: o.install,
        }),
        "loaded" => {
            report.tensors = o.tensors;
            report.bytes = o.bytes;
            report.load_seconds = o.seconds;
            if let Some(b) = options
                .commit_budget
                .filter(|&b| report.peak_above_baseline > b)
            {
                report.failure = Some(format!(
                    "commit peaked at {} above baseline, over the {} budget",
                    crate::units::human(report.peak_above_baseline),
                    crate::units::human(b)
                ));
            }
            report.passed = report.failure.is_none();
            Ok(report)
        }
        "out_of_memory" if o.stage == "load" => {
            let budget = options.commit_budget.map_or_else(
                || "the machine's memory".to_string(),
                |b| format!("a {} commit budget", crate::units::human(b)),
            );
            report.failure = Some(format!(
                "over budget: the load ran out of {budget}: {}",
                o.error
            ));
            Ok(report)
        }
        "failed" | "out_of_memory" => Err(PythonError::Failed {
            loader: options.loader,
            stage: o.stage,
            path: path.to_path_buf(),
            error: o.error,
        }),
        other => Err(protocol(format!(
            "the result line has outcome {other:?}, not one reshard knows"
        ))),
    }
}

/// The child's `PYTHONPATH`: the caller's entries, each relative one made
/// absolute against this process's working folder (the child runs in
/// another), and empty ones (an accidental `:x`, which Python reads as the
/// working folder) dropped. Nothing when the caller sets none.
fn python_path() -> Option<(&'static str, std::ffi::OsString)> {
    let value = std::env::var_os("PYTHONPATH")?;
    let entries = std::env::split_paths(&value)
        .filter(|p| !p.as_os_str().is_empty())
        .map(|p| std::path::absolute(&p).unwrap_or(p));
    Some(("PYTHONPATH", std::env::join_paths(entries).ok()?))
}

/// What [`supervise`] measured, and the reader threads to join.
struct Measured {
    ready: bool,
    /// Why the child was stopped before it exited.
    stopped: Option<Stopped>,
    baseline: u64,
    peak_commit: u64,
    baseline_rss: u64,
    peak_rss: u64,
    samples: u64,
    limit_error: Option<PythonError>,
    /// What the reader threads send once their pipe closes.
    stdout: mpsc::Receiver<String>,
    stderr: mpsc::Receiver<Vec<String>>,
}

/// What a reader thread sends, waited for until `stop` says to give up (a
/// reader that ended without sending, by a panic, gives the default).
fn collect<T: Default>(rx: &mpsc::Receiver<T>, stop: &Stop<'_>) -> Result<T, Stopped> {
    loop {
        if let Some(why) = stop.now() {
            return Err(why);
        }
        let left = stop
            .deadline
            .map_or(CANCEL_POLL, |d| d.saturating_duration_since(Instant::now()));
        match rx.recv_timeout(left.min(CANCEL_POLL)) {
            Ok(v) => return Ok(v),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => return Ok(T::default()),
        }
    }
}

/// Runs `read` on a thread of its own and returns the channel its result
/// comes on.
fn reader<T: Send + 'static>(read: impl FnOnce() -> T + Send + 'static) -> mpsc::Receiver<T> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(read());
    });
    rx
}

/// Longest result line kept from the child's stdout.
const MAX_RESULT_LINE: usize = 1 << 20;
/// Longest stderr line kept (the last 20 are shown when the load fails).
const MAX_STDERR_LINE: usize = 4096;

/// Calls `f` with every line of `r`, decoded lossily and cut to `max`
/// bytes, until `r` ends. Reads everything, so the child never blocks on
/// a full pipe or dies writing to a closed one; a line that is not UTF-8
/// (a library's Latin-1 message) or never ends costs at most `max` bytes.
fn each_line(mut r: impl Read, max: usize, mut f: impl FnMut(String)) {
    let mut line = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let n = match r.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        for part in buf[..n].split_inclusive(|&b| b == b'\n') {
            let body = part.strip_suffix(b"\n").unwrap_or(part);
            let room = max.saturating_sub(line.len());
            line.extend_from_slice(&body[..body.len().min(room)]);
            if part.ends_with(b"\n") {
                f(String::from_utf8_lossy(&line).into_owned());
                line.clear();
            }
        }
    }
    if !line.is_empty() {
        f(String::from_utf8_lossy(&line).into_owned());
    }
}

/// When [`supervise`] gives up on the child.
struct Stop<'a> {
    deadline: Option<Instant>,
    cancel: &'a AtomicBool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stopped {
    Timeout,
    Cancelled,
}

impl Stop<'_> {
    fn now(&self) -> Option<Stopped> {
        if self.cancel.load(Ordering::SeqCst) {
            Some(Stopped::Cancelled)
        } else if self.deadline.is_some_and(|d| Instant::now() >= d) {
            Some(Stopped::Timeout)
        } else {
            None
        }
    }
}

/// How often the wait for the ready line looks at the cancel flag.
const CANCEL_POLL: Duration = Duration::from_millis(50);

/// Waits for the child's ready line, takes the baseline, limits the child,
/// lets it load and samples it until it exits or `stop` says to give up.
fn supervise(
    child: &mut Child,
    tree: Result<&ProcessTree, &std::io::Error>,
    budget: Option<u64>,
    stop: &Stop<'_>,
) -> Measured {
    let (tx, rx) = mpsc::channel::<()>();
    let stderr = child.stderr.take();
    let stderr = reader(move || {
        let mut tail: Vec<String> = Vec::new();
        let Some(e) = stderr else { return tail };
        each_line(e, MAX_STDERR_LINE, |line| {
            if line.trim() == READY {
                let _ = tx.send(());
            } else if !line.trim().is_empty() {
                if tail.len() == 20 {
                    tail.remove(0);
                }
                tail.push(line);
            }
        });
        tail
    });
    let stdout = child.stdout.take();
    let stdout = reader(move || {
        // Only the last JSON line is the result; the rest is not kept.
        let mut last = String::new();
        if let Some(o) = stdout {
            each_line(o, MAX_RESULT_LINE, |line| {
                if line.trim_start().starts_with('{') {
                    last = line;
                }
            });
        }
        last
    });
    let mut m = Measured {
        ready: false,
        stopped: None,
        baseline: 0,
        peak_commit: 0,
        baseline_rss: 0,
        peak_rss: 0,
        samples: 0,
        limit_error: None,
        stdout,
        stderr,
    };
    // The sender is dropped when stderr closes: the child ended first.
    loop {
        if let Some(why) = stop.now() {
            m.stopped = Some(why);
            return m;
        }
        let left = stop
            .deadline
            .map_or(CANCEL_POLL, |d| d.saturating_duration_since(Instant::now()));
        match rx.recv_timeout(left.min(CANCEL_POLL)) {
            Ok(()) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => return m,
        }
    }
    m.ready = true;
    let now = crate::platform::process_memory(child);
    m.baseline = now.commit.unwrap_or(0);
    m.peak_commit = m.baseline;
    m.baseline_rss = now.rss.unwrap_or(0);
    if let Some(b) = budget {
        let bytes = m.baseline.saturating_add(b);
        let set = match tree {
            Ok(t) => t.limit_commit(bytes),
            Err(e) => Err(std::io::Error::new(e.kind(), e.to_string())),
        };
        if let Err(e) = set {
            m.limit_error = Some(PythonError::Limit { bytes, source: e });
            return m;
        }
    }
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(b"go\n");
    }
    loop {
        let now = crate::platform::process_memory(child);
        m.samples += 1;
        m.peak_commit = m.peak_commit.max(now.commit.unwrap_or(0));
        m.peak_commit = m.peak_commit.max(now.peak_commit.unwrap_or(0));
        m.peak_rss = m
            .peak_rss
            .max(now.rss.unwrap_or(0))
            .max(now.peak_rss.unwrap_or(0));
        if !matches!(child.try_wait(), Ok(None)) {
            break;
        }
        if let Some(why) = stop.now() {
            m.stopped = Some(why);
            break;
        }
        std::thread::sleep(SAMPLE_EVERY);
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_python_loader_names() {
        for l in PythonLoader::ALL {
            assert_eq!(l.to_string().parse::<PythonLoader>().unwrap(), l);
        }
        for bad in ["transformers", "python:", "python:vllm", "py:transformers"] {
            assert!(bad.parse::<PythonLoader>().is_err(), "{bad}");
        }
    }

    #[test]
    fn every_script_starts_with_the_harness_and_ends_with_main() {
        for l in PythonLoader::ALL {
            let s = l.script();
            assert!(s.starts_with(HARNESS), "{l}");
            assert!(s.trim_end().ends_with("main(prepare, load)"), "{l}");
        }
    }

    #[test]
    fn lines_are_read_lossily_and_cut_to_the_limit() {
        let input: &[u8] = b"caf\xe9\nxxxxxxxxxx\n{\"a\": 1}\nno end";
        let mut lines = Vec::new();
        each_line(input, 8, |l| lines.push(l));
        assert_eq!(lines, ["caf\u{fffd}", "xxxxxxxx", "{\"a\": 1}", "no end"]);
    }

    #[test]
    fn stops_at_the_deadline_or_on_cancel_and_a_huge_timeout_is_none() {
        let cancel = AtomicBool::new(false);
        let past = Stop {
            deadline: Some(Instant::now()),
            cancel: &cancel,
        };
        assert_eq!(past.now(), Some(Stopped::Timeout));
        let never = Stop {
            deadline: Instant::now().checked_add(Duration::MAX),
            cancel: &cancel,
        };
        assert_eq!(never.deadline, None);
        assert_eq!(never.now(), None);
        cancel.store(true, Ordering::SeqCst);
        assert_eq!(never.now(), Some(Stopped::Cancelled));
    }

    #[test]
    fn transformers_is_the_mmap_row_except_on_windows() {
        assert_eq!(
            PythonLoader::Transformers.model(Os::Linux),
            model::Loader::TransformersV5Mmap
        );
        assert_eq!(
            PythonLoader::Transformers.model(Os::Windows),
            model::Loader::TransformersV5Pread
        );
        assert_eq!(
            PythonLoader::TransformersPread.model(Os::Linux),
            model::Loader::TransformersV5Pread
        );
    }
}
