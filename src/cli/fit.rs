//! `reshard fit`: will a checkpoint load on this (or a given) machine with
//! each loader, and what conversion would make it? Renders a
//! [`FitReport`] as text or JSON; the arithmetic lives in `reshard::fit`.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::Context;

use reshard::fit::loader::{Loader, Os};
use reshard::fit::machine::{Figure, Machine, Source};
use reshard::fit::{self, FitOptions, FitReport, HostBudgetKind, LoaderFit, Scenario};
use reshard::format::{self, Dtype};
use reshard::names::escape;
use reshard::plan::PlanOptions;
use reshard::units::{human, ByteSize};

use super::machine::MachineArgs;
use super::printer::{self, paint, plural, Colour};
use super::ExitStatus;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// A .safetensors/.bin/.gguf file (or any member of a gguf-split set),
    /// a model folder, or a Hugging Face cache folder.
    path: PathBuf,
    #[command(flatten)]
    pub machine: MachineArgs,
    /// What if the checkpoint were converted with this --dtype?
    #[arg(long, value_name = "DTYPE")]
    dtype: Option<Dtype>,
    /// What if the checkpoint were converted with this --max-shard-size?
    #[arg(long, value_name = "SIZE", value_parser = crate::cli::convert::parse_shard_size)]
    max_shard_size: Option<ByteSize>,
    /// What if its Linear weights were quantized with this --quantize
    /// scheme? (Bytes, host commit and VRAM of the stored FP8 output.)
    #[arg(long, value_enum, value_name = "SCHEME")]
    quantize: Option<crate::cli::convert::QuantizeArg>,
    /// With --quantize fp8-block: the block, as convert's --block.
    #[arg(long, value_name = "ROWSxCOLS", value_parser = crate::cli::convert::parse_block, requires = "quantize")]
    block: Option<[u64; 2]>,
    /// Plan for this program: every form it loads that reshard can write
    /// (casts, FP8 layouts, GGUF types), judged on the machine with the
    /// program's loader rows and VRAM rule, best first, with the command
    /// that writes the best. Programs: comfyui, comfyui-gguf, forge,
    /// invokeai, transformers, diffusers, llama.cpp, vllm.
    #[arg(long = "for", value_name = "PROGRAM", value_parser = crate::cli::fit_for::parse_program)]
    for_program: Option<String>,
    /// With --for: VRAM kept free for activations beside the weights
    /// (default 1GiB; ComfyUI's and Forge's own rules replace it).
    #[arg(long, value_name = "SIZE", requires = "for_program")]
    reserve: Option<ByteSize>,
    /// With --for: write the best form's placement to FILE as an
    /// accelerate `device_map` (JSON: the first blocks on GPU 0 in layer
    /// order, the rest on "cpu"), for from_pretrained(device_map=...).
    /// FILE must not exist.
    #[arg(long, value_name = "FILE", requires = "for_program")]
    device_map: Option<PathBuf>,
    #[command(flatten)]
    pub print: crate::cli::printer::OutputArgs,
    /// Print only the verdict and the advice (the lines after the tables)
    /// and errors.
    #[arg(short, long)]
    quiet: bool,
}

impl Args {
    fn options(&self) -> FitOptions {
        let asked =
            self.dtype.is_some() || self.max_shard_size.is_some() || self.quantize.is_some();
        let what_if = asked.then(|| PlanOptions {
            max_shard_size: self
                .max_shard_size
                .map_or(PlanOptions::default().max_shard_size, ByteSize::bytes),
            dtype: self.dtype,
            quantize: self.quantize.map(Into::into),
            quantize_block: self.block,
            ..PlanOptions::default()
        });
        self.machine
            .options(self.path.display().to_string(), what_if)
    }
}

pub fn run(args: Args) -> anyhow::Result<ExitStatus> {
    let machine = args.machine.machine();
    if let Some(name) = &args.for_program {
        let program = fit::program::program(name).expect("--for was parsed");
        let context = || format!("cannot plan {} for {name}", args.path.display());
        // The program's own opening: one that loads one file refuses a
        // pipeline here as `convert --fit` does.
        let (ck, _) = fit::make::open_for(&args.path, program).with_context(context)?;
        let r = fit::make::make_fit(
            &ck,
            machine,
            &args.options(),
            program,
            args.reserve.map(|r| r.0),
        )
        .with_context(context)?;
        if let Some(file) = &args.device_map {
            crate::cli::fit_for::write_device_map(file, &args.path, &ck, &r)?;
        }
        if args.print.json {
            printer::json(&r)?;
        } else {
            printer::text(&crate::cli::fit_for::render(
                &args.path.display().to_string(),
                &r,
            ))?;
        }
        return Ok(match r.best() {
            Some(_) => ExitStatus::Ok,
            None => ExitStatus::CheckFailed,
        });
    }
    let (ck, composite) =
        open(&args.path).with_context(|| format!("cannot read {}", args.path.display()))?;
    let report = fit::fit(&ck, machine, &args.options())
        .with_context(|| format!("cannot judge {}", args.path.display()))?;
    if args.print.json {
        printer::json(&report)?;
    } else if args.quiet {
        let mut o = render_verdict(&report);
        render_advice(&mut o, &report);
        printer::text(&o)?;
    } else {
        let mut path = args.path.display().to_string();
        if let Some(what) = composite {
            path = format!("{path} ({what})");
        }
        printer::text(&render(&path, &report))?;
    }
    Ok(if report.fits {
        ExitStatus::Ok
    } else {
        ExitStatus::CheckFailed
    })
}

/// The checkpoint fit judges ([`format::layout::open_as_loaded`]); the
/// second value describes a composite folder for the report's heading.
fn open(
    path: &std::path::Path,
) -> Result<(format::Checkpoint, Option<String>), format::FormatError> {
    let (ck, layout) = format::layout::open_as_loaded(path)?;
    let what = layout.map(|l| {
        format!(
            "{}: its {} weight sets together, as its library holds them once loaded",
            l.kind.describe(),
            l.sets.len()
        )
    });
    Ok((ck, what))
}

fn figure(f: Option<Figure>) -> String {
    match f {
        None => "unknown".into(),
        Some(f) => {
            let src = match f.source {
                Source::Detected => "detected",
                Source::Given => "given",
                Source::Derived => "derived",
            };
            format!("{} ({src})", human(f.bytes))
        }
    }
}

fn render(path: &str, r: &FitReport) -> String {
    let mut o = String::new();
    render_machine(&mut o, &r.machine);
    let _ = writeln!(o);
    let budget = match r.budget.host_kind {
        HostBudgetKind::CommitLimit => format!(
            "peak commit against the commit limit, {}",
            human(r.budget.host_bytes)
        ),
        HostBudgetKind::AvailableRam => {
            let mut s = format!(
                "private resident memory against available RAM, {}",
                human(r.budget.host_bytes)
            );
            if let Some(c) = r.budget.commit_bytes {
                let _ = write!(
                    s,
                    "; commit against free commit, {} (strict overcommit)",
                    human(c)
                );
            }
            s
        }
    };
    let target = match r.budget.vram_bytes {
        Some(v) => format!("weights to GPU 0 ({} dedicated)", human(v)),
        None => "no GPU: weights stay in host memory".into(),
    };
    let _ = writeln!(o, "{}: {budget}; {target}", escape(path));
    let _ = writeln!(
        o,
        "baseline: {} for the loader's Python process before it reads a weight (--baseline), added to each Python loader's commit when judging",
        human(r.params.baseline)
    );
    let _ = writeln!(o);
    render_scenario(&mut o, "as it is", &r.today, r.machine.os);
    let _ = writeln!(o, "  calibrated against (docs/fit.md):");
    let judged = |l: &Loader| {
        std::iter::once(&r.today)
            .chain(&r.what_if)
            .any(|s| s.loaders.iter().any(|f| f.loader == *l))
    };
    for l in r.loaders.iter().filter(|l| judged(l)) {
        let _ = writeln!(
            o,
            "    {:<22} {}: {}",
            l.name(),
            l.formula(),
            l.calibrated_with()
        );
    }
    if let Some(w) = &r.what_if {
        let _ = writeln!(o);
        let mut label = format!(
            "after reshard convert --max-shard-size {}",
            human(w.max_shard_size.unwrap_or(0))
        );
        if let Some(d) = w.dtype {
            let _ = write!(label, " --dtype {}", d.name().to_ascii_lowercase());
        }
        if let Some(q) = w.quantize {
            let _ = write!(label, " --quantize {}", q.name());
        }
        render_scenario(&mut o, &label, w, r.machine.os);
        render_side_by_side(&mut o, r, w);
    }
    let _ = writeln!(o);
    render_advice(&mut o, r);
    o
}

fn render_machine(o: &mut String, m: &Machine) {
    let pagefile = if m.os == Os::Windows {
        "pagefile"
    } else {
        "swap"
    };
    let os_src = if m.os_source == Source::Given {
        "given"
    } else {
        "detected"
    };
    let _ = writeln!(o, "machine");
    let _ = writeln!(o, "  os              {} ({os_src})", m.os);
    let _ = writeln!(o, "  ram             {}", figure(m.ram));
    if m.os != Os::Windows {
        let _ = writeln!(o, "  available ram   {}", figure(m.available));
    }
    let _ = writeln!(o, "  {pagefile:<15} {}", figure(m.pagefile));
    let _ = writeln!(o, "  commit limit    {}", figure(m.commit_limit));
    if m.committed.is_some() {
        let _ = writeln!(o, "  committed now   {}", figure(m.committed));
        let _ = writeln!(o, "  free commit     {}", figure(m.free_commit));
    }
    if let Some(strict) = m.overcommit_strict {
        let mode = if strict {
            "strict (vm.overcommit_memory=2)"
        } else {
            "heuristic (commit limit not enforced)"
        };
        let _ = writeln!(o, "  overcommit      {mode}");
    }
    let vram = if m.vram.is_none() {
        "none detected (no CUDA driver or device found; give --vram)".into()
    } else {
        figure(m.vram)
    };
    let _ = writeln!(o, "  vram (gpu 0)    {vram}");
}

fn render_scenario(o: &mut String, label: &str, s: &Scenario, os: Os) {
    let z = &s.sizes;
    let _ = writeln!(
        o,
        "{label}{}: {} {}, sum(S) {}, max(S) {}, sum(T) {}, max(T) {}",
        if s.format == format::Format::Gguf {
            " (gguf)"
        } else {
            ""
        },
        s.shard_count,
        plural(s.shard_count, "shard", "shards"),
        human(z.shard_sum),
        human(z.shard_max),
        human(z.tensor_sum),
        human(z.tensor_max)
    );
    // Windows judges the commit at a shard's open (the header view on top
    // of what the load holds), so it gets a column of its own there.
    let windows = os == Os::Windows;
    let open_header = if windows {
        format!(" {:>11}", "at open")
    } else {
        String::new()
    };
    let _ = writeln!(
        o,
        "  {:<22} {:>11} {:>11}{open_header} {:>11} {:>11} {:>11}  verdict",
        "loader", "baseline", "commit", "rss", "private", "vram"
    );
    for l in &s.loaders {
        let open = if windows {
            format!(" {:>11}", human(l.open_commit))
        } else {
            String::new()
        };
        let _ = writeln!(
            o,
            "  {:<22} {:>11} {:>11}{open} {:>11} {:>11} {:>11}  {}",
            l.loader.name(),
            human(l.baseline),
            human(l.peak_commit),
            human(l.peak_rss),
            human(l.peak_rss_private),
            human(l.vram),
            verdict(l, os)
        );
    }
    if windows && s.loaders.iter().any(|l| l.open_commit > l.peak_commit) {
        let _ = writeln!(
            o,
            "  at open: for a few milliseconds safetensors maps the shard it opens a second time (its header view), and Windows checks that against the limit too"
        );
    }
    // One line per reason, naming the loaders it applies to.
    let mut reasons: Vec<(&str, Vec<&str>)> = Vec::new();
    for n in &s.not_applicable {
        match reasons.iter_mut().find(|r| r.0 == n.reason) {
            Some(r) => r.1.push(n.loader.name()),
            None => reasons.push((&n.reason, vec![n.loader.name()])),
        }
    }
    for (why, names) in reasons {
        let _ = writeln!(o, "  not applicable: {} ({why})", names.join(", "));
    }
    if let Some(v) = &s.vram {
        if v.spill > 0 {
            let _ = writeln!(
                o,
                "  vram: weights need {}, {} more than dedicated; under NVIDIA's System Memory Fallback that spills into shared GPU memory (slow), otherwise CUDA runs out of memory. In layer order the first {} of {} blocks fit in dedicated VRAM.",
                human(v.needed),
                human(v.spill),
                v.leading_blocks_fit,
                v.blocks_total
            );
        } else {
            let _ = writeln!(
                o,
                "  vram: weights need {} of {} dedicated",
                human(v.needed),
                human(v.dedicated)
            );
        }
    }
}

fn verdict(l: &LoaderFit, os: Os) -> String {
    let mut v = if l.fits {
        "fits".to_string()
    } else {
        "does not fit:".to_string()
    };
    if l.host_shortfall > 0 {
        let what = if os == Os::Windows { "commit" } else { "ram" };
        let _ = write!(v, " {} short of {what}", human(l.host_shortfall));
    }
    if l.vram_shortfall > 0 {
        if l.host_shortfall > 0 {
            v.push(',');
        }
        let _ = write!(v, " {} short of vram", human(l.vram_shortfall));
    }
    if l.offloaded > 0 {
        let _ = write!(
            v,
            " ({} of the weights kept in host memory: vram is short, so it runs slower)",
            human(l.offloaded)
        );
    }
    if l.over_free_commit {
        v.push_str(" (more than the commit free now)");
    }
    if l.pages_from_disk {
        v.push_str(" (mapped pages exceed available ram: reads from disk again, slow)");
    }
    v
}

fn render_side_by_side(o: &mut String, r: &FitReport, w: &Scenario) {
    let pairs: Vec<(&LoaderFit, &LoaderFit)> = r
        .today
        .loaders
        .iter()
        .filter_map(|a| {
            w.loaders
                .iter()
                .find(|b| b.loader == a.loader)
                .map(|b| (a, b))
        })
        .collect();
    if pairs.is_empty() {
        return;
    }
    // The figure the verdict judges: on Windows the commit at an open.
    let windows = r.params.os == Os::Windows;
    let judged = |l: &LoaderFit| {
        if windows {
            l.open_commit
        } else {
            l.peak_commit
        }
    };
    let _ = writeln!(
        o,
        "  change in peak commit{}:",
        if windows { " (at open)" } else { "" }
    );
    for (a, b) in pairs {
        let _ = writeln!(
            o,
            "  {:<22} {:>11} -> {:<11} {}",
            a.loader.name(),
            human(judged(a)),
            human(judged(b)),
            match (a.fits, b.fits) {
                (false, true) => "now fits",
                (true, false) => "no longer fits",
                (true, true) => "fits",
                (false, false) => "does not fit",
            }
        );
    }
}

/// `fits`, or `does not fit: ` and the judged loaders that do not (in the
/// what-if scenario when there is one): `-q`'s first line.
fn render_verdict(r: &FitReport) -> String {
    let judged = r.what_if.as_ref().unwrap_or(&r.today);
    let mut short: Vec<&str> = judged
        .loaders
        .iter()
        .filter(|l| !l.fits)
        .map(|l| l.loader.name())
        .collect();
    if short.is_empty() {
        // Then it fails because a loader named cannot read it.
        short = judged
            .not_applicable
            .iter()
            .map(|n| n.loader.name())
            .collect();
    }
    if r.fits {
        format!("{}\n", paint("fits", Colour::Good))
    } else if short.is_empty() {
        format!("{}\n", paint("does not fit", Colour::Bad))
    } else {
        let verdict = paint("does not fit", Colour::Bad);
        format!("{verdict}: {}\n", short.join(", "))
    }
}

fn render_advice(o: &mut String, r: &FitReport) {
    let judged = r.what_if.as_ref().unwrap_or(&r.today);
    if r.today.loaders.is_empty() {
        let _ = writeln!(o, "no loader named reads a {} checkpoint", r.today.format);
    } else if r.today.all_fit() {
        let _ = writeln!(o, "every loader judged fits the checkpoint as it is");
    }
    if !r.fits && judged.all_fit() && !judged.not_applicable.is_empty() {
        let names: Vec<&str> = judged
            .not_applicable
            .iter()
            .map(|n| n.loader.name())
            .collect();
        let _ = writeln!(
            o,
            "does not load: {} cannot read {} (named with --loader)",
            names.join(", "),
            if judged.max_shard_size.is_some() {
                "what convert writes"
            } else {
                "this checkpoint"
            }
        );
    }
    if let Some(rec) = &r.recommendation {
        let names: Vec<&str> = rec.fits.iter().map(|l| l.name()).collect();
        let _ = writeln!(o, "recommended: {}", rec.command);
        let _ = writeln!(
            o,
            "  then these loaders fit in host memory: {}",
            names.join(", ")
        );
    } else if r.today.loaders.iter().any(|l| l.host_shortfall > 0) {
        let _ = writeln!(o, "no conversion among the candidates (the checkpoint's own shard size down to 16MiB, bf16 for f32, and any what-if asked) makes more loaders fit");
    }
    for l in &r.not_helped_by_resharding {
        let why = match l {
            Loader::TransformersV5Mmap => "it keeps every shard mapped, so it needs the whole checkpoint in commit however it is sharded",
            Loader::TransformersV5Pread => "it reads straight into the parameters and maps no shard, so shard size barely changes its peak",
            Loader::Diffusers => "its shards' mappings can all be alive at once until the garbage collector frees them",
            Loader::Reshard => "its peak does not depend on shard size",
            Loader::LlamaCpp | Loader::ComfyuiGguf => "reshard writes safetensors, which it does not read",
            _ => "even the smallest candidate shards leave it over budget",
        };
        let gguf = matches!(l, Loader::LlamaCpp | Loader::ComfyuiGguf);
        let fix = match r
            .recommendation
            .as_ref()
            .filter(|rec| rec.dtype.is_some() && rec.fits.contains(l))
        {
            Some(rec) => format!(
                "the smaller dtype in the command above does ({})",
                rec.dtype.map_or("", Dtype::name)
            ),
            None if gguf => "only a smaller quantization (llama-quantize), more RAM or pagefile, or a larger GPU does".into(),
            None => "only a smaller dtype, more RAM or pagefile, or another loader does".into(),
        };
        let _ = writeln!(o, "{l}: resharding cannot make it fit: {why}; {fix}");
    }
    if let Some(v) = r.today.vram.as_ref().filter(|v| v.spill > 0) {
        let _ = writeln!(
            o,
            "vram: the weights are {} over dedicated VRAM whatever the shard size; only {} helps",
            human(v.spill),
            if r.today.format == format::Format::Gguf {
                "a smaller quantization, a larger GPU or keeping the last blocks in host memory (llama.cpp's -ngl N, which its --fit picks by itself; ComfyUI's lowvram mode, its default when the model does not fit)"
            } else {
                "a smaller dtype, a larger GPU or offloading the last blocks (device_map)"
            }
        );
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn parse(a: &[&str]) -> Result<Args, clap::Error> {
        Cli::try_parse_from(std::iter::once("fit").chain(a.iter().copied())).map(|c| c.args)
    }

    #[test]
    fn help_shows_the_calibrated_model() {
        use clap::CommandFactory;
        let help = Cli::command().render_long_help().to_string();
        let flat = help.split_whitespace().collect::<Vec<_>>().join(" ");
        let baseline = format!("(default: {}MiB,", reshard::fit::DEFAULT_BASELINE >> 20);
        assert!(flat.contains(&baseline), "{baseline} missing from\n{help}");
        for l in Loader::ALL {
            assert!(
                flat.contains(&l.formula()),
                "{} missing from\n{help}",
                l.formula()
            );
        }
    }

    #[test]
    fn parses_machine_flags() {
        let a = parse(&[
            "m",
            "--os",
            "windows",
            "--ram",
            "32GiB",
            "--pagefile",
            "8GiB",
            "--vram",
            "24GiB",
        ])
        .unwrap();
        let g = a.machine.given();
        assert_eq!(g.os, Some(Os::Windows));
        assert_eq!(
            (g.ram, g.pagefile, g.vram),
            (Some(32 << 30), Some(8 << 30), Some(24 << 30))
        );
        assert!(a.options().what_if.is_none());
    }

    #[test]
    fn pagefile_and_commit_limit_exclude_each_other() {
        assert!(parse(&["m", "--pagefile", "1GiB", "--commit-limit", "2GiB"]).is_err());
    }

    #[test]
    fn loaders_and_what_if() {
        let a = parse(&[
            "m",
            "--loader",
            "per-shard-mmap",
            "--loader",
            "reshard",
            "--dtype",
            "bf16",
        ])
        .unwrap();
        let o = a.options();
        assert_eq!(o.loaders, [Loader::PerShardMmap, Loader::Reshard]);
        let w = o.what_if.unwrap();
        assert_eq!((w.dtype, w.max_shard_size), (Some(Dtype::BF16), 1 << 30));
        assert!(parse(&["m", "--loader", "nope"]).is_err());
    }
}
