//! `reshard fit --for PROGRAM`: the forms that program loads, judged on the
//! machine and ranked best first, and the command that writes the best.
//! Renders a [`MakeFit`]; the planning lives in `reshard::fit::make`.

use std::fmt::Write as _;

use anyhow::Context;

use reshard::fit::make::{Candidate, MakeFit, Placement};
use reshard::fit::program::Form;
use reshard::names::escape;
use reshard::units::human;

/// The names `--for` accepts (the programs of the crate's table).
fn program_names() -> Vec<&'static str> {
    reshard::fit::program::programs()
        .iter()
        .map(|p| p.name.as_str())
        .collect()
}

/// Parses `--for`.
pub fn parse_program(s: &str) -> Result<String, String> {
    match reshard::fit::program::program(s) {
        Some(p) => Ok(p.name.clone()),
        None => Err(format!(
            "unknown program; choose one of: {}",
            program_names().join(", ")
        )),
    }
}

pub fn render(path: &str, r: &MakeFit) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "{} for {}:", escape(path), r.program);
    match r.vram_budget {
        Some(v) => {
            let _ = writeln!(
                o,
                "  VRAM for weights: {} of {} ({} rule, activation reserve {})",
                human(v),
                human(r.budget.vram_bytes.unwrap_or(0)),
                reshard::fit::program::program(&r.program).map_or("plain".into(), |p| format!(
                    "{:?}",
                    p.vram
                )
                .to_lowercase()),
                human(r.reserve)
            );
        }
        None => {
            let _ = writeln!(o, "  no GPU given (--vram): weights stay in host memory");
        }
    }
    let _ = writeln!(o, "  host budget: {}", human(r.budget.host_bytes));
    let _ = writeln!(
        o,
        "  {:<19} {:>6} {:>8} {:>11} {:>11} {:>11}  placement",
        "form", "bits", "error", "file", "VRAM", "host"
    );
    for c in &r.candidates {
        let _ = writeln!(
            o,
            "  {} {:<17} {:>6.2} {:>8} {:>11} {:>11} {:>11}  {}",
            if c.fits { "+" } else { "-" },
            c.form.name(),
            c.bits_per_weight,
            error(c),
            human(c.file_bytes),
            human(c.vram_weights),
            human(c.host.host_needed),
            placement(c)
        );
    }
    let sampled = r
        .candidates
        .iter()
        .map(|c| c.sampled_fraction)
        .fold(0.0, f64::max);
    if sampled > 0.0 {
        let _ = writeln!(
            o,
            "  error: relative RMS estimated on {} of the weights each form changes{}",
            share(sampled),
            if r.candidates.iter().any(|c| error(c) == "n/a") {
                " (n/a: every sampled value is zero)"
            } else {
                ""
            }
        );
    }
    for c in &r.candidates {
        render_not_finite(&mut o, c);
    }
    for f in &r.refused {
        let _ = writeln!(o, "  (not offered: {}: {})", f.form.name(), f.reason);
    }
    match r.best() {
        Some(best) => {
            let _ = writeln!(o, "best: {} ({})", best.form.name(), placement(best));
            match &best.command {
                Some(c) => {
                    let _ = writeln!(o, "  {c}");
                }
                None => {
                    let _ = writeln!(o, "  nothing to convert: load it as it is");
                }
            }
            if let (Placement::Offload { blocks_on_gpu, .. }, "llama.cpp") =
                (&best.placement, r.program.as_str())
            {
                let _ = writeln!(o, "  run it with --n-gpu-layers {blocks_on_gpu}");
            } else if let Some(v) = r
                .vram_budget
                .filter(|_| matches!(best.placement, Placement::Offload { .. }))
            {
                let _ = writeln!(
                    o,
                    "  placement: --device-map FILE writes it; max_memory {{0: {v}, \"cpu\": {}}}",
                    r.budget.host_bytes
                );
            }
        }
        None => {
            let _ = writeln!(o, "nothing {} reads fits this machine", r.program);
            if let Some(m) = &r.smallest_machine {
                let _ = writeln!(o, "  {}", m.describe());
            }
        }
    }
    o
}

/// Writes the best candidate's `device_map` to `file` (which must not
/// exist: it is the user's path, and nothing there is reshard's to
/// replace).
/// The device_map may not land on or in the checkpoint being judged: a
/// map written as `SRC/model.safetensors.index.json` (or any new file in a
/// model folder) changes the model fit read, and is not reshard's to write
/// there. `src` as given: a file protects itself (and the files it
/// names), a folder everything in it.
fn refuse_inside_the_checkpoint(
    file: &std::path::Path,
    src: &std::path::Path,
    ck: &reshard::format::Checkpoint,
) -> anyhow::Result<()> {
    let real = reshard::write::scope::resolve(file)?;
    let on_a_file = ck
        .files
        .iter()
        .any(|f| reshard::platform::canonicalize(&f.path).is_ok_and(|p| p == real));
    let folder = match src.is_dir() {
        true => reshard::platform::canonicalize(src).ok(),
        false => None,
    };
    if on_a_file || folder.is_some_and(|d| real.starts_with(d)) {
        anyhow::bail!(
            "{}: is in the checkpoint being judged ({}); refusing to write the device_map there",
            file.display(),
            src.display()
        );
    }
    Ok(())
}

pub fn write_device_map(
    file: &std::path::Path,
    src: &std::path::Path,
    ck: &reshard::format::Checkpoint,
    r: &MakeFit,
) -> anyhow::Result<()> {
    let best = r
        .best()
        .with_context(|| format!("no {} form fits: no device_map to write", r.program))?;
    let blocks_on_gpu = match &best.placement {
        Placement::Gpu => None,
        Placement::Offload { blocks_on_gpu, .. } => Some(*blocks_on_gpu),
        Placement::Host | Placement::TooBigForVram { .. } => {
            anyhow::bail!(
                "no GPU given (--vram): every weight stays on the host, no device_map to write"
            )
        }
    };
    let gguf = reshard::format::Format::Gguf;
    if best.form.format() == gguf || (best.form == Form::AsIs && ck.format == gguf) {
        anyhow::bail!(
            "the best form for {}, {}, is a GGUF file: a device_map places safetensors modules (llama.cpp takes --n-gpu-layers, printed by fit)",
            r.program,
            best.form.name()
        );
    }
    refuse_inside_the_checkpoint(file, src, ck)?;
    let names: Vec<&str> = ck.tensors.iter().map(|t| t.name.as_str()).collect();
    let map = reshard::fit::device_map::device_map(&names, blocks_on_gpu);
    let text = serde_json::to_string_pretty(&map)? + "\n";
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(file)
        .with_context(|| format!("cannot create {}", file.display()))?;
    std::io::Write::write_all(&mut f, text.as_bytes())
        .with_context(|| format!("cannot write {}", file.display()))?;
    Ok(())
}

/// The error column: "exact" for a form that changes nothing, "n/a" for
/// a sample of zeros only; "overflow" when the form writes sampled finite
/// values as infinities, and a `*` when NaN or infinite values of the
/// checkpoint were left out (each explained by [`render_not_finite`]).
fn error(c: &Candidate) -> String {
    if c.sample_overflow > 0 {
        return "overflow".into();
    }
    let mark = if c.sample_not_finite > 0 { "*" } else { "" };
    let e = match c.error_estimate {
        None if c.sample_not_finite > 0 => return "nan/inf*".into(),
        None => "n/a".into(),
        Some(e) if e == 0.0 && c.sampled_fraction == 0.0 => "exact".into(),
        Some(0.0) => "0%".into(),
        // A 16-bit cast's error can be far below 0.01%.
        Some(e) if e * 100.0 < 0.005 => "<0.01%".into(),
        Some(e) => format!("{:.2}%", e * 100.0),
    };
    format!("{e}{mark}")
}

/// The note under the table for a candidate whose sample held values that
/// are not finite, which its error leaves out.
fn render_not_finite(o: &mut String, c: &Candidate) {
    let form = c.form.name();
    if c.sample_not_finite > 0 {
        // An FP8 scale cannot hold an infinity: convert stops at one
        // unless told to clamp.
        let fp8 = c.form.quantize().is_some_and(|q| q.ggml().is_none());
        let _ = writeln!(
            o,
            "  * {form}: {} sampled {} NaN or infinite in the checkpoint, left out of its error{}",
            c.sample_not_finite,
            if c.sample_not_finite == 1 {
                "value is"
            } else {
                "values are"
            },
            if fp8 {
                "; an infinity stops its conversion unless --on-overflow saturate (or inf) is given"
            } else {
                ""
            }
        );
    }
    if c.sample_overflow > 0 {
        let _ = writeln!(
            o,
            "  overflow: {form}: {} sampled finite {} past its range (written as infinity or NaN), left out of its error; it ranks last of its width",
            c.sample_overflow,
            if c.sample_overflow == 1 { "value is" } else { "values are" }
        );
    }
}

/// A sampled share: "at most 5%", "at most 0.04%".
fn share(f: f64) -> String {
    let pct = f * 100.0;
    match pct {
        p if p >= 1.0 => format!("at most {p:.0}%"),
        p if p >= 0.01 => format!("at most {p:.2}%"),
        p => format!("at most {p:.4}%"),
    }
}

fn placement(c: &Candidate) -> String {
    let host_short = match c.host.host_shortfall {
        0 => String::new(),
        n => format!("; host short by {}", human(n)),
    };
    let p = match &c.placement {
        Placement::Gpu => "all on the GPU".to_string(),
        Placement::Host => "host only".to_string(),
        Placement::Offload {
            blocks_on_gpu,
            blocks,
            offloaded,
        } => format!(
            "first {blocks_on_gpu} of {blocks} blocks on the GPU, {} offloaded",
            human(*offloaded)
        ),
        Placement::TooBigForVram { short } => {
            format!("VRAM short by {} (no offload)", human(*short))
        }
    };
    format!("{p}{host_short}")
}
