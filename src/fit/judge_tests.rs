//! Fit on synthetic checkpoints, with every expected figure worked out by
//! hand in the comments.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::*;
use crate::fit::loader::DEFAULT_BASELINE;
use crate::fit::machine::{Detected, Given, MemoryStatus};
use crate::format::{DataRef, Format, Layout, SourceFile, Tensor};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// A small llama in F16, sizes chosen to add up by hand:
///
/// | tensor                      | bytes |
/// |-----------------------------|-------|
/// | model.embed_tokens.weight   | 1 GiB |
/// | model.layers.{0..3}.a / .b  | 1 GiB each, so 2 GiB per block |
/// | model.norm.weight           | 4 KiB |
/// | lm_head.weight              | 1 GiB |
///
/// sum(T) = 1 + 4 x 2 + 1 GiB + 4 KiB = 10 GiB + 4 KiB; max(T) = 1 GiB.
/// Two files of 6 GiB + 4 KiB and 4 GiB + 8 KiB (headers included):
/// sum(S) = 10 GiB + 12 KiB; max(S) = 6 GiB + 4 KiB.
fn llama() -> Checkpoint {
    let mut names: Vec<(String, u64)> = vec![("model.embed_tokens.weight".into(), GIB)];
    for l in 0..4 {
        names.push((format!("model.layers.{l}.a.weight"), GIB));
        names.push((format!("model.layers.{l}.b.weight"), GIB));
    }
    names.push(("model.norm.weight".into(), 4 * KIB));
    names.push(("lm_head.weight".into(), GIB));
    let mut offset = 0;
    let tensors = names
        .into_iter()
        .enumerate()
        .map(|(i, (name, len))| {
            let t = Tensor {
                name,
                dtype: Dtype::F16,
                shape: vec![len / 2],
                len,
                file: usize::from(i >= 6),
                data: DataRef::Contiguous { offset },
            };
            offset += len;
            t
        })
        .collect();
    let file = |name: &str, size| SourceFile {
        path: PathBuf::from(name),
        size,
        mtime_ns: 0,
    };
    Checkpoint {
        dir: PathBuf::from("llama"),
        format: Format::Safetensors,
        layout: Layout::Loose,
        prefix: "model".into(),
        files: vec![
            file("a.safetensors", 6 * GIB + 4 * KIB),
            file("b.safetensors", 4 * GIB + 8 * KIB),
        ],
        tensors,
        metadata: BTreeMap::new(),
        findings: Vec::new(),
    }
}

fn windows(ram: u64, pagefile: u64, vram: Option<u64>) -> Machine {
    let given = Given {
        os: Some(Os::Windows),
        ram: Some(ram),
        pagefile: Some(pagefile),
        commit_limit: None,
        vram,
    };
    Machine::resolve(&given, &Detected::default(), Os::Linux)
}

fn options() -> FitOptions {
    FitOptions {
        threads: 4,
        window: 256 * MIB,
        cuda_overhead: 512 * MIB,
        // The load's own arithmetic; the baseline has its own test.
        baseline: 0,
        path: "llama".into(),
        ..FitOptions::default()
    }
}

fn row(s: &Scenario, l: Loader) -> &LoaderFit {
    s.loaders.iter().find(|r| r.loader == l).unwrap()
}

#[test]
fn windows_commit_per_loader_against_ram_plus_pagefile() {
    // Commit limit = 12 GiB RAM + 2 GiB pagefile = 14 GiB. A 16 GiB GPU,
    // so every loader adds the 512 MiB CUDA term and the weights fit VRAM.
    let r = fit(
        &llama(),
        windows(12 * GIB, 2 * GIB, Some(16 * GIB)),
        &options(),
    )
    .unwrap();
    assert_eq!(r.budget.host_bytes, 14 * GIB);
    // (loader, held commit, commit at a shard's open, shortfall): Windows
    // judges the open, where the mapping loaders' header view of max(S)
    // = 6 GiB + 4 KiB comes on top of what they hold.
    let cases = [
        // sum(S) + 26 MiB + cuda = (10 GiB + 12 KiB) + 538 MiB; + max(S)
        // at the last open: 2.5 GiB + 26 MiB + 16 KiB short.
        (
            Loader::TransformersV5Mmap,
            10 * GIB + 538 * MIB + 12 * KIB,
            16 * GIB + 538 * MIB + 16 * KIB,
            2 * GIB + 538 * MIB + 16 * KIB,
        ),
        // 26 MiB + 4 threads x (24 MiB + one 1 GiB tensor staged) + cuda,
        // no view: fits.
        (
            Loader::TransformersV5Pread,
            4 * GIB + 634 * MIB,
            4 * GIB + 634 * MIB,
            0,
        ),
        // max(S) + 8 MiB + cuda; + max(S) at the open = 12.5 GiB + 8 MiB
        // + 8 KiB: fits.
        (
            Loader::PerShardMmap,
            6 * GIB + 520 * MIB + 4 * KIB,
            12 * GIB + 520 * MIB + 8 * KIB,
            0,
        ),
        // one shard read whole + cuda = 6.5 GiB + 4 KiB, no view: fits.
        (
            Loader::FullRead,
            6 * GIB + 512 * MIB + 4 * KIB,
            6 * GIB + 512 * MIB + 4 * KIB,
            0,
        ),
        // every shard mapped + cuda; + max(S) at the open: 2.5 GiB + 16 KiB short.
        (
            Loader::Diffusers,
            10 * GIB + 512 * MIB + 12 * KIB,
            16 * GIB + 512 * MIB + 16 * KIB,
            2 * GIB + 512 * MIB + 16 * KIB,
        ),
        // min(256 MiB, 1 GiB) + cuda = 768 MiB: fits.
        (Loader::Reshard, 768 * MIB, 768 * MIB, 0),
    ];
    for (loader, commit, open, short) in cases {
        let got = row(&r.today, loader);
        assert_eq!(
            (
                got.peak_commit,
                got.open_commit,
                got.host_shortfall,
                got.fits
            ),
            (commit, open, short, short == 0),
            "{loader}"
        );
        assert_eq!(got.host_needed, open, "{loader}: Windows judges the open");
        assert_eq!(got.vram, 10 * GIB + 4 * KIB, "{loader}: VRAM is sum(T)");
    }
    assert!(!r.fits);
    let v = r.today.vram.as_ref().unwrap();
    assert_eq!(
        (v.needed, v.spill, v.blocks_total, v.leading_blocks_fit),
        (10 * GIB + 4 * KIB, 0, 4, 4)
    );
}

#[test]
fn short_vram_spills_and_counts_leading_blocks() {
    // 8 GiB of VRAM. Forward order: embed (1 GiB), then the blocks end at
    // 3, 5, 7 and 9 GiB; three end within 8 GiB. Spill = 10 GiB + 4 KiB - 8 GiB.
    let r = fit(&llama(), windows(64 * GIB, 0, Some(8 * GIB)), &options()).unwrap();
    let v = r.today.vram.as_ref().unwrap();
    assert_eq!(
        (v.spill, v.leading_blocks_fit, v.blocks_total),
        (2 * GIB + 4 * KIB, 3, 4)
    );
    for l in &r.today.loaders {
        assert_eq!(l.vram_shortfall, 2 * GIB + 4 * KIB, "{}", l.loader);
        assert!(!l.fits);
    }
}

#[test]
fn linux_checks_private_rss_against_available_ram() {
    // 8 GiB available, no GPU: the weights stay on the host.
    let given = Given {
        os: Some(Os::Linux),
        ram: Some(8 * GIB),
        ..Given::default()
    };
    let m = Machine::resolve(&given, &Detected::default(), Os::Linux);
    let r = fit(&llama(), m, &options()).unwrap();
    assert_eq!(r.budget.host_kind, HostBudgetKind::AvailableRam);
    // (loader, private, file-backed)
    let cases = [
        // all shards mapped and only read: page cache; 26 MiB of its own.
        (Loader::TransformersV5Mmap, 26 * MIB, 10 * GIB + 12 * KIB),
        // sum(T) + 26 MiB + 4 threads x 24 MiB; no shard mapped.
        (
            Loader::TransformersV5Pread,
            10 * GIB + 122 * MIB + 4 * KIB,
            0,
        ),
        // sum(T) + 8 MiB on the host; one shard mapped.
        (
            Loader::PerShardMmap,
            10 * GIB + 8 * MIB + 4 * KIB,
            6 * GIB + 4 * KIB,
        ),
        // sum(T) + the largest shard's bytes.
        (Loader::FullRead, 16 * GIB + 8 * KIB, 0),
        // 256 MiB staging + one shard on the CPU stand-in (max(S)).
        (Loader::Reshard, 256 * MIB + 6 * GIB + 4 * KIB, 0),
    ];
    for (loader, private, file) in cases {
        let got = row(&r.today, loader);
        assert_eq!(
            (got.peak_rss_private, got.peak_rss_file),
            (private, file),
            "{loader}"
        );
        assert_eq!(got.fits, private <= 8 * GIB, "{loader}");
    }
    // Mapped pages past available RAM are re-read from disk, not a failure.
    assert!(row(&r.today, Loader::TransformersV5Mmap).pages_from_disk);
    assert!(r.today.vram.is_none());
}

#[test]
fn strict_overcommit_also_checks_commit() {
    let detected = Detected {
        memory: MemoryStatus {
            ram: Some(64 * GIB),
            available: Some(60 * GIB),
            commit_limit: Some(12 * GIB),
            committed: Some(2 * GIB),
            overcommit_memory: Some(2),
            ..MemoryStatus::default()
        },
        vram: None,
    };
    let m = Machine::resolve(
        &Given {
            vram: Some(80 * GIB),
            ..Given::default()
        },
        &detected,
        Os::Linux,
    );
    let r = fit(&llama(), m, &options()).unwrap();
    // Free commit = 12 - 2 = 10 GiB. transformers-v5-mmap commits sum(S) +
    // 26 MiB = 10 GiB + 26 MiB + 12 KiB on Linux (no second view, no CUDA
    // term): 26 MiB + 12 KiB short.
    assert_eq!(r.budget.commit_bytes, Some(10 * GIB));
    let got = row(&r.today, Loader::TransformersV5Mmap);
    assert_eq!(
        (got.peak_commit, got.host_shortfall),
        (10 * GIB + 26 * MIB + 12 * KIB, 26 * MIB + 12 * KIB)
    );
    assert!(row(&r.today, Loader::PerShardMmap).fits);
}

#[test]
fn recommends_the_largest_shards_that_fit_the_most_loaders() {
    // Commit limit 11 GiB, 16 GiB GPU. Today pread (4.6 GiB), full-read
    // (6.5 GiB) and reshard fit; per-shard needs 2 x 6 GiB + 0.5 GiB.
    // The largest candidate is the source's own size, 6 GiB (its largest
    // shard's tensor bytes): repacked in layer order without splitting a
    // block, embed + 2 blocks make 5 GiB, so per-shard fits (2 x 5 GiB +
    // 0.5 GiB + 8 MiB).
    // transformers-v5-mmap and diffusers need at least sum(S) + max(S) +
    // cuda > 11 GiB whatever the shard size.
    let r = fit(&llama(), windows(10 * GIB, GIB, Some(16 * GIB)), &options()).unwrap();
    assert_eq!(
        r.today.fitting_host(),
        [
            Loader::TransformersV5Pread,
            Loader::FullRead,
            Loader::Reshard
        ]
    );
    let rec = r.recommendation.unwrap();
    assert_eq!(rec.max_shard_size_arg, "6GiB");
    assert_eq!(rec.max_shard_size, 6 * GIB);
    assert_eq!(rec.dtype, None);
    assert_eq!(
        rec.command,
        "reshard convert llama OUT --max-shard-size 6GiB"
    );
    assert_eq!(
        rec.still_not_fitting,
        [Loader::TransformersV5Mmap, Loader::Diffusers]
    );
    assert_eq!(
        r.not_helped_by_resharding,
        [Loader::TransformersV5Mmap, Loader::Diffusers]
    );
}

#[test]
fn the_baseline_is_added_to_python_loaders_only() {
    let given = Given {
        os: Some(Os::Linux),
        ram: Some(64 * GIB),
        ..Given::default()
    };
    let m = Machine::resolve(&given, &Detected::default(), Os::Linux);
    let without = fit(&llama(), m.clone(), &options()).unwrap();
    let mut o = options();
    o.baseline = GIB;
    let with = fit(&llama(), m, &o).unwrap();
    assert_eq!(with.params.baseline, GIB);
    for (a, b) in without.today.loaders.iter().zip(&with.today.loaders) {
        let term = if b.loader == Loader::Reshard { 0 } else { GIB };
        assert_eq!(b.baseline, term, "{}", b.loader);
        // The peak is the load's; the baseline is judged on top of it.
        assert_eq!(a.peak_commit, b.peak_commit, "{}", b.loader);
        assert_eq!(b.host_needed, a.host_needed + term, "{}", b.loader);
    }
}

#[test]
fn what_if_scenario_decides_the_verdict() {
    let mut o = options();
    o.loaders = vec![Loader::PerShardMmap];
    o.what_if = Some(PlanOptions {
        max_shard_size: GIB,
        ..PlanOptions::default()
    });
    let r = fit(&llama(), windows(10 * GIB, GIB, Some(16 * GIB)), &o).unwrap();
    // Today the open of the 6 GiB shard, 2 x (6 GiB + 4 KiB) + 8 MiB +
    // 0.5 GiB > 11 GiB; with 1 GiB shards every tensor is alone: held
    // 1 GiB + header + 8 MiB + 0.5 GiB, and twice the shard at its open,
    // 2 x (1 GiB + header) + 8 MiB + 0.5 GiB, fits.
    assert!(!r.today.all_fit());
    let after = r.what_if.as_ref().unwrap();
    assert_eq!(after.max_shard_size, Some(GIB));
    let got = row(after, Loader::PerShardMmap);
    let (peak, open) = (got.peak_commit, got.open_commit);
    assert!(
        peak > GIB + 520 * MIB && peak < GIB + 520 * MIB + 4 * KIB,
        "{peak}"
    );
    assert!(
        open > 2 * GIB + 520 * MIB && open < 2 * GIB + 520 * MIB + 8 * KIB,
        "{open}"
    );
    // Every 1 GiB tensor alone, and the 4 KiB norm alone between two full
    // shards: 1 + 8 + 1 + 1 = 11 shards.
    assert_eq!(after.shard_count, 11);
    assert!(r.fits);
}

#[test]
fn no_commit_limit_is_an_error() {
    let m = Machine::resolve(
        &Given {
            os: Some(Os::Windows),
            ..Given::default()
        },
        &Detected::default(),
        Os::Linux,
    );
    assert!(matches!(
        fit(&llama(), m, &options()),
        Err(FitError::NoCommitLimit)
    ));
}

#[test]
fn vram_walk_counts_whole_blocks_in_forward_order() {
    let tensors = [
        ("lm_head.weight", 10),
        ("model.layers.1.w", 10),
        ("model.layers.0.w", 10),
        ("model.layers.0.v", 10),
        ("model.embed_tokens.weight", 10),
    ];
    // Forward: embed 10, layer 0 ends at 30, layer 1 at 40, head 50.
    let v = vram_fit(&tensors, 39);
    assert_eq!(
        (v.needed, v.spill, v.blocks_total, v.leading_blocks_fit),
        (50, 11, 2, 1)
    );
    assert_eq!(vram_fit(&tensors, 40).leading_blocks_fit, 2);
    assert_eq!(vram_fit(&tensors, 9).leading_blocks_fit, 0);
}

/// A GGUF llama, by hand:
///
/// | tensor               | type | elements | bytes  |
/// |----------------------|------|----------|--------|
/// | token_embd.weight    | Q8_0 | 64 Mi    | 68 MiB |
/// | blk.{0,1}.attn.weight| Q4_K | 128 Mi   | 72 MiB each |
/// | output_norm.weight   | F32  | 1 Ki     | 4 KiB  |
///
/// sum(T) = 212 MiB + 4 KiB; no `output.weight` (tied) unless `untied`,
/// which adds a 68 MiB Q8_0 `output.weight`. One file of sum(T) + 1 MiB.
fn gguf(untied: bool) -> Checkpoint {
    use crate::format::gguf::ggml::GgmlType;
    let q8 = |name: &str, n: u64| (name.to_string(), n, n / 32 * 34, Some(GgmlType::Q8_0));
    let mut rows = vec![
        q8("token_embd.weight", 64 << 20),
        (
            "blk.0.attn.weight".into(),
            128 << 20,
            72 * MIB,
            Some(GgmlType::Q4_K),
        ),
        (
            "blk.1.attn.weight".into(),
            128 << 20,
            72 * MIB,
            Some(GgmlType::Q4_K),
        ),
        ("output_norm.weight".into(), 1024, 4 * KIB, None),
    ];
    if untied {
        rows.push(q8("output.weight", 64 << 20));
    }
    let mut offset = 0;
    let tensors: Vec<Tensor> = rows
        .into_iter()
        .map(|(name, n, len, ty)| {
            let t = Tensor {
                name,
                dtype: if ty.is_some() { Dtype::U8 } else { Dtype::F32 },
                shape: vec![n / 1024, 1024],
                len,
                file: 0,
                data: match ty {
                    Some(ggml_type) => DataRef::Blocks { offset, ggml_type },
                    None => DataRef::Contiguous { offset },
                },
            };
            offset += len;
            t
        })
        .collect();
    Checkpoint {
        dir: PathBuf::from("model.gguf"),
        format: Format::Gguf,
        layout: Layout::Single,
        prefix: "model".into(),
        files: vec![SourceFile {
            path: PathBuf::from("model.gguf"),
            size: offset + MIB,
            mtime_ns: 0,
        }],
        tensors,
        metadata: BTreeMap::new(),
        findings: Vec::new(),
    }
}

fn judged(s: &Scenario) -> Vec<Loader> {
    s.loaders.iter().map(|l| l.loader).collect()
}

#[test]
fn a_gguf_is_judged_by_the_gguf_loaders_only() {
    let r = fit(
        &gguf(true),
        windows(8 * GIB, GIB, Some(16 * GIB)),
        &options(),
    )
    .unwrap();
    assert_eq!(r.today.format, Format::Gguf);
    assert_eq!(
        judged(&r.today),
        [Loader::LlamaCpp, Loader::ComfyuiGguf, Loader::Reshard]
    );
    let out: Vec<Loader> = r.today.not_applicable.iter().map(|n| n.loader).collect();
    assert_eq!(
        out,
        [
            Loader::TransformersV5Mmap,
            Loader::TransformersV5Pread,
            Loader::PerShardMmap,
            Loader::FullRead,
            Loader::Diffusers
        ]
    );
    // Left out of the default set, they do not decide the verdict.
    assert!(r.fits);
    // Untied: the input layer (token_embd, 68 MiB) stays on the CPU, the
    // rest goes to VRAM: 212 MiB + 4 KiB + 68 MiB (output) - 68 MiB.
    let llama = row(&r.today, Loader::LlamaCpp);
    assert_eq!(llama.vram, 212 * MIB + 4 * KIB);
    // Read-only mappings: only the CUDA term is charged on Windows.
    assert_eq!(
        (llama.peak_commit, llama.baseline, llama.offloaded),
        (512 * MIB, 0, 0)
    );
    // ComfyUI: all quantized bytes plus the largest weight (128 Mi
    // elements) in f16.
    let comfy = row(&r.today, Loader::ComfyuiGguf);
    assert_eq!(comfy.vram, 280 * MIB + 4 * KIB + 256 * MIB);
    assert_eq!(comfy.peak_commit, 512 * MIB);
}

#[test]
fn a_tied_token_embd_goes_to_the_gpu_as_the_output() {
    let r = fit(
        &gguf(false),
        windows(8 * GIB, GIB, Some(16 * GIB)),
        &options(),
    )
    .unwrap();
    assert_eq!(r.today.sizes.input_layer, 0);
    assert_eq!(r.today.sizes.quantized_elements_max, 128 << 20);
    assert_eq!(
        row(&r.today, Loader::LlamaCpp).vram,
        r.today.sizes.tensor_sum
    );
}

#[test]
fn short_vram_keeps_the_rest_on_the_host_for_the_gguf_loaders() {
    // 100 MiB of VRAM on Linux.
    let given = Given {
        os: Some(Os::Linux),
        ram: Some(8 * GIB),
        vram: Some(100 * MIB),
        ..Given::default()
    };
    let m = Machine::resolve(&given, &Detected::default(), Os::Linux);
    let r = fit(&gguf(true), m, &options()).unwrap();
    let llama = row(&r.today, Loader::LlamaCpp);
    assert_eq!((llama.vram, llama.vram_shortfall), (100 * MIB, 0));
    assert_eq!(llama.offloaded, 112 * MIB + 4 * KIB);
    assert_eq!(llama.peak_rss_private, 0, "the rest stays in the mapping");
    assert!(llama.fits);
    let comfy = row(&r.today, Loader::ComfyuiGguf);
    let rest = 280 * MIB + 4 * KIB + 256 * MIB - 100 * MIB;
    assert_eq!((comfy.offloaded, comfy.peak_rss_private), (rest, rest));
    assert!(comfy.fits);
    // reshard's row still needs every weight on the device.
    assert!(!row(&r.today, Loader::Reshard).fits);
}

#[test]
fn a_named_loader_that_cannot_read_the_format_fails_the_check() {
    let mut o = options();
    o.loaders = vec![Loader::PerShardMmap, Loader::LlamaCpp];
    let r = fit(&gguf(true), windows(8 * GIB, GIB, None), &o).unwrap();
    assert_eq!(judged(&r.today), [Loader::LlamaCpp]);
    assert!(r.today.all_fit());
    assert!(!r.fits, "per-shard-mmap cannot load a GGUF");
    o.loaders = vec![Loader::LlamaCpp];
    assert!(
        fit(&gguf(true), windows(8 * GIB, GIB, None), &o)
            .unwrap()
            .fits
    );
    // And the GGUF rows do not read safetensors.
    o.loaders = vec![Loader::ComfyuiGguf];
    let r = fit(&llama(), windows(64 * GIB, GIB, None), &o).unwrap();
    assert!(r.today.loaders.is_empty());
    assert!(!r.fits);
}

#[test]
fn the_default_set_leaves_the_gguf_loaders_out_of_a_safetensors_fit() {
    let r = fit(
        &llama(),
        windows(12 * GIB, 2 * GIB, Some(16 * GIB)),
        &options(),
    )
    .unwrap();
    assert!(!judged(&r.today).contains(&Loader::LlamaCpp));
    assert!(!judged(&r.today).contains(&Loader::ComfyuiGguf));
    assert_eq!(r.today.not_applicable.len(), 2);
}

#[test]
fn no_conversion_is_recommended_for_a_gguf() {
    // 1 GiB of commit on Windows without a GPU: comfyui-gguf's 512 MiB f32
    // dequantization plus its 976 MiB baseline do not fit; convert writes
    // safetensors, which it cannot read, so nothing is recommended.
    let mut o = options();
    o.baseline = DEFAULT_BASELINE;
    let r = fit(&gguf(true), windows(GIB, 0, None), &o).unwrap();
    let comfy = row(&r.today, Loader::ComfyuiGguf);
    assert_eq!(comfy.peak_commit, 512 * MIB);
    assert!(comfy.host_shortfall > 0);
    assert!(r.recommendation.is_none());
    assert_eq!(r.not_helped_by_resharding, [Loader::ComfyuiGguf]);
}

#[test]
fn a_gguf_what_if_is_judged_by_the_loaders_of_what_convert_writes() {
    let mut o = options();
    o.what_if = Some(PlanOptions {
        dtype: Some(Dtype::BF16),
        ..PlanOptions::default()
    });
    // The plan reads the GGUF's header: a real file.
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf/kinds.gguf");
    let ck = crate::format::open(&path).unwrap();
    let r = fit(&ck, windows(64 * GIB, GIB, None), &o).unwrap();
    assert_eq!(r.today.format, Format::Gguf);
    let w = r.what_if.as_ref().unwrap();
    assert_eq!(w.format, Format::Safetensors);
    assert!(judged(w).contains(&Loader::TransformersV5Pread));
    assert!(!judged(w).contains(&Loader::LlamaCpp));
    let out: Vec<Loader> = w.not_applicable.iter().map(|n| n.loader).collect();
    assert_eq!(out, [Loader::LlamaCpp, Loader::ComfyuiGguf]);
    // The default set: judged on what convert writes, it fits.
    assert!(r.fits);
}

#[test]
fn candidates_start_at_the_sources_own_shard_size_and_go_down_to_16_mib() {
    // llama(): its first file holds 6 GiB of tensors.
    let sizes = candidate_sizes(&llama());
    let args: Vec<&str> = sizes.iter().map(|s| s.1.as_str()).collect();
    assert_eq!(
        args,
        ["6GiB", "5GB", "2GiB", "1GiB", "512MiB", "256MiB", "128MiB", "64MiB", "32MiB", "16MiB"]
    );
    assert!(sizes.windows(2).all(|w| w[0].0 > w[1].0));
    assert_eq!(size_arg(64 * MIB), "64MiB");
    assert_eq!(size_arg(5_000_000_000), "5GB");
    assert_eq!(size_arg(1234), "1234B");
}

#[test]
fn a_what_if_that_merges_shards_is_not_what_is_recommended() {
    // Per-shard needs 2 x 6 GiB + 0.5 GiB today. The what-if asks for
    // 6.5 GiB shards: repacked by whole blocks they are at most 5 GiB, as
    // with the source's own 6 GiB, so both make the same loaders fit; the
    // larger what-if must not win on its size.
    let mut o = options();
    o.what_if = Some(PlanOptions {
        max_shard_size: 6 * GIB + GIB / 2,
        ..PlanOptions::default()
    });
    let r = fit(&llama(), windows(10 * GIB, GIB, Some(16 * GIB)), &o).unwrap();
    let rec = r.recommendation.unwrap();
    let asked = r.what_if.as_ref().unwrap();
    assert_eq!(asked.fitting_host(), rec.fits, "the same loaders fit");
    assert!(rec.max_shard_size <= 6 * GIB, "{rec:?}");
    assert_eq!(rec.max_shard_size_arg, "6GiB");
}
