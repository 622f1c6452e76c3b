//! The flags of `reshard convert`: parsed by clap, turned into the
//! library's [`ConvertOptions`] by [`ConvertArgs::to_options`].

use std::path::PathBuf;

use reshard::cast::OverflowPolicy;
use reshard::convert::{ConvertOptions, KeepPreset};
use reshard::exec::CopyPath;
use reshard::format::Dtype;
use reshard::plan::quantize::QuantizeScheme;
use reshard::plan::PlanOptions;
use reshard::units::ByteSize;
use reshard::write::digest::DigestAlgo;

use crate::cli::inspect::OrderArg;
use crate::cli::machine::MachineArgs;
use crate::cli::validate::LoadArgs;
use reshard::convert::split::ComponentPrefix;

#[derive(Debug, clap::Args)]
#[command(group(
    clap::ArgGroup::new("machine_given")
        .args(MACHINE_FLAGS)
        .multiple(true)
        .requires("fit")
))]
pub struct Args {
    /// The checkpoint to read (file, folder or Hugging Face cache folder).
    pub src: PathBuf,
    /// The folder to write (created if missing; never the source folder).
    /// NAME.safetensors names one file instead, NAME.gguf a GGUF file.
    pub dst: PathBuf,
    #[command(flatten)]
    pub options: ConvertArgs,
    /// Print the plan and write nothing.
    #[arg(long)]
    pub dry_run: bool,
    #[command(flatten)]
    pub print: crate::cli::printer::OutputArgs,
    /// Print only errors.
    #[arg(short, long)]
    pub quiet: bool,
    /// Also list every shard written.
    #[arg(short, long)]
    pub verbose: bool,
    /// After converting, run `reshard validate DST --against SRC`: load the
    /// output through reshard's loader and compare every tensor with the
    /// source (exit 1 when a check fails).
    #[arg(long)]
    pub validate: bool,
    #[command(flatten)]
    pub fit: FitArgs,
    /// The machine `--fit` plans for (default: this one).
    // Boxed: `convert`'s arguments are already the largest of the binary.
    #[command(flatten, next_help_heading = "Machine (--fit)")]
    pub machine: Box<MachineArgs>,
    #[command(flatten, next_help_heading = "Validation (--validate)")]
    pub load: LoadArgs,
}

/// The machine flags (fit's [`MachineArgs`]), which only `--fit` reads.
const MACHINE_FLAGS: [&str; 9] = [
    "os",
    "ram",
    "pagefile",
    "commit_limit",
    "vram",
    "loaders",
    "pread_threads",
    "baseline",
    "cuda_overhead",
];

/// `--fit`, `--for` and `--reserve`: shared by `convert` and `batch`.
#[derive(Debug, Clone, clap::Args)]
pub struct FitArgs {
    /// Plan with `fit --for PROGRAM` on the machine (detected, or the
    /// machine flags below), take the best form that fits and convert to
    /// it: its dtype, --quantize scheme, format and shard size. Exit 1,
    /// writing nothing, when no form fits. With --validate, the output is
    /// loaded under the budgets the plan promised (the machine's commit
    /// limit, and the program's VRAM for weights).
    #[arg(
        long,
        requires = "for_program",
        conflicts_with_all = ["dtype", "quantize", "max_shard_size", "single_file", "split_components", "commit_budget", "vram_budget"]
    )]
    pub fit: bool,
    /// With --fit: the program that loads the output (comfyui,
    /// comfyui-gguf, forge, invokeai, transformers, diffusers, llama.cpp,
    /// vllm). Required: the best form depends on what the program reads.
    #[arg(long = "for", value_name = "PROGRAM", requires = "fit", value_parser = crate::cli::fit_for::parse_program)]
    pub for_program: Option<String>,
    /// With --fit: VRAM kept free for activations beside the weights
    /// (default 1GiB; ComfyUI's and Forge's own rules replace it).
    #[arg(long, value_name = "SIZE", requires = "fit")]
    pub reserve: Option<ByteSize>,
}

/// The options `convert` and `batch` share.
#[derive(Debug, Clone, clap::Args)]
pub struct ConvertArgs {
    /// Largest shard (tensor bytes). IEC units (KiB, MiB, GiB) are powers of
    /// 1024; SI units (KB, MB, GB) are powers of 1000, as Hugging Face uses.
    /// A bare number under 1 MiB is refused: write its unit (10GB, or 10B
    /// for bytes). [default: 1GiB; a GGUF diffusion model: one file]
    #[arg(long, value_name = "SIZE", value_parser = parse_shard_size)]
    pub max_shard_size: Option<ByteSize>,
    #[command(flatten)]
    pub layout: LayoutArgs,
    /// Memory for buffers in flight, for the whole process.
    #[arg(long, default_value = "256MiB", value_name = "SIZE")]
    pub window: ByteSize,
    /// Tensor order in the output.
    #[arg(long, value_enum, default_value = "forward")]
    pub order: OrderArg,
    /// Worker threads (default: all cores).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// Replace a DST that holds another conversion or other files.
    #[arg(long)]
    pub overwrite: bool,
    /// Hide the progress bar.
    #[arg(long)]
    pub no_progress: bool,
    /// Cast floating-point tensors to this dtype (bf16, f16, f32, f64).
    #[arg(long, value_name = "DTYPE", value_parser = parse_dtype)]
    pub dtype: Option<Dtype>,
    /// Keep tensors whose names match this glob in their dtype (repeatable;
    /// with --dtype).
    #[arg(long, value_name = "GLOB", requires = "dtype")]
    pub keep_dtype: Vec<String>,
    /// Store Linear weights quantized to FP8 (the schemes below); norms,
    /// biases, embeddings, the output head and what the model family keeps
    /// stay in their dtype (or --dtype's). See docs/quantize.md for which
    /// program reads which scheme.
    #[arg(long, value_enum, value_name = "SCHEME")]
    pub quantize: Option<QuantizeArg>,
    /// With --quantize fp8-block: rows x columns of one scale's block.
    #[arg(long, value_name = "ROWSxCOLS", value_parser = parse_block, requires = "quantize")]
    pub block: Option<[u64; 2]>,
    /// With --quantize: keep tensors matching this glob unquantized
    /// (repeatable).
    #[arg(long, value_name = "GLOB", requires = "quantize")]
    pub keep: Vec<String>,
    /// With --quantize: quantize only the Linear weights matching this glob
    /// (repeatable; the family's keep list does not apply to them).
    #[arg(long, value_name = "GLOB", requires = "quantize")]
    pub quantize_only: Vec<String>,
    /// What to do with values too large for --dtype (with --quantize:
    /// also values infinite in the dtype a weight is quantized in; with
    /// --fit: for the form it chooses). [default: error]
    // Checked by `ConvertArgs::check_on_overflow`, not by clap: `--fit` is
    // not among these flags (batch and convert flatten it beside them).
    #[arg(long, value_enum)]
    pub on_overflow: Option<OverflowArg>,
    /// Write only the first name of tensors that share one storage.
    #[arg(long)]
    pub dedupe_tied: bool,
    /// Write expanded (stride-0) views even when their output is more than
    /// 16 times the bytes they read (a tiny .bin can otherwise ask for
    /// petabytes).
    #[arg(long)]
    pub allow_expanded: bool,
    /// Write quantized (FP8, MXFP4) weights that have no scale as their
    /// plain codes instead of refusing them.
    #[arg(long)]
    pub allow_unscaled: bool,
    /// GGUF source: keep GGUF tensor names (`blk.0.attn_q.weight`) instead
    /// of writing a transformers folder (Hugging Face names, llama's q/k
    /// rows put back, config.json and tokenizer from the header).
    #[arg(long)]
    pub keep_gguf_names: bool,
    /// Record each shard's sha256 in reshard.json (what `sha256sum` prints
    /// and Hub LFS object ids are) instead of its BLAKE3, which costs a
    /// fraction of the CPU.
    #[arg(long)]
    pub sha256: bool,
    /// Read and write every byte through buffers instead of reading the
    /// source through read-only shared mappings (never copy-on-write).
    /// Mappings already fall back by themselves where a file system refuses
    /// them; this avoids the one risk they carry, a source truncated by
    /// another program mid-read (see docs/convert.md).
    #[arg(long, alias = "no-kernel-copy")]
    pub no_mmap: bool,
}

/// `--dtype`: a dtype name, with the valid targets and, for an FP8 or
/// integer name, the flag that does what was meant.
fn parse_dtype(s: &str) -> Result<Dtype, String> {
    let lower = s.to_ascii_lowercase();
    let fp8 = ["fp8", "float8", "f8"].iter().any(|p| lower.starts_with(p));
    match s.parse::<Dtype>() {
        Ok(d) if reshard::cast::TARGETS.contains(&d) => Ok(d),
        _ if fp8 => Err(format!(
            "--dtype casts to bf16, f16, f32 or f64; FP8 needs scales or a clamp: use --quantize {}",
            if lower.contains("e5m2") { "fp8-e5m2" } else { "fp8" }
        )),
        _ => Err(format!("{s:?}: --dtype takes bf16, f16, f32 or f64")),
    }
}

/// Bare numbers under this are taken for a forgotten unit.
const BARE_SHARD_SIZE_MIN: u64 = 1 << 20;

/// `--max-shard-size` (convert's, batch's and fit's): a size, where a bare
/// number under 1 MiB is refused as a forgotten unit (`10` is 10 bytes,
/// which puts every tensor in a shard of its own; 10GB was meant).
pub fn parse_shard_size(s: &str) -> Result<ByteSize, String> {
    let size: ByteSize = s
        .parse()
        .map_err(|e: reshard::units::BadSize| e.to_string())?;
    let t = s.trim();
    if t.bytes().all(|b| b.is_ascii_digit() || b == b'.') && size.bytes() < BARE_SHARD_SIZE_MIN {
        return Err(format!(
            "{t:?} has no unit, so it is {t} bytes, which puts every tensor in a shard of its own: did you mean {t}GB? (write {t}B if you mean bytes)"
        ));
    }
    Ok(size)
}

/// `--block ROWSxCOLS` (or one number for square blocks).
pub fn parse_block(s: &str) -> Result<[u64; 2], String> {
    let bad = || format!("{s:?}: --block takes ROWSxCOLS, for example 128x128");
    let mut parts = s.split(['x', 'X']);
    let rows: u64 = parts
        .next()
        .ok_or_else(bad)?
        .trim()
        .parse()
        .map_err(|_| bad())?;
    let cols: u64 = match parts.next() {
        Some(c) => c.trim().parse().map_err(|_| bad())?,
        None => rows,
    };
    if parts.next().is_some() {
        return Err(bad());
    }
    if rows == 0 || cols == 0 {
        return Err(format!(
            "{s:?}: a block of 0 rows or columns holds no values"
        ));
    }
    Ok([rows, cols])
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum QuantizeArg {
    /// float8_e4m3fn storage, no scales (ComfyUI's fp8_e4m3fn weight
    /// dtype, Forge, diffusers layerwise casting, InvokeAI).
    Fp8,
    /// float8_e5m2 storage, no scales.
    #[value(name = "fp8-e5m2")]
    Fp8E5m2,
    /// ComfyUI's scaled FP8: a per-tensor weight_scale, comfy_quant and
    /// _quantization_metadata.
    #[value(name = "fp8-scaled")]
    Fp8Scaled,
    /// The older scaled FP8 layout (scaled_fp8 marker, scale_weight) of
    /// older ComfyUI and Forge builds.
    #[value(name = "fp8-scaled-legacy")]
    Fp8ScaledLegacy,
    /// compressed-tensors FP8_DYNAMIC: per-channel weight_scale (transformers
    /// with compressed-tensors, vLLM).
    #[value(name = "fp8-channel")]
    Fp8Channel,
    /// transformers FineGrainedFP8 / DeepSeek: weight_scale_inv per block.
    #[value(name = "fp8-block")]
    Fp8Block,
    /// GGUF Q8_0 (8-bit blocks of 32, ggml's reference rounding); needs a
    /// DST ending in .gguf.
    #[value(name = "q8_0")]
    Q8_0,
    /// GGUF Q4_0 (4-bit blocks of 32); needs a .gguf DST.
    #[value(name = "q4_0")]
    Q4_0,
    /// GGUF Q4_K (4-bit super-blocks of 256); needs a .gguf DST.
    #[value(name = "q4_k")]
    Q4K,
    /// GGUF Q6_K (6-bit super-blocks of 256); needs a .gguf DST.
    #[value(name = "q6_k")]
    Q6K,
}

impl From<QuantizeArg> for QuantizeScheme {
    fn from(a: QuantizeArg) -> QuantizeScheme {
        match a {
            QuantizeArg::Fp8 => QuantizeScheme::Fp8,
            QuantizeArg::Fp8E5m2 => QuantizeScheme::Fp8E5m2,
            QuantizeArg::Fp8Scaled => QuantizeScheme::Fp8Scaled,
            QuantizeArg::Fp8ScaledLegacy => QuantizeScheme::Fp8ScaledLegacy,
            QuantizeArg::Fp8Channel => QuantizeScheme::Fp8Channel,
            QuantizeArg::Fp8Block => QuantizeScheme::Fp8Block,
            QuantizeArg::Q8_0 => QuantizeScheme::Q8_0,
            QuantizeArg::Q4_0 => QuantizeScheme::Q4_0,
            QuantizeArg::Q4K => QuantizeScheme::Q4K,
            QuantizeArg::Q6K => QuantizeScheme::Q6K,
        }
    }
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum OverflowArg {
    /// Fail, naming the tensor and the count.
    Error,
    /// Clamp to the largest finite value of the target.
    Saturate,
    /// Become +-inf, as torch does.
    Inf,
}

impl ConvertArgs {
    /// Refuses `--on-overflow` where nothing narrows a value: it needs
    /// --dtype, --quantize or `fit` (`--fit`, which chooses one of them).
    /// A usage error (exit 2), as clap would give it.
    pub fn check_on_overflow(&self, fit: bool) -> anyhow::Result<()> {
        if self.on_overflow.is_some() && self.dtype.is_none() && self.quantize.is_none() && !fit {
            anyhow::bail!(
                "--on-overflow decides what a narrowing does to values too large for it: give it with --dtype, --quantize or --fit"
            );
        }
        Ok(())
    }

    pub fn to_options(&self) -> ConvertOptions {
        let mut options = ConvertOptions {
            plan: PlanOptions {
                max_shard_size: self.layout.max_shard_size(
                    self.max_shard_size
                        .map_or(PlanOptions::default().max_shard_size, ByteSize::bytes),
                ),
                order: self.order.into(),
                dtype: self.dtype,
                keep_dtype: self.keep_dtype.clone(),
                on_overflow: match self.on_overflow {
                    None | Some(OverflowArg::Error) => OverflowPolicy::Error,
                    Some(OverflowArg::Saturate) => OverflowPolicy::Saturate,
                    Some(OverflowArg::Inf) => OverflowPolicy::Inf,
                },
                dedupe_tied: self.dedupe_tied,
                allow_unscaled: self.allow_unscaled,
                quantize: self.quantize.map(Into::into),
                quantize_keep: self.keep.clone(),
                quantize_only: self.quantize_only.clone(),
                quantize_block: self.block,
                keep_gguf_names: self.keep_gguf_names,
                format: Default::default(),
            },
            window: self.window.bytes(),
            threads: self
                .threads
                .unwrap_or_else(|| ConvertOptions::default().threads),
            overwrite: self.overwrite,
            copy_other_files: true,
            walk: reshard::convert::Walk::Flat,
            config_dtype: true,
            single_file: false,
            within: None,
            allow_expanded: self.allow_expanded,
            id_salt: None,
            keep_components: Vec::new(),
            digest: if self.sha256 {
                DigestAlgo::Sha256
            } else {
                DigestAlgo::Blake3
            },
            copy: if self.no_mmap {
                CopyPath::ReadWrite
            } else {
                CopyPath::Auto
            },
            shard_size_given: self.max_shard_size.is_some(),
        };
        let presets: Vec<KeepPreset> = self
            .layout
            .keep_dtype_preset
            .iter()
            .map(|&p| p.into())
            .collect();
        options.keep_presets(&presets);
        options
    }
}

/// `--keep-dtype-preset` as typed: the library's [`KeepPreset`] (which
/// says what each keeps).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KeepPresetArg {
    /// The VAE: in f16 the SD and SDXL VAEs overflow to NaN (black images).
    Vae,
    /// Normalization weights: tiny, and the scales most hurt by rounding.
    Norms,
}

impl From<KeepPresetArg> for KeepPreset {
    fn from(p: KeepPresetArg) -> KeepPreset {
        match p {
            KeepPresetArg::Vae => KeepPreset::Vae,
            KeepPresetArg::Norms => KeepPreset::Norms,
        }
    }
}

/// The options about the output's layout (one file, components).
#[derive(Debug, Clone, clap::Args)]
pub struct LayoutArgs {
    /// Write each weight set as one `<prefix>.safetensors` (no index), for
    /// UIs that load one file (ComfyUI, A1111/Forge, InvokeAI): streamed
    /// through the window like shards, layer-ordered, the source's
    /// `__metadata__` kept. Merges a sharded checkpoint into one file.
    #[arg(long, conflicts_with = "max_shard_size")]
    pub single_file: bool,
    /// Split an all-in-one UI checkpoint into one file per component,
    /// `DST/NAME/NAME.safetensors`, names without their prefix (see
    /// docs/layouts.md for the prefix table).
    #[arg(long, conflicts_with = "max_shard_size")]
    pub split_components: bool,
    /// With --split-components: tensors starting with PREFIX form component
    /// NAME (repeatable; wins over the built-in table).
    #[arg(long, value_name = "NAME=PREFIX", requires = "split_components")]
    pub component_prefix: Vec<ComponentPrefix>,
    /// With --dtype: keep these in their dtype (repeatable): `vae` (a
    /// pipeline's or a split's `vae`, and `first_stage_model.*` in one
    /// file), `norms` (every `*norm*` and `*ln_*` tensor).
    #[arg(long, value_enum, value_name = "PRESET", requires = "dtype")]
    pub keep_dtype_preset: Vec<KeepPresetArg>,
}

impl LayoutArgs {
    /// The shard limit these options leave: none with `--single-file`.
    pub(super) fn max_shard_size(&self, given: u64) -> u64 {
        if self.single_file {
            u64::MAX
        } else {
            given
        }
    }
}
