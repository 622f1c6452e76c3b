//! Exit statuses and how an error chain is shown.

use std::io::Write;

/// 0: done (or the checks passed); 1: a check ran and failed; 2: an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    Ok,
    CheckFailed,
    Error,
}

impl ExitStatus {
    pub fn code(self) -> i32 {
        match self {
            ExitStatus::Ok => 0,
            ExitStatus::CheckFailed => 1,
            ExitStatus::Error => 2,
        }
    }
}

/// Prints `error: ...` and one `caused by: ...` line per cause. A broken pipe
/// on stdout (`reshard inspect x | head`) is not an error.
pub fn report(err: &anyhow::Error) -> ExitStatus {
    if is_broken_pipe(err) {
        return ExitStatus::Ok;
    }
    // A message is one line of its own: a newline or escape in it comes from
    // a name (a folder, a tensor) and is shown escaped, never raw.
    let shown = |e: &dyn std::fmt::Display| reshard::names::escape(&e.to_string()).into_owned();
    let mut stderr = std::io::stderr().lock();
    let label = super::printer::paint_stderr("error", super::printer::Colour::Bad);
    let _ = writeln!(stderr, "{label}: {}", shown(err));
    for cause in err.chain().skip(1) {
        let _ = writeln!(stderr, "caused by: {}", shown(cause));
    }
    ExitStatus::Error
}

/// Under `--json`: the error as [`report`] shows it on stderr, and as one
/// JSON object on stdout, so that a script reading stdout always gets
/// JSON: `{"error": "...", "causes": ["...", ...], "exit": 2}`.
pub fn report_json(err: &anyhow::Error) -> ExitStatus {
    let status = report(err);
    if is_broken_pipe(err) {
        return status;
    }
    let value = serde_json::json!({
        "error": err.to_string(),
        "causes": err.chain().skip(1).map(|c| c.to_string()).collect::<Vec<_>>(),
        "exit": status.code(),
    });
    let _ = super::printer::json(&value);
    status
}

fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
