//! Fuzz target: see `reshard::fuzz::pytorch` for the invariants checked.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| reshard::fuzz::pytorch(data));
