//! A GGUF model as a [`Checkpoint`], so every stage that reads checkpoints
//! (plan, exec, validate, fit, batch) reads GGUF files and split sets too.
//!
//! Tensors of a plain type (F32, F16, BF16, F64, I8 to I64) become ordinary
//! contiguous tensors of the matching dtype. Quantized tensors keep their
//! dense shape with dtype `U8` and [`DataRef::Blocks`], which says which
//! GGML type the bytes hold; only the cast stage's dequantizers read them.
//! A tensor of a type whose block size the table does not know cannot be
//! located, so it is refused here (naming it); `inspect`, which reads
//! headers through [`super::open_set`], still reports such files.

use std::path::{Path, PathBuf};

use super::error::GgufError;
use super::ggml::GgmlType;
use super::split::GgufModel;
use crate::format::{Checkpoint, DataRef, Dtype, Format, FormatError, Layout, Tensor};

/// The dtype a plain GGML type's elements are, as safetensors names them;
/// `None` for a block-quantized (or unknown) type.
pub fn plain_dtype(ty: GgmlType) -> Option<Dtype> {
    Some(match ty {
        GgmlType::F32 => Dtype::F32,
        GgmlType::F16 => Dtype::F16,
        GgmlType::BF16 => Dtype::BF16,
        GgmlType(24) => Dtype::I8,
        GgmlType(25) => Dtype::I16,
        GgmlType(26) => Dtype::I32,
        GgmlType(27) => Dtype::I64,
        GgmlType(28) => Dtype::F64,
        _ => return None,
    })
}

/// The checkpoint of `model` (opened with [`super::open`], so no member is
/// missing). Its metadata stays in the GGUF model: a checkpoint's metadata
/// is string pairs copied into every output shard, and a GGUF header holds
/// whole vocabularies.
pub fn to_checkpoint(path: &Path, model: GgufModel) -> Result<Checkpoint, FormatError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let layout = if model.files.len() > 1 {
        Layout::Loose
    } else {
        Layout::Single
    };
    let mut tensors = Vec::with_capacity(model.tensors.len());
    for t in model.tensors {
        let Some(len) = t.len else {
            return Err(FormatError::Gguf {
                path: model.files[t.file].path.clone(),
                source: GgufError::BadShape {
                    tensor: t.name,
                    shape: t.shape.iter().rev().copied().collect(),
                    reason: format!(
                        "is of {}, a type whose block size reshard does not know",
                        t.ggml_type
                    ),
                },
            });
        };
        let (dtype, data) = match plain_dtype(t.ggml_type) {
            Some(dtype) => (dtype, DataRef::Contiguous { offset: t.offset }),
            None => (
                Dtype::U8,
                DataRef::Blocks {
                    offset: t.offset,
                    ggml_type: t.ggml_type,
                },
            ),
        };
        tensors.push(Tensor {
            name: t.name,
            dtype,
            shape: t.shape,
            len,
            file: t.file,
            data,
        });
    }
    // The names every other format's reader checks (an empty name,
    // `__metadata__`, which would become the safetensors metadata key).
    let paths: Vec<PathBuf> = model.files.iter().map(|f| f.path.clone()).collect();
    crate::format::tensor_names::check(&paths, &tensors)?;
    Ok(Checkpoint {
        dir,
        format: Format::Gguf,
        layout,
        prefix: "model".into(),
        files: model.files,
        tensors,
        metadata: Default::default(),
        findings: Vec::new(),
    })
}
