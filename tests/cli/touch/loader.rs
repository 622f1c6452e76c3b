//! `validate --loader python:NAME` (issue 30): the user's Python never
//! imports code from the model folder or the folder reshard was started
//! in, and a loader's workers, even in a session of their own, end with it.

use std::path::{Path, PathBuf};

use crate::common::*;

/// The test Python, or any `python3` on PATH: the planted modules are
/// found (without the fix) whether or not the real libraries are installed.
fn any_python() -> Option<PathBuf> {
    if let Some(p) = python() {
        return Some(p);
    }
    let p = PathBuf::from(if cfg!(windows) { "python" } else { "python3" });
    let ok = std::process::Command::new(&p)
        .args(["-c", "pass"])
        .output()
        .is_ok_and(|o| o.status.success());
    ok.then_some(p)
}

/// Modules a model folder might hold, each writing `marks/NAME` when run.
const PLANTED: [&str; 7] = [
    "safetensors",
    "torch",
    "transformers",
    "json",
    "time",
    "sitecustomize",
    "usercustomize",
];

fn plant(dir: &Path, marks: &Path) {
    for name in PLANTED {
        let mark = marks.join(name);
        std::fs::write(
            dir.join(format!("{name}.py")),
            format!("open({:?}, 'w').write('ran')\n", mark.display().to_string()),
        )
        .unwrap();
    }
}

fn marks_written(marks: &Path) -> Vec<String> {
    std::fs::read_dir(marks)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

#[test]
fn loader_python_never_imports_the_model_folder_or_the_working_folder() {
    let Some(py) = any_python() else {
        eprintln!("skipped: no python");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let marks = tmp.path().join("marks");
    std::fs::create_dir(&marks).unwrap();
    let model = copy_fixture("tiny-llama", tmp.path());
    plant(&model, &marks);
    let elsewhere = tmp.path().join("cwd");
    std::fs::create_dir(&elsewhere).unwrap();
    plant(&elsewhere, &marks);
    // PYTHONPATH still reaches the user's Python (no -I): its
    // sitecustomize runs at startup.
    let user = tmp.path().join("user-path");
    std::fs::create_dir(&user).unwrap();
    let user_mark = tmp.path().join("user-path-ran");
    std::fs::write(
        user.join("sitecustomize.py"),
        format!(
            "open({:?}, 'w').write('ran')\n",
            user_mark.display().to_string()
        ),
    )
    .unwrap();
    // Started in the model folder with a relative path, and elsewhere with
    // the folder's absolute path; every loader.
    for (cwd, path) in [(&model, PathBuf::from(".")), (&elsewhere, model.clone())] {
        for loader in ["python:safetensors", "python:transformers"] {
            let out = reshard()
                .current_dir(cwd)
                .env("PYTHONPATH", &user)
                .args(["validate", "--loader", loader, "--python"])
                .arg(&py)
                .arg(&path)
                .timeout(std::time::Duration::from_secs(300))
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(
                marks_written(&marks),
                Vec::<String>::new(),
                "{loader}: {err}"
            );
            // Loaded (the test venv) or a missing library named, never a
            // planted module's doing.
            assert!(
                out.status.success() || err.contains("cannot import"),
                "{loader} in {}: {err}",
                cwd.display()
            );
            assert!(user_mark.exists(), "PYTHONPATH was dropped: {err}");
            std::fs::remove_file(&user_mark).unwrap();
        }
    }
}

/// A fake python that starts a worker in a session of its own (`setsid`),
/// which keeps stdout and stderr open for 300 s, writes the worker's pid
/// and its own to `NAME.pids`, says it is ready, and then runs `then`.
#[cfg(target_os = "linux")]
fn loader_with_a_setsid_worker(dir: &Path, name: &str, then: &str) -> (PathBuf, PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let pids = dir.join(format!("{name}.pids"));
    let fake = dir.join(format!("python-{name}"));
    std::fs::write(
        &fake,
        format!(
            "#!/bin/sh\nsetsid sleep 300 &\necho $! > '{p}'\necho $$ >> '{p}'\n\
             printf 'RESHARD-READY\\n' >&2\nread go\n{then}\n",
            p = pids.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    (fake, pids)
}

/// A worker in its own session is out of reach of a process-group kill
/// and held the pipes open: reshard waited for it (300 s here, forever for
/// a daemon) after the loader exited, and left it running after a timeout.
/// Now reshard is a child subreaper and kills every descendant, reads the
/// pipes only until the deadline, and reports what happened.
#[cfg(target_os = "linux")]
#[test]
fn loader_timeout_holds_when_a_worker_in_its_own_session_keeps_the_pipes_open() {
    let tmp = tempfile::tempdir().unwrap();
    let result = r#"echo '{"outcome": "loaded", "tensors": 1, "bytes": 4, "seconds": 0.1}'"#;
    for (case, then) in [("exits", result), ("hangs", "sleep 300")] {
        let (fake, pids) = loader_with_a_setsid_worker(tmp.path(), case, then);
        let started = std::time::Instant::now();
        let out = reshard()
            .args(["validate", "--loader", "python:transformers"])
            .args(["--loader-timeout", "3s", "--python"])
            .arg(&fake)
            .arg(fixture("tiny-llama"))
            .timeout(std::time::Duration::from_secs(100))
            .output()
            .unwrap();
        let took = started.elapsed();
        let err = String::from_utf8_lossy(&out.stderr);
        // Generous for a loaded machine; without the fix it is 300 s.
        assert!(took.as_secs() < 60, "{case}: {took:?}: {err}");
        if case == "hangs" {
            assert_eq!(out.status.code(), Some(2), "{case}: {err}");
            assert!(err.contains("no result after 3s"), "{case}: {err}");
        } else {
            assert!(!err.contains("no result after"), "{case}: {err}");
        }
        crate::loaders::assert_all_ended(case, &pids);
    }
}

/// `validate --loader python:diffusers` on a pipeline folder (what
/// docs/validate.md says it takes) exited 2 "no checkpoint found" before
/// Python started: the folder holds its weights in component folders. It
/// now loads the pipeline, predicted from all its weight sets together.
#[test]
fn python_diffusers_loads_a_pipeline_folder() {
    let Some(py) = python_with("torch, transformers, diffusers") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/layouts_check.py");
    run_python(
        &py,
        Program::Script(&script),
        &[std::ffi::OsStr::new("build-sd"), tmp.path().as_os_str()],
    );
    let sd = tmp.path().join("sd");
    assert!(sd.join("model_index.json").exists());
    assert!(!sd.join("model.safetensors").exists(), "not a pipeline");
    let out = reshard()
        .args([
            "validate",
            "--loader",
            "python:diffusers",
            "--json",
            "--python",
        ])
        .arg(&py)
        .arg(&sd)
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
        panic!("{}", String::from_utf8_lossy(&out.stderr));
    });
    assert_eq!(out.status.code(), Some(0), "{report}");
    assert_eq!(report["passed"], true, "{report}");
    // Every component's weights were loaded (the library may add buffers
    // it builds itself, such as position ids), not one folder's.
    let stored: u64 = ["unet", "vae", "text_encoder"]
        .iter()
        .map(|c| {
            let out = reshard()
                .args(["inspect", "--json"])
                .arg(sd.join(c))
                .output()
                .unwrap();
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            v["tensor_count"].as_u64().unwrap()
        })
        .sum();
    let loaded = report["tensors"].as_u64().unwrap();
    assert!(
        loaded >= stored,
        "loaded {loaded} of {stored} tensors: {report}"
    );
    assert!(
        report["prediction"]["peak_commit"].as_u64().unwrap() > 0,
        "{report}"
    );
}
