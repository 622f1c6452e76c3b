//! Fuzz target: see `reshard::fuzz::safetensors_header` for the invariants checked.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| reshard::fuzz::safetensors_header(data));
