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

/// `one` when `n` is 1, else `many`: "1 shard", "2 shards", "0 shards".
pub fn plural<'a>(n: impl TryInto<u64>, one: &'a str, many: &'a str) -> &'a str {
    if n.try_into().ok() == Some(1) {
        one
    } else {
        many
    }
}

/// inspect's `-q`: one `PATH: finding` line per finding.
pub fn findings_only<T: std::fmt::Display>(path: &str, findings: &[T]) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    for f in findings {
        let _ = writeln!(o, "{}: {f}", reshard::names::escape(path));
    }
    o
}

/// A colour for a verdict or an error label.
#[derive(Debug, Clone, Copy)]
pub enum Colour {
    Good,
    Bad,
}

/// Whether to colour what goes to `stream`: it is a terminal, and neither
/// `NO_COLOR` (any non-empty value, <https://no-color.org>) nor
/// `TERM=dumb` asks for plain text.
fn colour_on(stream: &impl std::io::IsTerminal) -> bool {
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    let dumb = std::env::var_os("TERM").is_some_and(|t| t == "dumb");
    stream.is_terminal() && !no_color && !dumb
}

fn paint_if(on: bool, s: &str, c: Colour) -> String {
    if !on {
        return s.to_string();
    }
    let code = match c {
        Colour::Good => "32",
        Colour::Bad => "31",
    };
    format!("\x1b[1;{code}m{s}\x1b[0m")
}

/// `s` in colour `c` when stdout takes colour ([`colour_on`]).
pub fn paint(s: &str, c: Colour) -> String {
    paint_if(colour_on(&std::io::stdout()), s, c)
}

/// `s` in colour `c` when stderr takes colour ([`colour_on`]).
pub fn paint_stderr(s: &str, c: Colour) -> String {
    paint_if(colour_on(&std::io::stderr()), s, c)
}
