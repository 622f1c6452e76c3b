//! Replays the fuzz corpora (fuzz/corpus/<target>) and the saved crashes
//! (fuzz/regressions/<target>) through the same entry points the cargo-fuzz
//! targets use, plus about 5,000 deterministic mutations of them a target,
//! so CI checks what fuzzing found without running a fuzzer.

use std::path::Path;

type Entry = fn(&[u8]);

fn targets() -> Vec<(&'static str, Entry)> {
    vec![
        (
            "safetensors_header",
            reshard::fuzz::safetensors_header as Entry,
        ),
        ("index_json", reshard::fuzz::index_json),
        ("planner", reshard::fuzz::planner),
        ("pytorch", reshard::fuzz::pytorch),
        ("pickle", reshard::fuzz::pickle),
        ("gguf_header", reshard::fuzz::gguf_header),
        ("manifests", reshard::fuzz::manifests),
    ]
}

fn inputs(target: &str) -> Vec<Vec<u8>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut out = Vec::new();
    for dir in [
        root.join("corpus").join(target),
        root.join("regressions").join(target),
    ] {
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for e in entries.flatten() {
                out.push(std::fs::read(e.path()).unwrap());
            }
        }
    }
    out
}

/// xorshift64: deterministic mutations, no dependency.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

#[test]
fn corpora_and_regressions_replay_without_panics() {
    for (name, entry) in targets() {
        let seeds = inputs(name);
        assert!(!seeds.is_empty(), "no corpus for {name}");
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        // About 5,000 mutated runs a target, however large the corpus.
        let per_seed = (5_000 / seeds.len()).clamp(1, 200);
        for seed in &seeds {
            entry(seed);
            for _ in 0..per_seed {
                let mut m = seed.clone();
                let edits = 1 + next(&mut state) % 4;
                for _ in 0..edits {
                    if m.is_empty() {
                        m.push(next(&mut state) as u8);
                        continue;
                    }
                    let at = (next(&mut state) % m.len() as u64) as usize;
                    match next(&mut state) % 3 {
                        0 => m[at] = next(&mut state) as u8,
                        1 => {
                            m.truncate(at);
                        }
                        _ => m.insert(
                            at,
                            b"{}[]\":,0123456789-.e"[(next(&mut state) % 20) as usize],
                        ),
                    }
                }
                entry(&m);
            }
        }
    }
}
