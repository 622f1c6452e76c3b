//! Fuzz target: see `reshard::fuzz::index_json` for the invariants checked.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| reshard::fuzz::index_json(data));
