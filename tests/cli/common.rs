//! Helpers shared by the integration tests.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// The `reshard` binary built for this test run.
pub fn reshard() -> assert_cmd::Command {
    assert_cmd::Command::cargo_bin("reshard").unwrap()
}

/// The path of a fixture in tests/fixtures: under `RESHARD_TEST_ROOT` when
/// set (a test binary carried away from its checkout, as
/// scripts/gpu-check.sh runs it on a GPU machine), else in the checkout the
/// tests were built from.
pub fn fixture(name: &str) -> PathBuf {
    std::env::var_os("RESHARD_TEST_ROOT")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
        .join("tests/fixtures")
        .join(name)
}

/// Runs `reshard convert SRC DST --no-progress EXTRA...`.
pub fn convert(src: &Path, dst: &Path, extra: &[&str]) -> assert_cmd::assert::Assert {
    reshard()
        .arg("convert")
        .arg(src)
        .arg(dst)
        .arg("--no-progress")
        .args(extra)
        .assert()
}

/// Copies a fixture folder into `dir` and returns the copy's path.
/// `reshard validate OUT --against SRC`, asserted by the caller.
pub fn validate_against(out: &Path, src: &Path) -> assert_cmd::assert::Assert {
    reshard()
        .arg("validate")
        .arg(out)
        .arg("--against")
        .arg(src)
        .assert()
}

pub fn copy_fixture(name: &str, dir: &Path) -> PathBuf {
    let dst = dir.join(name);
    copy_dir(&fixture(name), &dst);
    dst
}

pub fn copy_dir(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for entry in std::fs::read_dir(src).unwrap() {
        let entry = entry.unwrap();
        let to = dst.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &to);
        } else {
            std::fs::copy(entry.path(), &to).unwrap();
        }
    }
}

/// One tensor of a fixture's expected.json.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct ExpectedTensor {
    pub dtype: String,
    pub shape: Vec<u64>,
    pub sha256: String,
}

#[derive(Debug, Clone, serde::Deserialize)]
pub struct Expected {
    pub tensors: BTreeMap<String, ExpectedTensor>,
    #[serde(default)]
    pub shared_storage: serde_json::Value,
}

pub fn expected(name: &str) -> Expected {
    let text = std::fs::read_to_string(fixture(name).join("expected.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// torch's dtype name for a safetensors dtype name.
pub fn torch_name(dtype: &str) -> &'static str {
    match dtype {
        "BF16" => "bfloat16",
        "F16" => "float16",
        "F32" => "float32",
        "F64" => "float64",
        "I64" => "int64",
        "I32" => "int32",
        "I16" => "int16",
        "I8" => "int8",
        "U8" => "uint8",
        "BOOL" => "bool",
        "F8_E4M3" => "float8_e4m3fn",
        "F8_E5M2" => "float8_e5m2",
        other => panic!("no torch name for {other}"),
    }
}

/// Reads every tensor of the checkpoint at `path` through the library and
/// returns name -> (safetensors dtype, shape, sha256 of its bytes).
pub fn read_all(path: &Path) -> BTreeMap<String, (String, Vec<u64>, String)> {
    let ck = reshard::format::open(path).unwrap();
    let reader = reshard::format::read::SourceReader::open(&ck).unwrap();
    let mut out = BTreeMap::new();
    for t in &ck.tensors {
        let mut stream = reader.tensor_bytes(t);
        let mut bytes = Vec::new();
        stream.read_to_end(&mut bytes).unwrap();
        assert_eq!(bytes.len() as u64, t.len, "{}", t.name);
        let sha = hex(&Sha256::digest(&bytes));
        out.insert(
            t.name.clone(),
            (t.dtype.name().to_string(), t.shape.clone(), sha),
        );
    }
    out
}

/// Asserts that the checkpoint at `path` holds exactly the fixture's tensors.
pub fn assert_matches_expected(path: &Path, fixture_name: &str) {
    let expected = expected(fixture_name);
    let got = read_all(path);
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        expected.tensors.keys().collect::<Vec<_>>(),
        "tensor names of {}",
        path.display()
    );
    for (name, e) in &expected.tensors {
        let (dtype, shape, sha) = &got[name];
        assert_eq!(torch_name(dtype), e.dtype, "dtype of {name}");
        assert_eq!(shape, &e.shape, "shape of {name}");
        assert_eq!(sha, &e.sha256, "bytes of {name}");
    }
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The ggml oracle's Python: llama-cpp-python (libllama and libggml built
/// from source) and numpy, which scripts/lib/ggml-venv.sh builds and
/// scripts/test.sh exports as `RESHARD_GGML_PYTHON`. Without it the tests
/// that need it skip, except on Linux under CI, which always has it.
pub fn ggml_python() -> Option<PathBuf> {
    let python = std::env::var_os("RESHARD_GGML_PYTHON").map(PathBuf::from);
    if python.is_none() {
        assert!(
            std::env::var_os("CI").is_none() || cfg!(windows),
            "CI is set but RESHARD_GGML_PYTHON is not (scripts/test.sh exports it)"
        );
        eprintln!("skipped: RESHARD_GGML_PYTHON is unset (scripts/lib/ggml-venv.sh builds one)");
    }
    python
}

/// A Python interpreter with the `safetensors` and `numpy` packages, if one
/// is set up (`.ci/run` makes `.venv`). Under CI its absence is a failure.
pub fn python() -> Option<PathBuf> {
    let candidates = [
        std::env::var_os("RESHARD_TEST_PYTHON").map(PathBuf::from),
        Some(Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python")).filter(|_| cfg!(unix)),
    ];
    for p in candidates.into_iter().flatten() {
        let ok = std::process::Command::new(&p)
            .args(["-c", "import safetensors, numpy"])
            .output()
            .is_ok_and(|o| o.status.success());
        if ok {
            return Some(p);
        }
    }
    if cfg!(windows) {
        // The CI's venv is a Linux one; scripts/windows-test.sh unsets the
        // variable. A Windows Python given in RESHARD_TEST_PYTHON is used.
        eprintln!("skipped: no Windows Python with safetensors and numpy (RESHARD_TEST_PYTHON)");
        return None;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "CI is set but no Python with safetensors+numpy was found (.venv/bin/python)"
    );
    eprintln!("skipped: no Python with safetensors and numpy (run .ci/run to make .venv)");
    None
}

/// The test Python ([`python`]) when it also imports every module of
/// `imports` (`"torch, transformers"`): the one check every interop test
/// makes. Without them, a failure under CI and a skip elsewhere, naming
/// what is missing.
pub fn python_with(imports: &str) -> Option<PathBuf> {
    let python = python()?;
    let ok = std::process::Command::new(&python)
        .args(["-c", &format!("import {imports}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        return Some(python);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "CI is set but {} cannot import {imports} (tests/requirements.txt)",
        python.display()
    );
    eprintln!("skipped: {} cannot import {imports}", python.display());
    None
}

/// Runs `python` on `program` (`-c` code, or a script's path) with `args`,
/// offline, asserting it succeeds; returns its stdout. The one way the
/// tests run Python.
pub fn run_python<S: AsRef<std::ffi::OsStr>>(
    python: &Path,
    program: Program<'_>,
    args: &[S],
) -> String {
    let mut cmd = std::process::Command::new(python);
    match program {
        Program::Code(code) => cmd.args(["-c", code]),
        Program::Script(path) => cmd.arg(path),
    };
    let out = cmd
        .args(args)
        .env("HF_HUB_OFFLINE", "1")
        .env("TRANSFORMERS_OFFLINE", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "python failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// What [`run_python`] runs.
#[derive(Clone, Copy)]
pub enum Program<'a> {
    Code(&'a str),
    Script(&'a Path),
}

/// Writes a safetensors file from a header JSON value and a data section.
pub fn write_safetensors(path: &Path, header: &serde_json::Value, data: &[u8]) {
    let mut json = serde_json::to_vec(header).unwrap();
    while !json.len().is_multiple_of(8) {
        json.push(b' ');
    }
    write_safetensors_raw(path, &json, data);
}

/// The tests' one safetensors byte writer: the u64 length of `json`, then
/// `json` exactly as given (a hostile test passes headers no writer would
/// make: unpadded, malformed), then `data`.
pub fn write_safetensors_raw(path: &Path, json: &[u8], data: &[u8]) {
    let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(json);
    bytes.extend_from_slice(data);
    std::fs::write(path, bytes).unwrap();
}

/// Runs the reshard binary with `args` under a timeout guard (a hang fails
/// the test instead of stalling it): its output and its peak RSS in KiB.
/// Unix measures with GNU time (`None` when /usr/bin/time is not
/// installed). Windows reads the child's PeakWorkingSetSize while it runs
/// and once it has exited, less that of `reshard --version` (a Wine process
/// starts at about 120 MiB of its own; Windows reads it after exit, Wine
/// only while the process lives, so there it is a lower bound).
pub fn run_measured(
    args: &[&std::ffi::OsStr],
    timeout: std::time::Duration,
) -> Option<(std::process::Output, u64)> {
    #[cfg(unix)]
    {
        if !Path::new("/usr/bin/time").exists() {
            eprintln!("skipped a peak RSS check: /usr/bin/time is not installed");
            return None;
        }
        let report = tempfile::NamedTempFile::new().unwrap();
        let mut cmd = std::process::Command::new("/usr/bin/time");
        cmd.args(["-f", "%M", "-o"])
            .arg(report.path())
            .arg(assert_cmd::cargo::cargo_bin("reshard"))
            .args(args);
        let out = run_guarded(cmd, args, timeout, |_| {});
        let text = std::fs::read_to_string(report.path()).unwrap();
        let peak = text
            .lines()
            .filter_map(|l| l.trim().parse::<u64>().ok())
            .next_back()
            .unwrap_or_else(|| panic!("no peak RSS in {text:?}"));
        Some((out, peak))
    }
    #[cfg(windows)]
    {
        let measure = |args: &[&std::ffi::OsStr]| {
            let mut cmd = std::process::Command::new(assert_cmd::cargo::cargo_bin("reshard"));
            cmd.args(args);
            let mut peak = 0;
            let out = run_guarded(cmd, args, timeout, |child| {
                peak = peak.max(peak_working_set(child));
            });
            (out, peak)
        };
        static IDLE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
        let idle = *IDLE.get_or_init(|| measure(&["--version".as_ref()]).1);
        let (out, peak) = measure(args);
        if peak == 0 {
            eprintln!("skipped a peak RSS check: the child's working set could not be read");
            return None;
        }
        Some((out, peak.saturating_sub(idle) / 1024))
    }
}

/// Spawns `cmd` with piped output, calls `sample` every 20 ms while it runs
/// and once after it exits, and kills it past `timeout`.
fn run_guarded(
    mut cmd: std::process::Command,
    args: &[&std::ffi::OsStr],
    timeout: std::time::Duration,
    mut sample: impl FnMut(&std::process::Child),
) -> std::process::Output {
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Drain the pipes meanwhile, so a chatty child never blocks on them.
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out_thread = std::thread::spawn(move || {
        let mut v = Vec::new();
        std::io::Read::read_to_end(&mut stdout, &mut v).map(|_| v)
    });
    let err_thread = std::thread::spawn(move || {
        let mut v = Vec::new();
        std::io::Read::read_to_end(&mut stderr, &mut v).map(|_| v)
    });
    let deadline = std::time::Instant::now() + timeout;
    let status = loop {
        sample(&child);
        if let Some(status) = child.try_wait().unwrap() {
            sample(&child);
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("reshard {args:?} did not finish within {timeout:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    std::process::Output {
        status,
        stdout: out_thread.join().unwrap().unwrap(),
        stderr: err_thread.join().unwrap().unwrap(),
    }
}

/// The child's peak working set in bytes (0 where it cannot be read).
#[cfg(windows)]
fn peak_working_set(child: &std::process::Child) -> u64 {
    use std::os::windows::io::AsRawHandle;
    use windows_sys::Win32::System::ProcessStatus::{
        GetProcessMemoryInfo, PROCESS_MEMORY_COUNTERS,
    };
    // SAFETY: an all-zero PROCESS_MEMORY_COUNTERS is valid; the handle is
    // the child's, open (with full access) for as long as `child` lives.
    unsafe {
        let mut c: PROCESS_MEMORY_COUNTERS = std::mem::zeroed();
        let size = std::mem::size_of::<PROCESS_MEMORY_COUNTERS>() as u32;
        c.cb = size;
        if GetProcessMemoryInfo(child.as_raw_handle(), &mut c, size) == 0 {
            return 0;
        }
        c.PeakWorkingSetSize as u64
    }
}

/// sha256 of every regular file under `dir` (links by their target, other
/// file types by their kind, never opened: a FIFO must not block this).
/// Converts `src` into `fast` with `args` and into `slow` with `args` and
/// `--no-mmap`, and asserts both trees hold the same files with the same
/// bytes; returns how many files.
pub fn assert_same_without_mmap(src: &Path, fast: &Path, slow: &Path, args: &[&str]) -> usize {
    convert(src, fast, args).success();
    let mut slow_args = args.to_vec();
    slow_args.push("--no-mmap");
    convert(src, slow, &slow_args).success();
    let strip = |dir: &Path| -> Vec<(PathBuf, String)> {
        tree_hashes(dir)
            .into_iter()
            .map(|(p, h)| (p.strip_prefix(dir).unwrap().to_path_buf(), h))
            .collect()
    };
    let (a, b) = (strip(fast), strip(slow));
    assert_eq!(a, b, "{} with and without --no-mmap", src.display());
    a.len()
}

pub fn tree_hashes(dir: &Path) -> BTreeMap<PathBuf, String> {
    let mut out = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let p = e.path();
        let meta = std::fs::symlink_metadata(&p).unwrap();
        let kind = meta.file_type();
        if kind.is_dir() {
            out.extend(tree_hashes(&p));
        } else if kind.is_symlink() {
            out.insert(
                p.clone(),
                format!("link {:?}", std::fs::read_link(&p).unwrap()),
            );
        } else if kind.is_file() {
            out.insert(p.clone(), hex(&Sha256::digest(std::fs::read(&p).unwrap())));
        } else {
            out.insert(p.clone(), "special".into());
        }
    }
    out
}

/// Makes a symbolic link at `link` pointing to `target` (a relative target
/// resolves from the link's folder, as on Unix). Returns false, after printing
/// why, where the platform makes no link: Windows without the symlink
/// privilege or Developer Mode, and Wine 8, whose CreateSymbolicLinkW is a
/// stub that reports success and makes nothing.
pub fn symlink(target: impl AsRef<Path>, link: impl AsRef<Path>) -> bool {
    let (target, link) = (target.as_ref(), link.as_ref());
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink(target, link).unwrap();
        true
    }
    #[cfg(windows)]
    {
        // Windows links want backslashes in a relative target.
        let target = PathBuf::from(target.to_string_lossy().replace('/', "\\"));
        let resolved = link.parent().unwrap().join(&target);
        let made = if resolved.is_dir() {
            std::os::windows::fs::symlink_dir(&target, link)
        } else {
            std::os::windows::fs::symlink_file(&target, link)
        };
        let is_link = link
            .symlink_metadata()
            .is_ok_and(|m| m.file_type().is_symlink());
        match made {
            Ok(()) if is_link => true,
            Ok(()) => {
                eprintln!(
                    "skipped symlink {}: CreateSymbolicLinkW reported success but made nothing (Wine 8 stub)",
                    link.display()
                );
                false
            }
            Err(e) => {
                eprintln!("skipped symlink {}: {e}", link.display());
                false
            }
        }
    }
}

/// Whether this platform makes symbolic links (probed once, in a temp dir).
pub fn symlinks_supported() -> bool {
    static SUPPORTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SUPPORTED.get_or_init(|| {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("target"), "x").unwrap();
        symlink("target", tmp.path().join("link"))
    })
}

/// Whether the tests run under Wine (its ntdll exports `wine_get_version`).
/// Wine 8 does not do all that Windows does: it accepts a Job Object memory
/// limit without enforcing it, and charges a copy-on-write file view to no
/// counter (Windows charges the whole view when it is mapped). Tests that
/// need those print why they skip the assertion.
pub fn under_wine() -> bool {
    #[cfg(windows)]
    {
        use windows_sys::Win32::System::LibraryLoader::{GetModuleHandleA, GetProcAddress};
        // SAFETY: both names are NUL-terminated literals; ntdll is loaded in
        // every Windows process, and a null module handle is checked first.
        unsafe {
            let ntdll = GetModuleHandleA(c"ntdll.dll".as_ptr().cast());
            !ntdll.is_null() && GetProcAddress(ntdll, c"wine_get_version".as_ptr().cast()).is_some()
        }
    }
    #[cfg(not(windows))]
    false
}

/// Whether a commit budget is enforced in the child (an allocation past it
/// fails): `RLIMIT_DATA` on Linux, a Job Object on Windows, but not under
/// Wine, where only the measured peak can fail the check.
pub fn commit_limit_enforced() -> bool {
    if under_wine() {
        eprintln!("note: Wine accepts the Job Object memory limit but does not enforce it; only the measured peak fails the budget here");
        return false;
    }
    true
}

/// What validate's commit figure is read from on this platform.
pub const COMMIT_SOURCE: &str = if cfg!(windows) {
    "PagefileUsage"
} else {
    "VmData"
};
