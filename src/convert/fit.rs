//! `convert --fit` and `batch --mode convert --fit`: plan a program's forms
//! of the source on a machine ([`crate::fit::make`]), take the best that
//! fits, and turn its [`Conversion`] into the [`ConvertOptions`] that run
//! it. Both commands go through [`choose`] and [`FitChoice::apply`], so the
//! command fit prints and the conversion run are one value.
//!
//! A checkpoint that fits as it is (no conversion) is still written: the
//! same tensors and dtypes in layer order, no shard larger than the
//! source's largest file, so every loader's peak stays at most what fit
//! judged. A GGUF that fits as it is has nothing to write (reshard writes
//! GGUF from safetensors and PyTorch checkpoints only): refused with
//! [`FitChoiceError::GgufAsIs`], which says to load the file itself.

use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use super::file_dst::DstKind;
use super::options::ConvertOptions;
use crate::fit::machine::Machine;
use crate::fit::make::{make_fit, open_for, Candidate, Conversion, MakeFit, Placement};
use crate::fit::program::Program;
use crate::fit::{FitError, FitOptions};
use crate::format::Format;
use crate::plan::OutputFormat;
use crate::units::human;

/// What to plan for: the program, the machine and fit's options.
#[derive(Debug, Clone)]
pub struct FitTarget {
    pub program: &'static Program,
    pub machine: Machine,
    /// Fit's options (`path` is set per source).
    pub options: FitOptions,
    /// `--reserve`: the activation reserve of the plain VRAM rule.
    pub reserve: Option<u64>,
}

/// Why no choice could be made (nothing fitting is a choice of none).
#[derive(Debug, thiserror::Error)]
pub enum FitChoiceError {
    #[error(transparent)]
    Fit(#[from] FitError),
    /// A GGUF that the program loads as it is: reshard writes GGUF from
    /// safetensors or PyTorch checkpoints only, so there is nothing to
    /// write (the file itself is the output).
    #[error("{}: {program} loads this GGUF as it is ({placement}): nothing to convert, load the file itself (reshard writes GGUF from safetensors or PyTorch checkpoints, not from a GGUF)", .path.display())]
    GgufAsIs {
        path: std::path::PathBuf,
        program: String,
        placement: String,
    },
}

/// The plan and what was taken from it.
#[derive(Debug, Clone, Serialize)]
pub struct FitChoice {
    /// Every candidate, best first, as `fit --for` reports them.
    pub plan: MakeFit,
    /// The best candidate that fits; `None`: nothing fits.
    pub chosen: Option<Candidate>,
    /// What runs: the candidate's conversion, or for the checkpoint as it
    /// is, a copy in shards no larger than its largest file.
    pub conversion: Option<Conversion>,
    /// One line: why this candidate (`None` when nothing fits).
    pub reason: Option<String>,
}

/// Plans `target.program`'s forms of the checkpoint at `src` (a pipeline
/// or sentence-transformers folder as its library holds it loaded, as
/// `fit` judges it) and takes the best that fits.
pub fn choose(src: &Path, target: &FitTarget) -> Result<FitChoice, FitChoiceError> {
    let (ck, _) = open_for(src, target.program)?;
    let mut options = target.options.clone();
    options.path = src.display().to_string();
    let plan = make_fit(
        &ck,
        target.machine.clone(),
        &options,
        target.program,
        target.reserve,
    )?;
    let chosen = plan.best().cloned();
    if let Some(c) = chosen.as_ref().filter(|c| c.conversion.is_none()) {
        if ck.format == Format::Gguf {
            return Err(FitChoiceError::GgufAsIs {
                path: src.to_path_buf(),
                program: plan.program.clone(),
                placement: placement(c),
            });
        }
    }
    let conversion = chosen.as_ref().map(|c| {
        c.conversion.unwrap_or(Conversion {
            dtype: None,
            quantize: None,
            format: OutputFormat::Safetensors,
            max_shard_size: match ck.files.len() {
                1 => None,
                _ => ck.files.iter().map(|f| f.size).max(),
            },
        })
    });
    let reason = chosen.as_ref().map(|c| reason(&plan, c));
    Ok(FitChoice {
        plan,
        chosen,
        conversion,
        reason,
    })
}

impl FitChoice {
    /// What the output must be for the program to load it: a GGUF file, one
    /// safetensors file (a program that loads one file), or a folder.
    pub fn dst_kind(&self) -> Option<DstKind> {
        let c = self.conversion?;
        Some(match c.format {
            OutputFormat::Gguf => DstKind::GgufFile,
            _ if c.max_shard_size.is_none() && self.single_file() => DstKind::SafetensorsFile,
            _ => DstKind::Folder,
        })
    }

    fn single_file(&self) -> bool {
        crate::fit::program::program(&self.plan.program).is_some_and(|p| p.single_file)
    }

    /// `base` with the chosen conversion's dtype, scheme, format and shard
    /// size (`None` when nothing fits).
    pub fn apply(&self, base: &ConvertOptions) -> Option<ConvertOptions> {
        let c = self.conversion?;
        let mut o = base.clone();
        let plan = c.plan_options();
        o.plan.dtype = plan.dtype;
        o.plan.quantize = plan.quantize;
        o.plan.format = plan.format;
        o.plan.max_shard_size = plan.max_shard_size;
        o.shard_size_given = c.max_shard_size.is_some();
        Some(o)
    }

    /// Why nothing fits, in one line (fit's verdict and the smallest
    /// machine).
    pub fn nothing_fits(&self) -> String {
        let p = &self.plan;
        let mut o = format!("nothing {} reads fits this machine", p.program);
        if let (true, Some(r)) = (p.candidates.is_empty(), p.refused.first()) {
            // Not the machine: no form can be written at all.
            let _ = write!(
                o,
                ": no form can be written ({}: {})",
                r.form.name(),
                r.reason
            );
        }
        if let Some(m) = &p.smallest_machine {
            let _ = write!(o, ": {}", m.describe());
        }
        o
    }
}

/// Where the candidate's weights go, in words.
pub fn placement(c: &Candidate) -> String {
    match &c.placement {
        Placement::Gpu => "all on the GPU".into(),
        Placement::Host => "no GPU: weights in host memory".into(),
        Placement::Offload {
            blocks_on_gpu,
            blocks,
            offloaded,
        } => format!(
            "{blocks_on_gpu} of {blocks} blocks on the GPU, {} offloaded",
            human(*offloaded)
        ),
        Placement::TooBigForVram { short } => format!("VRAM short by {}", human(*short)),
    }
}

/// "highest-precision form that fits: fp8-scaled, 39 of 58 blocks on the
/// GPU", and what kept each more precise form out.
fn reason(plan: &MakeFit, chosen: &Candidate) -> String {
    let mut o = format!(
        "highest-precision form {} reads that fits: {}, {}",
        plan.program,
        chosen.form.name(),
        placement(chosen)
    );
    let better: Vec<String> = plan
        .candidates
        .iter()
        .filter(|c| c.form.class() < chosen.form.class())
        .map(|c| {
            let why = match (c.fits, c.host.host_shortfall) {
                (true, _) => format!("fits only with {}", placement(c)),
                (false, 0) => placement(c),
                (false, short) => format!("host short by {}", human(short)),
            };
            format!("{} ({why})", c.form.name())
        })
        .collect();
    if !better.is_empty() {
        let _ = write!(o, "; not {}", better.join(", "));
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fit::loader::Os;
    use crate::fit::machine::{Detected, Given};

    const GIB: u64 = 1 << 30;

    fn target(program: &str, vram: Option<u64>) -> FitTarget {
        let given = Given {
            os: Some(Os::Linux),
            ram: Some(64 * GIB),
            pagefile: None,
            commit_limit: None,
            vram,
        };
        FitTarget {
            program: crate::fit::program::program(program).unwrap(),
            machine: Machine::resolve(&given, &Detected::default(), Os::Linux),
            options: FitOptions::default(),
            reserve: Some(0),
        }
    }

    fn tiny_llama() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-llama")
    }

    #[test]
    fn a_machine_without_a_gpu_takes_the_checkpoint_as_it_is() {
        // 64 GiB of RAM and no GPU: the 430 KiB model fits as it is.
        let c = choose(&tiny_llama(), &target("transformers", None)).unwrap();
        let chosen = c.chosen.as_ref().unwrap();
        assert_eq!(chosen.form.name(), "as-is");
        let conv = c.conversion.unwrap();
        assert_eq!((conv.dtype, conv.quantize), (None, None));
        // One source file: one output shard, in a folder (transformers).
        assert_eq!(c.dst_kind(), Some(DstKind::Folder));
        let o = c.apply(&ConvertOptions::default()).unwrap();
        assert_eq!(o.plan.max_shard_size, u64::MAX);
    }

    #[test]
    fn the_options_run_are_the_candidates_conversion() {
        // 345 KiB of VRAM: the bf16 weights (427.6 KiB) only fit with a
        // block offloaded, fp8-channel (341.5 KiB) wholly on the GPU,
        // which ranks first.
        let c = choose(&tiny_llama(), &target("transformers", Some(345 << 10))).unwrap();
        let chosen = c.chosen.clone().unwrap();
        assert_eq!(chosen.form.name(), "fp8-channel");
        let conv = chosen.conversion.unwrap();
        assert_eq!(c.conversion, Some(conv));
        let o = c.apply(&ConvertOptions::default()).unwrap();
        assert_eq!(o.plan.quantize, conv.quantize);
        assert_eq!(Some(o.plan.max_shard_size), conv.max_shard_size);
        assert!(o.shard_size_given);
        let command = chosen.command.unwrap();
        assert!(command.ends_with(&conv.flags()), "{command}");
        assert!(c.reason.unwrap().contains("not as-is (fits only with"));
    }

    #[test]
    fn nothing_fitting_is_no_choice_and_says_why() {
        // 1 KiB of VRAM and vLLM, which keeps every weight on the GPU.
        let c = choose(&tiny_llama(), &target("vllm", Some(1 << 10))).unwrap();
        assert!(c.chosen.is_none() && c.conversion.is_none());
        assert!(c.apply(&ConvertOptions::default()).is_none());
        assert!(c
            .nothing_fits()
            .starts_with("nothing vllm reads fits this machine"));
    }
}
