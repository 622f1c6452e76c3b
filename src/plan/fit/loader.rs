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
    /// transformers 5.0 to 5.16: every shard mapped copy-on-write and kept.
    TransformersV5Mmap,
    /// transformers >= 5.17 on Windows: positioned reads, a few tensors in flight.
    TransformersV5Pread,
    /// transformers 4, accelerate, diffusers, vLLM's default iterator.
    PerShardMmap,
    /// `disable_mmap` / `safetensors.torch.load_file` into RAM.
    FullRead,
    /// reshard's own validating loader (`reshard validate`).
    Reshard,
}

impl Loader {
    pub const ALL: [Loader; 5] = [
        Loader::TransformersV5Mmap,
        Loader::TransformersV5Pread,
        Loader::PerShardMmap,
        Loader::FullRead,
        Loader::Reshard,
    ];

    /// The stable name used on the command line and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            Loader::TransformersV5Mmap => "transformers-v5-mmap",
            Loader::TransformersV5Pread => "transformers-v5-pread",
            Loader::PerShardMmap => "per-shard-mmap",
            Loader::FullRead => "full-read",
            Loader::Reshard => "reshard",
        }
    }

    /// The peak host commit on Windows, as a formula.
    pub fn formula(self) -> &'static str {
        match self {
            Loader::TransformersV5Mmap => "sum(S) + max(S)",
            Loader::TransformersV5Pread => "max(S) + threads x 2 x max(T)",
            Loader::PerShardMmap => "2 x max(S)",
            Loader::FullRead => "sum(S)",
            Loader::Reshard => "min(staging, max(T)), + max(S) without a GPU",
        }
    }

    /// Whether smaller shards lower this loader's peak. transformers v5 with
    /// mmap keeps every shard mapped, so its peak is the sum of all shards
    /// whatever their size; the whole-file reader holds the whole state dict;
    /// reshard's loader is already independent of shard size.
    pub fn resharding_helps(self) -> bool {
        matches!(self, Loader::TransformersV5Pread | Loader::PerShardMmap)
    }
}

impl fmt::Display for Loader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
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

/// The predicted peaks of `loader` on a checkpoint of `sizes`.
///
/// The Windows commit formulas are the table of docs/fit.md. Two terms are
/// Windows-only: the safetensors loader's second copy-on-write view of a
/// file to read its header (`+ max(S)` at open; Linux does not charge that
/// read-only view) and the CUDA context's commit. Without a GPU the weights
/// stay on the host, so loaders whose formula does not already hold every
/// shard add sum(T).
pub fn peak(loader: Loader, s: &Sizes, p: &LoadParams) -> Peak {
    let windows = p.os == Os::Windows;
    let second_view = if windows { s.shard_max } else { 0 };
    let in_flight = p.threads.saturating_mul(2).saturating_mul(s.tensor_max);
    let staging = p.window.min(s.tensor_max);
    // (commit before the CPU/GPU terms, private RSS, file-backed RSS,
    // whether the loader already holds every weight on the host)
    let (commit, private, file, holds_all) = match loader {
        Loader::TransformersV5Mmap => (
            s.shard_sum.saturating_add(second_view),
            0,
            s.shard_sum,
            true,
        ),
        Loader::TransformersV5Pread => (
            s.shard_max.saturating_add(in_flight),
            in_flight,
            s.shard_max,
            false,
        ),
        Loader::PerShardMmap => (
            s.shard_max.saturating_add(second_view),
            0,
            s.shard_max,
            false,
        ),
        Loader::FullRead => (s.shard_sum, s.shard_sum, 0, true),
        Loader::Reshard => (staging, staging, 0, false),
    };
    let (commit, private, vram) = if p.gpu {
        let cuda = if windows { p.cuda_overhead } else { 0 };
        (commit.saturating_add(cuda), private, s.tensor_sum)
    } else if loader == Loader::Reshard {
        // Without a GPU, `reshard validate --device cpu` stands host memory
        // in for the device one shard at a time: staging plus one shard.
        (
            commit.saturating_add(s.shard_max),
            private.saturating_add(s.shard_max),
            0,
        )
    } else if holds_all {
        (commit, private, 0)
    } else {
        (
            commit.saturating_add(s.tensor_sum),
            private.saturating_add(s.tensor_sum),
            0,
        )
    };
    Peak {
        commit,
        rss_private: private,
        rss_file: file,
        vram,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;

    /// Three shards of 10, 10 and 4 GiB; 24 GiB of tensors, the largest 1 GiB.
    fn sizes() -> Sizes {
        Sizes::new(
            &[10 * GIB, 10 * GIB, 4 * GIB],
            [GIB, 8 * GIB, 14 * GIB + GIB / 2, GIB / 2],
        )
    }

    fn params(os: Os, gpu: bool) -> LoadParams {
        LoadParams {
            os,
            gpu,
            threads: 4,
            window: 256 * MIB,
            cuda_overhead: 512 * MIB,
        }
    }

    #[test]
    fn sizes_sum_and_max() {
        let s = sizes();
        assert_eq!(s.shard_sum, 24 * GIB);
        assert_eq!(s.shard_max, 10 * GIB);
        // 1 + 8 + 14.5 + 0.5 = 24 GiB; the largest is 14.5 GiB.
        assert_eq!(s.tensor_sum, 24 * GIB);
        assert_eq!(s.tensor_max, 14 * GIB + GIB / 2);
    }

    #[test]
    fn windows_gpu_commit_per_loader() {
        let s = Sizes {
            shard_sum: 24 * GIB,
            shard_max: 10 * GIB,
            tensor_sum: 24 * GIB - MIB,
            tensor_max: GIB,
        };
        let p = params(Os::Windows, true);
        let cuda = 512 * MIB;
        let cases = [
            // sum(S) + max(S) + cuda = 24 + 10 GiB + 512 MiB
            (Loader::TransformersV5Mmap, 34 * GIB + cuda),
            // max(S) + threads x 2 x max(T) + cuda = 10 + 4 x 2 x 1 GiB + 512 MiB
            (Loader::TransformersV5Pread, 18 * GIB + cuda),
            // 2 x max(S) + cuda = 20 GiB + 512 MiB
            (Loader::PerShardMmap, 20 * GIB + cuda),
            // sum(S) + cuda
            (Loader::FullRead, 24 * GIB + cuda),
            // min(256 MiB, 1 GiB) + cuda = 256 + 512 MiB
            (Loader::Reshard, 768 * MIB),
        ];
        for (loader, commit) in cases {
            let got = peak(loader, &s, &p);
            assert_eq!(got.commit, commit, "{loader}");
            // VRAM is sum(T) for every loader.
            assert_eq!(got.vram, 24 * GIB - MIB, "{loader}");
        }
    }

    #[test]
    fn linux_gpu_rss_and_commit_per_loader() {
        let s = Sizes {
            shard_sum: 24 * GIB,
            shard_max: 10 * GIB,
            tensor_sum: 24 * GIB,
            tensor_max: GIB,
        };
        let p = params(Os::Linux, true);
        // (loader, commit, private RSS, file-backed RSS)
        let cases = [
            // No second view, no CUDA term: commit sum(S); all pages mapped, file-backed.
            (Loader::TransformersV5Mmap, 24 * GIB, 0, 24 * GIB),
            // max(S) + 4 x 2 x 1 GiB; the buffers in flight are private.
            (Loader::TransformersV5Pread, 18 * GIB, 8 * GIB, 10 * GIB),
            // one shard mapped at a time.
            (Loader::PerShardMmap, 10 * GIB, 0, 10 * GIB),
            // the whole state dict in private memory.
            (Loader::FullRead, 24 * GIB, 24 * GIB, 0),
            // one 256 MiB staging buffer.
            (Loader::Reshard, 256 * MIB, 256 * MIB, 0),
        ];
        for (loader, commit, private, file) in cases {
            let got = peak(loader, &s, &p);
            assert_eq!(
                (got.commit, got.rss_private, got.rss_file),
                (commit, private, file),
                "{loader}"
            );
        }
    }

    #[test]
    fn without_gpu_weights_stay_on_the_host() {
        let s = Sizes {
            shard_sum: 24 * GIB,
            shard_max: 10 * GIB,
            tensor_sum: 24 * GIB,
            tensor_max: GIB,
        };
        let p = params(Os::Windows, false);
        let cases = [
            // Already holds every shard: unchanged, no CUDA term, no VRAM.
            (Loader::TransformersV5Mmap, 34 * GIB),
            (Loader::FullRead, 24 * GIB),
            // 2 x max(S) + sum(T) = 20 + 24 GiB
            (Loader::PerShardMmap, 44 * GIB),
            // max(S) + 8 GiB + sum(T) = 10 + 8 + 24 GiB
            (Loader::TransformersV5Pread, 42 * GIB),
            // the CPU stand-in holds one shard: 256 MiB staging + max(S)
            (Loader::Reshard, 10 * GIB + 256 * MIB),
        ];
        for (loader, commit) in cases {
            let got = peak(loader, &s, &p);
            assert_eq!(got.commit, commit, "{loader}");
            assert_eq!(got.vram, 0, "{loader}");
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
        let p = LoadParams {
            os: Os::Linux,
            gpu: true,
            threads: 1,
            window: 256 * MIB,
            cuda_overhead: 0,
        };
        assert_eq!(peak(Loader::Reshard, &s, &p).commit, 40);
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
                "reshard"
            ]
        );
        for l in Loader::ALL {
            assert_eq!(serde_json::to_value(l).unwrap(), l.name());
        }
    }
}
