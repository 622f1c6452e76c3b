//! "Make it fit" on checkpoints shaped like real ones (headers only: the
//! planner never reads a weight), each case saying why its choice is the
//! highest-precision form that fits.

use std::path::{Path, PathBuf};

use super::*;
use crate::fit::loader::Os;
use crate::fit::machine::{Detected, Given};
use crate::fit::program::program;

const GIB: u64 = 1 << 30;

/// FLUX.1-dev's transformer as one bf16 file: 19 double and 38 single
/// blocks of width 3072 and the input and output layers, 11.9 billion
/// weights, 23.7 GB (the shapes tests/cli/fit_for.rs writes as a file).
fn flux_shapes() -> Vec<(String, Vec<u64>)> {
    serde_json::from_str(include_str!("../../tests/fixtures/flux1-dev-shapes.json")).unwrap()
}

fn flux(dir: &Path) -> Checkpoint {
    open(&sparse(
        dir,
        "flux1-dev.safetensors",
        &flux_shapes(),
        Dtype::BF16,
    ))
}

/// A safetensors file of `shapes` in `dtype` whose data section is a
/// hole: only the header is written, so a 24 GB model costs nothing, and
/// the error estimate's sample is all zeros ("n/a").
fn sparse(dir: &Path, name: &str, shapes: &[(String, Vec<u64>)], dtype: Dtype) -> PathBuf {
    let mut header = serde_json::Map::new();
    let mut offset = 0u64;
    for (name, shape) in shapes {
        let len = shape.iter().product::<u64>() * (dtype.bits() / 8);
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": dtype.name(), "shape": shape, "data_offsets": [offset, offset + len]}),
        );
        offset += len;
    }
    let path = dir.join(name);
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

fn open(path: &Path) -> Checkpoint {
    crate::format::open(path).unwrap()
}

fn machine(os: Os, ram: u64, pagefile: u64, vram: Option<u64>) -> Machine {
    let given = Given {
        os: Some(os),
        ram: Some(ram),
        pagefile: Some(pagefile),
        commit_limit: None,
        vram,
    };
    Machine::resolve(&given, &Detected::default(), Os::Linux)
}

fn plan_for(ck: &Checkpoint, m: Machine, name: &str) -> MakeFit {
    let options = FitOptions {
        path: ck.files[0]
            .path
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into(),
        ..FitOptions::default()
    };
    make_fit(ck, m, &options, program(name).unwrap(), None).unwrap()
}

fn forms(r: &MakeFit) -> Vec<(Form, bool, u8)> {
    r.candidates
        .iter()
        .map(|c| (c.form, c.fits, super::placement_rank(&c.placement)))
        .collect()
}

#[test]
fn flux_on_a_12_gib_windows_card_in_comfyui_offloads_the_bf16_weights() {
    // 23.8 GB of weights against ComfyUI's 0.88 x 12 GiB - 1.4 GiB = 9.2
    // GiB: no form ComfyUI reads (8-bit at best: 11.9 GB) fits VRAM, and it
    // offloads in lowvram mode, so the highest precision whose host side
    // fits wins: the model as it is.
    let dir = tempfile::tempdir().unwrap();
    let r = plan_for(
        &flux(dir.path()),
        machine(Os::Windows, 32 * GIB, 32 * GIB, Some(12 * GIB)),
        "comfyui",
    );
    let best = r.best().unwrap();
    assert!(
        matches!(best.placement, Placement::Offload { .. }),
        "{:?}",
        forms(&r)
    );
    assert_eq!(best.form, Form::AsIs, "{:?}", forms(&r));
    assert!(r.candidates.iter().all(|c| c.placement != Placement::Gpu));
    // Bits per weight: 16 as is; 8 and a little for the FP8 layouts,
    // whose kept input and output layers and norms stay bf16.
    for c in &r.candidates {
        let bits = c.bits_per_weight;
        match c.form {
            Form::AsIs | Form::F16 => assert_eq!(bits, 16.0),
            _ => assert!(bits > 8.0 && bits < 9.0, "{:?} {bits}", c.form),
        }
    }
}

#[test]
fn flux_on_a_12_gib_card_with_comfyui_gguf_takes_the_best_gguf_that_fits_whole() {
    // ComfyUI-GGUF reads GGUF: Q8_0 (8.5 bits, 12.6 GB) is over the
    // 9.85 GB (0.88 x 12 GiB - 1.4 GiB) budget, Q6_K (6.56 bits, 9.74 GB)
    // fits it whole, and a form wholly on the GPU beats any that offloads.
    let dir = tempfile::tempdir().unwrap();
    let r = plan_for(
        &flux(dir.path()),
        machine(Os::Windows, 32 * GIB, 32 * GIB, Some(12 * GIB)),
        "comfyui-gguf",
    );
    let best = r.best().unwrap();
    assert_eq!(best.placement, Placement::Gpu, "{:?}", forms(&r));
    assert_eq!(best.form, Form::Q6K, "{:?}", forms(&r));
    assert!(best.vram_weights < r.vram_budget.unwrap());
    let q8 = r.candidates.iter().find(|c| c.form == Form::Q8_0).unwrap();
    assert!(matches!(q8.placement, Placement::Offload { .. }));
    let cmd = best.command.as_deref().unwrap();
    assert!(cmd.ends_with("OUT.gguf --quantize q6_k"), "{cmd}");
}

#[test]
fn flux_in_invokeai_counts_scaled_fp8_as_the_bf16_it_folds_into() {
    // InvokeAI folds scaled FP8 into bf16 on load and keeps whole models
    // on the GPU: fp8-scaled needs the bf16 23.8 GB of VRAM, so on a 16
    // GiB card (15 GiB for weights) it does not fit, and the best that
    // fits whole is GGUF Q8_0 (8.5 bits, 12.6 GB).
    let dir = tempfile::tempdir().unwrap();
    let r = plan_for(
        &flux(dir.path()),
        machine(Os::Linux, 64 * GIB, 0, Some(16 * GIB)),
        "invokeai",
    );
    let scaled = r
        .candidates
        .iter()
        .find(|c| c.form == Form::Fp8Scaled)
        .unwrap();
    let as_is = r.candidates.iter().find(|c| c.form == Form::AsIs).unwrap();
    assert_eq!(scaled.vram_weights, as_is.vram_weights);
    assert!(matches!(scaled.placement, Placement::TooBigForVram { .. }));
    assert_eq!(r.best().unwrap().form, Form::Q8_0, "{:?}", forms(&r));
}

#[test]
fn when_nothing_fits_the_smallest_machine_is_named() {
    // vLLM neither offloads nor reads a 4-bit form: on a 4 GiB card the
    // smallest it reads (8-bit, 13.0 GB with the kept layers) needs that
    // and the 1 GiB reserve.
    let dir = tempfile::tempdir().unwrap();
    let r = plan_for(
        &flux(dir.path()),
        machine(Os::Linux, 64 * GIB, 0, Some(4 * GIB)),
        "vllm",
    );
    assert!(r.best().is_none(), "{:?}", forms(&r));
    let m = r.smallest_machine.as_ref().unwrap();
    let smallest = r.candidates.iter().map(|c| c.vram_weights).min().unwrap();
    assert_eq!(m.vram, Some(smallest + DEFAULT_RESERVE));
    assert!(matches!(m.form, Form::Fp8Channel | Form::Fp8Block));
}
