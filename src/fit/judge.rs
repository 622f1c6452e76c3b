//! Judging one checkpoint on one machine: each loader's peaks against the
//! budgets, for the checkpoint as it is, a what-if conversion, and the
//! shard sizes and dtype the recommendation searches.

use serde::{Deserialize, Serialize};

use crate::format::{Checkpoint, Dtype, Format, Tensor};

use super::loader::{peak, LoadParams, Loader, Os, Peak, Sizes};
use super::machine::Machine;
use crate::plan::order::{block_of, sort_indices, Order};
use crate::plan::{OutputFormat, Plan, PlanError, PlanOptions, ShardPlan};

/// Shard sizes the recommendation tries, largest (least change) first.
/// Only those below the checkpoint's largest shard are tried, beside its
/// own shard size ([`candidate_sizes`]): larger shards never lower a peak.
pub const CANDIDATE_SHARD_SIZES: [(u64, &str); 9] = [
    (5_000_000_000, "5GB"),
    (2 << 30, "2GiB"),
    (1 << 30, "1GiB"),
    (512 << 20, "512MiB"),
    (256 << 20, "256MiB"),
    (128 << 20, "128MiB"),
    (64 << 20, "64MiB"),
    (32 << 20, "32MiB"),
    (16 << 20, "16MiB"),
];

/// The shard sizes [`recommend`] tries on `ck`, largest first: the
/// checkpoint's own (its largest shard's tensor bytes, rounded up to a
/// whole MiB or GiB), then each of [`CANDIDATE_SHARD_SIZES`] below it.
/// Merging shards is never the least change: every loader's peak grows
/// or stays with the shard size.
pub fn candidate_sizes(ck: &Checkpoint) -> Vec<(u64, String)> {
    let mut per_file = vec![0u64; ck.files.len()];
    for t in &ck.tensors {
        if let Some(f) = per_file.get_mut(t.file) {
            *f = f.saturating_add(t.len);
        }
    }
    let largest = per_file.into_iter().max().unwrap_or(0).max(1);
    let (unit, name) = if largest > 1 << 30 {
        (1u64 << 30, "GiB")
    } else {
        (1 << 20, "MiB")
    };
    let units = largest.div_ceil(unit);
    let own = units.saturating_mul(unit);
    let mut sizes = vec![(own, format!("{units}{name}"))];
    sizes.extend(
        CANDIDATE_SHARD_SIZES
            .iter()
            .filter(|(size, _)| *size < own)
            .map(|&(size, arg)| (size, arg.to_string())),
    );
    sizes
}

/// Why a fit cannot be judged.
#[derive(Debug, thiserror::Error)]
pub enum FitError {
    #[error("cannot tell the commit limit of the windows machine: give --commit-limit, or --ram and --pagefile")]
    NoCommitLimit,
    #[error("cannot tell the available RAM of the {os} machine: give --ram")]
    NoRam { os: Os },
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Sample(#[from] super::sample::SampleError),
    /// `fit --for P --loader L` where L is none of P's rows: a usage
    /// error, not a plan where nothing fits.
    #[error("--loader {loaders} names none of {program}'s rows ({rows}): --loader with --for chooses among the program's rows; give one of them, or leave --loader out")]
    ForeignLoader {
        loaders: String,
        program: String,
        rows: String,
    },
    #[error(transparent)]
    Read(#[from] crate::format::FormatError),
    /// A program that loads one file, asked for a folder of several
    /// weight sets (a diffusers pipeline): no one file holds them.
    #[error("{}: {program} loads one weights file, and this {kind} has {sets} weight sets ({names}); convert one of its component folders (SRC/NAME) for {program}, or the whole folder for the library that loads it (--for diffusers, transformers)", .path.display())]
    OneFileProgram {
        path: std::path::PathBuf,
        program: String,
        kind: &'static str,
        sets: usize,
        names: String,
    },
    /// No form of the program could be judged because the checkpoint
    /// itself cannot be read as planned (a GGUF tensor type reshard does
    /// not decode, a bad shape): an input error, not "nothing fits".
    #[error("{path}: no form {program} reads can be planned from it")]
    Unplannable {
        path: String,
        program: String,
        /// Boxed: a plan error is large, and fit's results are many.
        #[source]
        source: Box<PlanError>,
    },
}

/// What to judge, besides the checkpoint and the machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FitOptions {
    /// The loaders to judge; the exit status depends on these only. Empty:
    /// every loader that reads the checkpoint (the others are listed as
    /// not applicable). A loader named here that cannot read it fails the
    /// check.
    pub loaders: Vec<Loader>,
    pub threads: u64,
    pub window: u64,
    pub cuda_overhead: u64,
    /// The Python process's commit before the load (`--baseline`).
    pub baseline: u64,
    /// `baseline` was measured in the loader's process with its device
    /// runtime up (`--baseline` given): it holds the CUDA context's host
    /// commit, which the Python loaders then do not add again.
    pub baseline_holds_device: bool,
    /// Judge the checkpoint as `convert` would write it with these options.
    pub what_if: Option<PlanOptions>,
    /// The path to print in the recommended command line.
    pub path: String,
}

impl Default for FitOptions {
    fn default() -> Self {
        let calibrated = LoadParams::calibrated(crate::platform::Os::current());
        FitOptions {
            loaders: Vec::new(),
            threads: calibrated.threads,
            window: calibrated.window,
            cuda_overhead: calibrated.cuda_overhead,
            baseline: calibrated.baseline,
            baseline_holds_device: false,
            what_if: None,
            path: String::new(),
        }
    }
}

/// What a host peak is checked against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HostBudgetKind {
    /// Windows: every charge counts against RAM + pagefile.
    CommitLimit,
    /// Linux and macOS: private resident memory against available RAM.
    AvailableRam,
}

/// The budgets every loader is checked against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Budget {
    pub host_kind: HostBudgetKind,
    pub host_bytes: u64,
    /// Linux under strict overcommit: commit limit minus committed (or the
    /// given commit limit).
    pub commit_bytes: Option<u64>,
    /// Windows: commit limit minus what is committed now, when known.
    pub free_commit_bytes: Option<u64>,
    /// Dedicated VRAM of GPU 0; `None`: no GPU, weights stay on the host.
    pub vram_bytes: Option<u64>,
}

impl Budget {
    pub fn of(m: &Machine) -> Result<Budget, FitError> {
        let vram_bytes = m.vram.map(|v| v.bytes);
        if m.os == Os::Windows {
            let limit = m.commit_limit.ok_or(FitError::NoCommitLimit)?;
            return Ok(Budget {
                host_kind: HostBudgetKind::CommitLimit,
                host_bytes: limit.bytes,
                commit_bytes: None,
                free_commit_bytes: m.free_commit.map(|f| f.bytes),
                vram_bytes,
            });
        }
        let available = m.available.ok_or(FitError::NoRam { os: m.os })?;
        let commit_bytes = match (m.overcommit_strict, m.commit_limit) {
            (Some(true), Some(l)) => Some(m.free_commit.map_or(l.bytes, |f| f.bytes)),
            _ => None,
        };
        Ok(Budget {
            host_kind: HostBudgetKind::AvailableRam,
            host_bytes: available.bytes,
            commit_bytes,
            free_commit_bytes: None,
            vram_bytes,
        })
    }
}

/// One loader's peaks and verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoaderFit {
    pub loader: Loader,
    /// Peak commit held during the load, above the process baseline: what
    /// a sampler of the process's commit sees.
    pub peak_commit: u64,
    /// The commit at the instant a shard is opened, above the baseline:
    /// `peak_commit` plus safetensors' short-lived header view on Windows
    /// ([`Peak::open_commit`]). The Windows verdict judges this one.
    #[serde(default)]
    pub open_commit: u64,
    /// The loader's process before the load (0 for reshard's own loader),
    /// added to the peaks when judging.
    pub baseline: u64,
    pub peak_rss: u64,
    pub peak_rss_private: u64,
    pub peak_rss_file: u64,
    pub vram: u64,
    /// The host figure checked: commit on Windows, private RSS elsewhere.
    pub host_needed: u64,
    /// How far the host figure (or the strict commit) exceeds its budget.
    pub host_shortfall: u64,
    /// How far the weights exceed dedicated VRAM.
    pub vram_shortfall: u64,
    pub fits: bool,
    /// Weights kept on the host because dedicated VRAM is short (the GGUF
    /// loaders offload what does not fit): it fits, slower.
    pub offloaded: u64,
    /// Windows: the peak exceeds the commit free right now.
    pub over_free_commit: bool,
    /// Mapped pages exceed available RAM: they will be dropped and read
    /// again from disk (slow, not a failure).
    pub pages_from_disk: bool,
}

impl LoaderFit {
    pub fn judge(loader: Loader, p: Peak, b: &Budget, params: &LoadParams) -> LoaderFit {
        let baseline = if loader.in_python() {
            params.baseline
        } else {
            0
        };
        // Windows checks each view against the commit limit when it is
        // mapped, so the instant of an open counts, however short.
        let host_needed = if params.os == Os::Windows {
            p.open_commit
        } else {
            p.rss_private
        }
        .saturating_add(baseline);
        let total_commit = p.open_commit.saturating_add(baseline);
        let commit_short = b.commit_bytes.map_or(0, |c| total_commit.saturating_sub(c));
        let host_shortfall = host_needed.saturating_sub(b.host_bytes).max(commit_short);
        let vram_shortfall = b.vram_bytes.map_or(0, |v| p.vram.saturating_sub(v));
        LoaderFit {
            loader,
            peak_commit: p.commit,
            open_commit: p.open_commit,
            baseline,
            peak_rss: p.rss(),
            peak_rss_private: p.rss_private,
            peak_rss_file: p.rss_file,
            vram: p.vram,
            host_needed,
            host_shortfall,
            vram_shortfall,
            offloaded: p.offloaded,
            fits: host_shortfall == 0 && vram_shortfall == 0,
            over_free_commit: b.free_commit_bytes.is_some_and(|f| total_commit > f),
            pages_from_disk: params.os != Os::Windows
                && p.rss().saturating_add(baseline) > b.host_bytes,
        }
    }
}

/// The weights against dedicated VRAM, walked in forward order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VramFit {
    pub needed: u64,
    pub dedicated: u64,
    /// Bytes past dedicated VRAM: under NVIDIA's System Memory Fallback
    /// they spill into shared GPU memory (system RAM, slow).
    pub spill: u64,
    pub blocks_total: u64,
    /// Numbered blocks that fit whole in dedicated VRAM, in forward order,
    /// after everything that precedes them (embeddings first).
    pub leading_blocks_fit: u64,
    /// The bytes of those blocks and what precedes them: what a placement
    /// of the leading blocks holds on the GPU (0 when no block fits; the
    /// rest, `needed - leading_bytes`, is offloaded, which can be more
    /// than `spill`: a block is placed whole or not at all).
    #[serde(default)]
    pub leading_bytes: u64,
}

/// Walks `(name, bytes)` in forward order and counts the numbered blocks
/// whose last tensor still fits within `dedicated` bytes.
pub fn vram_fit(tensors: &[(&str, u64)], dedicated: u64) -> VramFit {
    let names: Vec<&str> = tensors.iter().map(|t| t.0).collect();
    let order = sort_indices(&names, Order::Forward);
    // Cumulative bytes at the last tensor of each block, in forward order.
    let mut ends: Vec<(crate::plan::order::Block, u64)> = Vec::new();
    let mut total = 0u64;
    for i in order {
        let (name, bytes) = tensors[i];
        total = total.saturating_add(bytes);
        if let Some(b) = block_of(name) {
            match ends.last_mut() {
                Some((last, end)) if *last == b => *end = total,
                _ => ends.push((b, total)),
            }
        }
    }
    let mut blocks: Vec<&crate::plan::order::Block> = ends.iter().map(|e| &e.0).collect();
    blocks.sort();
    blocks.dedup();
    let fitting = || ends.iter().take_while(|e| e.1 <= dedicated);
    VramFit {
        needed: total,
        dedicated,
        spill: total.saturating_sub(dedicated),
        blocks_total: blocks.len() as u64,
        leading_blocks_fit: fitting().count() as u64,
        leading_bytes: fitting().last().map_or(0, |e| e.1),
    }
}

/// A judged loader that cannot read the scenario's format, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NotApplicable {
    pub loader: Loader,
    pub reason: String,
}

/// The checkpoint as it is, or as a conversion would write it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Scenario {
    /// `None`: the checkpoint as it is.
    pub max_shard_size: Option<u64>,
    pub dtype: Option<Dtype>,
    /// `--quantize`: the scheme its Linear weights would be stored in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quantize: Option<crate::plan::quantize::QuantizeScheme>,
    /// The format the loaders would read: the checkpoint's own, or
    /// safetensors for what `convert` writes.
    pub format: Format,
    pub shard_count: u64,
    #[serde(flatten)]
    pub sizes: Sizes,
    pub vram: Option<VramFit>,
    /// The judged loaders that read `format`.
    pub loaders: Vec<LoaderFit>,
    /// The judged loaders that do not read `format`: left out of `loaders`.
    pub not_applicable: Vec<NotApplicable>,
}

impl Scenario {
    /// Judges the loaders that read `format` on shards of `shards` bytes
    /// holding `tensors`; the others are listed as not applicable.
    pub fn judge(
        format: Format,
        shards: &[u64],
        sizes: Sizes,
        tensors: &[(&str, u64)],
        ctx: &Context<'_>,
    ) -> Scenario {
        let (read, unread): (Vec<Loader>, Vec<Loader>) =
            ctx.loaders.iter().partition(|l| l.reads(format));
        let loaders = read
            .into_iter()
            .map(|l| LoaderFit::judge(l, peak(l, &sizes, ctx.params), ctx.budget, ctx.params))
            .collect();
        let not_applicable = unread
            .into_iter()
            .filter_map(|loader| {
                loader.cannot_read(format).map(|why| NotApplicable {
                    loader,
                    reason: why.to_string(),
                })
            })
            .collect();
        Scenario {
            max_shard_size: None,
            dtype: None,
            quantize: None,
            format,
            shard_count: shards.len() as u64,
            sizes,
            vram: ctx.budget.vram_bytes.map(|v| vram_fit(tensors, v)),
            loaders,
            not_applicable,
        }
    }

    /// The checkpoint as it is: shard sizes are file sizes.
    pub fn of_checkpoint(ck: &Checkpoint, ctx: &Context<'_>) -> Scenario {
        let shards: Vec<u64> = ck.files.iter().map(|f| f.size).collect();
        let tensors: Vec<(&str, u64)> = ck
            .tensors
            .iter()
            .map(|t| (t.name.as_str(), t.len))
            .collect();
        let mut sizes = Sizes::new(&shards, tensors.iter().map(|t| t.1));
        if ck.format == Format::Gguf {
            sizes.input_layer = llama_cpp_input_layer(&ck.tensors);
            sizes.quantized_elements_max = ck
                .tensors
                .iter()
                .filter(|t| comfyui_dequantizes(t))
                .map(|t| t.shape.iter().fold(1u64, |a, &d| a.saturating_mul(d)))
                .max()
                .unwrap_or(0);
        }
        Scenario::judge(ck.format, &shards, sizes, &tensors, ctx)
    }

    /// The checkpoint as `convert` would write it under `plan`.
    pub fn of_plan(plan: &Plan, ctx: &Context<'_>) -> Scenario {
        let shards: Vec<u64> = plan
            .shards
            .iter()
            .map(|s| {
                let header = crate::write::format::of_plan(plan)
                    .header_bytes(std::path::Path::new(&s.file), plan, s)
                    .map_or_else(|_| header_estimate(s), |h| h.len() as u64);
                s.data_len.saturating_add(header)
            })
            .collect();
        let tensors: Vec<(&str, u64)> = plan.tensors().map(|t| (t.name.as_str(), t.len)).collect();
        let sizes = Sizes::new(&shards, tensors.iter().map(|t| t.1));
        let format = match plan.options.format {
            OutputFormat::Safetensors => Format::Safetensors,
            OutputFormat::Gguf => Format::Gguf,
        };
        let mut s = Scenario::judge(format, &shards, sizes, &tensors, ctx);
        s.max_shard_size = Some(plan.options.max_shard_size);
        s.dtype = plan.options.dtype;
        s.quantize = plan.options.quantize;
        s
    }

    /// The judged loaders whose host memory fits (VRAM aside: shard sizes
    /// do not change it).
    pub fn fitting_host(&self) -> Vec<Loader> {
        self.loaders
            .iter()
            .filter(|l| l.host_shortfall == 0)
            .map(|l| l.loader)
            .collect()
    }

    pub fn all_fit(&self) -> bool {
        self.loaders.iter().all(|l| l.fits)
    }
}

/// The tensors llama.cpp puts on its input layer, which it keeps on the CPU
/// whatever `-ngl` says (llama-arch.cpp's `LLM_TENSOR_LAYER_INPUT`).
const LLAMA_CPP_INPUT_LAYER: [&str; 4] = [
    "token_embd",
    "position_embd",
    "token_types",
    "per_layer_token_embd",
];

/// Bytes of llama.cpp's input layer that stay on the CPU only. When the
/// file has no `output.weight`, llama.cpp uses `token_embd` as the output
/// too and copies it to the output layer's device: it is then not counted.
fn llama_cpp_input_layer(tensors: &[Tensor]) -> u64 {
    let tied = !tensors.iter().any(|t| t.name == "output.weight");
    tensors
        .iter()
        .filter(|t| {
            let stem = t.name.split('.').next().unwrap_or("");
            LLAMA_CPP_INPUT_LAYER.contains(&stem) && !(tied && stem == "token_embd")
        })
        .fold(0u64, |a, t| a.saturating_add(t.len))
}

/// ComfyUI-GGUF dequantizes every tensor whose type torch cannot use as
/// it is: all but F32 and F16 (so BF16 too; ops.py's
/// `torch_compatible_tensor_types`).
fn comfyui_dequantizes(t: &Tensor) -> bool {
    t.ggml_type().is_some() || t.dtype == Dtype::BF16
}

/// A generous bound on a shard header when the exact one cannot be built.
fn header_estimate(s: &ShardPlan) -> u64 {
    8 + 1024
        + s.tensors
            .iter()
            .map(|t| t.name.len() as u64 + 96)
            .sum::<u64>()
}

/// What every scenario is judged with.
#[derive(Debug, Clone, Copy)]
pub struct Context<'a> {
    pub loaders: &'a [Loader],
    pub params: &'a LoadParams,
    pub budget: &'a Budget,
}

/// The conversion that makes the most loaders fit in host memory. VRAM is
/// left aside: shard sizes do not change it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recommendation {
    pub max_shard_size: u64,
    /// `--max-shard-size` as typed (`1GiB`).
    pub max_shard_size_arg: String,
    pub dtype: Option<Dtype>,
    /// The command line to run.
    pub command: String,
    /// Loaders whose host memory fits after the conversion.
    pub fits: Vec<Loader>,
    /// Loaders whose host memory is still short.
    pub still_not_fitting: Vec<Loader>,
}

/// Everything `reshard fit` reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FitReport {
    pub machine: Machine,
    pub budget: Budget,
    pub params: LoadParams,
    pub loaders: Vec<Loader>,
    pub today: Scenario,
    pub what_if: Option<Scenario>,
    pub recommendation: Option<Recommendation>,
    /// Judged loaders short of host memory that no shard size makes fit
    /// (at the checkpoint's own dtype).
    pub not_helped_by_resharding: Vec<Loader>,
    /// Every judged loader fits (in the what-if scenario when there is one).
    pub fits: bool,
}

/// Judges `ck` on `machine`.
pub fn fit(ck: &Checkpoint, machine: Machine, options: &FitOptions) -> Result<FitReport, FitError> {
    let budget = Budget::of(&machine)?;
    let params = load_params(&machine, &budget, options);
    let mut loaders = options.loaders.clone();
    loaders.sort();
    loaders.dedup();
    if loaders.is_empty() {
        loaders = Loader::ALL.to_vec();
    }
    let ctx = Context {
        loaders: &loaders,
        params: &params,
        budget: &budget,
    };
    let today = Scenario::of_checkpoint(ck, &ctx);
    let what_if = match &options.what_if {
        Some(o) => Some(Scenario::of_plan(&sized_plan(ck, o)?, &ctx)),
        None => None,
    };
    let judged = what_if.as_ref().unwrap_or(&today);
    // A loader named on the command line that cannot read the checkpoint
    // cannot load it: that fails the check. The default set leaves such
    // loaders out and says why.
    let named = !options.loaders.is_empty();
    let unreadable_named = named && !judged.not_applicable.is_empty();
    let fits = judged.all_fit() && !judged.loaders.is_empty() && !unreadable_named;
    let host_short: Vec<Loader> = today
        .loaders
        .iter()
        .filter(|l| l.host_shortfall > 0)
        .map(|l| l.loader)
        .collect();
    let (recommendation, not_helped_by_resharding) = if host_short.is_empty() {
        (None, Vec::new())
    } else if ck.format == Format::Gguf {
        // `convert` writes safetensors, which the GGUF loaders do not read:
        // no conversion reshard makes helps them.
        (None, host_short)
    } else {
        let asked = options
            .what_if
            .as_ref()
            .zip(what_if.as_ref())
            .filter(|(o, _)| o.quantize.is_none());
        recommend(ck, &today, asked, &ctx, &options.path)?
    };
    Ok(FitReport {
        machine,
        budget,
        params,
        loaders,
        today,
        what_if,
        recommendation,
        not_helped_by_resharding,
        fits,
    })
}

/// The load parameters of `options` on `machine`.
pub(super) fn load_params(machine: &Machine, budget: &Budget, options: &FitOptions) -> LoadParams {
    LoadParams {
        os: machine.os,
        gpu: budget.vram_bytes.is_some(),
        threads: options.threads,
        window: options.window,
        cuda_overhead: options.cuda_overhead,
        baseline: options.baseline,
        vram: budget.vram_bytes,
        baseline_holds_device: options.baseline_holds_device,
    }
}

/// Tries every candidate shard size ([`candidate_sizes`]) at the source
/// dtype and (for f32/f64 sources) at bf16, and the what-if conversion
/// asked for, and keeps the least change among those that make the most
/// loaders fit: no cast before a cast, then the largest shards. `None` when
/// none beats the checkpoint as it is. The second value: the loaders no
/// conversion without a cast makes fit (the what-if included, so the
/// advice never contradicts its own table).
fn recommend(
    ck: &Checkpoint,
    today: &Scenario,
    asked: Option<(&PlanOptions, &Scenario)>,
    ctx: &Context<'_>,
    path: &str,
) -> Result<(Option<Recommendation>, Vec<Loader>), FitError> {
    let wide = ck
        .tensors
        .iter()
        .any(|t| matches!(t.dtype, Dtype::F32 | Dtype::F64));
    let dtypes: &[Option<Dtype>] = if wide {
        &[None, Some(Dtype::BF16)]
    } else {
        &[None]
    };
    let sizes = candidate_sizes(ck);
    // Shards past the checkpoint's own size are no less change than its own.
    let own = sizes.first().map_or(u64::MAX, |s| s.0);
    let mut tried: Vec<(u64, String, Option<Dtype>, Vec<Loader>)> = Vec::new();
    for &dtype in dtypes {
        for (size, arg) in sizes.iter().cloned() {
            let options = PlanOptions {
                max_shard_size: size,
                dtype,
                ..PlanOptions::default()
            };
            let s = Scenario::of_plan(&sized_plan(ck, &options)?, ctx);
            tried.push((size, arg, dtype, s.fitting_host()));
        }
    }
    if let Some((o, s)) = asked {
        tried.push((
            o.max_shard_size,
            size_arg(o.max_shard_size),
            o.dtype,
            s.fitting_host(),
        ));
    }
    // The loaders that read the checkpoint (and what convert writes).
    let judged: Vec<Loader> = today.loaders.iter().map(|l| l.loader).collect();
    let mut reshard_fixes: Vec<Loader> = today.fitting_host();
    for (_, _, dtype, fits) in &tried {
        if dtype.is_none() {
            reshard_fixes.extend(fits.iter().copied());
        }
    }
    let unhelped = judged
        .iter()
        .copied()
        .filter(|l| !reshard_fixes.contains(l))
        .collect();
    // Most loaders fitting, then no cast, then the largest shards up to the
    // checkpoint's own; on a full tie the earliest tried (a candidate
    // before the what-if, so a what-if that merges shards is not advised).
    let best = tried
        .into_iter()
        .enumerate()
        .max_by_key(|(i, (size, _, dtype, fits))| {
            (
                fits.len(),
                dtype.is_none(),
                (*size).min(own),
                std::cmp::Reverse(*i),
            )
        })
        .map(|(_, t)| t)
        .filter(|(_, _, _, fits)| fits.len() > today.fitting_host().len())
        .map(|(size, arg, dtype, fits)| {
            let mut command = format!(
                "reshard convert {} OUT --max-shard-size {arg}",
                crate::platform::shell_quote(path)
            );
            if let Some(d) = dtype {
                command.push_str(&format!(" --dtype {}", d.name().to_ascii_lowercase()));
            }
            let still_not_fitting = judged
                .iter()
                .copied()
                .filter(|l| !fits.contains(l))
                .collect();
            Recommendation {
                max_shard_size: size,
                max_shard_size_arg: arg,
                dtype,
                command,
                fits,
                still_not_fitting,
            }
        });
    Ok((best, unhelped))
}

/// `--max-shard-size` as one would type `bytes`: `64MiB`, `5GB`, or the
/// number of bytes with a `B` when no unit divides it.
pub(super) fn size_arg(bytes: u64) -> String {
    const UNITS: [(u64, &str); 6] = [
        (1 << 30, "GiB"),
        (1_000_000_000, "GB"),
        (1 << 20, "MiB"),
        (1_000_000, "MB"),
        (1 << 10, "KiB"),
        (1_000, "KB"),
    ];
    UNITS
        .iter()
        .find(|(unit, _)| bytes > 0 && bytes.is_multiple_of(*unit))
        .map_or_else(
            || format!("{bytes}B"),
            |(unit, name)| format!("{}{name}", bytes / unit),
        )
}

#[cfg(test)]
#[path = "judge_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "windows_reports_tests.rs"]
mod windows_reports_tests;

/// The plan `convert` would make under `options`, for its sizes: a GGUF's
/// tensors keep their GGUF names here, since names do not change sizes and
/// a file transformers has no names for still has a size.
pub(super) fn sized_plan(ck: &Checkpoint, options: &PlanOptions) -> Result<Plan, PlanError> {
    let mut options = options.clone();
    options.keep_gguf_names = true;
    crate::write::format::plan(ck, &options)
}
