//! `fit --for PROGRAM` on a FLUX.1-dev-shaped single file (real names and
//! dims, 23.7 GB of bf16 as a sparse file: only the header is written), on
//! the 12 GB Windows card of the issue: each program gets the
//! highest-precision form it reads that fits, and the command that
//! writes it.

use std::path::{Path, PathBuf};

use crate::common::*;

/// FLUX.1-dev's transformer header (tests/fixtures/flux1-dev-shapes.json)
/// over a sparse data section.
pub(crate) fn flux(dir: &Path) -> PathBuf {
    let shapes: Vec<(String, Vec<u64>)> =
        serde_json::from_slice(&std::fs::read(fixture("flux1-dev-shapes.json")).unwrap()).unwrap();
    let mut header = serde_json::Map::new();
    let mut offset = 0u64;
    for (name, shape) in shapes {
        let len = shape.iter().product::<u64>() * 2;
        header.insert(
            name,
            serde_json::json!({"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + len]}),
        );
        offset += len;
    }
    let path = dir.join("flux1-dev.safetensors");
    let mut json = serde_json::to_vec(&header).unwrap();
    while !json.len().is_multiple_of(8) {
        json.push(b' ');
    }
    let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
    bytes.extend(&json);
    std::fs::write(&path, &bytes).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(bytes.len() as u64 + offset).unwrap();
    path
}

const WINDOWS_12G: [&str; 8] = [
    "--os",
    "windows",
    "--ram",
    "32GiB",
    "--pagefile",
    "8GiB",
    "--vram",
    "12GiB",
];

fn plan(path: &Path, program: &str, machine: &[&str]) -> (i32, serde_json::Value) {
    let out = reshard()
        .arg("fit")
        .arg(path)
        .args(["--for", program, "--json"])
        .args(machine)
        .output()
        .unwrap();
    let json = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}", String::from_utf8_lossy(&out.stderr));
    });
    (out.status.code().unwrap(), json)
}

fn best(r: &serde_json::Value) -> (&str, &str, Option<&str>) {
    let c = r["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["fits"] == true)
        .unwrap();
    (
        c["form"].as_str().unwrap(),
        c["placement"]["kind"].as_str().unwrap(),
        c["command"].as_str(),
    )
}

#[test]
fn each_program_gets_the_best_form_it_reads_that_fits() {
    let dir = tempfile::tempdir().unwrap();
    let src = flux(dir.path());
    // ComfyUI reads no GGUF and offloads: 16-bit does not fit the host
    // with 13 GiB offloaded, scaled FP8 (the first 8-bit form of its list)
    // does, with 39 of 58 blocks on the GPU.
    let (code, r) = plan(&src, "comfyui", &WINDOWS_12G);
    assert_eq!(code, 0);
    let (form, placement, cmd) = best(&r);
    assert_eq!((form, placement), ("fp8-scaled", "offload"), "{r}");
    assert!(cmd
        .unwrap()
        .ends_with("OUT.safetensors --quantize fp8-scaled"));
    // ComfyUI-GGUF: Q6_K (9.07 GiB) fits the 9.17 GiB weight budget
    // whole, and all-on-the-GPU beats the 8-bit forms that offload.
    let (_, r) = plan(&src, "comfyui-gguf", &WINDOWS_12G);
    let (form, placement, cmd) = best(&r);
    assert_eq!((form, placement), ("q6_k", "gpu"), "{r}");
    assert!(cmd.unwrap().ends_with("OUT.gguf --quantize q6_k"));
    // InvokeAI keeps whole models on the GPU: Q8_0 (11.75 GiB) is over its
    // 11 GiB, the Q8_0 FLUX that runs out of memory there while ComfyUI
    // runs it; scaled FP8 counts as the bf16 it folds into.
    let (_, r) = plan(&src, "invokeai", &WINDOWS_12G);
    assert_eq!(best(&r).0, "q6_k", "{r}");
    let row = |form: &str| {
        r["candidates"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["form"] == form)
            .unwrap()
            .clone()
    };
    assert_eq!(row("q8_0")["placement"]["kind"], "too_big_for_vram");
    assert_eq!(
        row("fp8-scaled")["vram_weights"],
        row("as-is")["vram_weights"]
    );
}

#[test]
fn nothing_fitting_exits_1_and_names_the_smallest_machine() {
    let dir = tempfile::tempdir().unwrap();
    let src = flux(dir.path());
    let machine = ["--os", "linux", "--ram", "64GiB", "--vram", "4GiB"];
    let (code, r) = plan(&src, "vllm", &machine);
    assert_eq!(code, 1, "{r}");
    assert!(r["smallest_machine"]["vram"].as_u64().unwrap() > 12 << 30);
    let out = reshard()
        .arg("fit")
        .arg(&src)
        .args(["--for", "vllm"])
        .args(machine)
        .assert()
        .code(1);
    let text = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
    assert!(
        text.contains("nothing vllm reads fits this machine"),
        "{text}"
    );
    assert!(text.contains("of dedicated VRAM"), "{text}");
}

#[test]
fn an_unknown_program_lists_the_known_ones() {
    let out = reshard()
        .args(["fit", "x.safetensors", "--for", "a1111"])
        .assert()
        .code(2);
    let err = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
    assert!(
        err.contains("comfyui-gguf") && err.contains("llama.cpp"),
        "{err}"
    );
}

#[test]
fn device_map_places_the_leading_blocks_on_the_gpu_and_refuses_to_overwrite() {
    let dir = tempfile::tempdir().unwrap();
    let src = flux(dir.path());
    let machine = ["--os", "linux", "--ram", "64GiB", "--vram", "12GiB"];
    let (_, r) = plan(&src, "transformers", &machine);
    let best = r["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["fits"] == true)
        .unwrap();
    assert_eq!(best["placement"]["kind"], "offload", "{r}");
    let on_gpu = best["placement"]["blocks_on_gpu"].as_u64().unwrap();
    let total = best["placement"]["blocks"].as_u64().unwrap();
    assert!(on_gpu > 0 && on_gpu < total);
    let file = dir.path().join("device_map.json");
    reshard()
        .arg("fit")
        .arg(&src)
        .args(["--for", "transformers", "--device-map"])
        .arg(&file)
        .args(machine)
        .assert()
        .success();
    let map: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    let blocks_on_gpu = map
        .iter()
        .filter(|(k, v)| k.contains("_blocks.") && **v == 0)
        .count() as u64;
    assert_eq!(blocks_on_gpu, on_gpu);
    // The layer order `convert --order forward` writes: double blocks
    // before single blocks, the rest of the model after the last block.
    assert_eq!(map["double_blocks.0"], 0);
    assert_eq!(map["single_blocks.37"], "cpu");
    assert_eq!(map["final_layer.linear"], "cpu");
    // Every module of the checkpoint is placed.
    assert_eq!(map.len(), 7 + 19 + 38);
    // An existing file is the user's: refused, unchanged.
    std::fs::write(&file, "mine").unwrap();
    reshard()
        .arg("fit")
        .arg(&src)
        .args(["--for", "transformers", "--device-map"])
        .arg(&file)
        .args(machine)
        .assert()
        .code(2);
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "mine");
}

/// A small FLUX-named bf16 model with real values: four double blocks of
/// five Linear kinds, each with its own distribution and a scale that
/// grows with the block (Gaussian q/k/v, uniform projections, a Laplace
/// MLP input, an MLP output with 0.5% outliers twenty times its spread,
/// text q/k/v of tiny values below plain FP8's normal range), norms, and
/// the input and output layers. 4.0 million weights.
fn varied_flux(path: &Path) {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut uniform = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        ((state >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    let gauss = move |u: &mut dyn FnMut() -> f64| {
        (-2.0 * u().ln()).sqrt() * (std::f64::consts::TAU * u()).cos()
    };
    let mut header = serde_json::Map::new();
    let mut data: Vec<u8> = Vec::new();
    let mut tensor = |name: String, shape: Vec<u64>, value: &mut dyn FnMut() -> f64| {
        let start = data.len();
        for _ in 0..shape.iter().product::<u64>() {
            let bits = (value() as f32).to_bits();
            let bf16 = ((bits + 0x7fff + ((bits >> 16) & 1)) >> 16) as u16;
            data.extend_from_slice(&bf16.to_le_bytes());
        }
        header.insert(
            name,
            serde_json::json!({"dtype": "BF16", "shape": shape, "data_offsets": [start, data.len()]}),
        );
    };
    tensor("img_in.weight".into(), vec![256, 64], &mut || {
        0.05 * gauss(&mut uniform)
    });
    for b in 0..4u64 {
        let s = 1.0 + b as f64;
        let p = |n: &str| format!("double_blocks.{b}.{n}");
        tensor(p("img_attn.qkv.weight"), vec![768, 256], &mut || {
            0.02 * s * gauss(&mut uniform)
        });
        tensor(p("img_attn.proj.weight"), vec![256, 256], &mut || {
            0.05 * s * (2.0 * uniform() - 1.0)
        });
        tensor(p("img_mlp.0.weight"), vec![1024, 256], &mut || {
            let sign = if uniform() < 0.5 { -1.0 } else { 1.0 };
            0.03 * s * sign * uniform().ln()
        });
        tensor(p("img_mlp.2.weight"), vec![256, 1024], &mut || {
            let outlier = if uniform() < 0.005 { 20.0 } else { 1.0 };
            0.01 * s * outlier * gauss(&mut uniform)
        });
        tensor(p("txt_attn.qkv.weight"), vec![768, 256], &mut || {
            1e-3 * s * gauss(&mut uniform)
        });
        tensor(p("img_attn.norm.query_norm.scale"), vec![128], &mut || 1.0);
    }
    tensor(
        "final_layer.linear.weight".into(),
        vec![64, 256],
        &mut || 0.02 * gauss(&mut uniform),
    );
    write_safetensors(path, &serde_json::Value::Object(header), &data);
}

/// The relative RMS of a quality report's totals (JSON).
fn relative_rms(quality: &serde_json::Value) -> f64 {
    let total = &quality["total"];
    let (e, x) = (
        total["sum_sq_error"].as_f64(),
        total["sum_sq_source"].as_f64(),
    );
    (e.unwrap() / x.unwrap()).sqrt()
}

/// `validate OUT --against SRC --json`'s quality report: the error of the
/// whole converted checkpoint.
fn whole_error(out: &Path, src: &Path) -> f64 {
    let o = reshard()
        .arg("validate")
        .arg(out)
        .arg("--against")
        .arg(src)
        .args(["--json", "--no-progress"])
        .output()
        .unwrap();
    let r: serde_json::Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stderr)));
    relative_rms(&r["against"]["quality"])
}

#[test]
fn the_sampled_error_estimate_is_within_20_percent_of_the_whole_conversion() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("flux-small.safetensors");
    varied_flux(&src);
    let machine = ["--os", "linux", "--ram", "64GiB", "--vram", "24GiB"];
    let (_, r) = plan(&src, "comfyui-gguf", &machine);
    let candidate = |form: &str| {
        r["candidates"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["form"] == form)
            .unwrap_or_else(|| panic!("no {form}: {r}"))
            .clone()
    };
    for (form, out) in [
        ("fp8-scaled", "out-fp8.safetensors"),
        ("q8_0", "out-q8_0.gguf"),
        ("q4_k", "out-q4_k.gguf"),
    ] {
        let c = candidate(form);
        let sampled = c["sampled_fraction"].as_f64().unwrap();
        assert!(sampled > 0.0 && sampled < 0.10, "{form}: {c}");
        let estimate = c["error_estimate"].as_f64().unwrap();
        let out = dir.path().join(out);
        convert(&src, &out, &["-q", "--quantize", form]).success();
        let whole = whole_error(&out, &src);
        assert!(
            (estimate / whole - 1.0).abs() < 0.20,
            "{form}: estimate {estimate} on {sampled} of the weights, whole {whole}"
        );
    }
    // Plain FP8 loses the tiny text q/k/v values (below E4M3's smallest
    // normal without a scale): the estimate says so, and scaled FP8, of
    // the same width, ranks above it.
    let plain = candidate("fp8")["error_estimate"].as_f64().unwrap();
    let scaled = candidate("fp8-scaled")["error_estimate"].as_f64().unwrap();
    assert!(plain > scaled, "{plain} {scaled}");
    let order: Vec<&str> = r["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["form"].as_str().unwrap())
        .collect();
    let at = |f: &str| order.iter().position(|o| *o == f).unwrap();
    assert!(at("fp8-scaled") < at("fp8"), "{order:?}");
    // Q4_K's error is below Q4_0's on the same weights: it ranks first.
    let q4k = candidate("q4_k")["error_estimate"].as_f64().unwrap();
    let q40 = candidate("q4_0")["error_estimate"].as_f64().unwrap();
    assert!(
        q4k < q40 && at("q4_k") < at("q4_0"),
        "{q4k} {q40} {order:?}"
    );
    // The text shows the column.
    let out = reshard()
        .arg("fit")
        .arg(&src)
        .args(["--for", "comfyui-gguf"])
        .args(machine)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(text.contains(" error ") && text.contains('%'), "{text}");
    assert!(text.contains("relative RMS estimated on at most"), "{text}");
}

/// `--loader` with `--for` narrows the program's rows (issue 29 item 5):
/// transformers on Windows is judged by the pread backend of 5.17 on, and
/// `--loader transformers-v5-mmap` judges 5.4-5.16, which map every shard;
/// a loader that is none of the program's rows is a usage error, exit 2,
/// naming the loader and the program's rows (`fit` and `convert --fit`).
#[test]
fn loader_narrows_the_programs_rows() {
    let dir = tempfile::tempdir().unwrap();
    let src = flux(dir.path());
    let rows = |r: &serde_json::Value| -> Vec<String> {
        r["candidates"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["host"]["loader"].as_str().unwrap().to_string())
            .collect()
    };
    let (_, r) = plan(&src, "transformers", &WINDOWS_12G);
    let default_rows = rows(&r);
    assert!(!default_rows.is_empty());
    assert!(
        default_rows.iter().all(|l| l == "transformers-v5-pread"),
        "{r}"
    );
    let mut narrowed = WINDOWS_12G.to_vec();
    narrowed.extend(["--loader", "transformers-v5-mmap"]);
    let (_, r) = plan(&src, "transformers", &narrowed);
    let mmap_rows = rows(&r);
    assert_eq!(mmap_rows.len(), default_rows.len(), "{r}");
    assert!(mmap_rows.iter().all(|l| l == "transformers-v5-mmap"), "{r}");
    // A loader that is none of the program's rows is a usage error (it
    // once left every form refused, exit 1 as if nothing fitted).
    for cmd in ["fit", "convert"] {
        let mut c = reshard();
        c.arg(cmd).arg(&src);
        if cmd == "convert" {
            c.arg(dir.path().join("out")).arg("--fit");
        }
        let out = c
            .args(["--for", "comfyui", "--loader", "llama.cpp"])
            .args(WINDOWS_12G)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{cmd}: {err}");
        assert!(
            err.contains("--loader llama.cpp names none of comfyui's rows (per-shard-mmap)"),
            "{cmd}: {err}"
        );
        assert!(!dir.path().join("out").exists());
    }
}

/// A GGUF holding a tensor type reshard cannot decode (IQ2_XXS), for a
/// program that needs it dequantized: no form can be planned, which is the
/// input's fault: exit 2 naming the file and the tensor (it was exit 1,
/// "nothing fits"). A program that reads it as it is still plans it.
#[test]
fn a_gguf_type_reshard_cannot_decode_is_an_input_error_not_nothing_fits() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("iq.gguf");
    let string = |b: &mut Vec<u8>, s: &str| {
        b.extend((s.len() as u64).to_le_bytes());
        b.extend(s.as_bytes());
    };
    // GGUF v3: one key, a 256x4 IQ2_XXS tensor (66 bytes a 256-block) and
    // a 256-value f32 norm.
    let tensors: [(&str, &[u64], u32, usize); 2] = [
        ("blk.0.attn_q.weight", &[256, 4], 16, 66 * 4),
        ("output_norm.weight", &[256], 0, 1024),
    ];
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend((tensors.len() as u64).to_le_bytes());
    b.extend(1u64.to_le_bytes());
    string(&mut b, "general.architecture");
    b.extend(8u32.to_le_bytes());
    string(&mut b, "llama");
    let mut data = Vec::new();
    for (name, ne, ty, len) in tensors {
        string(&mut b, name);
        b.extend((ne.len() as u32).to_le_bytes());
        for d in ne {
            b.extend(d.to_le_bytes());
        }
        b.extend(ty.to_le_bytes());
        b.extend((data.len() as u64).to_le_bytes());
        data.extend(std::iter::repeat_n(1u8, len));
        data.resize(data.len().next_multiple_of(32), 0);
    }
    b.resize(b.len().next_multiple_of(32), 0);
    b.extend(data);
    std::fs::write(&path, b).unwrap();
    let machine = ["--os", "linux", "--ram", "16GiB", "--vram", "1GiB"];
    let out = reshard()
        .arg("fit")
        .arg(&path)
        .args(["--for", "transformers"])
        .args(machine)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(
            "iq.gguf: tensor \"blk.0.attn_q.weight\" is IQ2_XXS, which reshard cannot dequantize"
        ),
        "{err}"
    );
    assert!(
        err.contains("no form transformers reads can be planned"),
        "{err}"
    );
    let (code, r) = plan(&path, "comfyui-gguf", &machine);
    assert_eq!(code, 0, "{r}");
    assert_eq!(best(&r).0, "as-is");
}

/// What `--device-map FILE` writes loads in transformers (issue 29: "the
/// device-map JSON loads with transformers on the CPU, the GPU index
/// replaced by `cpu`, with every tensor placed"): accelerate's own
/// `check_device_map` finds no parameter without a device, every key is a
/// module of the model, the load succeeds and its logits are the
/// checkpoint's. A 300 KiB card splits the tiny Llama's 2 blocks, so the
/// map has both a GPU and a CPU part.
#[test]
fn the_device_map_loads_in_transformers_with_every_tensor_placed() {
    let Some(python) = python_with("torch, transformers, accelerate") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let map = dir.path().join("device_map.json");
    let model = fixture("tiny-llama");
    reshard()
        .arg("fit")
        .arg(&model)
        .args(["--for", "transformers", "--os", "linux", "--ram", "16GiB"])
        .args(["--vram", "300KiB", "--reserve", "0", "--device-map"])
        .arg(&map)
        .assert()
        .success();
    let written: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&std::fs::read(&map).unwrap()).unwrap();
    assert!(written.values().any(|v| v == 0), "{written:?}");
    assert!(written.values().any(|v| v == "cpu"), "{written:?}");
    let code = r#"
import json, sys, torch
from accelerate.utils import check_device_map
from transformers import AutoModelForCausalLM
model_dir, map_file = sys.argv[1], sys.argv[2]
dm = {k: ("cpu" if v == 0 else v) for k, v in json.load(open(map_file)).items()}
ref = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
modules = dict(ref.named_modules())
unknown = [k for k in dm if k not in modules]
assert not unknown, f"not modules of the model: {unknown}"
check_device_map(ref, dm)
m = AutoModelForCausalLM.from_pretrained(model_dir, device_map=dm, dtype=torch.float32)
off = [n for n, p in list(m.named_parameters()) + list(m.named_buffers()) if p.device.type != "cpu"]
assert not off, f"not placed: {off}"
ids = torch.tensor([[1, 2, 3, 4, 5]])
with torch.no_grad():
    d = (m(ids).logits - ref(ids).logits).abs().max().item()
assert d == 0.0, d
print("ok")
"#;
    let out = run_python(
        &python,
        Program::Code(code),
        &[model.as_os_str(), map.as_os_str()],
    );
    assert!(out.contains("ok"), "{out}");
}

/// The error column (issue 29 review): NaN weights in the sample are said
/// (a `*` and a line naming the count; `sample_not_finite` in --json), and
/// a form that writes finite weights as infinities (Q4_0 of weights near
/// 1e6: its f16 block scale overflows) reads "overflow", never "n/a",
/// which means only a sample of zeros.
#[test]
fn the_error_column_says_nan_and_overflow_and_keeps_n_a_for_zeros() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("llama");
    copy_dir(&fixture("gguf/llm/llama"), &src);
    let file = src.join("model.safetensors");
    crate::fit_convert::fill_tensors(&file, "q_proj.weight", &1.0e6f32.to_le_bytes());
    crate::fit_convert::fill_tensors(&file, "k_proj.weight", &f32::NAN.to_le_bytes());
    let machine = ["--os", "linux", "--ram", "16GiB", "--vram", "1GiB"];
    let (code, r) = plan(&src, "diffusers", &machine);
    assert_eq!(code, 0, "{r}");
    let form = |name: &str| {
        r["candidates"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["form"] == name)
            .unwrap_or_else(|| panic!("no {name}: {r}"))
            .clone()
    };
    let q8 = form("q8_0");
    assert!(q8["sample_not_finite"].as_u64().unwrap() > 0, "{q8}");
    assert_eq!(q8["sample_overflow"], 0, "{q8}");
    assert!(q8["error_estimate"].as_f64().is_some(), "{q8}");
    let q4 = form("q4_0");
    assert!(q4["sample_overflow"].as_u64().unwrap() > 0, "{q4}");
    let out = reshard()
        .arg("fit")
        .arg(&src)
        .args(["--for", "diffusers"])
        .args(machine)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let row = |name: &str| {
        text.lines()
            .find(|l| l.trim_start()[2..].starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no {name}: {text}"))
            .to_string()
    };
    assert!(row("q4_0").contains(" overflow "), "{text}");
    assert!(row("q8_0").contains("%*"), "{text}");
    assert!(!text.contains("n/a"), "{text}");
    assert!(text.contains("* q8_0: "), "{text}");
    assert!(text.contains("overflow: q4_0: "), "{text}");
}

/// llama.cpp loads a GGUF as it is (it maps the file): a GGUF source gets
/// an "as is" candidate, with `--n-gpu-layers` when VRAM holds only some
/// blocks, and no device_map (a GGUF places layers, not modules). A
/// safetensors source is not offered as is: llama.cpp does not read it.
#[test]
fn llama_cpp_takes_a_gguf_as_it_is_and_not_safetensors() {
    let gguf = fixture("gguf/llm/llama-q8_0.gguf");
    let generous = ["--os", "linux", "--ram", "64GiB", "--vram", "8GiB"];
    let (code, r) = plan(&gguf, "llama.cpp", &generous);
    assert_eq!(code, 0, "{r}");
    assert_eq!(best(&r), ("as-is", "gpu", None));
    // 100 KiB holds the blocks but not the whole 118 KiB of weights.
    let small = [
        "--os",
        "linux",
        "--ram",
        "64GiB",
        "--vram",
        "100KiB",
        "--reserve",
        "0",
    ];
    let out = reshard()
        .arg("fit")
        .arg(&gguf)
        .args(["--for", "llama.cpp"])
        .args(small)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains("best: as-is (first 2 of 2 blocks on the GPU"),
        "{text}"
    );
    assert!(
        text.contains("  nothing to convert: load it as it is\n"),
        "{text}"
    );
    assert!(text.contains("  run it with --n-gpu-layers 2\n"), "{text}");
    let dir = tempfile::tempdir().unwrap();
    let map = dir.path().join("map.json");
    let out = reshard()
        .arg("fit")
        .arg(&gguf)
        .args(["--for", "llama.cpp", "--device-map"])
        .arg(&map)
        .args(small)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("as-is, is a GGUF file"), "{err}");
    assert!(!map.exists());

    let (_, r) = plan(&fixture("tiny-llama"), "llama.cpp", &generous);
    let refused = r["refused"].as_array().unwrap();
    assert!(
        refused
            .iter()
            .any(|f| f["form"] == "as-is"
                && f["reason"] == "llama.cpp does not read Safetensors files"),
        "{refused:?}"
    );
    assert!(r["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .all(|c| c["form"] != "as-is"));
}

/// A program that loads one file (ComfyUI, Forge, InvokeAI) and a
/// diffusers pipeline of two weight sets: `fit --for` refuses it with
/// `convert --fit`'s message and exit status, instead of offering the
/// folder "as is" as if it were one file.
#[test]
fn one_file_programs_refuse_a_pipeline_as_convert_fit_does() {
    let dir = tempfile::tempdir().unwrap();
    let src = crate::layouts::judge::pipeline(dir.path());
    for program in ["comfyui", "forge", "invokeai"] {
        let out = reshard()
            .arg("fit")
            .arg(&src)
            .args(["--for", program, "--os", "linux", "--ram", "64GiB"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{program}: {err}");
        assert!(
            err.contains(&format!("{program} loads one weights file, and this diffusers pipeline (model_index.json) has 2 weight sets (text_encoder, unet)")),
            "{err}"
        );
        assert!(out.stdout.is_empty(), "{program}");
    }
    // diffusers loads the folder: planned as it holds it.
    let (code, r) = plan(&src, "diffusers", &["--os", "linux", "--ram", "64GiB"]);
    assert_eq!(code, 0, "{r}");
    assert_eq!(best(&r).0, "as-is");
}
