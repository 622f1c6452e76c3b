//! Names and headers reshard derives (issue 30): a name made by stripping a
//! component prefix or by a scheme's suffix rule, and a header made by
//! merging the sources' `__metadata__`, pass the reader's rules before
//! anything is written. Each once gave an output neither reshard nor
//! safetensors could open, with exit status 0.

use std::path::Path;
use std::time::Duration;

use serde_json::json;

use super::{assert_refused, convert_out, stderr_of};
use crate::common::*;

/// No safetensors file anywhere under `dir` (or no `dir` at all).
fn no_weights_under(dir: &Path) {
    let written: Vec<_> = super::tree(dir)
        .into_keys()
        .filter(|p| p.to_string_lossy().contains(".safetensors"))
        .collect();
    assert!(written.is_empty(), "wrote {written:?}");
}

/// One F32 scalar per name, back to back.
fn scalars(names: &[&str]) -> (serde_json::Value, Vec<u8>) {
    let mut header = serde_json::Map::new();
    for (i, name) in names.iter().enumerate() {
        header.insert(
            name.to_string(),
            json!({"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]}),
        );
    }
    (header.into(), vec![0; 4 * names.len()])
}

#[test]
fn split_components_never_strips_a_name_to_the_metadata_key() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("aio.safetensors");
    let (header, data) = scalars(&["first_stage_model.__metadata__", "model.diffusion_model.x"]);
    write_safetensors(&src, &header, &data);
    let dst = tmp.path().join("parts");
    let out = convert_out(&src, &dst, &["--split-components"]);
    assert_refused(
        &out,
        "aio.safetensors: tensor \"first_stage_model.__metadata__\"",
    );
    assert!(stderr_of(&out).contains("would be written as \"__metadata__\""));
    no_weights_under(&dst);
}

/// gpt-oss's MXFP4 pair `STEM_blocks` + `STEM_scales`, U8 codes of `dtype`.
fn mxfp4(dir: &Path, stem: &str, dtype: &str) {
    std::fs::create_dir_all(dir).unwrap();
    let mut data: Vec<u8> = (0..32).collect();
    data.extend([127, 127]);
    write_safetensors(
        &dir.join("model.safetensors"),
        &json!({
            format!("{stem}_blocks"): {"dtype": dtype, "shape": [1, 2, 1, 16], "data_offsets": [0, 32]},
            format!("{stem}_scales"): {"dtype": "U8", "shape": [1, 2, 1], "data_offsets": [32, 34]},
        }),
        &data,
    );
    let config = json!({"quantization_config": {"quant_method": "mxfp4"}});
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
}

#[test]
fn mxfp4_blocks_never_become_a_metadata_or_empty_name() {
    let tmp = tempfile::tempdir().unwrap();
    for (stem, dense) in [("__metadata__", "\"__metadata__\""), ("", "\"\"")] {
        let src = tmp.path().join(format!("src{}", stem.len()));
        mxfp4(&src, stem, "U8");
        let dst = tmp.path().join(format!("out{}", stem.len()));
        let out = convert_out(&src, &dst, &["--dtype", "bf16"]);
        assert_refused(
            &out,
            &format!("model.safetensors: tensor \"{stem}_blocks\" would be written as {dense}"),
        );
        no_weights_under(&dst);
        // Resharded as is, the names are the source's and convert works.
        let kept = tmp.path().join(format!("kept{}", stem.len()));
        let out = convert_out(&src, &kept, &[]);
        assert!(out.status.success(), "{}", stderr_of(&out));
    }
}

#[test]
fn mxfp4_blocks_stored_as_i8_are_refused_naming_the_dtype() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    mxfp4(&src, "model.layers.0.mlp.experts.down_proj", "I8");
    let out = convert_out(&src, &tmp.path().join("out"), &["--dtype", "bf16"]);
    assert_refused(
        &out,
        "model.safetensors: quantized weight \"model.layers.0.mlp.experts.down_proj_blocks\" is I8; its codes must be U8",
    );
    assert!(!stderr_of(&out).contains("shape"), "{}", stderr_of(&out));
}

/// Two shards, each with its own 17 MiB `__metadata__` value: each header
/// is within the reader's 32 MiB, their merge is not. convert once wrote a
/// 35.6 MB header (that its own validate refused) at a 290 MB peak RSS;
/// the merge is now refused as it is read.
#[test]
fn merged_metadata_over_the_header_limit_is_refused_before_writing() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    std::fs::create_dir(&src).unwrap();
    let mut weight_map = serde_json::Map::new();
    for (i, (key, tensor)) in [("a", "x.weight"), ("b", "y.weight")].iter().enumerate() {
        let file = format!("model-0000{}-of-00002.safetensors", i + 1);
        let meta = json!({"format": "pt", *key: "v".repeat(17 << 20)});
        write_safetensors(
            &src.join(&file),
            &json!({"__metadata__": meta, *tensor: {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}),
            &[0; 4],
        );
        weight_map.insert(tensor.to_string(), file.into());
    }
    let index = json!({"metadata": {"total_size": 8}, "weight_map": weight_map});
    std::fs::write(src.join("model.safetensors.index.json"), index.to_string()).unwrap();
    let dst = tmp.path().join("out");
    let args = ["convert".as_ref(), src.as_os_str(), dst.as_os_str()];
    let more = ["--no-progress", "--window", "16MiB"].map(std::ffi::OsStr::new);
    let args: Vec<&std::ffi::OsStr> = args.into_iter().chain(more).collect();
    let Some((out, peak_kib)) = run_measured(&args, Duration::from_secs(300)) else {
        return;
    };
    assert_refused(
        &out,
        "model-00002-of-00002.safetensors: __metadata__ key \"b\": with the earlier shards' __metadata__ it makes 35651594 bytes, over the 33554432 bytes",
    );
    assert!(!dst.exists(), "nothing was written, not even DST");
    assert!(peak_kib < PEAK_KIB, "peak RSS {peak_kib} KiB");
}

/// What the refusal may cost: the first shard's 17 MiB metadata and the
/// second's header as read (64 MB measured, debug build); the run that
/// wrote the header peaked at 290 MB.
const PEAK_KIB: u64 = 110 << 10;

/// A source header of 32 MiB less 2 bytes without `"format": "pt"`: the
/// output's, which adds it, is 16 bytes over (padded) the reader's limit. It is
/// refused while planning, before DST exists, naming the shard.
#[test]
fn an_output_header_over_the_readers_limit_is_refused_before_writing() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("model.safetensors");
    let max = 32usize << 20;
    let header = |v: &str| json!({"__metadata__": {"k": v}, "w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}});
    let bare = serde_json::to_vec(&header("")).unwrap().len();
    let json = serde_json::to_vec(&header(&"v".repeat(max - 2 - bare))).unwrap();
    assert_eq!(json.len(), max - 2);
    let mut padded = json;
    padded.extend(b"  ");
    write_safetensors_raw(&src, &padded, &[0; 4]);
    let dst = tmp.path().join("out");
    let out = convert_out(&src, &dst, &[]);
    assert_refused(
        &out,
        "shard header for model.safetensors: 33554448 bytes or more, over the 33554432 bytes reshard's reader accepts",
    );
    assert!(stderr_of(&out).contains("1 tensor entries and a __metadata__ of "));
    assert!(!dst.exists(), "nothing was written, not even DST");
}
