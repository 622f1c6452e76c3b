//! What a conversion is asked to do ([`ConvertOptions`]) and what it did
//! ([`ConvertSummary`]).

use std::path::PathBuf;

use serde::Serialize;

use super::error::GateError;
use super::other::{SkippedFile, Walk};
use crate::exec::CopyPath;
use crate::format::layout::Library;
use crate::format::Finding;
use crate::plan::PlanOptions;
use crate::write::digest::DigestAlgo;
use crate::write::manifest::Manifest;

/// How to run a conversion, beyond the plan.
#[derive(Debug, Clone)]
pub struct ConvertOptions {
    pub plan: PlanOptions,
    /// Bytes of buffers in flight, in total.
    pub window: u64,
    pub threads: usize,
    /// Replace a DST that holds a different conversion, or write into one
    /// that holds other (non-weight) files. Never removes a file reshard did
    /// not write.
    pub overwrite: bool,
    /// Copy config.json, tokenizer files, ... from the source folder.
    pub copy_other_files: bool,
    /// Which other files: the folder's own ([`Walk::Flat`]) or the whole
    /// tree but other weight sets' folders ([`Walk::Tree`]).
    pub walk: Walk,
    /// Rewrite config.json's dtype when casting (transformers configs; a
    /// diffusers config has no dtype key and is copied as it is).
    pub config_dtype: bool,
    /// SRC was one file, not a folder: DST may sit beside it.
    pub single_file: bool,
    /// `batch`: DST must resolve inside this folder (OUT).
    pub within: Option<PathBuf>,
    /// Write expanded (stride-0) views however much they amplify
    /// (see [`crate::plan::check_expanded`]).
    pub allow_expanded: bool,
    /// Mixed into the plan id when the checkpoint handed in is derived from
    /// the source (a component of a split): the same files with other
    /// prefixes are another conversion.
    pub id_salt: Option<String>,
    /// Weight sets (layout folders, split components) written in their own
    /// dtype whatever `plan.dtype` says (`--keep-dtype-preset vae`).
    pub keep_components: Vec<String>,
    /// The shard digest recorded in the manifest (BLAKE3 unless `--sha256`).
    pub digest: DigestAlgo,
    /// How source bytes are read: through mappings where possible, or buffers.
    pub copy: CopyPath,
    /// `plan.max_shard_size` was asked for. When not, a GGUF that keeps its
    /// names (a diffusion model for ComfyUI, Forge or InvokeAI, which load
    /// one file) is written as one file.
    pub shard_size_given: bool,
}

impl Default for ConvertOptions {
    fn default() -> Self {
        ConvertOptions {
            plan: PlanOptions::default(),
            window: 256 << 20,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            overwrite: false,
            copy_other_files: true,
            walk: Walk::Flat,
            config_dtype: true,
            single_file: false,
            within: None,
            allow_expanded: false,
            id_salt: None,
            keep_components: Vec::new(),
            digest: DigestAlgo::default(),
            copy: CopyPath::default(),
            shard_size_given: false,
        }
    }
}

/// What [`convert_gated`] waits on before it removes anything an earlier
/// run left in DST and before it commits. It may block (until a check on
/// another thread is done); an error keeps the output uncommitted.
pub type BeforeCommit<'a> = &'a (dyn Fn() -> Result<(), GateError> + Sync);

/// What a conversion did.
#[derive(Debug, Clone, Serialize)]
pub struct ConvertSummary {
    pub dst: String,
    /// True when DST already held this exact conversion: no shard was
    /// written (mirrored files may have been refreshed).
    pub up_to_date: bool,
    /// Mirrored files recopied into an up-to-date output because their
    /// source changed (or the manifest did not record it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refreshed_files: Vec<String>,
    pub shards: usize,
    /// Shards a previous, interrupted run had finished and this run kept.
    pub resumed_shards: usize,
    pub tensors: usize,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub seconds: f64,
    /// Most bytes of window buffers held at once.
    pub peak_buffer_bytes: u64,
    pub window: u64,
    /// Other files of the source folder that were not copied, and why (a
    /// symlink out of the model's folder, a name that is not UTF-8, ...).
    pub skipped_files: Vec<SkippedFile>,
    /// Weight files outside any converted folder (`onnx/model.onnx`),
    /// copied as they are.
    pub copied_as_is: Vec<String>,
    /// Files a manifest found in DST claimed under a name reshard writes,
    /// but whose bytes were not what it recorded: each moved aside (the
    /// claimed name, the name it was moved to), never deleted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub set_aside: Vec<(String, String)>,
    /// The other weight sets of the model (sentence-transformers modules,
    /// diffusers components), each converted in its own folder.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub components: Vec<ComponentSummary>,
    pub manifest: Manifest,
}

/// What converting one weight set other than the root did.
#[derive(Debug, Clone, Serialize)]
pub struct ComponentSummary {
    /// Its folder under DST (and under SRC), `/` separators.
    pub path: String,
    pub library: Library,
    pub one_file: bool,
    /// What inspect would report about its source.
    pub findings: Vec<Finding>,
    pub summary: ConvertSummary,
}

/// Common cases of `--keep-dtype` (docs/layouts.md says why).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeepPreset {
    /// The VAE: in f16 the SD and SDXL VAEs overflow to NaN (black images).
    Vae,
    /// Normalization weights: tiny, and the scales most hurt by rounding.
    Norms,
}

impl KeepPreset {
    /// The tensor-name globs the preset keeps.
    pub fn globs(self) -> &'static [&'static str] {
        match self {
            KeepPreset::Vae => &["first_stage_model.*"],
            KeepPreset::Norms => &["*norm*", "*ln_*"],
        }
    }

    /// The weight sets (layout folders, split components) kept whole.
    pub fn components(self) -> &'static [&'static str] {
        match self {
            KeepPreset::Vae => &["vae"],
            KeepPreset::Norms => &[],
        }
    }
}

impl ConvertOptions {
    /// Adds what `presets` keep out of a cast: their tensor-name globs to
    /// `--keep-dtype`, their weight sets to the components kept whole.
    pub fn keep_presets(&mut self, presets: &[KeepPreset]) {
        for p in presets {
            self.plan
                .keep_dtype
                .extend(p.globs().iter().map(|g| g.to_string()));
            self.keep_components
                .extend(p.components().iter().map(|c| c.to_string()));
        }
    }
}
