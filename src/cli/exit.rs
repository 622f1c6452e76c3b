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
    let _ = writeln!(stderr, "error: {}", shown(err));
    for cause in err.chain().skip(1) {
        let _ = writeln!(stderr, "caused by: {}", shown(cause));
    }
    ExitStatus::Error
}

fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
