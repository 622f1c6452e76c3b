//! Fuzz target: see `reshard::fuzz::planner` for the invariants checked.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| reshard::fuzz::planner(data));
