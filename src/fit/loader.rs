//! The loaders `fit` knows, and the formula for each one's peak memory.
//!
//! This module owns the arithmetic only: given shard sizes, tensor sizes and
//! a few parameters it returns predicted peaks. It reads no file and knows
//! nothing of the machine; [`super`] compares the peaks with a budget.
//! docs/fit.md gives the source of every formula.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::format::Format;
pub use crate::platform::Os;

/// A way of loading a checkpoint, named by what it does to memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Loader {
    /// transformers 5 `from_pretrained`, mmap backend (the Linux and macOS
    /// default in 5.24; Windows 5.0-5.16): every shard mapped and kept.
    TransformersV5Mmap,
    /// transformers >= 5.17 on Windows (pread backend): reads straight into
    /// the parameters, no shard mapped.
    TransformersV5Pread,
    /// Empty model + per-shard `safetensors.torch.load_file` +
    /// `load_state_dict` (transformers 4, accelerate, vLLM's iterator).
    PerShardMmap,
    /// Read each file whole + `safetensors.torch.load(bytes)`
    /// (transformers' `disable_mmap`).
    FullRead,
    /// diffusers `from_pretrained`, component by component.
    Diffusers,
    /// llama.cpp (`llama-cli`, `llama-server` and the programs built on it):
    /// every GGUF file mapped read-only (`llama_mmap`), the layers copied
    /// from the mapping to the GPU.
    #[serde(rename = "llama.cpp")]
    LlamaCpp,
    /// ComfyUI-GGUF's loader nodes: gguf-py's read-only `np.memmap` of the
    /// file, the quantized bytes moved to the GPU as they are and
    /// dequantized one layer at a time when it runs.
    ComfyuiGguf,
    /// reshard's own validating loader (`reshard validate`).
    Reshard,
}

impl Loader {
    pub const ALL: [Loader; 8] = [
        Loader::TransformersV5Mmap,
        Loader::TransformersV5Pread,
        Loader::PerShardMmap,
        Loader::FullRead,
        Loader::Diffusers,
        Loader::LlamaCpp,
        Loader::ComfyuiGguf,
        Loader::Reshard,
    ];

    /// The stable name used on the command line and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            Loader::TransformersV5Mmap => "transformers-v5-mmap",
            Loader::TransformersV5Pread => "transformers-v5-pread",
            Loader::PerShardMmap => "per-shard-mmap",
            Loader::FullRead => "full-read",
            Loader::Diffusers => "diffusers",
            Loader::LlamaCpp => "llama.cpp",
            Loader::ComfyuiGguf => "comfyui-gguf",
            Loader::Reshard => "reshard",
        }
    }

    /// Whether the loader reads checkpoints of `format`: the GGUF loaders
    /// read GGUF only, the safetensors loaders never read GGUF, reshard's
    /// own loader reads every format reshard opens.
    pub fn reads(self, format: Format) -> bool {
        match self {
            Loader::Reshard => true,
            Loader::LlamaCpp | Loader::ComfyuiGguf => format == Format::Gguf,
            _ => format != Format::Gguf,
        }
    }

    /// Why the loader cannot load a checkpoint of `format` (`None` when it
    /// can, see [`Loader::reads`]).
    pub fn cannot_read(self, format: Format) -> Option<&'static str> {
        if self.reads(format) {
            return None;
        }
        Some(match self {
            Loader::LlamaCpp | Loader::ComfyuiGguf => "these read GGUF files only",
            _ => "these read safetensors or .bin, not GGUF; reshard convert writes a GGUF as safetensors",
        })
    }

    /// Whether `validate --emulate` reproduces the loader's pattern: the
    /// GGUF loaders map read-only, which commits nothing to reproduce.
    pub fn emulated(self) -> bool {
        !matches!(self, Loader::LlamaCpp | Loader::ComfyuiGguf)
    }

    /// Whether the loader runs in a Python process that imports torch and
    /// its library first: fit's baseline term applies to it.
    pub fn in_python(self) -> bool {
        !matches!(self, Loader::Reshard | Loader::LlamaCpp)
    }

    /// Whether smaller shards lower this loader's peak: those that hold one
    /// shard (mapped or read) on top of the model's storage. transformers
    /// with mmap and diffusers keep every shard mapped (diffusers until the
    /// garbage collector runs), pread maps none, and reshard's loader is
    /// already bounded by its staging buffer.
    pub fn resharding_helps(self) -> bool {
        matches!(self, Loader::PerShardMmap | Loader::FullRead)
    }
}

impl fmt::Display for Loader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Loader {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Loader::ALL
            .into_iter()
            .find(|l| l.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Loader::ALL.iter().map(|l| l.name()).collect();
                format!("unknown loader {s:?}: use one of {}", names.join(", "))
            })
    }
}

/// The sizes a checkpoint presents to a loader. `S` are shard file sizes
/// (header included), `T` tensor sizes.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Sizes {
    /// sum(S)
    pub shard_sum: u64,
    /// max(S)
    pub shard_max: u64,
    /// sum(T): the weights' bytes.
    pub tensor_sum: u64,
    /// max(T)
    pub tensor_max: u64,
    /// GGUF: bytes of llama.cpp's input layer (`token_embd`,
    /// `position_embd`, `token_types`, `per_layer_token_embd`), which it
    /// keeps on the CPU however many layers go to the GPU; a `token_embd`
    /// that also serves as the missing `output` is copied to the GPU too
    /// and is not counted. 0 for other formats.
    #[serde(default)]
    pub input_layer: u64,
    /// GGUF: elements of the largest block-quantized tensor, max(n):
    /// ComfyUI-GGUF dequantizes one such weight at a time. 0 without one.
    #[serde(default)]
    pub quantized_elements_max: u64,
}

impl Sizes {
    pub fn new(shards: &[u64], tensors: impl IntoIterator<Item = u64>) -> Sizes {
        let (mut tensor_sum, mut tensor_max) = (0u64, 0u64);
        for t in tensors {
            tensor_sum = tensor_sum.saturating_add(t);
            tensor_max = tensor_max.max(t);
        }
        Sizes {
            shard_sum: shards.iter().fold(0u64, |a, &s| a.saturating_add(s)),
            shard_max: shards.iter().copied().max().unwrap_or(0),
            tensor_sum,
            tensor_max,
            input_layer: 0,
            quantized_elements_max: 0,
        }
    }
}

/// The commit of a Python process that has imported torch and
/// transformers on CPU, before it reads a weight: `VmData` measured on
/// Linux with torch 2.15.0 (CPU build) and transformers 5.24.0 (docs/fit.md).
pub const DEFAULT_BASELINE: u64 = 976 << 20;
/// Commit per reader thread of safetensors 0.8's pread backend, above the
/// weights (measured; docs/fit.md).
pub const PREAD_PER_THREAD: u64 = 24 << 20;
/// transformers 5.24 runs `min(4, cpus)` pread reader threads.
pub const PREAD_MAX_THREADS: u64 = 4;
/// reshard validate's default staging buffer (`--staging`; defined here,
/// at the bottom, so `validate` and `fit` share it without a cycle).
pub const DEFAULT_WINDOW: u64 = 64 << 20;
/// Host commit charged for a CUDA context on Windows (WDDM). An estimate to
/// be measured; see docs/fit.md.
pub const DEFAULT_CUDA_OVERHEAD: u64 = 512 << 20;

/// What a load runs with, besides the checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoadParams {
    pub os: Os,
    /// Weights go to a GPU (one is present or `--vram` was given). Without
    /// one they stay in host memory.
    pub gpu: bool,
    /// Reader threads of the pread backend.
    pub threads: u64,
    /// reshard's staging window.
    pub window: u64,
    /// Host commit of a CUDA context on Windows (WDDM), charged when `gpu`.
    pub cuda_overhead: u64,
    /// The commit of the loader's Python process before it reads a weight
    /// (`fit --baseline`); reported apart from the peak and added to it
    /// when judging, for the loaders that run in Python.
    pub baseline: u64,
    /// Dedicated VRAM when known: the GGUF loaders keep on the host what
    /// does not fit (llama.cpp's `--fit`/`-ngl`, ComfyUI's lowvram mode).
    #[serde(default)]
    pub vram: Option<u64>,
    /// The baseline was measured in the loader's own process with its
    /// device runtime up (`fit --baseline`): the CUDA (or XPU) context's
    /// host commit is already in it, so the Python loaders do not add
    /// `cuda_overhead` again (docs/fit.md, "The Windows rows").
    #[serde(default)]
    pub baseline_holds_device: bool,
}

impl LoadParams {
    /// The calibrated defaults on `os` without a GPU: `min(4, cpus)` pread
    /// threads, the measured baseline.
    pub fn calibrated(os: Os) -> LoadParams {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
        LoadParams {
            os,
            gpu: false,
            threads: cpus.min(PREAD_MAX_THREADS),
            window: DEFAULT_WINDOW,
            cuda_overhead: DEFAULT_CUDA_OVERHEAD,
            baseline: DEFAULT_BASELINE,
            vram: None,
            baseline_holds_device: false,
        }
    }

    /// The device runtime's host commit that `loader`'s peak carries:
    /// Windows with a GPU only (WDDM charges a context's host side; Linux
    /// does not), and not for a Python loader whose measured baseline
    /// already holds it.
    fn device_term(&self, loader: Loader) -> u64 {
        let in_baseline = loader.in_python() && self.baseline_holds_device;
        if self.gpu && self.os == Os::Windows && !in_baseline {
            self.cuda_overhead
        } else {
            0
        }
    }
}

/// Predicted peaks of one loader, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Peak {
    /// Host commit held while the load runs: what Windows charges against
    /// the commit limit, and what Linux charges under strict overcommit
    /// (`vm.overcommit_memory=2`). A sampler of the process's commit
    /// (`psutil`'s `private`, `PrivateUsage`) sees this figure.
    pub commit: u64,
    /// The commit at the instant a shard is opened: `commit` plus, on
    /// Windows, safetensors' own copy-on-write view of the file being
    /// opened, which lives only while torch maps the same file (a few
    /// milliseconds, which a sampler at 0.1 s misses) but is charged when
    /// Windows checks the next view against the commit limit. Equals
    /// `commit` where there is no such view. The figure fit judges.
    #[serde(default)]
    pub open_commit: u64,
    /// Resident anonymous (private) memory: needs RAM (or swap).
    pub rss_private: u64,
    /// Resident file-backed pages of mapped shards that are only read: page
    /// cache, which the kernel can drop and read again.
    pub rss_file: u64,
    /// Device memory for the weights (0 without a GPU).
    pub vram: u64,
    /// Weights a GGUF loader keeps on the host because dedicated VRAM is
    /// short (llama.cpp: in its mapping; comfyui-gguf: private copies,
    /// counted in `commit`): the load fits, but runs slower.
    #[serde(default)]
    pub offloaded: u64,
}

impl Peak {
    /// Private plus file-backed resident pages.
    pub fn rss(&self) -> u64 {
        self.rss_private.saturating_add(self.rss_file)
    }
}

/// How many shard-sized blocks a loader holds at its peak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShardHold {
    /// None: tensors go straight from the file into their storage.
    None,
    /// One shard at a time (the largest sets the peak): max(S).
    One,
    /// Every shard, kept to the end: sum(S).
    All,
}

/// What a loader holds at its peak, term by term: the one model that
/// `fit` adds up ([`peak`]) and `validate --emulate` reproduces, allocation
/// for allocation, so the two agree by construction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pattern {
    /// The model's own storage on the host: sum(T) without a GPU, 0 with one
    /// (or when the parameters are views of the mapped shards).
    pub storage: u64,
    /// The loader's own fixed allocations (reader threads, staging, Python
    /// objects), measured per loader.
    pub overhead: u64,
    pub shards: ShardHold,
    /// Held shards are copy-on-write file mappings (file-backed resident
    /// pages) rather than bytes read into private memory.
    pub mapped: bool,
    /// Windows: safetensors' second, short-lived copy-on-write view of a
    /// file to read its header (memmap2's `map_copy_read_only`, kept until
    /// torch's `from_file` has mapped the file again): max(S) at open, in
    /// [`Peak::open_commit`] only.
    pub header_view: bool,
    /// Held shards are read-only shared mappings (the GGUF loaders), which
    /// no OS charges to commit; `validate --emulate` does not reproduce
    /// these ([`Loader::emulated`]).
    pub read_only: bool,
}

/// Fixed commit of transformers' mmap `from_pretrained` above the mapped
/// shards (measured, docs/fit.md).
pub const TRANSFORMERS_OVERHEAD: u64 = 26 << 20;
/// Fixed commit of empty model + per-shard `load_file` + `load_state_dict`.
pub const PER_SHARD_OVERHEAD: u64 = 8 << 20;
/// The terms of `loader`'s peak on a checkpoint of `sizes`.
pub fn pattern(loader: Loader, s: &Sizes, p: &LoadParams) -> Pattern {
    let storage = if p.gpu { 0 } else { s.tensor_sum };
    let windows = p.os == Os::Windows;
    let pread_threads = p.threads.saturating_mul(PREAD_PER_THREAD);
    match loader {
        // Every shard mapped writable-private; the parameters are views of
        // the mappings.
        Loader::TransformersV5Mmap => Pattern {
            storage: 0,
            overhead: TRANSFORMERS_OVERHEAD,
            shards: ShardHold::All,
            mapped: true,
            header_view: windows,
            read_only: false,
        },
        // Straight into the parameters; with a GPU each reader thread
        // stages a tensor on the host.
        Loader::TransformersV5Pread => Pattern {
            storage,
            overhead: TRANSFORMERS_OVERHEAD
                .saturating_add(pread_threads)
                .saturating_add(if p.gpu {
                    p.threads.saturating_mul(s.tensor_max)
                } else {
                    0
                }),
            shards: ShardHold::None,
            mapped: false,
            header_view: false,
            read_only: false,
        },
        // The model's storage first, then one shard mapped at a time.
        Loader::PerShardMmap => Pattern {
            storage,
            overhead: PER_SHARD_OVERHEAD,
            shards: ShardHold::One,
            mapped: true,
            header_view: windows,
            read_only: false,
        },
        // Each shard read whole, every tensor copied out of the bytes.
        Loader::FullRead => Pattern {
            storage,
            overhead: 0,
            shards: ShardHold::One,
            mapped: false,
            header_view: false,
            read_only: false,
        },
        // The model's storage, and each shard's `load_file` mapping, which
        // stays alive until the garbage collector frees it: at worst every
        // shard at the end of `from_pretrained` (measured from sum(T) +
        // 27 MiB to sum(T) + sum(S) depending on when they are freed).
        Loader::Diffusers => Pattern {
            storage,
            overhead: 0,
            shards: ShardHold::All,
            mapped: true,
            header_view: windows,
            read_only: false,
        },
        // Every file mapped read-only and kept: the tensors the CPU uses are
        // views of the mapping (the GPU's are copied from it, see
        // [`gguf_peak`]).
        Loader::LlamaCpp | Loader::ComfyuiGguf => Pattern {
            storage: 0,
            overhead: 0,
            shards: ShardHold::All,
            mapped: true,
            header_view: false,
            read_only: true,
        },
        // One staging buffer; without a GPU, `reshard validate --device
        // cpu` stands host memory in for the device one shard at a time.
        Loader::Reshard => Pattern {
            storage: 0,
            overhead: p.window.min(s.tensor_max),
            shards: if p.gpu {
                ShardHold::None
            } else {
                ShardHold::One
            },
            mapped: false,
            header_view: false,
            read_only: false,
        },
    }
}

impl Pattern {
    /// The shard bytes held at the peak.
    pub fn held(&self, s: &Sizes) -> u64 {
        match self.shards {
            ShardHold::None => 0,
            ShardHold::One => s.shard_max,
            ShardHold::All => s.shard_sum,
        }
    }
}

/// The predicted peaks of `loader` on a checkpoint of `sizes`, above the
/// loader's process baseline (which [`super`] adds when judging): the sum
/// of its [`pattern`]'s terms, plus the CUDA context's commit on Windows
/// with a GPU unless the baseline holds it; the header view counts in
/// [`Peak::open_commit`] only.
pub fn peak(loader: Loader, s: &Sizes, p: &LoadParams) -> Peak {
    if matches!(loader, Loader::LlamaCpp | Loader::ComfyuiGguf) {
        return gguf_peak(loader, s, p);
    }
    let t = pattern(loader, s, p);
    let held = t.held(s);
    let view = if t.header_view { s.shard_max } else { 0 };
    let private = t.storage.saturating_add(t.overhead);
    let (private, file) = if t.mapped {
        (private, held)
    } else {
        (private.saturating_add(held), 0)
    };
    let commit = private
        .saturating_add(file)
        .saturating_add(p.device_term(loader));
    Peak {
        commit,
        open_commit: commit.saturating_add(view),
        rss_private: private,
        rss_file: file,
        vram: if p.gpu { s.tensor_sum } else { 0 },
        offloaded: 0,
    }
}

/// Bytes per element of ComfyUI-GGUF's dequantized weight on the GPU: its
/// own VRAM estimate reserves the largest quantized weight in f16.
pub const COMFYUI_GPU_DEQUANT_BYTES: u64 = 2;
/// On the CPU ComfyUI computes in f32: the dequantized weight is 4 bytes
/// per element.
pub const COMFYUI_CPU_DEQUANT_BYTES: u64 = 4;

/// The GGUF loaders (docs/fit.md gives the source of each term). Both map
/// every file read-only, which no OS charges to commit, and read every page
/// of it once (page cache: sum(S)).
///
/// - llama.cpp: without a GPU the tensors are views of the mapping:
///   nothing committed. With one, every layer but the input layer is copied
///   from the mapping to device buffers; what does not fit dedicated VRAM
///   stays in the mapping (`--fit`, or `-ngl` with fewer layers).
/// - comfyui-gguf: without a GPU the weights stay in the mapping and one
///   at a time is dequantized to f32 when used. With one, the quantized
///   bytes go to VRAM plus room to dequantize the largest weight in f16;
///   in lowvram mode what does not fit is copied to the GPU and back to
///   release the mapping, so it becomes private host memory.
fn gguf_peak(loader: Loader, s: &Sizes, p: &LoadParams) -> Peak {
    let cuda = p.device_term(loader);
    let n = s.quantized_elements_max;
    let (private, vram, offloaded) = match loader {
        Loader::LlamaCpp if p.gpu => {
            let want = s.tensor_sum.saturating_sub(s.input_layer);
            let on_gpu = p.vram.map_or(want, |v| want.min(v));
            (0, on_gpu, want - on_gpu)
        }
        Loader::LlamaCpp => (0, 0, 0),
        _ if p.gpu => {
            let want = s
                .tensor_sum
                .saturating_add(n.saturating_mul(COMFYUI_GPU_DEQUANT_BYTES));
            let on_gpu = p.vram.map_or(want, |v| want.min(v));
            let rest = want - on_gpu;
            (rest, on_gpu, rest)
        }
        _ => (n.saturating_mul(COMFYUI_CPU_DEQUANT_BYTES), 0, 0),
    };
    let commit = private.saturating_add(cuda);
    Peak {
        commit,
        open_commit: commit,
        rss_private: private,
        rss_file: s.shard_sum,
        vram,
        offloaded,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;

    fn params(os: Os, gpu: bool) -> LoadParams {
        LoadParams {
            os,
            gpu,
            threads: 4,
            window: 256 * MIB,
            cuda_overhead: 512 * MIB,
            baseline: 0,
            vram: None,
            baseline_holds_device: false,
        }
    }

    /// 24 GiB of shards, the largest 10 GiB; 24 GiB - 1 MiB of tensors,
    /// the largest 1 GiB.
    fn sizes() -> Sizes {
        Sizes {
            shard_sum: 24 * GIB,
            shard_max: 10 * GIB,
            tensor_sum: 24 * GIB - MIB,
            tensor_max: GIB,
            ..Sizes::default()
        }
    }

    /// A GGUF: 8 GiB in two files, 7 GiB of tensors, 512 MiB of it the
    /// input layer; the largest quantized weight has 256 Mi elements.
    fn gguf() -> Sizes {
        Sizes {
            shard_sum: 8 * GIB,
            shard_max: 5 * GIB,
            tensor_sum: 7 * GIB,
            tensor_max: GIB,
            input_layer: 512 * MIB,
            quantized_elements_max: 256 * MIB,
        }
    }

    fn with_vram(os: Os, vram: Option<u64>) -> LoadParams {
        LoadParams {
            vram,
            ..params(os, true)
        }
    }

    #[test]
    fn llama_cpp_maps_read_only_and_commits_nothing() {
        let s = gguf();
        // CPU: the tensors are views of the read-only mappings.
        let cpu = peak(Loader::LlamaCpp, &s, &params(Os::Windows, false));
        assert_eq!((cpu.commit, cpu.rss_private, cpu.vram), (0, 0, 0));
        assert_eq!(cpu.rss_file, 8 * GIB, "every page read once: sum(S)");
        // GPU with room: all but the input layer go to VRAM; Windows adds
        // only the CUDA term to commit.
        let all = peak(
            Loader::LlamaCpp,
            &s,
            &with_vram(Os::Windows, Some(24 * GIB)),
        );
        assert_eq!((all.vram, all.offloaded), (7 * GIB - 512 * MIB, 0));
        assert_eq!(all.commit, 512 * MIB);
        let linux = peak(Loader::LlamaCpp, &s, &with_vram(Os::Linux, Some(24 * GIB)));
        assert_eq!(linux.commit, 0);
        // 4 GiB of VRAM: the rest stays in the mapping, still uncharged.
        let short = peak(Loader::LlamaCpp, &s, &with_vram(Os::Linux, Some(4 * GIB)));
        assert_eq!(
            (short.vram, short.offloaded),
            (4 * GIB, 3 * GIB - 512 * MIB)
        );
        assert_eq!((short.commit, short.rss_private), (0, 0));
        assert!(!Loader::LlamaCpp.in_python());
        assert!(!Loader::LlamaCpp.resharding_helps());
    }

    #[test]
    fn comfyui_gguf_dequantizes_one_weight_and_copies_what_vram_cannot_hold() {
        let s = gguf();
        // CPU: one weight dequantized to f32 at a time: 4 x 256 Mi.
        let cpu = peak(Loader::ComfyuiGguf, &s, &params(Os::Windows, false));
        assert_eq!((cpu.commit, cpu.rss_private, cpu.vram), (GIB, GIB, 0));
        assert_eq!(cpu.rss_file, 8 * GIB);
        // GPU with room: quantized bytes + the largest weight in f16.
        let all = peak(
            Loader::ComfyuiGguf,
            &s,
            &with_vram(Os::Linux, Some(24 * GIB)),
        );
        assert_eq!(
            (all.vram, all.offloaded, all.commit),
            (7 * GIB + 512 * MIB, 0, 0)
        );
        // 6 GiB: 1.5 GiB stays on the host as private copies (lowvram
        // releases the mapping), charged to commit; Windows adds CUDA.
        let short = peak(
            Loader::ComfyuiGguf,
            &s,
            &with_vram(Os::Windows, Some(6 * GIB)),
        );
        assert_eq!((short.vram, short.offloaded), (6 * GIB, GIB + 512 * MIB));
        assert_eq!(short.commit, GIB + 512 * MIB + 512 * MIB);
        assert_eq!(short.rss_private, GIB + 512 * MIB);
        assert!(Loader::ComfyuiGguf.in_python());
    }

    #[test]
    fn each_loader_reads_its_formats() {
        for l in Loader::ALL {
            let gguf = matches!(l, Loader::LlamaCpp | Loader::ComfyuiGguf);
            let reshard = l == Loader::Reshard;
            assert_eq!(l.reads(Format::Gguf), gguf || reshard, "{l}");
            assert_eq!(l.reads(Format::Safetensors), !gguf, "{l}");
            assert_eq!(l.reads(Format::Pytorch), !gguf, "{l}");
            assert_eq!(
                l.cannot_read(Format::Gguf).is_some(),
                !(gguf || reshard),
                "{l}"
            );
            assert_eq!(l.emulated(), !gguf, "{l}");
        }
    }

    #[test]
    fn sizes_sum_and_max() {
        let s = Sizes::new(
            &[10 * GIB, 10 * GIB, 4 * GIB],
            [GIB, 8 * GIB, 14 * GIB + GIB / 2, GIB / 2],
        );
        assert_eq!((s.shard_sum, s.shard_max), (24 * GIB, 10 * GIB));
        assert_eq!((s.tensor_sum, s.tensor_max), (24 * GIB, 14 * GIB + GIB / 2));
    }

    #[test]
    fn linux_cpu_commit_per_loader_is_the_calibrated_formula() {
        let s = sizes();
        let t = s.tensor_sum;
        let cases = [
            // every shard mapped: sum(S) + 26 MiB
            (Loader::TransformersV5Mmap, 24 * GIB + 26 * MIB),
            // sum(T) + 26 MiB + 4 threads x 24 MiB
            (Loader::TransformersV5Pread, t + 26 * MIB + 96 * MIB),
            // sum(T) + max(S) + 8 MiB
            (Loader::PerShardMmap, t + 10 * GIB + 8 * MIB),
            // sum(T) + max(S)
            (Loader::FullRead, t + 10 * GIB),
            // sum(T) + sum(S)
            (Loader::Diffusers, t + 24 * GIB),
            // 256 MiB staging + one shard held by the CPU stand-in
            (Loader::Reshard, 256 * MIB + 10 * GIB),
        ];
        for (loader, commit) in cases {
            let got = peak(loader, &s, &params(Os::Linux, false));
            assert_eq!(got.commit, commit, "{loader}");
            assert_eq!(got.vram, 0, "{loader}");
        }
    }

    #[test]
    fn windows_opens_with_a_header_view_and_charges_cuda_with_a_gpu() {
        let s = sizes();
        for loader in Loader::ALL {
            let at = |os, gpu| peak(loader, &s, &params(os, gpu));
            let (linux, windows) = (at(Os::Linux, false), at(Os::Windows, false));
            let view = if pattern(loader, &s, &params(Os::Windows, false)).header_view {
                10 * GIB
            } else {
                0
            };
            // The held commit is the same on both; the header view exists
            // only at the instant a shard is opened, on Windows.
            assert_eq!(windows.commit, linux.commit, "{loader}");
            assert_eq!(linux.open_commit, linux.commit, "{loader}");
            assert_eq!(windows.open_commit, windows.commit + view, "{loader}");
            let (gpu_l, gpu_w) = (at(Os::Linux, true), at(Os::Windows, true));
            assert_eq!(gpu_w.commit, gpu_l.commit + 512 * MIB, "{loader}");
            assert_eq!(gpu_w.open_commit, gpu_w.commit + view, "{loader}");
        }
        assert!(pattern(Loader::TransformersV5Mmap, &s, &params(Os::Windows, false)).header_view);
        assert!(pattern(Loader::PerShardMmap, &s, &params(Os::Windows, false)).header_view);
        assert!(!pattern(Loader::TransformersV5Pread, &s, &params(Os::Windows, false)).header_view);
        assert!(!pattern(Loader::FullRead, &s, &params(Os::Windows, false)).header_view);
    }

    #[test]
    fn a_baseline_measured_with_the_device_up_holds_the_cuda_term() {
        let s = sizes();
        let p = LoadParams {
            baseline_holds_device: true,
            ..params(Os::Windows, true)
        };
        for loader in Loader::ALL {
            let measured = peak(loader, &s, &p).commit;
            let default = peak(loader, &s, &params(Os::Windows, true)).commit;
            // Python loaders: the context is in the measured baseline;
            // reshard and llama.cpp have no baseline and keep the term.
            let term = if loader.in_python() { 0 } else { 512 * MIB };
            assert_eq!(measured + 512 * MIB, default + term, "{loader}");
        }
    }

    #[test]
    fn with_a_gpu_the_storage_leaves_the_host() {
        let s = sizes();
        let p = params(Os::Linux, true);
        let cases = [
            (
                Loader::TransformersV5Mmap,
                24 * GIB + 26 * MIB,
                26 * MIB,
                24 * GIB,
            ),
            // each of 4 threads stages one tensor on the host
            (
                Loader::TransformersV5Pread,
                26 * MIB + 96 * MIB + 4 * GIB,
                26 * MIB + 96 * MIB + 4 * GIB,
                0,
            ),
            (Loader::PerShardMmap, 10 * GIB + 8 * MIB, 8 * MIB, 10 * GIB),
            (Loader::FullRead, 10 * GIB, 10 * GIB, 0),
            (Loader::Reshard, 256 * MIB, 256 * MIB, 0),
        ];
        for (loader, commit, private, file) in cases {
            let got = peak(loader, &s, &p);
            assert_eq!(
                (got.commit, got.rss_private, got.rss_file),
                (commit, private, file),
                "{loader}"
            );
            assert_eq!(got.vram, 24 * GIB - MIB, "{loader}");
        }
    }

    #[test]
    fn staging_is_the_smaller_of_window_and_largest_tensor() {
        let s = Sizes {
            shard_sum: 100,
            shard_max: 100,
            tensor_sum: 90,
            tensor_max: 40,
            ..Sizes::default()
        };
        assert_eq!(
            peak(Loader::Reshard, &s, &params(Os::Linux, true)).commit,
            40
        );
    }

    #[test]
    fn resharding_helps_only_loaders_holding_one_shard() {
        let small = Sizes {
            shard_max: GIB,
            ..sizes()
        };
        for l in Loader::ALL {
            let p = params(Os::Linux, false);
            let lower = peak(l, &small, &p).commit < peak(l, &sizes(), &p).commit;
            // reshard's CPU stand-in holds a shard too, but its peak is
            // bounded by design and it is not a user's loader.
            assert_eq!(lower && l != Loader::Reshard, l.resharding_helps(), "{l}");
        }
    }

    #[test]
    fn calibrated_threads_are_at_most_four() {
        let p = LoadParams::calibrated(Os::Linux);
        assert!((1..=4).contains(&p.threads));
        assert_eq!(p.baseline, DEFAULT_BASELINE);
        assert!(!p.gpu);
    }

    #[test]
    fn names_are_stable() {
        let names: Vec<&str> = Loader::ALL.iter().map(|l| l.name()).collect();
        assert_eq!(
            names,
            [
                "transformers-v5-mmap",
                "transformers-v5-pread",
                "per-shard-mmap",
                "full-read",
                "diffusers",
                "llama.cpp",
                "comfyui-gguf",
                "reshard"
            ]
        );
        for l in Loader::ALL {
            assert_eq!(serde_json::to_value(l).unwrap(), l.name());
            assert!(!l.calibrated_with().is_empty());
        }
    }
}
