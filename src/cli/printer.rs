//! Writing to stdout: JSON or text, with broken pipes surfaced as errors the
//! exit layer recognises. [`Printer`] is the one place a command's result
//! becomes output: JSON under `--json`, its rendered text otherwise.

use std::io::Write;

use serde::Serialize;

/// Prints `value` as pretty JSON followed by a newline. JSON escapes its
/// own control characters inside strings, so it is written as it is.
pub fn json<T: Serialize>(value: &T) -> anyhow::Result<()> {
    let mut s = serde_json::to_string_pretty(value)?;
    s.push('\n');
    raw(&s)
}

/// Prints rendered text, control characters other than its line breaks
/// escaped (`names::escape_text`): a name read from disk holding a terminal
/// escape never reaches the terminal raw, whichever renderer forgot it.
pub fn text(s: &str) -> anyhow::Result<()> {
    raw(&reshard::names::escape_text(s))
}

/// Prints machine output (JSON lines) as it is.
pub fn raw(s: &str) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(s.as_bytes())?;
    out.flush()?;
    Ok(())
}

/// Appends inspect's findings block to `o`: `findings      none`, or the
/// count and one `- finding` line each.
pub fn findings<T: std::fmt::Display>(o: &mut String, findings: &[T]) {
    use std::fmt::Write as _;
    if findings.is_empty() {
        let _ = writeln!(o, "  findings      none");
        return;
    }
    let _ = writeln!(o, "  findings      {}", findings.len());
    for f in findings {
        let _ = writeln!(o, "    - {f}");
    }
}

/// How a command prints its result.
#[derive(Debug, Clone, Copy)]
pub struct Printer {
    json: bool,
}

impl Printer {
    /// `json`: the command's `--json`.
    pub fn new(json: bool) -> Printer {
        Printer { json }
    }

    /// Prints `value` as JSON under `--json`, else the text `render`
    /// makes of it (rendered only when it is printed).
    pub fn result<T: Serialize>(
        &self,
        value: &T,
        render: impl FnOnce() -> String,
    ) -> anyhow::Result<()> {
        if self.json {
            json(value)
        } else {
            text(&render())
        }
    }
}

/// The output flags every command shares.
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct OutputArgs {
    /// Print the result as JSON on stdout instead of text: every figure in
    /// bytes, stable field names.
    #[arg(long)]
    pub json: bool,
}

impl OutputArgs {
    /// The printer these flags ask for.
    pub fn printer(&self) -> Printer {
        Printer::new(self.json)
    }
}
