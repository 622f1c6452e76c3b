//! `reshard inspect` of a `.gguf` file or split-set member: the summary of
//! [`reshard::inspect::gguf`], as text or JSON.

use std::fmt::Write as _;

use anyhow::Context;

use reshard::format::gguf;
use reshard::inspect::gguf::{tensor_lines, GgufSummary, GgufTensorLine};
use reshard::names::escape;
use reshard::units::human;

use super::args::Args;
use crate::cli::exit::ExitStatus;
use crate::cli::printer;
use reshard::units::group_thousands;

#[derive(serde::Serialize)]
struct JsonReport<'a> {
    #[serde(flatten)]
    summary: &'a GgufSummary,
    #[serde(skip_serializing_if = "Option::is_none")]
    tensors: Option<Vec<GgufTensorLine>>,
}

pub fn run(args: &Args) -> anyhow::Result<ExitStatus> {
    let model = gguf::open_set(&args.path)
        .with_context(|| format!("cannot inspect {}", args.path.display()))?;
    let summary = GgufSummary::of(&args.path.display().to_string(), &model);
    let lines = args.tensors.then(|| tensor_lines(&model));
    if args.print.json {
        printer::json(&JsonReport {
            summary: &summary,
            tensors: lines,
        })?;
    } else if let Some(lines) = &lines {
        printer::text(&render_tensors(lines))?;
    } else if args.quiet {
        printer::text(&printer::findings_only(&summary.path, &summary.findings))?;
    } else {
        printer::text(&render(&summary))?;
    }
    Ok(if args.strict && !summary.findings.is_empty() {
        ExitStatus::CheckFailed
    } else {
        ExitStatus::Ok
    })
}

/// Keys the text summary lists; ComfyUI-GGUF files carry one
/// `comfy.gguf.orig_shape.*` key per reshaped tensor.
const SHOW_KEYS: usize = 100;

fn render(s: &GgufSummary) -> String {
    let mut o = String::new();
    let layout = match &s.split {
        None => "single file".to_string(),
        Some(set) => format!(
            "split set of {}: {}",
            set.count,
            escape(&gguf::split::member_name(&set.prefix, 0, set.count))
                .replace("00001-of", "NNNNN-of")
        ),
    };
    let _ = writeln!(o, "{}", escape(&s.path));
    let _ = writeln!(o, "  format        gguf v{} ({layout})", s.version);
    let arch = s.architecture.as_deref().unwrap_or("-");
    let _ = writeln!(o, "  architecture  {}", escape(arch));
    if let Some(name) = &s.name {
        let _ = writeln!(o, "  name          {}", escape(name));
    }
    for f in &s.files {
        let _ = writeln!(
            o,
            "  file          {}  {}  ({} tensor{}, alignment {})",
            escape(&f.name),
            human(f.size),
            f.tensors,
            if f.tensors == 1 { "" } else { "s" },
            f.alignment
        );
    }
    let _ = writeln!(o, "  tensors       {}", s.tensor_count);
    let _ = writeln!(o, "  parameters    {}", group_thousands(s.parameter_count));
    let _ = writeln!(
        o,
        "  tensor bytes  {} ({} bytes)",
        human(s.total_bytes),
        s.total_bytes
    );
    for (ty, t) in &s.types {
        let _ = writeln!(
            o,
            "    {ty:<10}  {:>5} tensor{}  {}{}",
            t.tensors,
            if t.tensors == 1 { " " } else { "s" },
            human(t.bytes),
            if t.dequantizable {
                ""
            } else {
                "  (cannot be dequantized)"
            }
        );
    }
    if let Some(t) = &s.largest_tensor {
        let _ = writeln!(
            o,
            "  largest tensor {}  {}",
            escape(&t.name),
            human(t.bytes)
        );
    }
    let _ = writeln!(o, "  metadata      {} keys", s.metadata.len());
    for m in s.metadata.iter().take(SHOW_KEYS) {
        let _ = writeln!(o, "    {} = {}", escape(&m.key), m.value);
    }
    if s.metadata.len() > SHOW_KEYS {
        let _ = writeln!(
            o,
            "    ... {} more (--json lists every key)",
            s.metadata.len() - SHOW_KEYS
        );
    }
    printer::findings(&mut o, &s.findings);
    o
}

fn render_tensors(lines: &[GgufTensorLine]) -> String {
    let mut o = String::new();
    for t in lines {
        let shape: Vec<String> = t.shape.iter().map(u64::to_string).collect();
        let _ = writeln!(
            o,
            "{}  {}  [{}]  {}  {}@{}",
            escape(&t.name),
            t.ggml_type,
            shape.join(", "),
            t.bytes.map_or_else(|| "?".into(), human),
            escape(&t.file),
            t.offset
        );
    }
    o
}
