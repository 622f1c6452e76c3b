//! Fuzz target: see `reshard::fuzz::pickle` for the invariants checked.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| reshard::fuzz::pickle(data));
