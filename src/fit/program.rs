//! The programs `fit --for` plans for, read from `programs.json` (one data
//! file, with the program versions and the code each entry was read from):
//! the forms each one loads, which of them it dequantizes on load, the
//! calibrated loader rows its host peak follows, and its VRAM rule.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use super::loader::{Loader, Os};
use crate::format::{Dtype, Format};
use crate::plan::quantize::QuantizeScheme;

/// What reshard can write for a program to load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Form {
    /// The checkpoint unchanged (perhaps resharded).
    AsIs,
    Bf16,
    F16,
    Fp8,
    Fp8E5m2,
    Fp8Scaled,
    Fp8ScaledLegacy,
    Fp8Channel,
    Fp8Block,
    /// A GGUF of 16-bit elements.
    GgufBf16,
    GgufF16,
    #[serde(rename = "q8_0")]
    Q8_0,
    #[serde(rename = "q6_k")]
    Q6K,
    #[serde(rename = "q4_k")]
    Q4K,
    #[serde(rename = "q4_0")]
    Q4_0,
}

impl Form {
    /// The `--dtype` a form writes its unquantized weights in.
    pub fn dtype(self) -> Option<Dtype> {
        match self {
            Form::Bf16 | Form::GgufBf16 => Some(Dtype::BF16),
            Form::F16 | Form::GgufF16 => Some(Dtype::F16),
            _ => None,
        }
    }

    /// The `--quantize` scheme a form writes.
    pub fn quantize(self) -> Option<QuantizeScheme> {
        Some(match self {
            Form::Fp8 => QuantizeScheme::Fp8,
            Form::Fp8E5m2 => QuantizeScheme::Fp8E5m2,
            Form::Fp8Scaled => QuantizeScheme::Fp8Scaled,
            Form::Fp8ScaledLegacy => QuantizeScheme::Fp8ScaledLegacy,
            Form::Fp8Channel => QuantizeScheme::Fp8Channel,
            Form::Fp8Block => QuantizeScheme::Fp8Block,
            Form::Q8_0 => QuantizeScheme::Q8_0,
            Form::Q6K => QuantizeScheme::Q6K,
            Form::Q4K => QuantizeScheme::Q4K,
            Form::Q4_0 => QuantizeScheme::Q4_0,
            _ => return None,
        })
    }

    /// The format the form is written in.
    pub fn format(self) -> Format {
        match self {
            Form::GgufBf16 | Form::GgufF16 => Format::Gguf,
            _ if self.quantize().is_some_and(|q| q.ggml().is_some()) => Format::Gguf,
            _ => Format::Safetensors,
        }
    }

    /// The precision class of the form, best first (the documented order:
    /// as is > 16-bit > 8-bit > 6-bit > 4-bit). `source_bits`: the widest
    /// float of the checkpoint, for "as is".
    pub fn class(self) -> u8 {
        match self {
            Form::AsIs => 0,
            Form::Bf16 | Form::F16 | Form::GgufBf16 | Form::GgufF16 => 1,
            Form::Q6K => 3,
            Form::Q4K | Form::Q4_0 => 4,
            _ => 2,
        }
    }

    /// The name of the form, as `programs.json` and the report spell it.
    pub fn name(self) -> String {
        serde_json::to_value(self)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default()
    }
}

/// How a program budgets VRAM for weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum VramRule {
    /// ComfyUI's `maximum_vram_for_weights`: `0.88 x total - (0.8 GiB +
    /// EXTRA_RESERVED_VRAM)`, the reserve 400 MiB, 600 MiB on Windows
    /// (700 MiB there above 15 GiB in ComfyUI 0.3.50 and later).
    Comfyui,
    /// Forge's copy of it: 400 MiB, 600 MiB on Windows, 800 MiB there
    /// above 15 GiB.
    Forge,
    /// Dedicated VRAM minus the activation reserve (`--reserve`).
    Plain,
}

impl VramRule {
    /// The bytes of `vram` the program gives to weights; `reserve` is the
    /// activation reserve of the plain rule.
    pub fn weights_budget(self, vram: u64, os: Os, reserve: u64) -> u64 {
        const MIB: u64 = 1 << 20;
        let big = vram > 15 * 1024 * MIB;
        let extra = match (self, os) {
            (VramRule::Plain, _) => return vram.saturating_sub(reserve),
            (_, Os::Windows) if big => match self {
                VramRule::Forge => 800 * MIB,
                _ => 700 * MIB,
            },
            (_, Os::Windows) => 600 * MIB,
            _ => 400 * MIB,
        };
        // 0.88 x total, in integers: 22/25.
        (vram / 25 * 22).saturating_sub(819 * MIB + extra)
    }
}

/// The loader rows a program's host peak follows, by the format it reads.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostRows {
    #[serde(default)]
    pub safetensors: Option<Loader>,
    /// The Windows row, where it differs (transformers' pread backend).
    #[serde(default)]
    pub safetensors_windows: Option<Loader>,
    #[serde(default)]
    pub gguf: Option<Loader>,
}

/// One program of `programs.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Program {
    pub name: String,
    /// The versions and files the entry was read from.
    pub read_from: String,
    /// It loads one file (ComfyUI, Forge, InvokeAI), not a model folder.
    pub single_file: bool,
    pub forms: Vec<Form>,
    /// Forms it converts on load, and the dtype it converts them to.
    pub dequantizes: BTreeMap<String, Dtype>,
    pub host: HostRows,
    pub vram: VramRule,
    /// What does not fit VRAM can stay on the host and run from there.
    pub offload: bool,
}

impl Program {
    /// The loader row of `format` on `os`, or `None` when the program
    /// does not read that format.
    pub fn row(&self, format: Format, os: Os) -> Option<Loader> {
        match format {
            Format::Gguf => self.host.gguf,
            _ if os == Os::Windows => self.host.safetensors_windows.or(self.host.safetensors),
            _ => self.host.safetensors,
        }
    }

    /// [`Program::row`], narrowed to the loaders in `among` when it is not
    /// empty (`fit --for P --loader L`): the first of the program's rows
    /// for `format` that `among` names, the OS's own first, so
    /// `--for transformers --os windows --loader transformers-v5-mmap`
    /// judges transformers 5.4-5.16, which map every shard, instead of the
    /// pread backend of 5.17 on. `None`: no row of this program for
    /// `format` is among them.
    pub fn row_among(&self, format: Format, os: Os, among: &[Loader]) -> Option<Loader> {
        if among.is_empty() {
            return self.row(format, os);
        }
        let rows = match format {
            Format::Gguf => [self.host.gguf, None, None],
            _ => [
                self.row(format, os),
                self.host.safetensors_windows,
                self.host.safetensors,
            ],
        };
        rows.into_iter().flatten().find(|l| among.contains(l))
    }

    /// Refuses `--loader` loaders none of which is a row of the program
    /// (`among` empty: every row).
    pub fn check_loaders(&self, among: &[Loader]) -> Result<(), super::judge::FitError> {
        let rows = self.rows();
        if among.is_empty() || rows.iter().any(|r| among.contains(r)) {
            return Ok(());
        }
        let names = |ls: &[Loader]| ls.iter().map(|l| l.name()).collect::<Vec<_>>().join(", ");
        Err(super::judge::FitError::ForeignLoader {
            loaders: names(among),
            program: self.name.clone(),
            rows: names(&rows),
        })
    }

    /// Every loader row of the program, for messages.
    pub fn rows(&self) -> Vec<Loader> {
        let mut rows = Vec::new();
        for l in [
            self.host.safetensors,
            self.host.safetensors_windows,
            self.host.gguf,
        ]
        .into_iter()
        .flatten()
        {
            if !rows.contains(&l) {
                rows.push(l);
            }
        }
        rows
    }

    /// The dtype `form` is held in once loaded, when the program converts it.
    pub fn loaded_as(&self, form: Form) -> Option<Dtype> {
        self.dequantizes.get(&form.name()).copied()
    }
}

#[derive(Deserialize)]
struct Table {
    programs: Vec<Program>,
}

/// Every program of `programs.json`.
pub fn programs() -> &'static [Program] {
    static TABLE: OnceLock<Vec<Program>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let table: Table = serde_json::from_str(include_str!("programs.json"))
            .expect("src/fit/programs.json is valid (tested)");
        table.programs
    })
}

/// The program named `name`.
pub fn program(name: &str) -> Option<&'static Program> {
    programs().iter().find(|p| p.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_parses_and_names_the_programs_of_the_issue() {
        let names: Vec<&str> = programs().iter().map(|p| p.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "comfyui",
                "comfyui-gguf",
                "forge",
                "invokeai",
                "transformers",
                "diffusers",
                "llama.cpp",
                "vllm"
            ]
        );
        for p in programs() {
            assert!(!p.forms.is_empty(), "{}", p.name);
            // "as is" is in the source's format, which the program may not
            // read (llama.cpp and a safetensors source).
            for f in p.forms.iter().filter(|f| **f != Form::AsIs) {
                assert!(p.row(f.format(), Os::Linux).is_some(), "{} {f:?}", p.name);
            }
            for form in p.dequantizes.keys() {
                assert!(p.forms.iter().any(|f| &f.name() == form), "{}", p.name);
            }
        }
        assert_eq!(
            program("invokeai").unwrap().loaded_as(Form::Fp8Scaled),
            Some(Dtype::BF16)
        );
    }

    #[test]
    fn comfyuis_weight_budget_follows_model_management() {
        const GIB: u64 = 1 << 30;
        const MIB: u64 = 1 << 20;
        let twelve = 12 * GIB;
        // 0.88 x 12 GiB - 0.8 GiB - 400 MiB.
        let linux = VramRule::Comfyui.weights_budget(twelve, Os::Linux, 0);
        assert!(linux.abs_diff(twelve * 88 / 100 - 819 * MIB - 400 * MIB) < MIB);
        let windows = VramRule::Comfyui.weights_budget(twelve, Os::Windows, 0);
        assert_eq!(linux - windows, 200 * MIB);
        assert_eq!(
            VramRule::Plain.weights_budget(twelve, Os::Linux, GIB),
            11 * GIB
        );
    }
}
