//! One validation, start to finish, in this process: open the
//! checkpoint, read its manifest, load it on the device or through an
//! emulated loader, compare with a source, report. The budget child
//! ([`super::budget`]) runs the same [`run`] under its limit.

use std::path::Path;

use super::error::ValidateError;
use super::ledger::CommitLedger;
use super::options::{Loader, ValidateOptions};
use super::report::ValidateReport;
use super::{against, device, emulate, integrity, own};
use crate::format;
use crate::write::manifest::{Manifest, MANIFEST};

/// Validates the checkpoint at `path` in this process. A commit budget in
/// `options` is reported against, not enforced: use
/// [`validate_with_budget`] for that.
pub fn validate(path: &Path, options: &ValidateOptions) -> Result<ValidateReport, ValidateError> {
    let mut ledger = CommitLedger::start();
    run(path, options, &mut ledger, |ledger| {
        ledger.rebase();
        Ok(())
    })
}

/// The whole validation, shared by [`validate`] and the budget child.
/// `before_load` runs once the checkpoint is open and the device is ready,
/// just before the first byte is loaded: the child takes its baseline and
/// sets its limit there.
pub(crate) fn run(
    path: &Path,
    options: &ValidateOptions,
    ledger: &mut CommitLedger,
    before_load: impl FnOnce(&mut CommitLedger) -> Result<(), ValidateError>,
) -> Result<ValidateReport, ValidateError> {
    let mut report = ValidateReport::new(path, options);
    let ck = match format::open(path) {
        Ok(ck) => ck,
        Err(e) => match integrity::failure_of_open_error(&e) {
            Some(failure) => {
                report.fail(failure);
                return Ok(report);
            }
            None => return Err(e.into()),
        },
    };
    let manifest = Manifest::read(&ck.dir.join(MANIFEST))?;
    report.manifest = manifest.is_some();
    report.tensors = ck.tensors.len();
    report.files = ck.files.len();
    let expect = integrity::Expected::new(&ck, manifest.as_ref(), &mut report.failures);
    integrity::check_files(&ck.dir, manifest.as_ref(), &mut report.failures);
    let order = own::shard_order(&ck);
    let read = ck.tensors.iter().fold(0u64, |a, t| a.saturating_add(t.len));
    let passes = if options.against.is_some() { 2 } else { 1 };
    options.progress.start(read.saturating_mul(passes));

    match options.emulate {
        Some(Loader::Reshard) => return Err(ValidateError::EmulateReshard),
        Some(loader) => {
            if ck.format != format::Format::Safetensors {
                return Err(ValidateError::EmulateNeedsSafetensors {
                    loader,
                    path: path.to_path_buf(),
                    format: ck.format,
                });
            }
            before_load(ledger)?;
            emulate::run(&ck, &order, loader, &expect, options, ledger, &mut report)?;
        }
        None => {
            let mut device =
                device::open(options.device, device::staging_len(options.staging, &ck))?;
            report.device = device.info();
            // The load hashes on rayon threads (and cast_parallel may use
            // them): start them before the baseline so their stacks are not
            // counted as load.
            ledger.add_thread_stacks(against::warm_threads());
            before_load(ledger)?;
            own::run(
                &ck,
                &order,
                device.as_mut(),
                options,
                &expect,
                ledger,
                &mut report,
            )?;
        }
    }
    if let Some(src) = &options.against {
        let plan_options = manifest.as_ref().map(|m| &m.options);
        let dropped: Vec<(String, String)> = manifest
            .iter()
            .flat_map(|m| {
                m.dropped
                    .iter()
                    .map(|d| (d.tensor.clone(), d.same_as.clone()))
            })
            .collect();
        let result = against::compare(
            &ck,
            src,
            plan_options,
            &dropped,
            options,
            ledger,
            &mut report,
        );
        result.map_err(|e| match e {
            e @ ValidateError::Interrupted { .. } => e,
            e => ValidateError::Against {
                path: src.clone(),
                source: Box::new(e),
            },
        })?;
    }
    // Ctrl-C after the last loop's poll still keeps "passed" from being said.
    if options.cancel.is_set() {
        return Err(ValidateError::Interrupted {
            path: path.to_path_buf(),
        });
    }
    options.progress.finish();
    report.commit = Some(ledger.figures());
    report.finish(options);
    Ok(report)
}
