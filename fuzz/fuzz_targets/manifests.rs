//! Fuzz target: see `reshard::fuzz::manifests` for the invariants checked.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| reshard::fuzz::manifests(data));
