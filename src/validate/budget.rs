//! Enforcing a commit budget for real: the load runs in a child process
//! whose `RLIMIT_DATA` is its own baseline plus the budget, so an allocation
//! or copy-on-write mapping past the budget fails with ENOMEM, which the
//! loaders turn into a [`Failure::OverBudget`], instead of swapping.
//!
//! The parent re-executes the current binary with the hidden subcommand
//! [`CHILD_SUBCOMMAND`] and the arguments as JSON in [`CHILD_ENV`]; the child
//! opens the checkpoint and the device, takes its baseline (`VmData`), sets
//! the limit on itself, loads, lifts the limit and prints its report as JSON
//! on stdout. An allocation that fails where Rust cannot report it (an
//! infallible path) aborts the child; the parent reports that as
//! [`Failure::Stopped`].
//!
//! The binary that calls [`validate_with_budget`] must route
//! `CHILD_SUBCOMMAND` to [`child_main`]; the `reshard` binary does.
//!
//! The limit is [`crate::platform::CommitLimit`]: `RLIMIT_DATA` on Unix, a
//! Job Object with a process memory limit on Windows. Right after setting
//! it the child asks the system to commit more than the limit allows
//! ([`crate::platform::CommitLimit::refuses`]) and reports whether it was
//! refused: Wine accepts the Job Object limit but does not enforce it, and
//! there validate says so; a peak over the budget is still a failure, judged
//! from the measured figure.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde::{Deserialize, Serialize};

use super::error::ValidateError;
use super::ledger::CommitLedger;
use super::load::{self, validate};
use super::options::{Progress, ValidateOptions};
use super::relay;
use super::report::{Failure, ValidateReport};

/// The hidden subcommand the child runs under.
pub const CHILD_SUBCOMMAND: &str = "__validate-child";
/// The environment variable that carries the child's arguments as JSON.
pub const CHILD_ENV: &str = "RESHARD_VALIDATE_CHILD";

#[derive(Debug, Serialize, Deserialize)]
struct ChildArgs {
    path: PathBuf,
    options: ValidateOptions,
    /// Whether the child relays its progress ([`super::relay`]): the
    /// parent has a bar to draw.
    #[serde(default)]
    progress: bool,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
enum ChildOutcome {
    Report(Box<ValidateReport>),
    Error { chain: Vec<String> },
}

/// Validates `path` with `options.commit_budget` enforced in a child
/// process (without a budget, the same as [`validate`]).
pub fn validate_with_budget(
    path: &Path,
    options: &ValidateOptions,
) -> Result<ValidateReport, ValidateError> {
    let Some(budget) = options.commit_budget else {
        return validate(path, options);
    };
    let exe = std::env::current_exe().map_err(|e| ValidateError::Io {
        what: "find the current executable".into(),
        source: e,
    })?;
    let args = ChildArgs {
        path: path.to_path_buf(),
        options: options.clone(),
        progress: options.progress.is_some(),
    };
    let json = serde_json::to_string(&args).map_err(|e| ValidateError::Child {
        reason: e.to_string(),
    })?;
    let child = Command::new(&exe)
        .arg(CHILD_SUBCOMMAND)
        .env(CHILD_ENV, json)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| ValidateError::Io {
            what: format!("start {}", exe.display()),
            source: e,
        })?;
    let output = wait_or_cancel(child, options).map_err(|e| match e {
        Some(e) => ValidateError::Io {
            what: format!("wait for {}", exe.display()),
            source: e,
        },
        None => ValidateError::Interrupted {
            path: path.to_path_buf(),
        },
    })?;
    interpret(path, options, budget, &output)
}

/// How often the wait for the budget child looks at the cancel flag.
const CANCEL_POLL: std::time::Duration = std::time::Duration::from_millis(50);

/// The child's output once it exits; `Err(None)` when the cancel flag is
/// set first (the child is killed then: Ctrl-C reaches it too from a
/// terminal, but not a signal sent to reshard alone).
fn wait_or_cancel(
    mut child: std::process::Child,
    options: &ValidateOptions,
) -> Result<std::process::Output, Option<std::io::Error>> {
    let stdout = child.stdout.take();
    let stdout = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        if let Some(mut p) = stdout {
            let _ = std::io::Read::read_to_end(&mut p, &mut bytes);
        }
        bytes
    });
    let (events, relayed) = std::sync::mpsc::channel();
    let stderr = child.stderr.take();
    let stderr = std::thread::spawn(move || match stderr {
        Some(p) => relay::split_stderr(p, events),
        None => Vec::new(),
    });
    let status = loop {
        relay::replay_pending(&relayed, &options.progress);
        if let Some(status) = child.try_wait().map_err(Some)? {
            break status;
        }
        if options.cancel.is_set() {
            let _ = child.kill();
            let _ = child.wait();
            return Err(None);
        }
        std::thread::sleep(CANCEL_POLL);
    };
    let output = std::process::Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    };
    relay::replay_pending(&relayed, &options.progress);
    Ok(output)
}

/// Turns what the child printed and how it ended into the outcome.
fn interpret(
    path: &Path,
    options: &ValidateOptions,
    budget: u64,
    output: &std::process::Output,
) -> Result<ValidateReport, ValidateError> {
    match serde_json::from_slice::<ChildOutcome>(&output.stdout) {
        Ok(ChildOutcome::Report(report)) => return Ok(*report),
        Ok(ChildOutcome::Error { chain }) => {
            return Err(ValidateError::Child {
                reason: chain.join(": "),
            })
        }
        Err(_) => {}
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    let last = stderr
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim()
        .to_string();
    if let Some(how) = crate::platform::abnormal_exit(&output.status) {
        let mut report = ValidateReport::new(path, options);
        let detail = if last.is_empty() {
            how
        } else {
            format!("{how}; {last}")
        };
        report.fail(Failure::Stopped { budget, detail });
        report.finish(options);
        return Ok(report);
    }
    Err(ValidateError::Child {
        reason: format!("the budget child exited with {}: {last}", output.status),
    })
}

/// The child's entry point: runs the validation its environment describes
/// under the budget and returns the outcome as the one line of JSON the
/// parent reads from the child's stdout (the binary prints it).
#[must_use = "the caller prints it: the parent reads it from the child's stdout"]
pub fn child_main() -> String {
    let outcome = match child_run() {
        Ok(report) => ChildOutcome::Report(Box::new(report)),
        Err(e) => {
            let mut chain = vec![e.to_string()];
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                chain.push(s.to_string());
                source = s.source();
            }
            ChildOutcome::Error { chain }
        }
    };
    serde_json::to_string(&outcome).unwrap_or_else(|_| "{}".into())
}

fn child_run() -> Result<ValidateReport, ValidateError> {
    let text = std::env::var(CHILD_ENV).map_err(|_| ValidateError::Child {
        reason: format!("{CHILD_ENV} is not set"),
    })?;
    let mut args: ChildArgs = serde_json::from_str(&text).map_err(|e| ValidateError::Child {
        reason: format!("bad {CHILD_ENV}: {e}"),
    })?;
    if args.progress {
        args.options.progress =
            Progress::new(std::sync::Arc::new(relay::StderrReporter::default()));
    }
    let budget = args.options.commit_budget.unwrap_or(u64::MAX);
    let mut ledger = CommitLedger::start();
    let mut limit = None;
    let mut enforced = None;
    let result = load::run(&args.path, &args.options, &mut ledger, |ledger| {
        ledger.rebase();
        let total = ledger.baseline().saturating_add(budget);
        let set = crate::platform::CommitLimit::set(total).map_err(|e| ValidateError::Io {
            what: format!("limit this process's commit to {total} bytes"),
            source: e,
        })?;
        // The process already holds its baseline, so committing the whole
        // budget again must pass the limit.
        let probe = usize::try_from(budget.saturating_add(ENFORCEMENT_PROBE_SLACK));
        enforced = Some(set.refuses(probe.unwrap_or(usize::MAX)));
        limit = Some(set);
        Ok(())
    });
    // Lift the limit before the report is built and printed.
    drop(limit);
    result.map(|mut report| {
        report.commit_budget_enforced = enforced;
        report
    })
}

/// How far past the limit the enforcement probe reaches, so the answer does
/// not hang on a page or two of rounding.
const ENFORCEMENT_PROBE_SLACK: u64 = 16 << 20;

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;
    use std::process::{ExitStatus, Output};

    fn output(status: ExitStatus, stdout: &str, stderr: &str) -> Output {
        Output {
            status,
            stdout: stdout.as_bytes().to_vec(),
            stderr: stderr.as_bytes().to_vec(),
        }
    }

    #[test]
    fn a_child_killed_by_its_allocation_failure_is_a_failed_check() {
        let options = ValidateOptions {
            commit_budget: Some(1 << 20),
            ..ValidateOptions::default()
        };
        // SIGABRT after Rust's "memory allocation of N bytes failed".
        let out = output(
            ExitStatus::from_raw(6),
            "",
            "memory allocation of 4096 bytes failed\n",
        );
        let report = interpret(Path::new("m"), &options, 1 << 20, &out).unwrap();
        assert!(!report.passed);
        let text = report.failures[0].to_string();
        assert!(
            text.starts_with("over budget (the process was stopped by its allocation failure"),
            "{text}"
        );
        assert!(
            text.contains("memory allocation of 4096 bytes failed"),
            "{text}"
        );
    }

    #[test]
    fn a_child_report_or_error_passes_through() {
        let options = ValidateOptions::default();
        let mut sent = ValidateReport::new(Path::new("m"), &options);
        sent.passed = true;
        let json = serde_json::to_string(&ChildOutcome::Report(Box::new(sent.clone()))).unwrap();
        let got = interpret(
            Path::new("m"),
            &options,
            1,
            &output(ExitStatus::from_raw(0), &json, ""),
        )
        .unwrap();
        assert_eq!(got, sent);
        let json = serde_json::to_string(&ChildOutcome::Error {
            chain: vec!["no CUDA driver found".into()],
        })
        .unwrap();
        let err = interpret(
            Path::new("m"),
            &options,
            1,
            &output(ExitStatus::from_raw(0), &json, ""),
        )
        .unwrap_err();
        assert!(err.to_string().contains("no CUDA driver found"));
        // Exit 101 (a panic) is an error, not a verdict.
        let err = interpret(
            Path::new("m"),
            &options,
            1,
            &output(ExitStatus::from_raw(101 << 8), "", "panicked"),
        )
        .unwrap_err();
        assert!(matches!(err, ValidateError::Child { .. }));
    }
}
