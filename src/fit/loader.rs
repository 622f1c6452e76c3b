//! The loaders `fit` knows, and the formula for each one's peak memory.
//!
//! This module owns the arithmetic only: given shard sizes, tensor sizes and
//! a few parameters it returns predicted peaks. It reads no file and knows
//! nothing of the machine; [`super`] compares the peaks with a budget.
//! docs/fit.md gives the source of every formula.

use std::fmt;

use serde::{Deserialize, Serialize};

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
    /// reshard's own validating loader (`reshard validate`).
    Reshard,
}

impl Loader {
    pub const ALL: [Loader; 6] = [
        Loader::TransformersV5Mmap,
        Loader::TransformersV5Pread,
        Loader::PerShardMmap,
        Loader::FullRead,
        Loader::Diffusers,
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
            Loader::Reshard => "reshard",
        }
    }

    /// The peak host commit without a GPU, above the loader's process
    /// baseline, as a formula (Windows adds max(S) for the header view to
    /// the loaders that open shards with safetensors' mmap).
    pub fn formula(self) -> &'static str {
        match self {
            Loader::TransformersV5Mmap => "sum(S) + 26 MiB",
            Loader::TransformersV5Pread => "sum(T) + 26 MiB + threads x 24 MiB",
            Loader::PerShardMmap => "sum(T) + max(S) + 8 MiB",
            Loader::FullRead => "sum(T) + max(S)",
            Loader::Diffusers => "sum(T) + sum(S), at worst",
            Loader::Reshard => "min(staging, max(T)), + max(S) without a GPU",
        }
    }

    /// The library versions the row was calibrated against (docs/fit.md).
    pub fn calibrated_with(self) -> &'static str {
        match self {
            Loader::TransformersV5Mmap | Loader::TransformersV5Pread => {
                "transformers 5.24.0, safetensors 0.8.0, torch 2.15.0"
            }
            Loader::PerShardMmap | Loader::FullRead => "safetensors 0.8.0, torch 2.15.0",
            Loader::Diffusers => "diffusers 0.42.1, safetensors 0.8.0, torch 2.15.0",
            Loader::Reshard => "reshard",
        }
    }

    /// Whether the loader runs in a Python process that imports torch and
    /// its library first: fit's baseline term applies to it.
    pub fn in_python(self) -> bool {
        self != Loader::Reshard
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
        }
    }
}

/// Predicted peaks of one loader, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Peak {
    /// Host commit: what Windows charges against the commit limit, and what
    /// Linux charges under strict overcommit (`vm.overcommit_memory=2`).
    pub commit: u64,
    /// Resident anonymous (private) memory: needs RAM (or swap).
    pub rss_private: u64,
    /// Resident file-backed pages of mapped shards that are only read: page
    /// cache, which the kernel can drop and read again.
    pub rss_file: u64,
    /// Device memory for the weights (0 without a GPU).
    pub vram: u64,
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
    /// file to read its header, max(S) at open.
    pub header_view: bool,
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
        },
        // The model's storage first, then one shard mapped at a time.
        Loader::PerShardMmap => Pattern {
            storage,
            overhead: PER_SHARD_OVERHEAD,
            shards: ShardHold::One,
            mapped: true,
            header_view: windows,
        },
        // Each shard read whole, every tensor copied out of the bytes.
        Loader::FullRead => Pattern {
            storage,
            overhead: 0,
            shards: ShardHold::One,
            mapped: false,
            header_view: false,
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
/// with a GPU.
pub fn peak(loader: Loader, s: &Sizes, p: &LoadParams) -> Peak {
    let t = pattern(loader, s, p);
    let held = t.held(s);
    let view = if t.header_view { s.shard_max } else { 0 };
    let cuda = if p.gpu && p.os == Os::Windows {
        p.cuda_overhead
    } else {
        0
    };
    let private = t.storage.saturating_add(t.overhead);
    let (private, file) = if t.mapped {
        (private, held)
    } else {
        (private.saturating_add(held), 0)
    };
    Peak {
        commit: private
            .saturating_add(file)
            .saturating_add(view)
            .saturating_add(cuda),
        rss_private: private,
        rss_file: file,
        vram: if p.gpu { s.tensor_sum } else { 0 },
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
    fn windows_adds_the_header_view_to_mapping_loaders_and_cuda_with_a_gpu() {
        let s = sizes();
        for loader in Loader::ALL {
            let linux = peak(loader, &s, &params(Os::Linux, false)).commit;
            let windows = peak(loader, &s, &params(Os::Windows, false)).commit;
            let view = if pattern(loader, &s, &params(Os::Windows, false)).header_view {
                10 * GIB
            } else {
                0
            };
            assert_eq!(windows, linux + view, "{loader}");
            let gpu_l = peak(loader, &s, &params(Os::Linux, true)).commit;
            let gpu_w = peak(loader, &s, &params(Os::Windows, true)).commit;
            assert_eq!(gpu_w, gpu_l + view + 512 * MIB, "{loader}");
        }
        assert!(pattern(Loader::TransformersV5Mmap, &s, &params(Os::Windows, false)).header_view);
        assert!(!pattern(Loader::TransformersV5Pread, &s, &params(Os::Windows, false)).header_view);
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
                "reshard"
            ]
        );
        for l in Loader::ALL {
            assert_eq!(serde_json::to_value(l).unwrap(), l.name());
            assert!(!l.calibrated_with().is_empty());
        }
    }
}
