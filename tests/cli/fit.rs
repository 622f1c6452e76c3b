//! `reshard fit` on a real fixture and on a "virtual" 70B checkpoint: real
//! safetensors headers over sparse data sections, so ~128 GiB of weights
//! cost no disk. fit reads headers only; a test checks it reads no data.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::common::*;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// Writes a safetensors header for `tensors` (name, shape) in BF16 and makes
/// the data section a hole: the file is as long as the real one would be.
fn write_sparse_shard(path: &Path, tensors: &[(String, Vec<u64>)]) -> u64 {
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), json!({"format": "pt"}));
    let mut offset = 0u64;
    for (name, shape) in tensors {
        let len = shape.iter().product::<u64>() * 2;
        header.insert(
            name.clone(),
            json!({"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + len]}),
        );
        offset += len;
    }
    let mut text = serde_json::to_vec(&Value::Object(header)).unwrap();
    while !text.len().is_multiple_of(8) {
        text.push(b' ');
    }
    write_safetensors_raw(path, &text, &[]);
    // The data section is a hole: sparse files make big cases cost nothing.
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.set_len(8 + text.len() as u64 + offset).unwrap();
    8 + text.len() as u64 + offset
}

/// Llama-2-70B's tensor shapes (hidden 8192, MLP 28672, 8 KV heads of 128,
/// vocab 32000, 80 layers) in BF16:
///
/// | tensor | bytes |
/// |---|---|
/// | embed_tokens, lm_head | 32000 x 8192 x 2 = 500 MiB each (max(T)) |
/// | q_proj, o_proj | 8192 x 8192 x 2 = 128 MiB each |
/// | k_proj, v_proj | 1024 x 8192 x 2 = 16 MiB each |
/// | gate, up, down | 28672 x 8192 x 2 = 448 MiB each |
/// | two norms per layer, final norm | 16 KiB each |
///
/// A layer is 2 x 128 + 2 x 16 + 3 x 448 MiB + 32 KiB = 1632 MiB + 32 KiB,
/// sum(T) = 80 layers + 2 x 500 MiB + 16 KiB. Saved as transformers v5
/// does, in three big shards: embed + layers 0-29, layers 30-59, layers
/// 60-79 + norm + head.
const LAYER: u64 = 1632 * MIB + 32 * KIB;
const WEIGHTS_70B: u64 = 80 * LAYER + 1000 * MIB + 16 * KIB;
const MAX_T_70B: u64 = 500 * MIB;

fn layer(l: u64) -> Vec<(String, Vec<u64>)> {
    let p = format!("model.layers.{l}");
    vec![
        (format!("{p}.input_layernorm.weight"), vec![8192]),
        (format!("{p}.self_attn.q_proj.weight"), vec![8192, 8192]),
        (format!("{p}.self_attn.k_proj.weight"), vec![1024, 8192]),
        (format!("{p}.self_attn.v_proj.weight"), vec![1024, 8192]),
        (format!("{p}.self_attn.o_proj.weight"), vec![8192, 8192]),
        (format!("{p}.post_attention_layernorm.weight"), vec![8192]),
        (format!("{p}.mlp.gate_proj.weight"), vec![28672, 8192]),
        (format!("{p}.mlp.up_proj.weight"), vec![28672, 8192]),
        (format!("{p}.mlp.down_proj.weight"), vec![8192, 28672]),
    ]
}

/// Writes the virtual 70B into `dir`; returns the three file sizes.
fn virtual_70b(dir: &Path) -> [u64; 3] {
    std::fs::create_dir_all(dir).unwrap();
    let mut shards: [Vec<(String, Vec<u64>)>; 3] = Default::default();
    shards[0].push(("model.embed_tokens.weight".into(), vec![32000, 8192]));
    for l in 0..80 {
        shards[(l / 30) as usize].extend(layer(l));
    }
    shards[2].push(("model.norm.weight".into(), vec![8192]));
    shards[2].push(("lm_head.weight".into(), vec![32000, 8192]));
    let mut weight_map = serde_json::Map::new();
    let mut sizes = [0; 3];
    for (i, tensors) in shards.iter().enumerate() {
        let file = format!("model-{:05}-of-00003.safetensors", i + 1);
        sizes[i] = write_sparse_shard(&dir.join(&file), tensors);
        for (name, _) in tensors {
            weight_map.insert(name.clone(), json!(file));
        }
    }
    let index = json!({"metadata": {"total_size": WEIGHTS_70B}, "weight_map": weight_map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    sizes
}

fn fit_json(path: &Path, extra: &[&str]) -> (Value, i32) {
    let out = reshard()
        .arg("fit")
        .arg(path)
        .args(extra)
        .arg("--json")
        .output()
        .unwrap();
    let code = out.status.code().unwrap();
    assert!(
        code == 0 || code == 1,
        "exit {code}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (serde_json::from_slice(&out.stdout).unwrap(), code)
}

fn loader<'a>(scenario: &'a Value, name: &str) -> &'a Value {
    scenario["loaders"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["loader"] == name)
        .unwrap()
}

const WINDOWS_32_8: [&str; 8] = [
    "--os",
    "windows",
    "--ram",
    "32GiB",
    "--pagefile",
    "8GiB",
    "--vram",
    "141GiB",
];

#[test]
fn fit_virtual_70b_per_loader_on_windows() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("llama-70b");
    let s = virtual_70b(&dir);
    let (sum_s, max_s) = (s.iter().sum::<u64>(), *s.iter().max().unwrap());
    // Shard 1 (embed + 30 layers) is the largest.
    assert_eq!(max_s, s[0]);
    assert!(s[0] > 500 * MIB + 30 * LAYER && s[0] < 500 * MIB + 30 * LAYER + MIB);

    let args = [
        &WINDOWS_32_8[..],
        &["--baseline", "0", "--pread-threads", "4"],
    ]
    .concat();
    let (r, code) = fit_json(&dir, &args);
    assert_eq!(code, 1, "only pread and reshard's loader fit");
    assert_eq!(
        r["budget"]["host_bytes"],
        40 * GIB,
        "commit limit = 32 GiB RAM + 8 GiB pagefile"
    );
    assert_eq!(r["machine"]["commit_limit"]["source"], "derived");
    assert_eq!(r["machine"]["ram"]["source"], "given");
    let today = &r["today"];
    assert_eq!(today["tensor_sum"], WEIGHTS_70B);
    assert_eq!(today["tensor_max"], MAX_T_70B);
    // `--baseline 0` is a measured baseline: it holds the CUDA context, so
    // only reshard's own loader (no Python process) adds the CUDA term.
    // (loader, held commit, commit at a shard's open): Windows judges the
    // open, where the mapping loaders' header view of max(S) comes on top.
    let cuda = 512 * MIB;
    let cases = [
        // sum(S) + 26 MiB; + max(S) at the open
        (
            "transformers-v5-mmap",
            sum_s + 26 * MIB,
            sum_s + 26 * MIB + max_s,
        ),
        // 26 MiB + 4 threads x (24 MiB + one 500 MiB tensor on the host)
        (
            "transformers-v5-pread",
            26 * MIB + 4 * (24 * MIB + MAX_T_70B),
            26 * MIB + 4 * (24 * MIB + MAX_T_70B),
        ),
        // 8 MiB + max(S); + max(S) at the open
        ("per-shard-mmap", 8 * MIB + max_s, 8 * MIB + 2 * max_s),
        // one shard read whole
        ("full-read", max_s, max_s),
        // every shard mapped; + max(S) at the open
        ("diffusers", sum_s, sum_s + max_s),
        // min(64 MiB staging, 500 MiB) + cuda
        ("reshard", 64 * MIB + cuda, 64 * MIB + cuda),
    ];
    for (name, commit, open) in cases {
        let l = loader(today, name);
        assert_eq!(l["peak_commit"], commit, "{name}");
        assert_eq!(l["open_commit"], open, "{name}");
        assert_eq!(l["vram"], WEIGHTS_70B, "{name}");
        assert_eq!(l["host_shortfall"], open.saturating_sub(40 * GIB), "{name}");
        assert_eq!(l["fits"], open <= 40 * GIB, "{name}");
    }
    assert_eq!(today["vram"]["spill"], 0);
    assert_eq!(today["vram"]["leading_blocks_fit"], 80);

    // Only reshard's loader: it fits, exit 0.
    let (r, code) = fit_json(
        &dir,
        &[&WINDOWS_32_8[..], &["--loader", "reshard"]].concat(),
    );
    assert_eq!((code, &r["fits"]), (0, &json!(true)));
}

#[test]
fn fit_what_if_smaller_shards_lowers_per_shard_peak() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("llama-70b");
    let s = virtual_70b(&dir);
    let args = [&WINDOWS_32_8[..], &["--loader", "per-shard-mmap"]].concat();
    let (_, code) = fit_json(&dir, &args);
    assert_eq!(code, 1);
    let (r, code) = fit_json(&dir, &[&args[..], &["--max-shard-size", "1GiB"]].concat());
    assert_eq!(code, 0, "the what-if decides the exit status");
    let figure =
        |scenario: &Value, key: &str| loader(scenario, "per-shard-mmap")[key].as_u64().unwrap();
    let after = &r["what_if"];
    assert_eq!(after["max_shard_size"], GIB);
    // Held: 8 MiB + max(S) + cuda (no --baseline: the default one does not
    // hold the CUDA context); at the open, + max(S) again. max(S) is at
    // most 1 GiB of data plus a header after the conversion.
    let (today, today_open) = (
        figure(&r["today"], "peak_commit"),
        figure(&r["today"], "open_commit"),
    );
    assert_eq!(today, 8 * MIB + s[0] + 512 * MIB);
    assert_eq!(today_open, today + s[0]);
    let (peak, open) = (figure(after, "peak_commit"), figure(after, "open_commit"));
    assert!(peak <= GIB + 64 * KIB + 520 * MIB && peak < today, "{peak}");
    assert!(
        open <= 2 * (GIB + 64 * KIB) + 520 * MIB && open < today_open,
        "{open}"
    );
    // Text: both columns, side by side.
    let out = reshard()
        .arg("fit")
        .arg(&dir)
        .args(&args)
        .args(["--max-shard-size", "1GiB"])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("after reshard convert --max-shard-size 1.00 GiB"),
        "{text}"
    );
    assert!(text.contains("now fits"), "{text}");
}

#[test]
fn fit_recommends_resharding_and_says_what_it_cannot_help() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("llama-70b");
    virtual_70b(&dir);
    let (r, _) = fit_json(&dir, &WINDOWS_32_8);
    // 5GB shards (at most 4.66 GiB): per-shard 2 x 4.66 + 0.5 GiB plus the
    // 976 MiB baseline < 40 GiB, and the loaders holding one shard fit too;
    // pread fits already; 5GB is the largest candidate, so the least change.
    let rec = &r["recommendation"];
    assert_eq!(rec["max_shard_size_arg"], "5GB");
    assert_eq!(rec["dtype"], Value::Null);
    assert_eq!(
        rec["fits"],
        json!([
            "transformers-v5-pread",
            "per-shard-mmap",
            "full-read",
            "reshard"
        ])
    );
    assert_eq!(
        r["not_helped_by_resharding"],
        json!(["transformers-v5-mmap", "diffusers"])
    );
    let out = reshard()
        .arg("fit")
        .arg(&dir)
        .args(WINDOWS_32_8)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8(out.stdout).unwrap();
    let cmd = format!(
        "recommended: reshard convert {} OUT --max-shard-size 5GB",
        dir.display()
    );
    assert!(text.contains(&cmd), "{text}");
    assert!(
        text.contains(
            "transformers-v5-mmap: resharding cannot make it fit: it keeps every shard mapped"
        ),
        "{text}"
    );
    assert!(text.contains("baseline: 976.00 MiB"), "{text}");
    assert!(
        text.contains("commit limit    40.00 GiB (derived)"),
        "{text}"
    );
    assert!(text.contains("ram             32.00 GiB (given)"), "{text}");
}

#[test]
fn fit_short_vram_counts_leading_blocks() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("llama-70b");
    virtual_70b(&dir);
    let (r, code) = fit_json(
        &dir,
        &[
            "--os", "linux", "--ram", "64GiB", "--vram", "80GiB", "--loader", "reshard",
        ],
    );
    assert_eq!(code, 1);
    let v = &r["today"]["vram"];
    // 80 GiB - 500 MiB of embeddings = 81420 MiB for blocks of 1632 MiB + 32 KiB: 49 whole.
    assert_eq!(v["spill"], WEIGHTS_70B - 80 * GIB);
    assert_eq!(v["leading_blocks_fit"], 49);
    assert_eq!(v["blocks_total"], 80);
    // Linux: reshard's loader keeps one 64 MiB private staging buffer, no CUDA term.
    let l = loader(&r["today"], "reshard");
    assert_eq!(
        (&l["peak_rss_private"], &l["peak_commit"]),
        (&json!(64 * MIB), &json!(64 * MIB))
    );
}

/// fit reads headers only: the bytes the process read stay far below the
/// 128 GiB the shards would hold.
#[cfg(target_os = "linux")]
#[test]
fn fit_reads_no_tensor_data() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("llama-70b");
    virtual_70b(&dir);
    let bin = assert_cmd::cargo::cargo_bin("reshard");
    // A reaped child's I/O counts are added to its parent's /proc/PID/io.
    let script = format!(
        "{} fit {} --os linux --ram 1GiB >/dev/null; cat /proc/$$/io",
        bin.display(),
        dir.display()
    );
    let out = std::process::Command::new("sh")
        .args(["-c", &script])
        .output()
        .unwrap();
    let io = String::from_utf8_lossy(&out.stdout);
    let Some(rchar) = io.lines().find_map(|l| l.strip_prefix("rchar: ")) else {
        eprintln!("skipped: /proc/PID/io unreadable");
        return;
    };
    let rchar: u64 = rchar.trim().parse().unwrap();
    assert!(rchar < 64 * MIB, "fit read {rchar} bytes");
}

#[test]
fn fit_fixture_on_linux_with_exact_figures() {
    let path = fixture("tiny-llama-f32-sharded");
    let ck = reshard::format::open(&path).unwrap();
    let sum_s: u64 = ck.files.iter().map(|f| f.size).sum();
    let max_s = ck.files.iter().map(|f| f.size).max().unwrap();
    let sum_t = ck.total_bytes();
    let (r, code) = fit_json(
        &path,
        &["--os", "linux", "--ram", "1GiB", "--baseline", "0"],
    );
    assert_eq!(code, 0);
    assert_eq!(r["fits"], true);
    assert_eq!(r["recommendation"], Value::Null);
    let today = &r["today"];
    assert_eq!(
        (&today["shard_sum"], &today["shard_max"]),
        (&json!(sum_s), &json!(max_s))
    );
    // No GPU: weights stay on the host.
    let full = loader(today, "full-read");
    assert_eq!(
        (&full["peak_rss_private"], &full["peak_commit"]),
        (&json!(sum_t + max_s), &json!(sum_t + max_s))
    );
    let per = loader(today, "per-shard-mmap");
    assert_eq!(
        (&per["peak_rss_private"], &per["peak_rss_file"]),
        (&json!(sum_t + 8 * MIB), &json!(max_s))
    );
    let mmap = loader(today, "transformers-v5-mmap");
    assert_eq!(
        (&mmap["peak_rss_private"], &mmap["peak_rss_file"]),
        (&json!(26 * MIB), &json!(sum_s))
    );
    // The baseline is judged on top: 977 MiB of RAM is then too little for
    // the Python loaders, not for reshard's own.
    let (r, code) = fit_json(&path, &["--os", "linux", "--ram", "977MiB"]);
    assert_eq!(code, 1);
    assert_eq!(loader(&r["today"], "full-read")["fits"], false);
    assert_eq!(loader(&r["today"], "full-read")["baseline"], 976 * MIB);
    assert_eq!(loader(&r["today"], "reshard")["fits"], true);
}

#[test]
fn fit_fixture_recommends_bf16_for_f32() {
    // Commit limit 28300000 B, no GPU, no baseline. transformers-v5-mmap
    // holds sum(S) + 26 MiB = 878072 + 27262976 and needs + max(S) =
    // 256128 at the open of its largest shard today,
    // more in one f32 shard, and about 26 MiB + 2 x 441 KB in one bf16
    // shard: only the cast helps it.
    let path = fixture("tiny-llama-f32-sharded");
    let args = [
        "--os",
        "windows",
        "--commit-limit",
        "28300000",
        "--baseline",
        "0",
    ];
    let (r, code) = fit_json(&path, &args);
    assert_eq!(code, 1);
    let v5 = loader(&r["today"], "transformers-v5-mmap");
    assert_eq!(v5["peak_commit"], 878_072 + 27_262_976);
    assert_eq!(v5["open_commit"], 878_072 + 27_262_976 + 256_128);
    let rec = &r["recommendation"];
    assert_eq!(rec["dtype"], "BF16");
    assert!(
        rec["fits"]
            .as_array()
            .unwrap()
            .contains(&json!("transformers-v5-mmap")),
        "{rec}"
    );
    assert!(r["not_helped_by_resharding"]
        .as_array()
        .unwrap()
        .contains(&json!("transformers-v5-mmap")));
    let out = reshard().arg("fit").arg(&path).args(args).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    // Its shards hold under 1 MiB each: the cast keeps them, merges none.
    assert!(
        text.contains("--max-shard-size 1MiB --dtype bf16"),
        "{text}"
    );
    assert!(
        text.contains("the smaller dtype in the command above does (BF16)"),
        "{text}"
    );
}

#[test]
fn fit_bad_input_is_an_error() {
    reshard()
        .args(["fit", "/nonexistent/model"])
        .assert()
        .code(2);
    let tmp = tempfile::tempdir().unwrap();
    reshard()
        .arg("fit")
        .arg(fixture("tiny-llama-f32-sharded"))
        .args(["--ram", "lots"])
        .assert()
        .code(2);
    reshard().arg("fit").arg(tmp.path()).assert().code(2);
}

#[test]
fn fit_help_lists_loaders() {
    let out = reshard().args(["fit", "--help"]).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    for name in [
        "transformers-v5-mmap",
        "transformers-v5-pread",
        "per-shard-mmap",
        "full-read",
        "diffusers",
        "reshard",
        "--baseline",
    ] {
        assert!(text.contains(name), "{name} missing from --help");
    }
}

fn gguf_fit_json(path: &Path, extra: &[&str], code: i32) -> Value {
    let a = reshard()
        .arg("fit")
        .arg(path)
        .args([
            "--os",
            "windows",
            "--ram",
            "8GiB",
            "--pagefile",
            "1GiB",
            "--json",
        ])
        .args(extra)
        .assert()
        .code(code);
    serde_json::from_slice(&a.get_output().stdout).unwrap()
}

fn row_names(scenario: &Value) -> Vec<&str> {
    scenario["loaders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["loader"].as_str().unwrap())
        .collect()
}

#[test]
fn a_gguf_is_judged_by_llama_cpp_and_comfyui_gguf() {
    let split = fixture("gguf/split-00002-of-00002.gguf");
    let r = gguf_fit_json(&split, &["--vram", "8GiB"], 0);
    let today = &r["today"];
    assert_eq!(today["format"], "gguf");
    assert_eq!(row_names(today), ["llama.cpp", "comfyui-gguf", "reshard"]);
    let out: Vec<&str> = today["not_applicable"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["loader"].as_str().unwrap())
        .collect();
    assert_eq!(
        out,
        [
            "transformers-v5-mmap",
            "transformers-v5-pread",
            "per-shard-mmap",
            "full-read",
            "diffusers"
        ]
    );
    // Both members of the set, read-only mapped: llama.cpp commits only
    // the CUDA term on Windows and puts every weight on the GPU (the
    // fixture has no input layer).
    let llama = &today["loaders"][0];
    assert_eq!(today["shard_count"], 2);
    assert_eq!(llama["peak_commit"], 512 * MIB);
    assert_eq!(llama["baseline"], 0);
    assert_eq!(llama["vram"], today["tensor_sum"]);
    assert_eq!(llama["peak_rss_file"], today["shard_sum"]);
    // ComfyUI-GGUF: the quantized bytes plus the largest quantized weight
    // (blk.2.weight, Q4_K: 288 bytes, two 144-byte blocks of 256) in f16.
    let comfy = &today["loaders"][1];
    assert_eq!(comfy["vram"], 680 + 2 * 512);
}

#[test]
fn a_safetensors_loader_named_for_a_gguf_fails_the_check_and_says_why() {
    let gguf = fixture("gguf/types.gguf");
    let a = reshard()
        .arg("fit")
        .arg(&gguf)
        .args([
            "--os",
            "linux",
            "--ram",
            "8GiB",
            "--loader",
            "per-shard-mmap",
        ])
        .args(["--loader", "llama.cpp"])
        .assert()
        .code(1);
    let text = String::from_utf8_lossy(&a.get_output().stdout).into_owned();
    assert!(
        text.contains("not applicable: per-shard-mmap (these read safetensors or .bin, not GGUF"),
        "{text}"
    );
    assert!(
        text.contains("does not load: per-shard-mmap cannot read this checkpoint"),
        "{text}"
    );
    // llama.cpp alone fits: CPU only, the file mapped read-only.
    let r = gguf_fit_json(&gguf, &["--loader", "llama.cpp"], 0);
    assert_eq!(r["today"]["loaders"][0]["peak_commit"], 0);
    // The GGUF rows are not applicable to safetensors.
    let r = gguf_fit_json(&fixture("tiny-gpt2"), &[], 0);
    let names = row_names(&r["today"]);
    assert!(
        !names.contains(&"llama.cpp") && !names.contains(&"comfyui-gguf"),
        "{names:?}"
    );
    // And validate --emulate refuses them: nothing to reproduce.
    reshard()
        .args(["validate", "--emulate", "llama.cpp"])
        .arg(&gguf)
        .assert()
        .code(2)
        .stderr(predicates::str::contains("maps every file read-only"));
}

#[test]
fn a_gguf_what_if_is_judged_as_the_safetensors_convert_writes() {
    let r = gguf_fit_json(&fixture("gguf/kinds.gguf"), &["--dtype", "bf16"], 0);
    let w = &r["what_if"];
    assert_eq!(w["format"], "safetensors");
    assert!(row_names(w).contains(&"transformers-v5-pread"));
    assert!(!row_names(w).contains(&"llama.cpp"));
}

/// A 302 MiB f32 model in three shards of 25 x 4 MiB + 703 KiB (sparse):
/// the case where fit used to advise `--max-shard-size 5GB --dtype bf16`.
fn model_302_mib(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let mut weight_map = serde_json::Map::new();
    for s in 0..3u64 {
        let file = format!("model-{:05}-of-00003.safetensors", s + 1);
        let mut header = serde_json::Map::new();
        let mut offset = 0u64;
        let mut add =
            |name: String, shape: Vec<u64>, header: &mut serde_json::Map<String, Value>| {
                let len = shape.iter().product::<u64>() * 4;
                header.insert(
                    name.clone(),
                    json!({"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len]}),
                );
                offset += len;
                weight_map.insert(name, json!(file));
            };
        for i in 0..25 {
            add(
                format!("model.layers.{}.mlp.weight", s * 25 + i),
                vec![1024, 1024],
                &mut header,
            );
        }
        add(
            format!("model.layers.{}.norm.weight", s * 25),
            vec![180_000],
            &mut header,
        );
        let mut text = serde_json::to_vec(&Value::Object(header)).unwrap();
        while !text.len().is_multiple_of(8) {
            text.push(b' ');
        }
        let path = dir.join(&file);
        write_safetensors_raw(&path, &text, &[]);
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(8 + text.len() as u64 + offset).unwrap();
    }
    let index = json!({"metadata": {}, "weight_map": weight_map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
}

#[test]
fn fit_advice_is_the_least_change_and_never_merges_shards() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m302");
    model_302_mib(&dir);
    // Windows, 500 MiB commit limit: per-shard-mmap needs sum(T) + 2 x
    // max(S) + 8 MiB = 302 + 2 x 100.7 + 8 MiB today; 64 MiB shards
    // bring it to about 302 + 2 x 64 + 8 = 438 MiB, no cast needed.
    let machine = [
        "--os",
        "windows",
        "--commit-limit",
        "500MiB",
        "--baseline",
        "0",
    ];
    let args = [&machine[..], &["--loader", "per-shard-mmap"]].concat();
    let (r, code) = fit_json(&dir, &args);
    assert_eq!(code, 1);
    let rec = &r["recommendation"];
    assert_eq!(
        rec["dtype"],
        Value::Null,
        "a cast is not the least change: {rec}"
    );
    assert_eq!(rec["max_shard_size_arg"], "64MiB", "{rec}");
    assert_eq!(r["not_helped_by_resharding"], json!([]));
    // Every loader judged: bf16 makes more fit, and keeps the shards' own
    // size (101 MiB) instead of merging them into one 5GB file.
    let (r, _) = fit_json(&dir, &machine);
    let rec = &r["recommendation"];
    assert_eq!(rec["dtype"], "BF16", "{rec}");
    assert_eq!(rec["max_shard_size_arg"], "101MiB", "{rec}");
    assert!(rec["max_shard_size"].as_u64().unwrap() <= 101 * MIB);
}

#[test]
fn fit_advice_agrees_with_its_what_if_table() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m302");
    model_302_mib(&dir);
    // 380 MiB: 16 MiB shards make per-shard-mmap fit (302 + 2 x 16 + 8
    // MiB), which no candidate of 256 MiB or more did.
    let args = [
        "--os",
        "windows",
        "--commit-limit",
        "380MiB",
        "--baseline",
        "0",
        "--loader",
        "per-shard-mmap",
        "--max-shard-size",
        "16MiB",
    ];
    let (r, code) = fit_json(&dir, &args);
    assert_eq!(code, 0, "the what-if fits");
    assert_eq!(loader(&r["what_if"], "per-shard-mmap")["fits"], true);
    assert_eq!(r["not_helped_by_resharding"], json!([]));
    let rec = &r["recommendation"];
    assert_eq!(rec["dtype"], Value::Null, "{rec}");
    assert!(rec["fits"]
        .as_array()
        .unwrap()
        .contains(&json!("per-shard-mmap")));
    let out = reshard().arg("fit").arg(&dir).args(args).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(!text.contains("resharding cannot make it fit"), "{text}");
    assert!(text.contains("now fits"), "{text}");
}

#[test]
fn fit_quiet_prints_the_verdict_and_advice_only() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m302");
    model_302_mib(&dir);
    let args = [
        "--os",
        "windows",
        "--commit-limit",
        "500MiB",
        "--baseline",
        "0",
    ];
    let out = reshard()
        .arg("fit")
        .arg(&dir)
        .args(args)
        .arg("-q")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.starts_with("does not fit: per-shard-mmap, diffusers\n"),
        "{text}"
    );
    assert!(text.contains("recommended: reshard convert"), "{text}");
    assert!(!text.contains("machine"), "{text}");
    assert!(!text.contains("as it is"), "{text}");
    let out = reshard()
        .arg("fit")
        .arg(fixture("tiny-llama"))
        .args(["--os", "linux", "--ram", "64GiB", "-q"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("fits\n"), "{text}");
}

/// docs/fit.md's 302 MiB calibration Llama, as sparse files: each shard is
/// the header transformers wrote (tests/fixtures/llama-302m-headers) and
/// zeros to its size, beside the real index and config. fit reads headers
/// and sizes only, so it judges this exactly as the real checkpoint.
pub(crate) fn llama_302m(dir: &Path) -> PathBuf {
    let src = fixture("llama-302m-headers");
    let dst = dir.join("llama-302m");
    std::fs::create_dir_all(&dst).unwrap();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        let Some(shard) = name.strip_suffix(".header") else {
            std::fs::copy(&path, dst.join(&name)).unwrap();
            continue;
        };
        let header = std::fs::read(&path).unwrap();
        let json: serde_json::Value = serde_json::from_slice(&header[8..]).unwrap();
        let data_end = json
            .as_object()
            .unwrap()
            .values()
            .filter_map(|t| t["data_offsets"][1].as_u64())
            .max()
            .unwrap();
        let file = std::fs::File::create(dst.join(shard)).unwrap();
        std::io::Write::write_all(&mut &file, &header).unwrap();
        file.set_len(header.len() as u64 + data_end).unwrap();
    }
    dst
}

/// The sparse copy has the real checkpoint's shard sizes (transformers'
/// files of 146,819,824, 142,633,832 and 27,275,904 bytes) and opens as
/// its 57 tensors.
#[test]
fn the_sparse_calibration_llama_is_the_real_ones_layout() {
    let dir = tempfile::tempdir().unwrap();
    let model = llama_302m(dir.path());
    let sizes: Vec<u64> = (1..=3)
        .map(|k| {
            std::fs::metadata(model.join(format!("model-0000{k}-of-00003.safetensors")))
                .unwrap()
                .len()
        })
        .collect();
    assert_eq!(sizes, [146_819_824, 142_633_832, 27_275_904]);
    let out = reshard()
        .arg("inspect")
        .arg(&model)
        .arg("--json")
        .output()
        .unwrap();
    assert!(out.status.success());
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["tensor_count"], 57, "{j}");
}
