//! What DST names: `NAME.safetensors` is that one file, `NAME.gguf` is
//! refused (reshard writes no GGUF yet), anything else is a folder.

use super::{names_in, stderr};
use crate::common::{convert, copy_fixture, fixture};

#[test]
fn a_safetensors_dst_is_one_file_with_nothing_beside_it() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("models");
    std::fs::create_dir(&out).unwrap();
    let src = fixture("tiny-llama-f32-sharded");
    let file = out.join("merged.safetensors");
    let run = convert(&src, &file, &[]).success();
    assert!(
        stderr(&run).contains("gets the weights only"),
        "{}",
        stderr(&run)
    );
    assert!(file.is_file(), "a file, not a folder");
    assert_eq!(names_in(&out), ["merged.safetensors"], "no staging left");
    // The same bytes as --single-file writes into a folder.
    let folder = tmp.path().join("folder");
    convert(&src, &folder, &["--single-file"]).success();
    assert_eq!(
        std::fs::read(&file).unwrap(),
        std::fs::read(folder.join("model.safetensors")).unwrap()
    );
    // An existing file is replaced only with --overwrite.
    let again = convert(&src, &file, &["--single-file"]).code(2);
    assert!(
        stderr(&again).contains("pass --overwrite"),
        "{}",
        stderr(&again)
    );
    convert(&src, &file, &["--overwrite", "--dtype", "bf16"]).success();
    assert!(
        std::fs::metadata(&file).unwrap().len()
            < std::fs::metadata(folder.join("model.safetensors"))
                .unwrap()
                .len()
    );
    assert_eq!(names_in(&out), ["merged.safetensors"]);
    // A trailing separator names a folder.
    let slash = format!("{}/", tmp.path().join("dir.safetensors").display());
    convert(&src, std::path::Path::new(&slash), &[]).success();
    assert!(tmp.path().join("dir.safetensors/reshard.json").is_file());
}

#[test]
fn a_safetensors_dst_refuses_what_it_cannot_be() {
    let tmp = tempfile::tempdir().unwrap();
    let src = copy_fixture("tiny-llama", tmp.path());
    let file = tmp.path().join("m.safetensors");
    // Several shards into one file: name a folder.
    let e = stderr(&convert(&src, &file, &["--max-shard-size", "10KB"]).code(2));
    assert!(
        e.contains("--max-shard-size") && e.contains("name a folder"),
        "{e}"
    );
    let e = stderr(&convert(&src, &file, &["--split-components"]).code(2));
    assert!(e.contains("name a folder"), "{e}");
    // The source file itself, even with --overwrite.
    let own = src.join("model.safetensors");
    let before = std::fs::read(&own).unwrap();
    let e = stderr(&convert(&own, &own, &["--overwrite"]).code(2));
    assert!(e.contains("is the source file"), "{e}");
    assert_eq!(std::fs::read(&own).unwrap(), before);
    // A pipeline has several weight sets.
    let pipe = tmp.path().join("pipe");
    crate::common::copy_dir(&fixture("tiny-llama"), &pipe.join("text_encoder"));
    crate::common::copy_dir(&fixture("tiny-gpt2"), &pipe.join("unet"));
    std::fs::write(
        pipe.join("model_index.json"),
        r#"{"text_encoder": ["transformers", "X"], "unet": ["transformers", "Y"]}"#,
    )
    .unwrap();
    let e = stderr(&convert(&pipe, &file, &[]).code(2));
    assert!(
        e.contains("2 weight sets") && e.contains("name a folder"),
        "{e}"
    );
    assert!(!file.exists());
    // A folder already at that name is not replaced.
    std::fs::create_dir(&file).unwrap();
    let e = stderr(&convert(&src, &file, &["--overwrite"]).code(2));
    assert!(e.contains("not a regular file"), "{e}");
}

#[test]
fn a_gguf_dst_sets_the_format_and_refuses_an_llm_without_its_tokenizer() {
    // tiny-llama has no tokenizer.json: a GGUF of it would have no
    // vocabulary, so it is refused before anything is written (the
    // GGUF writer's own tests are tests/cli/gguf_out.rs).
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("model.gguf");
    let e = stderr(&convert(&fixture("tiny-llama"), &dst, &[]).code(2));
    assert!(
        e.contains("tokenizer.json") && e.contains("is missing"),
        "{e}"
    );
    assert!(!dst.exists());
    assert!(!tmp.path().join(".model.gguf.reshard").exists());
}
