//! Unit tests of the batch runner.

use super::*;

fn model(dir: &Path, name: &str) -> Model {
    Model {
        name: name.into(),
        source: dir.join("src").join(name),
        output: dir.join("out").join(name),
        hf_cache: false,
    }
}

fn options(mode: Mode, jobs: usize, fail_fast: bool) -> BatchOptions {
    BatchOptions {
        convert: ConvertOptions::default(),
        mode,
        jobs,
        verify_source: false,
        fail_fast,
        fit: None,
        convert_fit: None,
        validate: None,
    }
}

#[test]
fn modes_without_their_options_fail_per_model_naming_the_mode() {
    let tmp = tempfile::tempdir().unwrap();
    let models = [model(tmp.path(), "a"), model(tmp.path(), "b")];
    let pool = WindowPool::new(1 << 20);
    for mode in [Mode::Fit, Mode::Validate] {
        let results = run_batch(
            &models,
            0,
            &options(mode, 2, false),
            &pool,
            &NoBatchReport,
            &AtomicBool::new(false),
        );
        assert_eq!(results.len(), 2);
        for r in &results {
            assert_eq!(r.status, Status::Failed);
            assert_eq!(
                r.reason.as_deref(),
                Some(
                    format!("mode {mode} needs its options (BatchOptions::fit or ::validate)")
                        .as_str()
                )
            );
        }
    }
}

#[test]
fn fail_fast_starts_nothing_after_a_failure() {
    let tmp = tempfile::tempdir().unwrap();
    let models = [
        model(tmp.path(), "a"),
        model(tmp.path(), "b"),
        model(tmp.path(), "c"),
    ];
    let pool = WindowPool::new(1 << 20);
    let results = run_batch(
        &models,
        0,
        &options(Mode::Convert, 1, true),
        &pool,
        &NoBatchReport,
        &AtomicBool::new(false),
    );
    let statuses: Vec<Status> = results.iter().map(|r| r.status).collect();
    assert_eq!(statuses, [Status::Failed, Status::Skipped, Status::Skipped]);
    assert!(results[1]
        .reason
        .as_deref()
        .unwrap()
        .contains("--fail-fast"));
    assert!(
        results[0]
            .reason
            .as_deref()
            .unwrap()
            .contains(&Path::new("src").join("a").display().to_string()),
        "{:?}",
        results[0].reason
    );
}

#[test]
fn only_a_conversion_of_the_same_source_counts_as_ours() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let other = tmp.path().join("other");
    let dst = tmp.path().join("dst");
    for d in [&src, &other, &dst] {
        std::fs::create_dir(d).unwrap();
    }
    assert!(!converted_from(&dst, &src));
    std::fs::write(dst.join("notes.txt"), "mine").unwrap();
    assert!(!converted_from(&dst, &src));
    std::fs::write(dst.join(crate::write::manifest::PARTIAL), "{}").unwrap();
    assert!(
        !converted_from(&dst, &src),
        "a partial manifest is not a conversion"
    );
    let manifest = |root: &Path| {
        serde_json::json!({
            "reshard_version": "0", "plan_id": "p",
            "source": {"dir": "x", "root": root.canonicalize().unwrap().display().to_string(),
                       "format": "safetensors", "files": []},
            "options": crate::plan::PlanOptions::default(), "shards": []
        })
        .to_string()
    };
    std::fs::write(dst.join(MANIFEST), manifest(&other)).unwrap();
    assert!(!converted_from(&dst, &src), "another source's conversion");
    std::fs::write(dst.join(MANIFEST), manifest(&src)).unwrap();
    assert!(converted_from(&dst, &src));
}

/// What one job's reporter was told.
#[derive(Default)]
struct Told {
    total: AtomicUsize,
    advanced: AtomicUsize,
    finished: AtomicBool,
}

impl Reporter for Told {
    fn start(&self, bytes: u64) {
        self.total.store(bytes as usize, Ordering::SeqCst);
    }
    fn advance(&self, bytes: u64) {
        self.advanced.fetch_add(bytes as usize, Ordering::SeqCst);
    }
    fn finish(&self) {
        self.finished.store(true, Ordering::SeqCst);
    }
}

/// Hands every job a [`Told`] and keeps them.
#[derive(Default)]
struct Jobs(Mutex<Vec<Arc<Told>>>);

impl BatchReporter for Jobs {
    fn model_started(&self, _model: &Model) -> Arc<dyn Reporter + Send> {
        let told = Arc::new(Told::default());
        self.0.lock().unwrap().push(told.clone());
        told
    }
}

/// `--mode validate` gave its jobs' reporters nothing (no bar per model,
/// unlike `--mode convert`): the load now reports every byte it reads on
/// the job's reporter, as `validate` does on its bar.
#[test]
fn a_validate_job_reports_every_byte_it_reads_on_its_reporter() {
    let tmp = tempfile::tempdir().unwrap();
    let model = Model {
        name: "tiny-llama".into(),
        source: Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-llama"),
        output: tmp.path().join("out/tiny-llama"),
        hf_cache: false,
    };
    let models = [model];
    let pool = WindowPool::new(1 << 20);
    let cancel = AtomicBool::new(false);
    let converted = run_batch(
        &models,
        0,
        &options(Mode::Convert, 1, false),
        &pool,
        &NoBatchReport,
        &cancel,
    );
    assert_eq!(converted[0].status, Status::Converted, "{converted:?}");
    let mut validate = options(Mode::Validate, 1, false);
    validate.validate = Some(ValidateOptions::default());
    let jobs = Jobs::default();
    let results = run_batch(&models, 0, &validate, &pool, &jobs, &cancel);
    assert_eq!(results[0].status, Status::Passed, "{results:?}");
    let told = &jobs.0.lock().unwrap()[0];
    let total = told.total.load(Ordering::SeqCst) as u64;
    // The output's tensors and the source's, read for the comparison.
    assert!(total >= 2 * results[0].bytes && total > 0, "{total}");
    assert_eq!(told.advanced.load(Ordering::SeqCst) as u64, total);
    assert!(told.finished.load(Ordering::SeqCst));
}
