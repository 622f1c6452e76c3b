//! `reshard inspect`: what a checkpoint holds and what is wrong with it.

use std::fmt::Write as _;

use anyhow::Context;

use reshard::format;
use reshard::format::layout::{self, LayoutKind};
use reshard::inspect::{tensor_lines, LayoutSummary, Summary, TensorLine};
use reshard::names::escape;
use reshard::units::{group_thousands, human};

use super::{printer, ExitStatus};

mod args;
mod gguf;

pub use self::args::{Args, OrderArg};

#[derive(serde::Serialize)]
struct JsonReport<'a> {
    #[serde(flatten)]
    summary: &'a Summary,
    #[serde(skip_serializing_if = "Option::is_none")]
    tensors: Option<Vec<TensorLine>>,
}

pub fn run(args: Args) -> anyhow::Result<ExitStatus> {
    if reshard::format::gguf::is_gguf_path(&args.path) && args.path.is_file() {
        return gguf::run(&args);
    }
    if let Some(status) = run_layout(&args)? {
        return Ok(status);
    }
    let ck = format::open(&args.path)
        .with_context(|| format!("cannot inspect {}", args.path.display()))?;
    let summary = Summary::of(&args.path.display().to_string(), &ck);
    let lines = args.tensors.then(|| tensor_lines(&ck, args.order.into()));
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
        printer::text(&render_summary(&summary))?;
    }
    let failed = args.strict && !summary.findings.is_empty();
    Ok(if failed {
        ExitStatus::CheckFailed
    } else {
        ExitStatus::Ok
    })
}

/// A folder of several weight sets (or whose root holds none): one
/// summary per set and the total. `None` for a plain model or a file,
/// which `run` reports as it always has.
fn run_layout(args: &Args) -> anyhow::Result<Option<ExitStatus>> {
    if args.tensors || !args.path.is_dir() {
        return Ok(None);
    }
    let layout = layout::detect(&args.path)
        .with_context(|| format!("cannot inspect {}", args.path.display()))?;
    if layout.kind == LayoutKind::Model && layout.sets.len() == 1 {
        return Ok(None);
    }
    let s = LayoutSummary::of(&args.path.display().to_string(), &layout)
        .with_context(|| format!("cannot inspect {}", args.path.display()))?;
    if args.print.json {
        printer::json(&s)?;
    } else if args.quiet {
        let mut o = String::new();
        for c in &s.components {
            let path = match c.path.as_str() {
                "." => s.path.clone(),
                rel => format!("{}/{rel}", s.path.trim_end_matches('/')),
            };
            o.push_str(&printer::findings_only(&path, &c.summary.findings));
        }
        printer::text(&o)?;
    } else {
        let mut o = format!("{}: {}\n", escape(&s.path), s.kind.describe());
        for note in &s.notes {
            let _ = writeln!(o, "  note: {note}");
        }
        for c in &s.components {
            let _ = writeln!(
                o,
                "\n[{}] (loaded by {})",
                escape(&c.path),
                c.library.name()
            );
            o.push_str(&render_summary(&c.summary));
        }
        let t = &s.total;
        let _ = writeln!(
            o,
            "\ntotal: {} weight sets, {} tensors, {} parameters, {} ({} bytes), {} findings",
            t.weight_sets,
            t.tensor_count,
            group_thousands(t.parameter_count),
            human(t.total_bytes),
            t.total_bytes,
            t.findings
        );
        if let Some(f) = &t.largest_file {
            let _ = writeln!(o, "  largest file  {}  {}", escape(&f.name), human(f.bytes));
        }
        if let Some(f) = &t.largest_tensor {
            let _ = writeln!(
                o,
                "  largest tensor {}  {}",
                escape(&f.name),
                human(f.bytes)
            );
        }
        printer::text(&o)?;
    }
    Ok(Some(if args.strict && s.total.findings > 0 {
        ExitStatus::CheckFailed
    } else {
        ExitStatus::Ok
    }))
}

fn render_summary(s: &Summary) -> String {
    let mut o = String::new();
    let layout = match &s.layout {
        format::Layout::Single => "single file".to_string(),
        format::Layout::Loose => format!("{} loose shards, no index", s.files.len()),
        format::Layout::Indexed { index } => format!(
            "{} shard{} + {}",
            s.files.len(),
            if s.files.len() == 1 { "" } else { "s" },
            index
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        ),
    };
    let _ = writeln!(o, "{}", escape(&s.path));
    let _ = writeln!(o, "  format        {} ({layout})", s.format);
    for f in &s.files {
        let _ = writeln!(o, "  file          {}  {}", escape(&f.name), human(f.size));
    }
    let _ = writeln!(o, "  tensors       {}", s.tensor_count);
    let _ = writeln!(o, "  parameters    {}", group_thousands(s.parameter_count));
    let _ = writeln!(
        o,
        "  tensor bytes  {} ({} bytes)",
        human(s.total_bytes),
        s.total_bytes
    );
    for (dtype, bytes) in &s.bytes_per_dtype {
        let _ = writeln!(o, "    {dtype:<10}  {}", human(*bytes));
    }
    if let Some(t) = &s.largest_tensor {
        let _ = writeln!(
            o,
            "  largest tensor {}  {}",
            escape(&t.name),
            human(t.bytes)
        );
    }
    if let Some(f) = &s.largest_file {
        let _ = writeln!(o, "  largest file  {}  {}", escape(&f.name), human(f.bytes));
    }
    if s.blocks.count > 0 {
        let _ = writeln!(
            o,
            "  blocks        {} numbered, {} to {} each (largest {})",
            s.blocks.count,
            human(s.blocks.min_bytes),
            human(s.blocks.max_bytes),
            escape(s.blocks.largest.as_deref().unwrap_or("-"))
        );
    } else {
        let _ = writeln!(o, "  blocks        none numbered");
    }
    if let Some(q) = &s.quantization {
        let _ = writeln!(
            o,
            "  quantized     {}: {} weights ({} with scales), {} scales, {} companions (activation scales, comfy_quant, markers)",
            q.format, q.weights, q.scaled, q.scales, q.extras
        );
    }
    printer::findings(&mut o, &s.findings);
    o
}

fn render_tensors(lines: &[TensorLine]) -> String {
    let mut o = String::new();
    for t in lines {
        let shape = t
            .shape
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        let _ = writeln!(
            o,
            "{}  {}  [{}]  {}  {}@{}",
            escape(&t.name),
            t.dtype,
            shape,
            human(t.bytes),
            escape(&t.file),
            t.offset
        );
    }
    o
}
