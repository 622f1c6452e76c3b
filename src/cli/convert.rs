//! `reshard convert`: rewrite a checkpoint into small, layer-ordered shards.

use anyhow::Context;

use reshard::convert::{convert_to_file, file_options, gguf_options, ConvertSource, DstKind};
use reshard::exec::WindowPool;
use reshard::format::layout as layouts;
use reshard::plan::quantize::QuantizeScheme;

use reshard::validate::validate_with_budget;

use super::progress::Bar;
use super::{printer, ExitStatus};

mod args;
mod fit;
mod layout;
mod render;

pub use self::args::{parse_block, parse_shard_size, Args, ConvertArgs, FitArgs, QuantizeArg};
use self::layout::{dry_run, print_notes, render_components, run_split};
use self::render::render_summary;

pub fn run(args: Args) -> anyhow::Result<ExitStatus> {
    args.options.check_on_overflow(args.fit.fit)?;
    let mut options = args.options.to_options();
    options.single_file = !args.src.is_dir();
    // `--fit`: the plan's best form decides dtype, scheme, format and
    // shard size (clap refuses those flags beside it).
    let mut choice = None;
    if args.fit.fit {
        match fit::choose(&args, &options)? {
            Ok((c, fitted)) => {
                options = fitted;
                choice = Some(c);
            }
            Err(status) => return Ok(status),
        }
    }
    let to_file = dst_names_a_file(&args)?;
    if DstKind::of(&args.dst) == DstKind::GgufFile {
        options = gguf_options(&options, args.options.max_shard_size.is_some());
    } else if to_file {
        options = file_options(&options);
    }
    if args.options.layout.split_components {
        return run_split(&args, &options);
    }
    // A folder is read as a layout (its weight sets and the rest of its
    // tree); a file is one checkpoint. `batch` converts through the same.
    let source = ConvertSource::open(&args.src).with_context(|| {
        let models = models_below(&args.src);
        if models.is_empty() {
            return format!("cannot convert {}", args.src.display());
        }
        format!(
            "cannot convert {}: it is a folder of models ({}), not one; `reshard batch {} --out {}` converts each of them",
            args.src.display(),
            models.join(", "),
            reshard::platform::shell_quote(&args.src.display().to_string()),
            reshard::platform::shell_quote(&args.dst.display().to_string()),
        )
    })?;
    if args.dry_run {
        return dry_run(&args, &source, &options, choice.as_ref());
    }
    if !args.quiet {
        // What inspect would report: the output fixes some (format: pt,
        // alignment, index mismatches), the user should know about the rest.
        for finding in source.findings() {
            eprintln!("note: source: {finding}");
        }
        for note in source.notes() {
            eprintln!("note: {}", reshard::names::escape(&note.to_string()));
        }
        if DstKind::of(&args.dst) == DstKind::GgufFile {
            // What the dry run lists as fallbacks, said before the run.
            for (_, plan) in source.plans(&options).unwrap_or_default() {
                for f in plan.gguf_out.iter().flat_map(|g| &g.fallbacks) {
                    eprintln!(
                        "note: {} is written as {} instead of {}: {}",
                        reshard::names::escape(&f.tensor),
                        f.written,
                        f.wanted,
                        f.why
                    );
                }
            }
        }
        if to_file && args.src.is_dir() && DstKind::of(&args.dst) == DstKind::SafetensorsFile {
            eprintln!("note: a DST ending in .safetensors gets the weights only: config.json, the tokenizer and the other files stay behind (name a folder to keep them)");
        }
    }
    let cancel = super::cancel::on_ctrl_c();
    let bar = Bar::new(!(args.quiet || args.options.no_progress || args.print.json));
    let pool = WindowPool::new(options.window);
    let result = if to_file {
        convert_to_file(&source, &args.dst, &options, &pool, &bar, cancel)
    } else {
        source.convert(&args.dst, &options, &pool, &bar, cancel, &|| Ok(()))
    };
    let summary = match (result, &choice) {
        (Err(e), Some(c)) if e.is_overflow() && args.options.on_overflow.is_none() => {
            return Err(anyhow::Error::new(e).context(fit::overflow_advice(&args, c)))
        }
        (result, _) => result.with_context(|| {
            format!(
                "cannot convert {} into {}",
                args.src.display(),
                args.dst.display()
            )
        })?,
    };
    if !args.quiet {
        print_notes(&summary, "");
        for c in &summary.components {
            for finding in &c.findings {
                let path = reshard::names::escape(&c.path).into_owned();
                eprintln!("note: source: {path}: {finding}");
            }
            print_notes(&c.summary, &format!("{}/", c.path));
        }
    }
    if args.print.json && !args.validate {
        match &choice {
            Some(c) => printer::json(&serde_json::json!({ "fit": c, "convert": summary }))?,
            None => printer::json(&summary)?,
        }
    } else if !args.quiet && !args.print.json {
        printer::text(&render_summary(&summary, args.verbose))?;
        printer::text(&render_components(&summary.components, args.verbose))?;
    }
    if !args.validate {
        return Ok(ExitStatus::Ok);
    }
    // Each weight set is validated against its source folder; under
    // `--fit`, within the budgets the plan promised.
    let mut reports = Vec::new();
    let mut budgets = None;
    // The program holds every weight set on the GPU at once: each set is
    // loaded under what the sets before it left of the VRAM budget.
    let mut vram_used = 0u64;
    let sets = if to_file {
        vec![String::new()]
    } else {
        source.weight_sets()
    };
    for rel in &sets {
        let src = source.set_dir(rel);
        let dst = match (DstKind::of(&args.dst), summary.shards) {
            // A gguf-split set is read from its first file.
            (DstKind::GgufFile, n @ 2..) => reshard::convert::split_name(&args.dst, 0, n),
            _ => layouts::join_rel(&args.dst, rel),
        };
        let show = !(args.quiet || args.options.no_progress || args.print.json);
        let mut options = reshard::validate::ValidateOptions {
            progress: reshard::validate::Progress::new(std::sync::Arc::new(Bar::new(show))),
            ..args.load.options(Some(src))
        };
        if let Some(c) = &choice {
            let (mut fitted, line) = fit::budgets(c, options);
            fitted.vram_budget = fitted.vram_budget.map(|v| v.saturating_sub(vram_used));
            if sets.len() > 1 && fitted.vram_leading_blocks.is_some() {
                // The plan counts blocks over all sets together; each set
                // is checked for what it holds in the VRAM left, not for
                // a count of its own.
                fitted.vram_leading_blocks = Some(0);
            }
            options = fitted;
            if budgets.is_none() && !(args.quiet || args.print.json) {
                printer::text(&format!("{line}\n"))?;
            }
            // The plan's budgets, as the first set gets them.
            if budgets.is_none() {
                budgets = Some(serde_json::json!({
                "commit_budget": options.commit_budget,
                "vram_budget": options.vram_budget,
                "vram_leading_blocks": options.vram_leading_blocks,
                "device": options.device.to_string(),
                }));
            }
        }
        let report = validate_with_budget(&dst, &options)
            .with_context(|| format!("cannot validate {}", dst.display()))?;
        vram_used = vram_used.saturating_add(report.device_bytes);
        if !args.print.json && (!args.quiet || !report.passed) {
            printer::text(&super::validate::render(&report))?;
        }
        reports.push(report);
    }
    let passed = reports.iter().all(|r| r.passed);
    if args.print.json {
        let validate = match reports.as_slice() {
            [one] => serde_json::to_value(one)?,
            many => serde_json::to_value(many)?,
        };
        let mut out = serde_json::json!({ "convert": summary, "validate": validate });
        if let Some(c) = &choice {
            out["fit"] = serde_json::to_value(c)?;
            out["budgets"] = budgets.unwrap_or_default();
        }
        printer::json(&out)?;
    }
    Ok(if passed {
        ExitStatus::Ok
    } else {
        ExitStatus::CheckFailed
    })
}

/// The first few subfolders of `dir` that hold a checkpoint (or a pipeline
/// or sentence-transformers model): when SRC itself holds none, the user
/// likely meant `batch`. Only the folder's own entries are looked at, so a
/// mistyped SRC such as `~` costs no walk.
fn models_below(dir: &std::path::Path) -> Vec<String> {
    const SHOWN: usize = 3;
    const LOOKED_AT: usize = 64;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .filter_map(Result::ok)
        .filter(|e| e.path().is_dir())
        .take(LOOKED_AT)
        .filter(|e| {
            let p = e.path();
            p.join("model_index.json").is_file()
                || p.join("modules.json").is_file()
                || reshard::format::open(&p).is_ok()
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    if names.len() > SHOWN {
        let more = names.len() - SHOWN;
        names.truncate(SHOWN);
        names.push(format!("{more} more"));
    }
    names
}

/// Whether DST names one file (`NAME.safetensors`) rather than a folder;
/// a DST the binary cannot write as asked is refused here, before
/// anything is read.
fn dst_names_a_file(args: &Args) -> anyhow::Result<bool> {
    let dst = args.dst.display();
    let kind = DstKind::of(&args.dst);
    let scheme = args.options.quantize.map(QuantizeScheme::from);
    match scheme {
        Some(s) if s.ggml().is_some() && kind != DstKind::GgufFile => anyhow::bail!(
            "{dst}: --quantize {} writes GGUF blocks, and a DST that does not end in .gguf is safetensors; name a NAME.gguf file",
            s.name()
        ),
        Some(s) if s.ggml().is_none() && kind == DstKind::GgufFile => anyhow::bail!(
            "{dst}: --quantize {} is an FP8 safetensors scheme; a .gguf DST takes --quantize q8_0, q4_0, q4_k or q6_k (or --dtype f32, f16, bf16)",
            s.name()
        ),
        _ => {}
    }
    match kind {
        DstKind::Folder => Ok(false),
        DstKind::GgufFile if args.options.layout.split_components => anyhow::bail!(
            "{dst}: a DST ending in .gguf names one GGUF file (or split set), and --split-components writes a folder per component; name a folder"
        ),
        DstKind::GgufFile => Ok(true),
        DstKind::SafetensorsFile if args.options.max_shard_size.is_some() => anyhow::bail!(
            "{dst}: a DST ending in .safetensors names one file, and --max-shard-size writes several; name a folder to shard into (or drop --max-shard-size)"
        ),
        DstKind::SafetensorsFile if args.options.layout.split_components => anyhow::bail!(
            "{dst}: a DST ending in .safetensors names one file, and --split-components writes a folder per component; name a folder"
        ),
        DstKind::SafetensorsFile => Ok(true),
    }
}
