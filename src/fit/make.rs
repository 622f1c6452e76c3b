//! "Make it fit": from the checkpoint's headers and the machine, every form
//! a program loads that reshard can write ([`super::program`]), each sized
//! by the plan `convert` would make, judged against the program's host row
//! and VRAM rule, and ranked best first.
//!
//! Best follows the precision order of [`Form::class`] (as is > 16-bit >
//! 8-bit > 6-bit > 4-bit), every form wholly on the GPU before any that
//! offloads; within one class, the lower error estimated on a sample of
//! this checkpoint's weights ([`super::sample`]), then the order of the
//! program's `forms` list (finer-grained scales first, as `programs.json`
//! writes them).
//! Host memory: a folder output takes the largest shard size
//! ([`candidate_sizes`]) at which the program's row fits; a program that
//! loads one file gets one file.

use std::path::Path;

use serde::{Deserialize, Serialize};

pub use super::conversion::Conversion;
use super::judge::{
    candidate_sizes, load_params, sized_plan, vram_fit, Budget, Context, FitError, FitOptions,
    LoaderFit, Scenario,
};
use super::loader::Loader;
use super::machine::Machine;
use super::program::{Form, Program};
use super::sample::{Estimate, Sampler};
use crate::format::layout::{open_as_loaded, ModelLayout};
use crate::format::{Checkpoint, Dtype, Format};
use crate::plan::{OutputFormat, Plan, PlanError, PlanOptions};

/// The activation reserve when `--reserve` is not given: what a forward
/// pass of a diffusion model at 1024x1024 or an LLM at a few thousand
/// tokens holds beside its weights (ComfyUI's rule has its own).
pub const DEFAULT_RESERVE: u64 = 1 << 30;

/// Where a candidate's weights go.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Placement {
    /// Every weight in dedicated VRAM.
    Gpu,
    /// The first `blocks_on_gpu` of `blocks` numbered blocks (and what
    /// precedes them) in VRAM, `offloaded` bytes on the host.
    Offload {
        blocks_on_gpu: u64,
        blocks: u64,
        offloaded: u64,
    },
    /// No GPU given: every weight on the host.
    Host,
    /// Over the VRAM budget and the program does not offload.
    TooBigForVram { short: u64 },
}

/// One form, judged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Candidate {
    pub form: Form,
    /// `--max-shard-size` of a folder output (`None`: one file).
    pub max_shard_size: Option<u64>,
    pub file_bytes: u64,
    /// Stored bits per weight element, over every tensor.
    pub bits_per_weight: f64,
    /// The program's loader row and its host figures.
    pub host: LoaderFit,
    /// Bytes of weights on the GPU as the program holds them.
    pub vram_weights: u64,
    pub placement: Placement,
    pub fits: bool,
    /// The relative RMS error of the form's values, estimated on the
    /// finite values of a sample of this checkpoint's weights
    /// ([`super::sample`]): 0 for the checkpoint as it is, `None` when no
    /// sampled value is finite and non-zero ("n/a" when every one is zero,
    /// as in a sparse file).
    pub error_estimate: Option<f64>,
    /// The share of the elements the form changes that were sampled.
    pub sampled_fraction: f64,
    /// Sampled values NaN or infinite in the checkpoint, left out of the
    /// estimate.
    #[serde(default)]
    pub sample_not_finite: u64,
    /// Sampled finite values this form writes as infinity or NaN (past its
    /// range), left out of the estimate; such a form ranks last of its
    /// width.
    #[serde(default)]
    pub sample_overflow: u64,
    /// The conversion to run (`None` for "as is" with its own shards):
    /// what [`Candidate::command`] spells and `convert --fit` runs.
    pub conversion: Option<Conversion>,
    /// The `reshard convert` line of [`Candidate::conversion`].
    pub command: Option<String>,
}

/// A form the program reads that this checkpoint cannot take, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refused {
    pub form: Form,
    pub reason: String,
}

/// Everything `fit --for` reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MakeFit {
    pub program: String,
    pub machine: Machine,
    pub budget: Budget,
    /// The VRAM the program gives weights (`None` without a GPU).
    pub vram_budget: Option<u64>,
    pub reserve: u64,
    /// Best first.
    pub candidates: Vec<Candidate>,
    pub refused: Vec<Refused>,
    /// The smallest machine the last candidate would fit, when none fits.
    pub smallest_machine: Option<SmallestMachine>,
}

impl MakeFit {
    /// The best candidate that fits.
    pub fn best(&self) -> Option<&Candidate> {
        self.candidates.iter().find(|c| c.fits)
    }
}

/// What the smallest candidate needs of a machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SmallestMachine {
    pub form: Form,
    /// Commit limit (Windows) or available RAM.
    pub host: u64,
    /// Dedicated VRAM for every weight on the GPU (`None` when the program
    /// offloads or there is no GPU).
    pub vram: Option<u64>,
}

impl SmallestMachine {
    /// "the smallest form, F, needs a host budget of H[ and V of dedicated
    /// VRAM]": the one wording of fit's, convert's and batch's verdicts.
    pub fn describe(&self) -> String {
        let mut o = format!(
            "the smallest form, {}, needs a host budget of {}",
            self.form.name(),
            crate::units::human(self.host)
        );
        if let Some(v) = self.vram {
            o.push_str(&format!(
                " and {} of dedicated VRAM",
                crate::units::human(v)
            ));
        }
        o
    }
}

/// The checkpoint at `path` as `program` loads it: a pipeline or
/// sentence-transformers folder as its library holds it loaded
/// ([`open_as_loaded`]), refused for a program that loads one weights
/// file when the folder has several weight sets. What `fit --for`,
/// `convert --fit` and `batch --fit` plan, so all three refuse alike.
pub fn open_for(
    path: &Path,
    program: &Program,
) -> Result<(Checkpoint, Option<ModelLayout>), FitError> {
    let (ck, layout) = open_as_loaded(path)?;
    if let Some(l) = layout
        .as_ref()
        .filter(|l| program.single_file && l.sets.len() > 1)
    {
        let rels: Vec<&str> = l.sets.iter().map(|s| s.rel.as_str()).collect();
        return Err(FitError::OneFileProgram {
            path: path.to_path_buf(),
            program: program.name.clone(),
            kind: l.kind.describe(),
            sets: l.sets.len(),
            names: rels.join(", "),
        });
    }
    Ok((ck, layout))
}

/// Plans `program`'s forms of `ck` on `machine`. `reserve`: the
/// activation reserve of the plain VRAM rule.
pub fn make_fit(
    ck: &Checkpoint,
    machine: Machine,
    options: &FitOptions,
    program: &Program,
    reserve: Option<u64>,
) -> Result<MakeFit, FitError> {
    program.check_loaders(&options.loaders)?;
    let budget = Budget::of(&machine)?;
    let params = load_params(&machine, &budget, options);
    let reserve = reserve.unwrap_or(DEFAULT_RESERVE);
    let vram_budget = budget
        .vram_bytes
        .map(|v| program.vram.weights_budget(v, machine.os, reserve));
    let judge = Judge {
        ck,
        program,
        params: &params,
        budget: &budget,
        vram_budget,
        path: &options.path,
        loaders: &options.loaders,
        unreadable: std::cell::RefCell::new(None),
    };
    let mut candidates = Vec::new();
    let mut refused = Vec::new();
    let mut sampler = Sampler::new(ck);
    for &form in &program.forms {
        if let Some(why) = judge.pointless(form) {
            refused.push(Refused {
                form,
                reason: why.into(),
            });
            continue;
        }
        match judge.candidate(form) {
            Ok((mut c, plan)) => {
                let e = match plan {
                    Some(p) => sampler.estimate(&p)?,
                    None => Estimate::EXACT,
                };
                c.error_estimate = e.relative_rms;
                c.sampled_fraction = e.fraction();
                c.sample_not_finite = e.not_finite;
                c.sample_overflow = e.overflow;
                candidates.push(c);
            }
            Err(reason) => refused.push(Refused { form, reason }),
        }
    }
    if candidates.is_empty() {
        if let Some(source) = judge.unreadable.take() {
            return Err(FitError::Unplannable {
                path: options.path.clone(),
                program: program.name.clone(),
                source: Box::new(source),
            });
        }
    }
    // Stable: the table's order breaks ties the estimate leaves (and
    // orders the forms whose sample is all zeros).
    candidates.sort_by(|a, b| {
        let key = |c: &Candidate| (!c.fits, placement_rank(&c.placement), c.form.class());
        let error = |c: &Candidate| match c.sample_overflow {
            0 => c.error_estimate.unwrap_or(f64::INFINITY),
            _ => f64::INFINITY,
        };
        key(a).cmp(&key(b)).then(error(a).total_cmp(&error(b)))
    });
    let smallest_machine = match candidates.iter().any(|c| c.fits) {
        true => None,
        false => judge.smallest_machine(&candidates),
    };
    Ok(MakeFit {
        program: program.name.clone(),
        machine,
        budget,
        vram_budget,
        reserve,
        candidates,
        refused,
        smallest_machine,
    })
}

/// All on the GPU (or no GPU at all) before partial offload.
fn placement_rank(p: &Placement) -> u8 {
    match p {
        Placement::Gpu | Placement::Host => 0,
        Placement::Offload { .. } => 1,
        Placement::TooBigForVram { .. } => 2,
    }
}

struct Judge<'a> {
    ck: &'a Checkpoint,
    program: &'a Program,
    params: &'a super::loader::LoadParams,
    budget: &'a Budget,
    vram_budget: Option<u64>,
    path: &'a str,
    /// `--loader`: narrows the program's rows ([`Program::row_among`]).
    loaders: &'a [Loader],
    /// The first plan refused for what the checkpoint holds (not for what
    /// a form is): when no form is left, the error `make_fit` returns.
    unreadable: std::cell::RefCell<Option<PlanError>>,
}

impl Judge<'_> {
    /// Why a form needs no candidate of its own: a cast to the dtype every
    /// float weight already has is the checkpoint as it is.
    fn pointless(&self, form: Form) -> Option<&'static str> {
        let to = form.dtype()?;
        if form.format() != Format::Safetensors {
            return None;
        }
        let floats = self.ck.tensors.iter().filter(|t| t.dtype.is_float());
        let mut any = false;
        for t in floats {
            any = true;
            if t.dtype != to {
                return None;
            }
        }
        any.then_some("every float tensor already has this dtype: the same as as-is")
    }

    fn options(&self, form: Form, max_shard_size: u64) -> PlanOptions {
        let size = Some(max_shard_size).filter(|&s| s != u64::MAX);
        Conversion::of(form, size).plan_options()
    }

    fn plan(&self, form: Form, max_shard_size: u64) -> Result<Plan, String> {
        sized_plan(self.ck, &self.options(form, max_shard_size)).map_err(|e| {
            // The whole chain: "cannot describe the model as GGUF" alone
            // does not say that the tokenizer is missing.
            let mut text = e.to_string();
            let mut cause = std::error::Error::source(&e);
            while let Some(c) = cause {
                text.push_str(&format!(": {c}"));
                cause = c.source();
            }
            let input = matches!(
                e,
                PlanError::Read(_)
                    | PlanError::GgufUnsupported { .. }
                    | PlanError::GgufShape { .. }
            );
            if input && self.unreadable.borrow().is_none() {
                *self.unreadable.borrow_mut() = Some(e);
            }
            text
        })
    }

    /// The host judgement of `plan` under the program's row.
    fn host(&self, form: Form, plan: Option<&Plan>) -> Result<LoaderFit, String> {
        let format = match plan {
            Some(_) => form.format(),
            None => self.ck.format,
        };
        let row = match self.program.row_among(format, self.params.os, self.loaders) {
            Some(row) => row,
            None if self.program.row(format, self.params.os).is_none() => {
                return Err(format!(
                    "{} does not read {format:?} files",
                    self.program.name
                ));
            }
            None => {
                let names =
                    |ls: &[Loader]| ls.iter().map(|l| l.name()).collect::<Vec<_>>().join(", ");
                return Err(format!(
                    "--loader {} names none of {}'s rows ({})",
                    names(self.loaders),
                    self.program.name,
                    names(&self.program.rows())
                ));
            }
        };
        let loaders = [row];
        let ctx = Context {
            loaders: &loaders,
            params: self.params,
            budget: self.budget,
        };
        let s = match plan {
            Some(p) => Scenario::of_plan(p, &ctx),
            None => Scenario::of_checkpoint(self.ck, &ctx),
        };
        s.loaders
            .into_iter()
            .next()
            .ok_or_else(|| format!("{} does not read {format:?} files", row.name()))
    }

    /// The judged form and the plan that writes it (`None`: the
    /// checkpoint as it is).
    fn candidate(&self, form: Form) -> Result<(Candidate, Option<Plan>), String> {
        let single = self.program.single_file || form.format() == Format::Gguf;
        // (plan, shard size) for a conversion; `None` for the checkpoint.
        let mut chosen: Option<(Plan, Option<u64>)> = None;
        let mut host = None;
        if form == Form::AsIs {
            let today = self.host(form, None)?;
            // A GGUF is judged as the file it is: reshard writes GGUF from
            // safetensors only, and resharding it as safetensors is another
            // format, not "as is".
            let gguf = self.ck.format == Format::Gguf;
            let own_fits = today.host_shortfall == 0 && (!single || self.ck.files.len() == 1);
            if gguf || own_fits || (single && self.ck.files.len() == 1) {
                host = Some(today);
            }
        }
        if host.is_none() {
            let sizes: Vec<Option<u64>> = match single {
                true => vec![None],
                false => candidate_sizes(self.ck)
                    .into_iter()
                    .map(|s| Some(s.0))
                    .collect(),
            };
            for size in sizes {
                let plan = self.plan(form, size.unwrap_or(u64::MAX))?;
                let fit = self.host(form, Some(&plan))?;
                let done = fit.host_shortfall == 0;
                host = Some(fit);
                chosen = Some((plan, size));
                if done {
                    break;
                }
            }
        }
        let mut host = host.ok_or("no plan")?;
        let tensors: Vec<(String, u64)> = match &chosen {
            Some((p, _)) => p.tensors().map(|t| (t.name.clone(), t.len)).collect(),
            None => self
                .ck
                .tensors
                .iter()
                .map(|t| (t.name.clone(), t.len))
                .collect(),
        };
        let file_bytes = match &chosen {
            Some((p, _)) => p.shards.iter().map(|s| s.data_len).sum(),
            None => self.ck.files.iter().map(|f| f.size).sum(),
        };
        let elements: u64 = self.ck.tensors.iter().map(|t| t.numel()).sum();
        let stored: u64 = tensors.iter().map(|t| t.1).sum();
        // What sits in VRAM: the stored bytes, or the dtype the program
        // converts this form to on load.
        let on_gpu: Vec<(String, u64)> = match self.program.loaded_as(form) {
            Some(d) => {
                let cast = self.plan(form_of_dtype(d), u64::MAX)?;
                cast.tensors().map(|t| (t.name.clone(), t.len)).collect()
            }
            None => tensors.clone(),
        };
        let vram_weights: u64 = on_gpu.iter().map(|t| t.1).sum();
        let placement = self.placement(&on_gpu);
        if let Placement::Offload { offloaded, .. } = placement {
            // Python programs keep offloaded weights in host memory; the
            // GGUF loaders run them from the read-only mapping (no commit).
            if host.loader.in_python() {
                host.host_needed = host.host_needed.saturating_add(offloaded);
                host.host_shortfall = host.host_needed.saturating_sub(self.budget.host_bytes);
            }
        }
        let fits =
            host.host_shortfall == 0 && !matches!(placement, Placement::TooBigForVram { .. });
        let shard = chosen.as_ref().and_then(|c| c.1);
        let conversion = chosen.is_some().then(|| Conversion::of(form, shard));
        let command = conversion.map(|c| self.command(&c));
        let candidate = Candidate {
            form,
            max_shard_size: shard,
            file_bytes,
            bits_per_weight: stored as f64 * 8.0 / elements.max(1) as f64,
            host,
            vram_weights,
            placement,
            fits,
            error_estimate: None,
            sampled_fraction: 0.0,
            sample_not_finite: 0,
            sample_overflow: 0,
            conversion,
            command,
        };
        Ok((candidate, chosen.map(|c| c.0)))
    }

    fn placement(&self, on_gpu: &[(String, u64)]) -> Placement {
        let Some(budget) = self.vram_budget else {
            return Placement::Host;
        };
        let named: Vec<(&str, u64)> = on_gpu.iter().map(|t| (t.0.as_str(), t.1)).collect();
        let v = vram_fit(&named, budget);
        if v.spill == 0 {
            Placement::Gpu
        } else if self.program.offload {
            Placement::Offload {
                blocks_on_gpu: v.leading_blocks_fit,
                blocks: v.blocks_total,
                // Whole blocks: what the device_map keeps off the GPU.
                offloaded: v.needed - v.leading_bytes,
            }
        } else {
            Placement::TooBigForVram { short: v.spill }
        }
    }

    /// The `reshard convert` line that runs `c`.
    fn command(&self, c: &Conversion) -> String {
        let dst = match (c.format, self.program.single_file) {
            (OutputFormat::Gguf, _) => "OUT.gguf",
            (_, true) => "OUT.safetensors",
            (_, false) => "OUT",
        };
        format!(
            "reshard convert {} {dst}{}",
            crate::platform::shell_quote(self.path),
            c.flags()
        )
    }

    /// What the smallest candidate (the last by precision) needs.
    fn smallest_machine(&self, candidates: &[Candidate]) -> Option<SmallestMachine> {
        let c = candidates
            .iter()
            .max_by_key(|c| (c.form.class(), std::cmp::Reverse(c.vram_weights)))?;
        let vram = match (&c.placement, self.budget.vram_bytes) {
            (Placement::TooBigForVram { short }, Some(v)) => Some(v.saturating_add(*short)),
            _ => None,
        };
        Some(SmallestMachine {
            form: c.form,
            host: c.host.host_needed,
            vram,
        })
    }
}

/// The 16-bit cast form of `d`.
fn form_of_dtype(d: Dtype) -> Form {
    match d {
        Dtype::F16 => Form::F16,
        _ => Form::Bf16,
    }
}

#[cfg(test)]
#[path = "make_tests.rs"]
mod tests;
