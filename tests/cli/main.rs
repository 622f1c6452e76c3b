//! Integration tests: the real `reshard` binary on fixtures copied into temp
//! folders, and the library's readers against the fixtures' expected.json.
//!
//! Fixtures in tests/fixtures were written by transformers, torch and
//! huggingface_hub (see tests/fixtures/SOURCES.md), not by reshard.

mod batch;
mod batch_verify;
mod budgets;
mod cast;
mod common;
mod convert;
mod crash;
mod cuda;
mod digest;
mod docs_examples;
mod docs_output;
mod docs_setups;
mod docs_setups_venv;
mod fit;
mod fit_convert;
mod fit_for;
mod fuzz_corpus;
mod gguf;
mod gguf_adversarial;
mod gguf_against;
mod gguf_convert;
mod gguf_inspect;
mod gguf_llm;
mod gguf_out;
mod gguf_out_diffusers;
mod gguf_out_llama_cpp;
mod gguf_out_loaders;
mod gguf_out_not_finite;
mod hostile;
mod inspect;
mod kquant;
mod layouts;
mod loaders;
mod parts;
mod platform;
mod proof;
mod pytorch;
mod quant;
mod quantize_fp8;
mod quantize_review;
mod quantize_scaled;
mod readers;
mod snapshots;
mod touch;
mod user_facing;
mod validate;
