//! What each loader row says to a user: the real loader it stands for, its
//! peak formula and what it was calibrated against. The formulas are
//! written from the calibrated constants of [`super::loader`], and these
//! strings are the one source of `fit --help`, fit's report and the table
//! in docs/fit.md (a test compares the page with them).

use super::loader::{Loader, PER_SHARD_OVERHEAD, PREAD_PER_THREAD, TRANSFORMERS_OVERHEAD};

fn mib(bytes: u64) -> String {
    format!("{} MiB", bytes >> 20)
}

impl Loader {
    /// The real loader the row stands for.
    pub fn real_loader(self) -> &'static str {
        match self {
            Loader::TransformersV5Mmap => "transformers 5 `from_pretrained`, mmap backend (the Linux and macOS default in 5.24; Windows 5.0 to 5.16), sentence-transformers",
            Loader::TransformersV5Pread => "transformers >= 5.17 on Windows (pread backend)",
            Loader::PerShardMmap => "empty model + per-shard `safetensors.torch.load_file` + `load_state_dict` (transformers 4, accelerate)",
            Loader::FullRead => "read each file + `safetensors.torch.load(bytes)` (`from_pretrained(disable_mmap=True)`)",
            Loader::Diffusers => "diffusers `from_pretrained`, component by component",
            Loader::LlamaCpp => "llama.cpp (`llama-cli`, `llama-server`, and what embeds it) on a GGUF",
            Loader::ComfyuiGguf => "ComfyUI-GGUF's loader nodes on a GGUF",
            Loader::Reshard => "`reshard validate`",
        }
    }

    /// The peak host commit without a GPU, above the loader's process
    /// baseline, as a formula: what the load holds. On Windows the loaders
    /// that open shards through safetensors' mmap path add max(S) at the
    /// instant of an open (the header view, [`super::loader::Peak::open_commit`]).
    pub fn formula(self) -> String {
        match self {
            Loader::TransformersV5Mmap => format!("sum(S) + {}", mib(TRANSFORMERS_OVERHEAD)),
            Loader::TransformersV5Pread => format!(
                "sum(T) + {} + threads x {}",
                mib(TRANSFORMERS_OVERHEAD),
                mib(PREAD_PER_THREAD)
            ),
            Loader::PerShardMmap => format!("sum(T) + max(S) + {}", mib(PER_SHARD_OVERHEAD)),
            Loader::FullRead => "sum(T) + max(S)".into(),
            Loader::Diffusers => "sum(T) + sum(S), at worst".into(),
            Loader::LlamaCpp => "0 (files mapped read-only); VRAM sum(T) - input layer".into(),
            Loader::ComfyuiGguf => "4 x max(n) (files mapped read-only); VRAM sum(T) + 2 x max(n), the rest copied to host".into(),
            Loader::Reshard => "min(staging, max(T)), + max(S) without a GPU".into(),
        }
    }

    /// The library versions the row was calibrated against.
    pub fn calibrated_with(self) -> &'static str {
        match self {
            Loader::TransformersV5Mmap | Loader::TransformersV5Pread => {
                "transformers 5.24.0, safetensors 0.8.0, torch 2.15.0"
            }
            Loader::PerShardMmap | Loader::FullRead => "safetensors 0.8.0, torch 2.15.0",
            Loader::Diffusers => "diffusers 0.42.1, safetensors 0.8.0, torch 2.15.0",
            Loader::LlamaCpp => {
                "llama.cpp's source (llama-mmap.cpp, llama-model-loader.cpp), not measured"
            }
            Loader::ComfyuiGguf => "ComfyUI-GGUF 795e451 and gguf-py 0.19.0 source, not measured",
            Loader::Reshard => "reshard",
        }
    }

    /// The row of docs/fit.md's loader table.
    pub fn doc_row(self) -> String {
        format!(
            "| `{}` | {} | {} | {} |",
            self.name(),
            self.real_loader(),
            self.formula(),
            self.calibrated_with()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docs_fit_md_shows_every_row_as_the_model_writes_it() {
        let page = include_str!("../../docs/fit.md");
        for l in Loader::ALL {
            let row = l.doc_row();
            assert!(
                page.lines().any(|line| line == row),
                "docs/fit.md lacks the row\n{row}"
            );
        }
    }

    #[test]
    fn formulas_follow_the_calibrated_constants() {
        assert_eq!(Loader::TransformersV5Mmap.formula(), "sum(S) + 26 MiB");
        assert_eq!(
            Loader::TransformersV5Pread.formula(),
            "sum(T) + 26 MiB + threads x 24 MiB"
        );
        assert_eq!(Loader::PerShardMmap.formula(), "sum(T) + max(S) + 8 MiB");
    }
}
