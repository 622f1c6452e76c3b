//! The Hugging Face side of an LLM GGUF: what a llama.cpp file becomes when
//! it is turned back into a transformers folder.
//!
//! This module owns, as pure functions of the GGUF header, which model
//! family a file is ([`Family`]), what each tensor is called in
//! transformers and which rows llama.cpp permuted ([`names`]), the
//! `config.json` and `generation_config.json` text ([`config`]) and the
//! tokenizer files ([`tokenizer`]). It reads nothing but the header the
//! format stage already parsed and writes nothing: the plan and execute
//! stages read the tensor bytes, dequantize them and undo the row
//! permutation with `crate::cast::gguf::unpermuted_row`.

mod config;
mod error;
mod family;
mod meta;
mod names;
#[cfg(test)]
mod tests;
mod tokenizer;

pub use self::config::{config_json, generation_config_json};
pub use self::error::GgufHfError;
pub use self::family::Family;
pub use self::names::{hf_name, permuted_heads, skip_reason, ROPE_FREQS};
pub use self::tokenizer::tokenizer_files;
