//! The text `convert` prints: the plan of `--dry-run` and the summary of a
//! run.

use std::fmt::Write as _;

use reshard::convert::ConvertSummary;
use reshard::names::escape;
use reshard::plan::Plan;
use reshard::units::human;

use crate::cli::printer::plural;

pub fn render_plan(plan: &Plan, window: u64) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "plan: {} {}, {} of tensors, {} tensors",
        plan.shards.len(),
        plural(plan.shards.len(), "shard", "shards"),
        human(plan.total_size),
        plan.layer_order.len()
    );
    for s in &plan.shards {
        let blocks = match (&s.first_block, &s.last_block) {
            (Some(a), Some(b)) if a == b => escape(a).into_owned(),
            (Some(a), Some(b)) => format!("{} .. {}", escape(a), escape(b)),
            _ => "-".into(),
        };
        let _ = writeln!(
            o,
            "  {}  {:>10}  {:>4} {:<7}  {blocks}",
            s.file,
            human(s.data_len),
            s.tensors.len(),
            plural(s.tensors.len(), "tensor", "tensors")
        );
    }
    if let Some(index) = &plan.index_file {
        let _ = writeln!(o, "  {index}");
    }
    for c in &plan.casts {
        let _ = writeln!(
            o,
            "cast {} -> {}: {} tensors, {} -> {}",
            c.from,
            c.to,
            c.tensors,
            human(c.bytes_before),
            human(c.bytes_after)
        );
    }
    if let Some(g) = &plan.gguf {
        render_gguf(&mut o, plan, g);
    }
    if let Some(q) = &plan.quantized {
        render_quantized(&mut o, q);
    }
    if let Some(g) = &plan.gguf_out {
        render_gguf_out(&mut o, plan, g, verbose_types(plan));
    }
    for t in &plan.oversized {
        let _ = writeln!(o, "oversized: {} is {}, larger than --max-shard-size; it gets {} alone and sets the floor of every loader's peak", escape(&t.tensor), human(t.bytes), t.file);
    }
    for d in &plan.dropped {
        let _ = writeln!(
            o,
            "dropped tied name {} (same bytes as {})",
            escape(&d.tensor),
            escape(&d.same_as)
        );
    }
    let _ = writeln!(
        o,
        "peak memory: at most {} of buffers (--window) plus a small fixed overhead",
        human(window)
    );
    o
}

/// Whether a GGUF plan lists every tensor's type (small models) or only
/// the totals.
fn verbose_types(plan: &Plan) -> bool {
    plan.layer_order.len() <= 64
}

/// A GGUF output: its architecture, the types chosen and their bytes,
/// the fallbacks and what is left out.
fn render_gguf_out(o: &mut String, plan: &Plan, g: &reshard::plan::gguf_out::GgufOut, each: bool) {
    let _ = writeln!(
        o,
        "gguf: architecture {} ({}), {} metadata keys, alignment {}",
        g.architecture,
        g.kind,
        g.kv.0.len(),
        g.alignment
    );
    for t in &g.types {
        let _ = writeln!(
            o,
            "  {:<6} {:>5} {:<7}  {:>10}",
            t.ggml.to_string(),
            t.tensors,
            plural(t.tensors, "tensor", "tensors"),
            human(t.bytes)
        );
    }
    if each {
        for t in plan.tensors() {
            let ty = reshard::write::gguf::ggml_type(t).map_or("?".into(), |g| g.to_string());
            let _ = writeln!(o, "  {:<6} {}  {:?}", ty, escape(&t.name), t.shape);
        }
    }
    for f in &g.fallbacks {
        let _ = writeln!(
            o,
            "fallback: {} is {} instead of {}: {}",
            escape(&f.tensor),
            f.written,
            f.wanted,
            f.why
        );
    }
    if !g.left_out.is_empty() {
        let _ = writeln!(
            o,
            "left out: {} tensors outside the diffusion model's wrapper (first: {})",
            g.left_out.len(),
            escape(&g.left_out[0])
        );
    }
}

/// `--quantize`: what is quantized, what is kept and why.
fn render_quantized(o: &mut String, q: &reshard::plan::quantize::QuantizeRecord) {
    let _ = writeln!(
        o,
        "quantize {} ({}): {} Linear weights, {} -> {}",
        q.scheme.name(),
        q.dtype,
        q.tensors,
        human(q.bytes_before),
        human(q.bytes_after)
    );
    let _ = writeln!(
        o,
        "kept: {} tensors that are not Linear weights of blocks (norms, biases, 1-D, tiny), {} more:",
        q.not_linear,
        q.kept.len()
    );
    for k in &q.kept {
        let _ = writeln!(o, "  {}  ({})", escape(&k.tensor), k.because.describe());
    }
    if let Some(warning) = nothing_quantized(q.scheme, q.tensors) {
        let _ = writeln!(o, "{warning}");
    }
}

/// The warning for a `--quantize` that quantizes nothing (`--keep '*'`, a
/// `--quantize-only` that matches no Linear weight): the output is then
/// an unquantized copy, which the user did not ask for.
pub(super) fn nothing_quantized(
    scheme: reshard::plan::quantize::QuantizeScheme,
    tensors: usize,
) -> Option<String> {
    (tensors == 0).then(|| {
        format!(
            "warning: --quantize {} quantizes no weight: --keep, --quantize-only and the keep rules leave none of the model's Linear weights; the output is not quantized and carries no quantization_config",
            scheme.name()
        )
    })
}

/// A GGUF source: what each GGML type becomes, the names and rows.
fn render_gguf(o: &mut String, plan: &Plan, g: &reshard::plan::GgufRecord) {
    use std::collections::BTreeMap;
    let sizes: BTreeMap<&str, (reshard::format::Dtype, u64)> = plan
        .tensors()
        .map(|t| (t.name.as_str(), (t.dtype, t.len)))
        .collect();
    // (GGML type, output dtype) -> (tensors, output bytes)
    let mut by_type: BTreeMap<(String, String), (usize, u64)> = BTreeMap::new();
    for t in &g.tensors {
        let Some(&(dtype, len)) = sizes.get(t.tensor.as_str()) else {
            continue;
        };
        let entry = by_type
            .entry((t.from.to_string(), dtype.to_string()))
            .or_default();
        entry.0 += 1;
        entry.1 += len;
    }
    for ((from, to), (n, bytes)) in &by_type {
        let _ = writeln!(
            o,
            "from GGUF {from} -> {to}: {n} tensors, {}",
            human(*bytes)
        );
    }
    let unpermuted = g
        .tensors
        .iter()
        .filter(|t| t.unpermuted_heads.is_some())
        .count();
    if g.hf_names {
        let _ = writeln!(
            o,
            "names: transformers' ({}), q/k rows of {unpermuted} tensors put back; config.json and the tokenizer are made from the header",
            g.architecture.as_deref().unwrap_or("?")
        );
    } else {
        let _ = writeln!(o, "names: kept as in {}", g.file);
    }
    for name in &g.skipped {
        let _ = writeln!(o, "not written: {} (llama.cpp's own)", escape(name));
    }
}

pub fn render_summary(s: &ConvertSummary, verbose: bool) -> String {
    let mut o = String::new();
    if s.up_to_date && s.refreshed_files.is_empty() {
        let _ = writeln!(
            o,
            "{} is up to date ({} {}); nothing written",
            escape(&s.dst),
            s.shards,
            plural(s.shards, "shard", "shards")
        );
        return o;
    }
    if s.up_to_date {
        let names: Vec<_> = s.refreshed_files.iter().map(|n| escape(n)).collect();
        let _ = writeln!(
            o,
            "{} is up to date ({} {}); refreshed {} file{} changed in the source: {}",
            escape(&s.dst),
            s.shards,
            plural(s.shards, "shard", "shards"),
            names.len(),
            if names.len() == 1 { "" } else { "s" },
            names.join(", ")
        );
        return o;
    }
    if s.shards == 0 {
        let _ = writeln!(
            o,
            "copied {} files to {} (no weights in this folder)",
            s.manifest.copied_files.len(),
            escape(&s.dst)
        );
        return o;
    }
    let rate = human((s.bytes_read as f64 / s.seconds.max(1e-9)) as u64);
    let _ = writeln!(
        o,
        "wrote {} shard{} ({}) to {} in {:.2} s ({rate}/s), buffers peaked at {} of a {} window",
        s.shards,
        if s.shards == 1 { "" } else { "s" },
        human(s.bytes_written),
        escape(&s.dst),
        s.seconds,
        human(s.peak_buffer_bytes),
        human(s.window)
    );
    if let Some(q) = &s.manifest.quantized {
        let _ = writeln!(
            o,
            "quantized {} weight{} ({}): {} -> {}, {} saved",
            q.tensors,
            if q.tensors == 1 { "" } else { "s" },
            q.scheme.name(),
            human(q.bytes_before),
            human(q.bytes_after),
            human(q.bytes_before.saturating_sub(q.bytes_after))
        );
        o.push_str(&crate::cli::quality::render_quality(&q.quality));
    }
    if s.resumed_shards > 0 {
        let _ = writeln!(
            o,
            "resumed: kept {} {} an earlier run had finished",
            s.resumed_shards,
            plural(s.resumed_shards, "shard", "shards")
        );
    }
    for sh in &s.manifest.shards {
        if verbose {
            let _ = writeln!(o, "  {}  {}  {}", sh.file, human(sh.size), sh.digest);
        }
        for t in &sh.tensors {
            if let Some(c) = &t.cast {
                let st = &c.stats;
                if st.overflow + st.underflow + st.nan > 0 {
                    let _ = writeln!(
                        o,
                        "  {}: {} -> {}: {} overflowed, {} underflowed to zero, {} NaN",
                        escape(&t.name),
                        c.from,
                        c.to,
                        st.overflow,
                        st.underflow,
                        st.nan
                    );
                }
            }
        }
    }
    for t in &s.manifest.oversized {
        let _ = writeln!(
            o,
            "note: {} ({}) is larger than --max-shard-size and sits alone in {}",
            escape(&t.tensor),
            human(t.bytes),
            t.file
        );
    }
    o
}
