//! Writing to stdout: JSON or text, with broken pipes surfaced as errors the
//! exit layer recognises.

use std::io::Write;

use serde::Serialize;

/// Prints `value` as pretty JSON followed by a newline.
pub fn json<T: Serialize>(value: &T) -> anyhow::Result<()> {
    let mut s = serde_json::to_string_pretty(value)?;
    s.push('\n');
    text(&s)
}

/// Prints text as it is.
pub fn text(s: &str) -> anyhow::Result<()> {
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
