//! What `validate` found: plain serde data the CLI prints as text or JSON
//! and the budget child sends to its parent.

use std::fmt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::ledger::CommitFigures;
use super::options::{Loader, ValidateOptions};
use crate::units::human;

/// The device the load step used.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceInfo {
    /// `cpu` or `cuda:N`.
    pub device: String,
    pub name: String,
    /// Dedicated memory of a GPU; `None` for the CPU stand-in.
    pub total_memory: Option<u64>,
    /// Whether the staging buffer is page-locked (pinned) host memory.
    pub pinned_staging: bool,
}

/// One shard as loaded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardTiming {
    pub file: String,
    pub bytes: u64,
    pub tensors: usize,
    pub seconds: f64,
}

/// How much of the model a VRAM budget holds, in layer order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VramFit {
    pub budget: u64,
    /// Device bytes the whole model needs.
    pub needed: u64,
    /// Leading numbered blocks (layer order) whose tensors all fit.
    pub blocks_fit: usize,
    pub blocks_total: usize,
    /// The leading blocks an offloading load must hold in the budget
    /// ([`super::ValidateOptions::vram_leading_blocks`]); the rest stays
    /// on the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocks_required: Option<usize>,
}

/// Where a GPU load's allocations went, against the free dedicated memory
/// the driver reported before each (`cuMemGetInfo`). With NVIDIA's System
/// Memory Fallback (Windows) an allocation past it still succeeds, in
/// shared system memory; layer order puts the leading blocks first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    /// Free dedicated memory before the first allocation.
    pub free_at_start: u64,
    /// In load order: each numbered block, and each tensor outside blocks.
    pub groups: Vec<BlockPlacement>,
}

/// One block (or a tensor outside blocks) as [`Placement`] saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockPlacement {
    /// `model.layers.3`, or the tensor's name outside blocks.
    pub name: String,
    /// Whether `name` is a numbered block.
    pub block: bool,
    pub bytes: u64,
    /// Every allocation of it came while the driver reported enough free
    /// dedicated memory for it; `false`: after the dedicated memory ran out.
    pub dedicated: bool,
}

/// What an emulated loader mapped, and what DESIGN.md predicts for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EmulationReport {
    pub loader: Loader,
    pub shards: usize,
    /// Sum of the shard file sizes, sum(S).
    pub sum_shards: u64,
    /// The largest shard file, max(S).
    pub max_shard: u64,
    /// The steady-state peak the loader's pattern implies: sum(S) when every
    /// shard stays mapped or read, max(S) one shard at a time.
    pub predicted_peak: u64,
}

/// What `--against` compared.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgainstReport {
    pub source: String,
    pub tensors_compared: usize,
    /// Of those, compared with the cast of the source.
    pub cast_compared: usize,
    /// Of those, compared with the dequantization of a quantized source's
    /// codes and scales.
    #[serde(default)]
    pub dequantized_compared: usize,
    /// Of those, compared with quantizing the source again (codes, scales
    /// and their companions of a `convert --quantize` output).
    #[serde(default)]
    pub quantized_compared: usize,
    /// The scheme the output's layout shows, when it is quantized.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quantize_scheme: Option<crate::plan::quantize::QuantizeScheme>,
    /// The GGML types of a GGUF output's tensors, each compared with the
    /// source encoded again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gguf_types: Vec<String>,
    /// Of a GGUF output's tensors, those held as a float type where the
    /// options it shows give another type (`--keep`, `--quantize-only`,
    /// `--keep-dtype`), compared with the source encoded as that type.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub kept_as_float: usize,
    /// The error figures of its codes against the source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quality: Option<crate::cast::quantize::QualityReport>,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// A check that ran and failed. Each names the file and, where one is
/// involved, the tensor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Failure {
    /// The manifest lists a tensor that no file holds, or the index names a
    /// file that does not hold it.
    MissingTensor {
        tensor: String,
        file: String,
        reason: String,
    },
    /// A file holds a tensor the manifest or index does not list.
    UnlistedTensor {
        tensor: String,
        file: String,
        reason: String,
    },
    /// The manifest lists a shard that is not there.
    MissingShard { file: String },
    /// A file reshard wrote beside the shards (the index, config.json, a
    /// mirrored file) is gone or not what reshard.json recorded.
    FileChanged { file: String, reason: String },
    ShardChecksum {
        file: String,
        expected: String,
        actual: String,
    },
    ShardSize {
        file: String,
        expected: u64,
        actual: u64,
    },
    TensorChecksum {
        file: String,
        tensor: String,
        expected: String,
        actual: String,
    },
    TensorMeta {
        file: String,
        tensor: String,
        reason: String,
    },
    /// The bytes read back from the device differ from the file's.
    Readback {
        file: String,
        tensor: String,
        device: String,
    },
    /// An allocation or mapping failed under the commit budget.
    OverBudget {
        shard: String,
        tensor: Option<String>,
        needed: u64,
        committed: u64,
        budget: Option<u64>,
    },
    /// The budget child was stopped by a signal (an allocation failure in a
    /// path that cannot report it).
    Stopped { budget: u64, detail: String },
    /// The measured peak (sampled) went past the budget; on Linux the limit
    /// is enforced, elsewhere only measured.
    PeakOverBudget { peak: u64, budget: u64 },
    /// The device ran out of memory: an allocation failed with
    /// `held` device bytes already allocated.
    DeviceOutOfMemory {
        shard: String,
        tensor: String,
        needed: u64,
        held: u64,
        device: String,
    },
    /// The load went past `--vram-budget`.
    VramBudget {
        shard: String,
        tensor: String,
        fit: VramFit,
    },
    /// An offloading load's budget holds fewer leading blocks than it
    /// must ([`VramFit::blocks_required`]).
    VramBlocks { fit: VramFit },
    /// A tensor differs from the `--against` source.
    AgainstMismatch {
        tensor: String,
        file: String,
        reason: String,
    },
    /// A tensor exists on one side of `--against` only.
    AgainstMissing { tensor: String, side: String },
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::MissingTensor { tensor, file, reason } => write!(f, "{file}: tensor {tensor:?} is missing: {reason}"),
            Failure::UnlistedTensor { tensor, file, reason } => write!(f, "{file}: tensor {tensor:?} {reason}"),
            Failure::MissingShard { file } => write!(f, "{file}: listed in reshard.json but not found"),
            Failure::FileChanged { file, reason } => write!(f, "{file}: {reason}"),
            Failure::ShardChecksum { file, expected, actual } => {
                write!(f, "{file}: its digest is {actual}, reshard.json says {expected}")
            }
            Failure::ShardSize { file, expected, actual } => {
                write!(f, "{file}: {actual} bytes, reshard.json says {expected}")
            }
            Failure::TensorChecksum { file, tensor, expected, actual } => {
                write!(f, "{file}: tensor {tensor:?}: xxh3 is {actual}, reshard.json says {expected}")
            }
            Failure::TensorMeta { file, tensor, reason } => write!(f, "{file}: tensor {tensor:?}: {reason}"),
            Failure::Readback { file, tensor, device } => {
                write!(f, "{file}: tensor {tensor:?}: bytes read back from {device} differ from the file's")
            }
            Failure::OverBudget { shard, tensor, needed, committed, budget } => {
                write!(f, "over budget at shard {shard}")?;
                if let Some(t) = tensor {
                    write!(f, ", tensor {t:?}")?;
                }
                write!(f, ": needed {needed} bytes ({}) with {} already committed", human(*needed), human(*committed))?;
                match budget {
                    Some(b) => write!(f, ", past the {} commit budget", human(*b)),
                    None => write!(f, "; the allocation failed"),
                }
            }
            Failure::Stopped { budget, detail } => write!(
                f,
                "over budget (the process was stopped by its allocation failure under a {} commit budget: {detail})",
                human(*budget)
            ),
            Failure::PeakOverBudget { peak, budget } => {
                write!(f, "commit peaked at {} above baseline, over the {} budget", human(*peak), human(*budget))
            }
            Failure::DeviceOutOfMemory { shard, tensor, needed, held, device } => write!(
                f,
                "{device} out of memory at shard {shard}, tensor {tensor:?}: needed {needed} bytes ({}) with {held} bytes ({}) held",
                human(*needed),
                human(*held)
            ),
            Failure::VramBudget { shard, tensor, fit } => write!(
                f,
                "over VRAM budget at shard {shard}, tensor {tensor:?}: the model needs {} of a {} budget; {} of {} leading blocks fit",
                human(fit.needed),
                human(fit.budget),
                fit.blocks_fit,
                fit.blocks_total
            ),
            Failure::VramBlocks { fit } => write!(
                f,
                "VRAM budget {} holds {} of {} leading blocks, and the plan puts {} on the GPU",
                human(fit.budget),
                fit.blocks_fit,
                fit.blocks_total,
                fit.blocks_required.unwrap_or(0)
            ),
            Failure::AgainstMismatch { tensor, file, reason } => write!(f, "{file}: tensor {tensor:?}: {reason}"),
            Failure::AgainstMissing { tensor, side } => write!(f, "tensor {tensor:?} is only in {side}"),
        }
    }
}

/// Everything `validate` measured and found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ValidateReport {
    pub path: String,
    pub passed: bool,
    pub failures: Vec<Failure>,
    pub device: DeviceInfo,
    /// Whether `reshard.json` was there and its checksums were checked.
    pub manifest: bool,
    pub tensors: usize,
    /// Weight files of the checkpoint.
    pub files: usize,
    /// The shards loaded, in load order (fewer than `files` when the load
    /// stopped early).
    pub shards: Vec<ShardTiming>,
    pub bytes_loaded: u64,
    pub load_seconds: f64,
    /// Bytes loaded per second, in GB/s (10^9).
    pub throughput_gb_s: f64,
    /// The staging buffer actually used (bytes).
    pub staging: u64,
    /// Device bytes allocated, counted cumulatively as a GPU would hold them.
    pub device_bytes: u64,
    /// The most device bytes held at once (the CPU stand-in frees each shard).
    pub device_peak_held: u64,
    pub commit_budget: Option<u64>,
    /// Whether the system refused an allocation past the budget's limit
    /// (probed in the budget child; `None` without a budget). `false` means
    /// the budget was only measured against, as under Wine.
    #[serde(default)]
    pub commit_budget_enforced: Option<bool>,
    pub commit: Option<CommitFigures>,
    pub vram: Option<VramFit>,
    /// A GPU load's allocations against its free dedicated memory.
    #[serde(default)]
    pub placement: Option<Placement>,
    pub emulation: Option<EmulationReport>,
    pub against: Option<AgainstReport>,
}

impl ValidateReport {
    pub fn new(path: &Path, options: &ValidateOptions) -> ValidateReport {
        ValidateReport {
            path: path.display().to_string(),
            passed: false,
            failures: Vec::new(),
            device: DeviceInfo::default(),
            manifest: false,
            tensors: 0,
            files: 0,
            shards: Vec::new(),
            bytes_loaded: 0,
            load_seconds: 0.0,
            throughput_gb_s: 0.0,
            staging: 0,
            device_bytes: 0,
            device_peak_held: 0,
            commit_budget: options.commit_budget,
            commit_budget_enforced: None,
            commit: None,
            vram: None,
            placement: None,
            emulation: None,
            against: None,
        }
    }

    pub fn fail(&mut self, failure: Failure) {
        self.failures.push(failure);
        self.passed = false;
    }

    /// Settles `passed` and the derived figures once every step has run.
    pub fn finish(&mut self, options: &ValidateOptions) {
        self.load_seconds = self.shards.iter().fold(0.0, |a, s| a + s.seconds);
        self.throughput_gb_s = self.bytes_loaded as f64 / self.load_seconds.max(1e-9) / 1e9;
        if let (Some(budget), Some(c)) = (options.commit_budget, &self.commit) {
            let over_already = self
                .failures
                .iter()
                .any(|f| matches!(f, Failure::OverBudget { .. }));
            if c.peak_above_baseline > budget && !over_already {
                self.failures.push(Failure::PeakOverBudget {
                    peak: c.peak_above_baseline,
                    budget,
                });
            }
        }
        self.passed = self.failures.is_empty();
    }
}
