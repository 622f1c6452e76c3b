//! `validate --device cuda` and fit's VRAM detection against the CUDA
//! driver test double (tests/fake-cuda/fake_cuda.c), on Linux and under
//! Wine: every line of src/validate/device/cuda.rs runs here without a GPU.
//!
//! scripts/test.sh and scripts/windows-test.sh build the double and name
//! its folder in `RESHARD_TEST_FAKE_CUDA`; each test puts that folder first
//! on the reshard process's library search path (`LD_LIBRARY_PATH`, `PATH`
//! on Windows) and configures the double through `FAKE_CUDA_*` variables
//! (listed at the top of fake_cuda.c and in docs/validate.md).

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::common::*;

/// The variable that names the built double's folder.
const FAKE_CUDA_ENV: &str = "RESHARD_TEST_FAKE_CUDA";

/// The variable the platform's loader searches for a library by bare name.
const SEARCH_PATH: &str = if cfg!(windows) {
    "PATH"
} else {
    "LD_LIBRARY_PATH"
};

/// The driver a test runs against.
struct Driver {
    /// The built double's folder; `None`: this machine's own driver
    /// (`RESHARD_TEST_REAL_CUDA=1`, set by scripts/gpu-check.sh on a GPU).
    dir: Option<PathBuf>,
}

impl Driver {
    fn is_fake(&self) -> bool {
        self.dir.is_some()
    }
}

/// The driver for a test that runs on a real GPU too.
fn driver() -> Option<Driver> {
    if std::env::var_os("RESHARD_TEST_REAL_CUDA").is_some() {
        return Some(Driver { dir: None });
    }
    double()
}

/// The double, for a test that needs its configuration or its faults;
/// `None` (after saying why) on a real GPU, or when
/// `RESHARD_TEST_FAKE_CUDA` is unset: under CI that is a failure, so CI
/// cannot skip these tests by accident.
fn double() -> Option<Driver> {
    if std::env::var_os("RESHARD_TEST_REAL_CUDA").is_some() {
        eprintln!("skipped on the real driver: this test configures the double");
        return None;
    }
    match std::env::var_os(FAKE_CUDA_ENV) {
        Some(dir) => {
            let dir = PathBuf::from(dir);
            let lib = if cfg!(windows) {
                "cuda.dll"
            } else {
                "libcuda.so"
            };
            assert!(
                dir.join(lib).is_file(),
                "{FAKE_CUDA_ENV}={} holds no {lib}: build it with tests/fake-cuda/build.sh",
                dir.display()
            );
            Some(Driver { dir: Some(dir) })
        }
        None => {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI is set but {FAKE_CUDA_ENV} is not: scripts/test.sh builds the CUDA driver double"
            );
            eprintln!(
                "skipped: no CUDA driver double ({FAKE_CUDA_ENV} unset; run scripts/test.sh)"
            );
            None
        }
    }
}

/// What one reshard run printed.
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn text(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("no JSON report ({e}): {}", self.text()))
    }
}

/// Runs reshard with `args` and `env` set, on `driver` (the double first
/// on the library search path) or, with `None`, on the CPU device.
fn run(driver: Option<&Driver>, args: &[&str], env: &[(&str, String)]) -> Run {
    let mut cmd = reshard();
    cmd.args(args);
    if let Some(dir) = driver.and_then(|d| d.dir.as_ref()) {
        let mut paths = vec![dir.to_path_buf()];
        paths.extend(std::env::split_paths(
            &std::env::var_os(SEARCH_PATH).unwrap_or_default(),
        ));
        let joined: OsString = std::env::join_paths(paths).unwrap();
        cmd.env(SEARCH_PATH, joined);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let run = Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    // The double's symbol set must be complete: cudarc panics on a missing
    // entry point, which guarded() would report as no driver at all.
    assert!(!run.text().contains("panicked"), "{}", run.text());
    if driver.is_some() {
        assert!(
            !run.text().contains("no CUDA driver found"),
            "the double was not loaded: {}",
            run.text()
        );
    }
    run
}

/// `validate PATH --device cuda ARGS --json` on the double.
fn validate_cuda(driver: &Driver, path: &Path, args: &[&str], env: &[(&str, String)]) -> Run {
    let mut all = vec!["validate", path.to_str().unwrap(), "--device", "cuda"];
    all.extend_from_slice(args);
    run(Some(driver), &all, env)
}

/// Converts fixture `name` into `dir/name` with reshard.json (so tensors
/// are checked against their recorded xxh3) and returns the output.
fn converted(name: &str, dir: &Path) -> PathBuf {
    let dst = dir.join(name);
    convert(&fixture(name), &dst, &["--max-shard-size", "100KB"]).success();
    dst
}

fn env<'a>(pairs: &[(&'a str, u64)]) -> Vec<(&'a str, String)> {
    pairs.iter().map(|&(k, v)| (k, v.to_string())).collect()
}

/// The entry points the double logged to `log` (one name a line).
fn logged(log: &Path) -> BTreeSet<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn cuda_on_the_double_passes_and_matches_the_cpu_device() {
    let Some(dir) = driver() else { return };
    let tmp = tempfile::tempdir().unwrap();
    for name in ["tiny-llama-f32-sharded", "tiny-moe-sharded", "tiny-gpt2"] {
        let out = converted(name, tmp.path());
        let cpu = run(None, &["validate", out.to_str().unwrap(), "--json"], &[]);
        assert_eq!(cpu.code, 0, "{name} cpu: {}", cpu.text());
        // Both allocation paths: memory pools (cuMemAllocAsync, as an H200
        // allocates) and plain cuMemAlloc.
        for pools in [1, 0] {
            let log = tmp.path().join(format!("{name}-{pools}.log"));
            let mut vars = env(&[("FAKE_CUDA_MEMORY_POOLS", pools)]);
            vars.push(("FAKE_CUDA_LOG", log.display().to_string()));
            let cuda = validate_cuda(&dir, &out, &["--json"], &vars);
            assert_eq!(cuda.code, 0, "{name} cuda: {}", cuda.text());
            let (c, g) = (cpu.json(), cuda.json());
            assert_eq!(g["device"]["device"], "cuda:0");
            if dir.is_fake() {
                assert_eq!(g["device"]["name"], "reshard fake CUDA device");
                assert_eq!(g["device"]["total_memory"], 1u64 << 30);
            }
            assert_eq!(g["device"]["pinned_staging"], true);
            assert_eq!(g["manifest"], true);
            for key in [
                "tensors",
                "files",
                "bytes_loaded",
                "device_bytes",
                "failures",
            ] {
                assert_eq!(c[key], g[key], "{name}: {key}");
            }
            let shards = |r: &Value| -> Vec<(Value, Value, Value)> {
                r["shards"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|s| (s["file"].clone(), s["bytes"].clone(), s["tensors"].clone()))
                    .collect()
            };
            assert_eq!(shards(&c), shards(&g), "{name}");
            // A GPU keeps every tensor: it holds the whole model at the end.
            assert_eq!(g["device_peak_held"], g["device_bytes"]);
            if !dir.is_fake() {
                break;
            }
            let calls = logged(&log);
            let (used, unused) = if pools == 1 {
                ("cuMemAllocAsync", "cuMemAlloc_v2")
            } else {
                ("cuMemAlloc_v2", "cuMemAllocAsync")
            };
            assert!(calls.contains(used) && !calls.contains(unused), "{calls:?}");
        }
    }
}

/// Flips one byte of tensor data in a shard: both devices report the same
/// tensor with the same xxh3 (the per-tensor hash each device computed)
/// against reshard.json's.
#[test]
fn a_corrupted_shard_gives_the_same_per_tensor_hashes_on_cuda_and_cpu() {
    let Some(dir) = driver() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let out = converted("tiny-llama-f32-sharded", tmp.path());
    let ck = reshard::format::open(&out).unwrap();
    let victim = ck.tensors.iter().find(|t| t.len > 1000).unwrap();
    let path = &ck.files[victim.file].path;
    let mut bytes = std::fs::read(path).unwrap();
    bytes[(victim.offset() + victim.len / 2) as usize] ^= 0x40;
    std::fs::write(path, bytes).unwrap();
    let cpu = run(None, &["validate", out.to_str().unwrap(), "--json"], &[]);
    let cuda = validate_cuda(&dir, &out, &["--json"], &[]);
    assert_eq!((cpu.code, cuda.code), (1, 1), "{}", cuda.text());
    let checksums = |r: &Value| -> Vec<Value> {
        r["failures"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["kind"] == "tensor_checksum")
            .cloned()
            .collect()
    };
    let (c, g) = (checksums(&cpu.json()), checksums(&cuda.json()));
    assert_eq!(c.len(), 1, "{c:?}");
    assert_eq!(c[0]["tensor"], victim.name.as_str());
    assert_eq!(c, g);
}

#[test]
fn vram_budget_on_cuda_fits_the_blocks_fit_reports() {
    let Some(dir) = driver() else { return };
    let src = fixture("tiny-llama-f32-sharded");
    let src = src.to_str().unwrap();
    for (budget, bytes) in [
        ("300KiB", 300u64 << 10),
        ("600KiB", 600 << 10),
        ("2MiB", 2 << 20),
    ] {
        let cuda = validate_cuda(
            &dir,
            Path::new(src),
            &["--vram-budget", budget, "--json"],
            &[],
        );
        let fit = run(
            None,
            &[
                "fit", src, "--vram", budget, "--loader", "reshard", "--json",
            ],
            &[],
        );
        let (v, f) = (cuda.json(), fit.json());
        let fit_blocks = &f["today"]["vram"]["leading_blocks_fit"];
        assert_eq!(
            &v["vram"]["blocks_fit"],
            fit_blocks,
            "{budget}: {}",
            cuda.text()
        );
        let all_fit = v["vram"]["blocks_fit"] == v["vram"]["blocks_total"];
        assert_eq!(cuda.code, if all_fit { 0 } else { 1 }, "{}", cuda.text());
        if !dir.is_fake() {
            continue;
        }
        // The same count when the device itself is that small: fit detects
        // it through the double, and validate runs out of device memory.
        let small = env(&[("FAKE_CUDA_TOTAL_MEM", bytes)]);
        let fit = run(
            Some(&dir),
            &["fit", src, "--loader", "reshard", "--json"],
            &small,
        );
        assert_eq!(
            &fit.json()["today"]["vram"]["leading_blocks_fit"],
            fit_blocks
        );
        let cuda = validate_cuda(&dir, Path::new(src), &["--json"], &small);
        if all_fit {
            assert_eq!(cuda.code, 0, "{}", cuda.text());
        } else {
            assert_eq!(cuda.code, 1, "{}", cuda.text());
            assert_eq!(
                &cuda.json()["vram"]["blocks_fit"],
                fit_blocks,
                "{}",
                cuda.text()
            );
        }
    }
}

#[test]
fn an_out_of_memory_device_fails_naming_shard_tensor_and_bytes_held() {
    let Some(dir) = double() else { return };
    let src = fixture("tiny-llama-f32-sharded");
    let ck = reshard::format::open(&src).unwrap();
    let len_of = |name: &Value| {
        ck.tensors
            .iter()
            .find(|t| t.name == name.as_str().unwrap())
            .unwrap()
            .len
    };
    // The first allocation, then one past a byte limit.
    for (fault, value) in [
        ("FAKE_CUDA_OOM_AT_ALLOC", 1),
        ("FAKE_CUDA_OOM_PAST", 400_000),
    ] {
        let r = validate_cuda(&dir, &src, &["--json"], &env(&[(fault, value)]));
        assert_eq!(r.code, 1, "{fault}: {}", r.text());
        let report = r.json();
        let failures = report["failures"].as_array().unwrap();
        let f = &failures[0];
        assert_eq!(f["kind"], "device_out_of_memory", "{failures:?}");
        assert_eq!(f["device"], "cuda:0");
        assert_eq!(f["needed"], len_of(&f["tensor"]));
        let held = f["held"].as_u64().unwrap();
        assert_eq!(held, report["device_bytes"].as_u64().unwrap());
        if fault == "FAKE_CUDA_OOM_AT_ALLOC" {
            assert_eq!(held, 0);
        } else {
            assert!(held <= 400_000 && held + f["needed"].as_u64().unwrap() > 400_000);
        }
        let file = ck
            .files
            .iter()
            .find(|file| file.name() == f["shard"].as_str().unwrap());
        assert!(file.is_some(), "{f}");
        let text = validate_cuda(&dir, &src, &[], &env(&[(fault, value)])).text();
        let line = format!(
            "cuda:0 out of memory at shard {}, tensor {}: needed {} bytes",
            f["shard"].as_str().unwrap(),
            f["tensor"],
            f["needed"]
        );
        assert!(text.contains(&line), "{text}");
        assert!(text.contains(&format!("with {held} bytes")), "{text}");
    }
}

#[test]
fn a_corrupting_copy_is_caught_by_the_readback() {
    let Some(dir) = double() else { return };
    let src = fixture("tiny-llama-f32-sharded");
    // No reshard.json here: the readback is the only check of the copy.
    for copy in [1, 7] {
        let r = validate_cuda(
            &dir,
            &src,
            &["--json"],
            &env(&[("FAKE_CUDA_CORRUPT_COPY", copy)]),
        );
        assert_eq!(r.code, 1, "{}", r.text());
        let failures = r.json()["failures"].as_array().unwrap().clone();
        assert_eq!(failures.len(), 1, "{failures:?}");
        assert_eq!(failures[0]["kind"], "readback");
        assert_eq!(failures[0]["device"], "cuda:0");
        let text = validate_cuda(&dir, &src, &[], &env(&[("FAKE_CUDA_CORRUPT_COPY", copy)])).text();
        let tensor = failures[0]["tensor"].as_str().unwrap();
        assert!(
            text.contains(&format!(
                "tensor {tensor:?}: bytes read back from cuda:0 differ from the file's"
            )),
            "{text}"
        );
    }
}

#[test]
fn a_failing_copy_or_a_vanished_device_exits_2_naming_the_tensor() {
    let Some(dir) = double() else { return };
    let src = fixture("tiny-llama-f32-sharded");
    for (fault, code) in [
        ("FAKE_CUDA_FAIL_COPY", "CUDA_ERROR_ILLEGAL_ADDRESS"),
        ("FAKE_CUDA_VANISH_AT_COPY", "CUDA_ERROR_DEVICE_UNAVAILABLE"),
    ] {
        let r = validate_cuda(&dir, &src, &[], &env(&[(fault, 3)]));
        assert_eq!(r.code, 2, "{fault}: {}", r.text());
        assert!(r.stderr.contains(code), "{}", r.stderr);
        assert!(
            r.stderr.contains("caused by: CUDA: shard model-"),
            "{}",
            r.stderr
        );
        assert!(r.stderr.contains(", tensor \""), "{}", r.stderr);
    }
    let r = validate_cuda(&dir, &src, &[], &env(&[("FAKE_CUDA_VANISH_AT_COPY", 3)]));
    assert!(
        r.stderr.contains("busy or unavailable"),
        "the driver's own words: {}",
        r.stderr
    );
}

#[test]
fn an_old_driver_is_refused_naming_its_version() {
    let Some(dir) = double() else { return };
    let src = fixture("tiny-llama");
    let old = validate_cuda(
        &dir,
        &src,
        &[],
        &env(&[("FAKE_CUDA_DRIVER_VERSION", 11010)]),
    );
    assert_eq!(old.code, 2, "{}", old.text());
    assert!(
        old.stderr
            .contains("the CUDA driver supports CUDA 11.1; reshard needs 11.2 or newer"),
        "{}",
        old.stderr
    );
    let oldest = validate_cuda(
        &dir,
        &src,
        &[],
        &env(&[("FAKE_CUDA_DRIVER_VERSION", 11020)]),
    );
    assert_eq!(oldest.code, 0, "{}", oldest.text());
}

#[test]
fn no_device_or_a_missing_ordinal_is_an_error_naming_the_count() {
    let Some(dir) = double() else { return };
    let src = fixture("tiny-llama");
    let src = src.to_str().unwrap();
    let r = run(Some(&dir), &["validate", src, "--device", "cuda:1"], &[]);
    assert_eq!(r.code, 2);
    assert!(
        r.stderr.contains("CUDA device 1 does not exist (1 found)"),
        "{}",
        r.stderr
    );
    let two = env(&[("FAKE_CUDA_DEVICES", 2)]);
    let r = run(
        Some(&dir),
        &["validate", src, "--device", "cuda:1", "--json"],
        &two,
    );
    assert_eq!(r.code, 0, "{}", r.text());
    assert_eq!(r.json()["device"]["device"], "cuda:1");
}

/// 2 tensors of 4 MiB in one file (one per layer), so the staging buffer
/// (the largest tensor, 4 MiB) stands out in the commit figure.
fn write_two_layers(dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let len = 4usize << 20;
    let mut header = serde_json::Map::new();
    for i in 0..2 {
        header.insert(
            format!("model.layers.{i}.mlp.weight"),
            serde_json::json!({"dtype": "F32", "shape": [len / 4], "data_offsets": [i * len, (i + 1) * len]}),
        );
    }
    let data: Vec<u8> = (0..2 * len).map(|i| (i % 251) as u8).collect();
    let path = dir.join("model.safetensors");
    write_safetensors(&path, &Value::Object(header), &data);
    path
}

#[test]
fn the_commit_figure_counts_the_pinned_staging_buffer_and_the_budget_applies() {
    let Some(dir) = driver() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let model = write_two_layers(&tmp.path().join("m"));
    let staging = 4u64 << 20;
    let r = validate_cuda(&dir, &model, &["--json", "--commit-budget", "64MiB"], &[]);
    assert_eq!(r.code, 0, "{}", r.text());
    let report = r.json();
    assert_eq!(report["staging"], staging);
    assert_eq!(report["device"]["pinned_staging"], true);
    let peak = report["commit"]["peak_above_baseline"].as_u64().unwrap();
    // Pinned memory is commit; on Linux device memory is not (the double's
    // is a shared mapping, which VmData does not count), so the peak is
    // the staging buffer and a little; on Windows both are charged.
    assert!(peak >= staging, "{}", report["commit"]);
    if cfg!(unix) && dir.is_fake() {
        assert!(peak < staging + (2 << 20), "{}", report["commit"]);
    }
    // A budget the staging buffer alone exceeds fails, as on the CPU.
    let r = validate_cuda(&dir, &model, &["--commit-budget", "2MiB"], &[]);
    assert_eq!(r.code, 1, "{}", r.text());
    if commit_limit_enforced() {
        assert!(
            r.stdout
                .contains("over budget at shard model.safetensors: needed 4194304 bytes"),
            "{}",
            r.text()
        );
    } else {
        assert!(
            r.stdout.contains("over the 2.00 MiB budget"),
            "{}",
            r.text()
        );
    }
    if !dir.is_fake() {
        return;
    }
    // When pinning fails the staging buffer is plain memory, charged too.
    let r = validate_cuda(
        &dir,
        &model,
        &["--json"],
        &env(&[("FAKE_CUDA_PINNED_FAIL", 1)]),
    );
    assert_eq!(r.code, 0, "{}", r.text());
    let report = r.json();
    assert_eq!(report["device"]["pinned_staging"], false);
    assert!(report["commit"]["peak_above_baseline"].as_u64().unwrap() >= staging);
}

#[test]
fn fit_detects_vram_through_the_driver() {
    let Some(dir) = double() else { return };
    let src = fixture("tiny-llama");
    let src = src.to_str().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("fit.log");
    let vars = [
        ("FAKE_CUDA_TOTAL_MEM", (3u64 << 30).to_string()),
        ("FAKE_CUDA_LOG", log.display().to_string()),
    ];
    let r = run(Some(&dir), &["fit", src], &vars);
    assert!(
        r.stdout.contains("vram (gpu 0)    3.00 GiB (detected)"),
        "{}",
        r.text()
    );
    let r = run(Some(&dir), &["fit", src, "--json"], &vars);
    assert_eq!(r.json()["machine"]["vram"]["bytes"], 3u64 << 30);
    // Reading the total needs no context (a real one costs host commit).
    let calls = logged(&log);
    assert!(calls.contains("cuDeviceTotalMem_v2"), "{calls:?}");
    assert!(!calls.contains("cuDevicePrimaryCtxRetain"), "{calls:?}");
    // A driver without devices, and (where this machine has none) no driver.
    let none = "vram (gpu 0)    none detected (no CUDA driver or device found; give --vram)";
    let r = run(Some(&dir), &["fit", src], &env(&[("FAKE_CUDA_DEVICES", 0)]));
    assert!(r.stdout.contains(none), "{}", r.text());
    if !reshard::validate::device::cuda::driver_present() {
        let r = run(None, &["fit", src], &[]);
        assert!(r.stdout.contains(none), "{}", r.text());
    }
}

/// With free dedicated memory below the model and System Memory Fallback
/// on, the leading blocks are allocated in dedicated memory and the rest
/// after it ran out; the report says which, block by block.
#[test]
fn the_report_says_which_blocks_came_after_dedicated_memory_ran_out() {
    let Some(dir) = double() else { return };
    let src = fixture("tiny-llama-f32-sharded");
    let ck = reshard::format::open(&src).unwrap();
    // The load order: shards in layer order, tensors by offset.
    let mut order = Vec::new();
    for f in reshard::validate::shard_order(&ck) {
        let mut ts: Vec<_> = ck.tensors.iter().filter(|t| t.file == f).collect();
        ts.sort_by_key(|t| t.offset());
        order.extend(ts);
    }
    let free = 500_000u64;
    let mut used = 0;
    let mut expected: Vec<(String, bool)> = Vec::new();
    for t in order {
        let name = reshard::plan::order::block_of(&t.name).map_or(t.name.clone(), |b| b.name());
        let dedicated = used + t.len <= free;
        used += t.len;
        match expected.iter_mut().find(|(n, _)| *n == name) {
            Some(e) => e.1 &= dedicated,
            None => expected.push((name, dedicated)),
        }
    }
    assert!(expected.iter().any(|e| e.1) && expected.iter().any(|e| !e.1));
    let vars = env(&[
        ("FAKE_CUDA_FREE_MEM", free),
        ("FAKE_CUDA_SYSMEM_FALLBACK", 1),
    ]);
    let r = validate_cuda(&dir, &src, &["--json"], &vars);
    assert_eq!(r.code, 0, "{}", r.text());
    let p = &r.json()["placement"];
    assert_eq!(p["free_at_start"], free);
    let got: Vec<(String, bool)> = p["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            (
                g["name"].as_str().unwrap().to_string(),
                g["dedicated"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(got, expected);
    let first_after = &expected.iter().find(|e| !e.1).unwrap().0;
    let text = validate_cuda(&dir, &src, &[], &vars).stdout;
    assert!(
        text.contains(&format!("from {first_after} on past it")),
        "{text}"
    );
    // Without the fallback, the first allocation past the free memory is
    // out of memory.
    let r = validate_cuda(
        &dir,
        &src,
        &["--json"],
        &env(&[("FAKE_CUDA_FREE_MEM", free)]),
    );
    assert_eq!(r.code, 1, "{}", r.text());
    assert_eq!(r.json()["failures"][0]["kind"], "device_out_of_memory");
}

/// Every function of src/validate/device/cuda.rs, by the driver entry
/// point that only it reaches, counted from the double's call log over a
/// few runs (the paths the tests above take, in small).
#[test]
fn every_cuda_device_function_is_exercised() {
    let Some(dir) = double() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("calls.log");
    let src = fixture("tiny-llama");
    let src = src.to_str().unwrap();
    let with = |pairs: &[(&'static str, u64)]| {
        let mut v = env(pairs);
        v.push(("FAKE_CUDA_LOG", log.display().to_string()));
        v
    };
    // (arguments, environment, exit status)
    type Case<'a> = (&'a [&'a str], Vec<(&'a str, String)>, i32);
    let runs: [Case; 5] = [
        (&["validate", src, "--device", "cuda"], with(&[]), 0),
        (
            &["validate", src, "--device", "cuda"],
            with(&[("FAKE_CUDA_MEMORY_POOLS", 0), ("FAKE_CUDA_PINNED_FAIL", 1)]),
            0,
        ),
        (
            &["validate", src, "--device", "cuda"],
            with(&[("FAKE_CUDA_FAIL_COPY", 2)]),
            2,
        ),
        (
            &["validate", src, "--device", "cuda"],
            with(&[("FAKE_CUDA_OOM_AT_ALLOC", 2)]),
            1,
        ),
        (&["fit", src], with(&[]), 0),
    ];
    for (args, vars, code) in runs {
        let r = run(Some(&dir), args, &vars);
        assert_eq!(r.code, code, "{args:?} {vars:?}: {}", r.text());
    }
    let calls = logged(&log);
    let table = [
        ("dedicated_memory", "cuDeviceTotalMem_v2"),
        ("check_driver_version", "cuDriverGetVersion"),
        ("CudaDevice::open", "cuDeviceGetCount"),
        ("CudaDevice::open", "cuDevicePrimaryCtxRetain"),
        ("CudaDevice::open", "cuDeviceGetName"),
        ("CudaDevice::pinned", "cuMemHostAlloc"),
        ("Device::staging (pinned)", "cuEventSynchronize"),
        ("Device::alloc (memory pools)", "cuMemAllocAsync"),
        ("Device::alloc (no pools)", "cuMemAlloc_v2"),
        ("Device::alloc (zeroed)", "cuMemsetD8Async"),
        ("Device::upload", "cuMemcpyHtoDAsync_v2"),
        ("Device::upload", "cuStreamSynchronize"),
        ("Device::download", "cuMemcpyDtoHAsync_v2"),
        ("Device::free_dedicated", "cuMemGetInfo_v2"),
        ("driver_text", "cuGetErrorString"),
        ("drop (memory pools)", "cuMemFreeAsync"),
        ("drop (no pools)", "cuMemFree_v2"),
        ("drop (pinned staging)", "cuMemFreeHost"),
        ("drop (context)", "cuDevicePrimaryCtxRelease_v2"),
    ];
    let missing: Vec<_> = table
        .iter()
        .filter(|(_, entry)| !calls.contains(*entry))
        .collect();
    assert!(
        missing.is_empty(),
        "not exercised: {missing:?}; called: {calls:?}"
    );
}

/// A library that loads but lacks an entry point cudarc resolves is named
/// as such, not taken for "no driver" (cudarc panics on the missing symbol).
#[test]
fn a_driver_lacking_an_entry_point_is_named_not_taken_for_none() {
    let Some(dir) = double() else { return };
    let lacking = Driver {
        dir: dir.dir.map(|d| d.join("lacking")),
    };
    let r = validate_cuda(&lacking, &fixture("tiny-llama"), &[], &[]);
    assert_eq!(r.code, 2, "{}", r.text());
    assert!(
        r.stderr
            .contains("the driver library lacks the entry point cuDeviceGetName"),
        "{}",
        r.stderr
    );
}
