//! The folders docs_output.rs runs the pages' command blocks in: each
//! function lays out, under a temporary folder, the files one block names
//! (copies of tests/fixtures and examples/, or tiny synthesized checkpoints
//! with the page's names; fit reads only headers, so a sparse data section
//! stands in for a large model).

use std::path::{Path, PathBuf};

use sha2::Digest;

use crate::common::{copy_dir, fixture, write_safetensors_raw};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub(crate) fn readme(dir: &Path) {
    copy_dir(
        &repo().join("examples/tiny-llama"),
        &dir.join("examples/tiny-llama"),
    );
}

pub(crate) fn moe(dir: &Path) {
    copy_dir(
        &fixture("tiny-moe-sharded"),
        &dir.join("tests/fixtures/tiny-moe-sharded"),
    );
}

pub(crate) fn tiny_llama(dir: &Path) {
    copy_dir(&fixture("tiny-llama"), &dir.join("tiny-llama"));
}

/// fit.md's FLUX.1-dev-shaped file: real names and dims, sparse data.
pub(crate) fn flux_dev(dir: &Path) {
    crate::fit_for::flux(dir);
}

/// gguf.md's FLUX-shaped file: the shapes its dry run shows (the plan
/// reads no values, so they are zeros).
pub(crate) fn flux(dir: &Path) {
    let tensors: [(&str, &[u64]); 5] = [
        ("double_blocks.0.img_attn.proj.weight", &[64, 256]),
        ("double_blocks.0.img_attn.proj.bias", &[64]),
        ("double_blocks.0.img_mlp.0.weight", &[48, 96]),
        ("img_in.weight", &[64, 40]),
        ("final_layer.linear.weight", &[16, 16]),
    ];
    zeros_f32(&dir.join("flux.safetensors"), &tensors);
}

/// A safetensors file of F32 `tensors` (name, shape), all zeros: what a
/// page's plan or split shows depends on names and shapes only.
fn zeros_f32(path: &Path, tensors: &[(&str, &[u64])]) {
    let mut header = serde_json::Map::new();
    let mut at = 0u64;
    for (name, shape) in tensors {
        let len = shape.iter().product::<u64>() * 4;
        header.insert(
            name.to_string(),
            serde_json::json!({"dtype": "F32", "shape": shape, "data_offsets": [at, at + len]}),
        );
        at += len;
    }
    let json = serde_json::to_vec(&serde_json::Value::Object(header)).unwrap();
    write_safetensors_raw(path, &json, &vec![0u8; at as usize]);
}

/// One F32 tensor with three values past F16's range.
pub(crate) fn overflowing(dir: &Path) {
    let data: Vec<u8> = [1e6f32, -1e6, 7e4, 1.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    write_safetensors_raw(
        &dir.join("big.safetensors"),
        br#"{"__metadata__":{"format":"pt"},"model.layers.3.mlp.down_proj.weight":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#,
        &data,
    );
}

/// inspect.md's folder with four findings: no `format: pt`, a misaligned
/// tensor, a shard the index does not list, a wrong total_size.
pub(crate) fn damaged(dir: &Path) {
    let d = dir.join("damaged-folder");
    std::fs::create_dir_all(&d).unwrap();
    // A header of 128 bytes puts "b" (data offset 3) at byte 139.
    let json = br#"{"a":{"dtype":"U8","shape":[3],"data_offsets":[0,3]},"b":{"dtype":"F32","shape":[2],"data_offsets":[3,11]}}"#;
    let mut header = json.to_vec();
    header.resize(128, b' ');
    write_safetensors_raw(
        &d.join("model-00001-of-00002.safetensors"),
        &header,
        &[1; 11],
    );
    write_safetensors_raw(
        &d.join("model-00002-of-00002.safetensors"),
        br#"{"c":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}"#,
        &[0],
    );
    std::fs::write(
        d.join("model.safetensors.index.json"),
        br#"{"metadata": {"total_size": 99}, "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors"}}"#,
    )
    .unwrap();
}

/// batch.md's small ROOT, already converted into `out`.
pub(crate) fn batch_root(dir: &Path) {
    for f in ["tiny-gpt2", "tiny-t5"] {
        copy_dir(&fixture(f), &dir.join("root").join(f));
    }
    crate::common::reshard()
        .arg("batch")
        .arg(dir.join("root"))
        .arg("--out")
        .arg(dir.join("out"))
        .arg("-q")
        .assert()
        .success();
}

/// A fixture where the page names it: `tests/fixtures/NAME` under `dir`.
fn at_fixtures(dir: &Path, name: &str) {
    copy_dir(&fixture(name), &dir.join("tests/fixtures").join(name));
}

pub(crate) fn tiny_moe_and_t5(dir: &Path) {
    moe(dir);
    at_fixtures(dir, "tiny-t5");
}

pub(crate) fn gpt2_bin(dir: &Path) {
    at_fixtures(dir, "tiny-gpt2-bin");
}

pub(crate) fn fixture_tiny_llama(dir: &Path) {
    at_fixtures(dir, "tiny-llama");
}

/// The gguf fixtures (the split set and the llama.cpp-converted tiny
/// Llama with its source) at tests/fixtures/gguf.
pub(crate) fn gguf_fixtures(dir: &Path) {
    at_fixtures(dir, "gguf");
}

/// inspect.md's tiny Llama cut off at 300000 bytes.
pub(crate) fn truncated(dir: &Path) {
    let d = dir.join("truncated-model");
    copy_dir(&fixture("tiny-llama"), &d);
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(d.join("model.safetensors"))
        .unwrap();
    file.set_len(300_000).unwrap();
}

/// layouts.md's tiny Llama with a file named as a Windows device.
pub(crate) fn tiny_llama_aux(dir: &Path) {
    tiny_llama(dir);
    std::fs::write(dir.join("tiny-llama/aux.json"), b"{}").unwrap();
}

/// gguf.md's files: llama.cpp's Q8_0 tiny Llama beside the flux file of
/// the page's later blocks.
pub(crate) fn llama_q8_0(dir: &Path) {
    std::fs::copy(
        fixture("gguf/llm/llama-q8_0.gguf"),
        dir.join("llama-q8_0.gguf"),
    )
    .unwrap();
}

/// gguf.md after its first conversion: tiny-llama converted from
/// llama-q8_0.gguf to bf16, and the flux file converted to Q8_0.
pub(crate) fn gguf_page_converted(dir: &Path) {
    llama_q8_0(dir);
    flux(dir);
    for args in [
        ["llama-q8_0.gguf", "tiny-llama", "--dtype", "bf16"],
        ["flux.safetensors", "flux-q8_0.gguf", "--quantize", "q8_0"],
    ] {
        crate::common::reshard()
            .arg("convert")
            .args(args)
            .arg("-q")
            .current_dir(dir)
            .assert()
            .success();
    }
}

/// gguf.md's tiny Llama quantized to Q8_0.
pub(crate) fn gguf_page_quantized(dir: &Path) {
    gguf_page_converted(dir);
    crate::common::reshard()
        .args([
            "convert",
            "tiny-llama",
            "tiny-llama-q8_0.gguf",
            "--quantize",
            "q8_0",
            "-q",
        ])
        .current_dir(dir)
        .assert()
        .success();
}

/// The gguf LLM fixtures at tests/fixtures/gguf/llm.
pub(crate) fn gguf_llm(dir: &Path) {
    at_fixtures(dir, "gguf/llm/llama");
}

/// Runs `reshard ARGS -q` in `dir` and requires exit `code`.
fn reshard_in(dir: &Path, args: &[&str], code: i32) {
    crate::common::reshard()
        .args(args)
        .arg("-q")
        .current_dir(dir)
        .assert()
        .code(code);
}

/// batch.md's `models/`: five model folders (`broken` cut short), a
/// Hugging Face cache repo of the tiny gpt2, and a symlink loop.
pub(crate) fn batch_models(dir: &Path) {
    let m = dir.join("models");
    for (from, to) in [
        ("tiny-t5", "google/t5-tiny"),
        ("tiny-gpt2", "gpt2"),
        ("tiny-llama", "meta/llama-tiny"),
        ("tiny-llama-f32-sharded", "meta/llama-tiny-sharded"),
        ("tiny-llama", "broken"),
    ] {
        copy_dir(&fixture(from), &m.join(to));
    }
    std::fs::OpenOptions::new()
        .write(true)
        .open(m.join("broken/model.safetensors"))
        .unwrap()
        .set_len(100_000)
        .unwrap();
    let repo = m.join("hub/models--acme--tiny");
    let snapshot = repo.join("snapshots/5f2c9e1");
    std::fs::create_dir_all(repo.join("blobs")).unwrap();
    std::fs::create_dir_all(&snapshot).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), "5f2c9e1").unwrap();
    for file in ["config.json", "model.safetensors"] {
        let bytes = std::fs::read(fixture("tiny-gpt2").join(file)).unwrap();
        let name = crate::common::hex(&sha2::Sha256::digest(&bytes));
        std::fs::write(repo.join("blobs").join(&name), &bytes).unwrap();
        crate::common::symlink(format!("../../blobs/{name}"), snapshot.join(file));
    }
    std::fs::create_dir_all(m.join("notes")).unwrap();
    std::fs::write(m.join("notes/README.md"), "notes\n").unwrap();
    crate::common::symlink("..", m.join("notes/up"));
}

/// `models/` converted once into `converted/`.
pub(crate) fn batch_converted(dir: &Path) {
    batch_models(dir);
    reshard_in(dir, &["batch", "models", "--out", "converted"], 1);
}

/// `models/` converted, then the cache repo's weight blob corrupted (its
/// last byte changed; its name still the old content's hash).
pub(crate) fn batch_corrupted(dir: &Path) {
    batch_converted(dir);
    let blobs = dir.join("models/hub/models--acme--tiny/blobs");
    for entry in std::fs::read_dir(blobs).unwrap() {
        let path = entry.unwrap().path();
        let mut bytes = std::fs::read(&path).unwrap();
        if bytes.len() > 100_000 {
            *bytes.last_mut().unwrap() ^= 0xff;
            std::fs::write(&path, bytes).unwrap();
        }
    }
}

/// `models/` converted in three parts, each with its own report.
pub(crate) fn batch_parts(dir: &Path) {
    batch_models(dir);
    for i in 0..3 {
        let part = format!("{i}/3");
        let report = format!("converted/.reports/part-{i}.json");
        let code = if i == 2 { 1 } else { 0 };
        reshard_in(
            dir,
            &[
                "batch",
                "models",
                "--out",
                "converted",
                "--part",
                &part,
                "--report",
                &report,
            ],
            code,
        );
    }
}

/// batch.md's `gguf/`: a folder of GGUF files (a split set among them) and
/// a gpt2 folder with a GGUF beside its safetensors.
pub(crate) fn batch_gguf(dir: &Path) {
    let g = dir.join("gguf");
    std::fs::create_dir_all(g.join("llama")).unwrap();
    for f in [
        "kinds.gguf",
        "types.gguf",
        "split-00001-of-00002.gguf",
        "split-00002-of-00002.gguf",
    ] {
        std::fs::copy(fixture("gguf").join(f), g.join("llama").join(f)).unwrap();
    }
    copy_dir(&fixture("tiny-gpt2"), &g.join("mixed"));
    std::fs::copy(fixture("gguf/kinds.gguf"), g.join("mixed/gpt2-q8.gguf")).unwrap();
}

/// layouts.md's tiny Llama and an `$EDITOR` (`sh .edit`, which the runner
/// sets) that appends a line to the file it is given.
pub(crate) fn tiny_llama_editor(dir: &Path) {
    tiny_llama(dir);
    std::fs::write(dir.join(".edit"), "echo >> \"$1\"\n").unwrap();
}

/// validate.md's tiny Llama and `./hangs`, a "Python" that never answers.
pub(crate) fn tiny_llama_hangs(dir: &Path) {
    tiny_llama(dir);
    let hangs = dir.join("hangs");
    std::fs::write(&hangs, "#!/bin/sh\nexec sleep 60\n").unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&hangs, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
}

/// quantize.md's tiny FLUX-shaped file (real FLUX key names, small dims).
/// BF16 values in (-1, 1), from a fixed linear congruential sequence.
pub(crate) fn flux_tiny(dir: &Path) {
    let names: [(&str, &[u64]); 9] = [
        ("img_in.weight", &[64, 32]),
        ("time_in.in_layer.weight", &[64, 32]),
        ("double_blocks.0.img_attn.qkv.weight", &[96, 64]),
        ("double_blocks.0.img_attn.norm.query_norm.scale", &[32]),
        ("double_blocks.0.img_mlp.0.weight", &[128, 64]),
        ("double_blocks.0.img_mlp.0.bias", &[128]),
        ("double_blocks.0.img_mod.lin.weight", &[96, 64]),
        ("single_blocks.0.linear1.weight", &[96, 64]),
        ("final_layer.linear.weight", &[64, 64]),
    ];
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
    let mut data = Vec::new();
    let mut i = 0u32;
    for (name, shape) in names {
        let start = data.len();
        for _ in 0..shape.iter().product::<u64>() {
            i = i.wrapping_mul(1_103_515_245).wrapping_add(12345);
            let v = ((i >> 8) as f32 / (1 << 24) as f32 - 0.5) * 2.0;
            data.extend(&((v.to_bits() >> 16) as u16).to_le_bytes());
        }
        header.insert(
            name.into(),
            serde_json::json!({"dtype": "BF16", "shape": shape, "data_offsets": [start, data.len()]}),
        );
    }
    crate::common::write_safetensors(
        &dir.join("flux-tiny.safetensors"),
        &serde_json::Value::Object(header),
        &data,
    );
}

/// quantize.md's file quantized with fp8-scaled into `flux-fp8`.
pub(crate) fn flux_tiny_scaled(dir: &Path) {
    flux_tiny(dir);
    reshard_in(
        dir,
        &[
            "convert",
            "flux-tiny.safetensors",
            "flux-fp8",
            "--quantize",
            "fp8-scaled",
        ],
        0,
    );
}

/// layouts.md's all-in-one SD 1.5-shaped file: one tensor or two under each
/// component's prefix (zeros: splitting reads no values).
pub(crate) fn sd15_aio(dir: &Path) {
    let tensors: [(&str, &[u64]); 6] = [
        ("alphas_cumprod", &[1000]),
        (
            "cond_stage_model.transformer.text_model.embeddings.token_embedding.weight",
            &[1000, 32],
        ),
        ("first_stage_model.decoder.conv_out.weight", &[3, 32, 3, 3]),
        ("first_stage_model.encoder.conv_in.weight", &[32, 3, 3, 3]),
        (
            "model.diffusion_model.input_blocks.0.0.weight",
            &[32, 4, 3, 3],
        ),
        (
            "model.diffusion_model.middle_block.1.proj_in.weight",
            &[400, 400],
        ),
    ];
    zeros_f32(&dir.join("sd15-aio.safetensors"), &tensors);
}

/// fit.md's llama-302m: the calibration Llama's real headers over sparse
/// data (tests/fixtures/llama-302m-headers).
pub(crate) fn llama_302m(dir: &Path) {
    crate::fit::llama_302m(dir);
}

/// layouts.md's `big`: 1 GiB in 4 shards of 4 f32 tensors of 64 MiB
/// each, as torch writes them (aligned, `format: pt`), sparse (zeros read
/// from holes), with its index.
pub(crate) fn big_merge(dir: &Path) {
    let d = dir.join("big");
    std::fs::create_dir_all(&d).unwrap();
    let mut weight_map = serde_json::Map::new();
    let len: u64 = 4096 * 4096 * 4;
    for k in 0..4 {
        let name = format!("model-{:05}-of-00004.safetensors", k + 1);
        let mut header = serde_json::Map::new();
        for t in 0..4u64 {
            let tensor = format!("model.layers.{}.mlp.weight", k * 4 + t);
            header.insert(
                tensor.clone(),
                serde_json::json!({"dtype": "F32", "shape": [4096, 4096], "data_offsets": [t * len, (t + 1) * len]}),
            );
            weight_map.insert(tensor, name.clone().into());
        }
        header.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
        let mut json = serde_json::to_vec(&header).unwrap();
        json.resize(json.len().next_multiple_of(8), b' ');
        let file = std::fs::File::create(d.join(&name)).unwrap();
        let mut prefix = (json.len() as u64).to_le_bytes().to_vec();
        prefix.extend_from_slice(&json);
        std::io::Write::write_all(&mut &file, &prefix).unwrap();
        file.set_len(prefix.len() as u64 + 4 * len).unwrap();
    }
    let index = serde_json::json!({"metadata": {"total_size": 16 * len}, "weight_map": weight_map});
    std::fs::write(
        d.join("model.safetensors.index.json"),
        serde_json::to_vec(&index).unwrap(),
    )
    .unwrap();
}

/// validate.md's real output: `out` (layouts.md's `big` resharded into
/// 256 MiB shards), the calibration Llama's headers as `llama-302m`, and
/// its 64 MiB reshard `r64`.
pub(crate) fn validate_real(dir: &Path) {
    big_merge(dir);
    llama_302m(dir);
    for (src, dst, size) in [("big", "out", "256MiB"), ("llama-302m", "r64", "64MiB")] {
        crate::common::reshard()
            .current_dir(dir)
            .args(["convert", src, dst, "--max-shard-size", size, "-q"])
            .assert()
            .success();
    }
}

/// fit.md's gguf split set where the page names it.
pub(crate) fn gguf_split(dir: &Path) {
    gguf_fixtures(dir);
}

/// fit.md's qwen2-14b: the layout of the Windows report (4 bf16 shards of
/// 8,718,768,250, 8,708,030,832 twice and 3,403,745,670 bytes, 27.51 GiB),
/// as 1 GiB tensors and a remainder per shard, sparse. fit's Windows terms
/// depend on the shard sizes, not on how a shard is cut.
pub(crate) fn qwen2_14b(dir: &Path) {
    let d = dir.join("qwen2-14b");
    std::fs::create_dir_all(&d).unwrap();
    let files: [(u64, usize); 4] = [
        (8_718_768_250, 1024),
        (8_708_030_832, 1024),
        (8_708_030_832, 1024),
        (3_403_745_670, 472),
    ];
    let mut weight_map = serde_json::Map::new();
    for (k, &(size, header_len)) in files.iter().enumerate() {
        let name = format!("model-{:05}-of-00004.safetensors", k + 1);
        let data = size - 8 - header_len as u64;
        let mut header = serde_json::Map::new();
        let (mut at, mut t) = (0u64, 0);
        while at < data {
            let len = (data - at).min(1 << 30) / 2 * 2;
            if len == 0 {
                break;
            }
            let tensor = format!("model.layers.{k}.t{t}.weight");
            header.insert(
                tensor.clone(),
                serde_json::json!({"dtype": "BF16", "shape": [len / 2], "data_offsets": [at, at + len]}),
            );
            weight_map.insert(tensor, name.clone().into());
            at += len;
            t += 1;
        }
        header.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
        let mut json = serde_json::to_vec(&header).unwrap();
        assert!(json.len() <= header_len);
        json.resize(header_len, b' ');
        let file = std::fs::File::create(d.join(&name)).unwrap();
        let mut prefix = (header_len as u64).to_le_bytes().to_vec();
        prefix.extend_from_slice(&json);
        std::io::Write::write_all(&mut &file, &prefix).unwrap();
        file.set_len(size).unwrap();
    }
    let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": weight_map});
    std::fs::write(
        d.join("model.safetensors.index.json"),
        serde_json::to_vec(&index).unwrap(),
    )
    .unwrap();
}

/// batch.md's `--fit` root: the tiny Llama (bf16), the f32 Llama of the
/// GGUF fixtures and a FLUX-shaped file.
pub(crate) fn fit_root(dir: &Path) {
    let root = dir.join("root");
    copy_dir(&fixture("tiny-llama"), &root.join("tiny-llama"));
    copy_dir(&fixture("gguf/llm/llama"), &root.join("llama"));
    std::fs::create_dir_all(root.join("flux")).unwrap();
    crate::fit_for::flux(&root.join("flux"));
}
