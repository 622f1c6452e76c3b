//! Fuzz target: see `reshard::fuzz::gguf_header` for the invariants checked.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| reshard::fuzz::gguf_header(data));
