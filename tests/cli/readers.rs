//! The readers against the fixtures' expected.json: names, dtypes, shapes and
//! the sha256 of every tensor's bytes as torch saw them.

use crate::common::*;

#[test]
fn safetensors_fixtures_match_expected() {
    for name in [
        "tiny-llama",
        "tiny-llama-f32-sharded",
        "tiny-gpt2",
        "tiny-moe-sharded",
        "tiny-t5",
    ] {
        assert_matches_expected(&fixture(name), name);
    }
}

#[test]
fn python_written_files_are_read() {
    let Some(python) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let script = r#"
import sys, json, hashlib, numpy as np
from safetensors.numpy import save_file
rng = np.random.default_rng(7)
tensors = {
    "model.layers.0.w": rng.standard_normal((7, 5)).astype(np.float32),
    "model.layers.1.w": rng.standard_normal((3,)).astype(np.float16),
    "ids": np.arange(11, dtype=np.int64),
    "flag": np.array([True, False, True]),
    "scalar": np.array(3.5, dtype=np.float64),
    "empty": np.zeros((0, 4), dtype=np.float32),
}
save_file(tensors, sys.argv[1] + "/py.safetensors", metadata={"format": "pt"})
print(json.dumps({k: [list(v.shape), hashlib.sha256(np.ascontiguousarray(v).tobytes()).hexdigest()] for k, v in tensors.items()}))
"#;
    let stdout = run_python(&python, Program::Code(script), &[dir.path()]);
    let want: std::collections::BTreeMap<String, (Vec<u64>, String)> =
        serde_json::from_str(&stdout).unwrap();
    let got = read_all(&dir.path().join("py.safetensors"));
    assert_eq!(got.len(), want.len());
    for (name, (shape, sha)) in want {
        assert_eq!(got[&name].1, shape, "{name}");
        assert_eq!(got[&name].2, sha, "{name}");
    }
}
