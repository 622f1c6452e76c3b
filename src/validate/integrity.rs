//! Integrity: every tensor exactly once, and the bytes `reshard.json`
//! promises.
//!
//! [`Expected`] cross-checks the set of tensors the files hold against the
//! index (through [`crate::format::open`]'s findings) and the manifest, and
//! records what each file and tensor should hash to. [`ShardCheck`] hashes a
//! shard's bytes as the load step streams them, so each file is read once.
//! [`check_files`] checks the files written beside the shards (index,
//! configs, tokenizer and mirrored files) against their recorded digests.

use std::path::Path;

use super::report::Failure;
use crate::format::{Checkpoint, Finding, FormatError};
use crate::write::digest::{digest_file, DigestAlgo, ShardHasher};
use crate::write::manifest::{Manifest, ShardRecord, TensorRecord};

/// Turns the errors of [`crate::format::open`] that mean "a tensor is
/// missing or listed twice" into failures; other errors stay errors.
pub fn failure_of_open_error(e: &FormatError) -> Option<Failure> {
    let name = |p: &std::path::Path| {
        p.file_name().map_or_else(
            || p.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        )
    };
    match e {
        FormatError::IndexTensorMissing { path, tensor, file } => Some(Failure::MissingTensor {
            tensor: tensor.clone(),
            file: file.clone(),
            reason: format!("{} maps it to {file}, which does not hold it", name(path)),
        }),
        FormatError::IndexMissingFile { path, tensor, file } => Some(Failure::MissingTensor {
            tensor: tensor.clone(),
            file: file.clone(),
            reason: format!("{} maps it to {file}, which does not exist", name(path)),
        }),
        FormatError::TensorInTwoFiles {
            tensor,
            first,
            second,
        } => Some(Failure::UnlistedTensor {
            tensor: tensor.clone(),
            file: name(second),
            reason: format!(
                "is also in {}; a tensor must be stored exactly once",
                name(first)
            ),
        }),
        _ => None,
    }
}

/// Checks every file reshard.json records writing beside the shards (the
/// index, config.json, tokenizer and other mirrored files): each must be a
/// regular file in `dir` of the recorded size and digest.
pub fn check_files(dir: &Path, manifest: Option<&Manifest>, failures: &mut Vec<Failure>) {
    for r in manifest.iter().flat_map(|m| &m.files) {
        let changed = |reason: String| Failure::FileChanged {
            file: r.name.clone(),
            reason,
        };
        if !crate::names::is_plain_relative(&r.name) {
            failures.push(changed(
                "reshard.json records a name that is not a plain path in the output".into(),
            ));
            continue;
        }
        let path = dir.join(&r.name);
        match std::fs::symlink_metadata(&path) {
            Err(_) => failures.push(changed("listed in reshard.json but not found".into())),
            Ok(m) if !m.file_type().is_file() => failures.push(changed(
                "not a regular file (a symlink or a folder), though reshard wrote one".into(),
            )),
            Ok(m) if m.len() != r.size => failures.push(changed(format!(
                "{} bytes, reshard.json says {}",
                m.len(),
                r.size
            ))),
            Ok(_) => match digest_file(&path, r.digest.algo()) {
                Ok(d) if d == r.digest => {}
                Ok(d) => failures.push(changed(format!(
                    "changed since reshard wrote it: its digest is {d}, reshard.json says {}",
                    r.digest
                ))),
                Err(e) => failures.push(changed(format!("cannot read it: {e}"))),
            },
        }
    }
}

/// What each file and tensor of a checkpoint should be, from its manifest.
pub struct Expected<'a> {
    /// By file index of the checkpoint.
    shards: Vec<Option<&'a ShardRecord>>,
    /// By tensor index of the checkpoint.
    tensors: Vec<Option<&'a TensorRecord>>,
}

impl<'a> Expected<'a> {
    /// Cross-checks `ck` against its index findings and `manifest`,
    /// pushing a failure for every tensor missing or unlisted on either side.
    pub fn new(
        ck: &Checkpoint,
        manifest: Option<&'a Manifest>,
        failures: &mut Vec<Failure>,
    ) -> Expected<'a> {
        for finding in &ck.findings {
            if let Finding::TensorNotInIndex { tensor, file } = finding {
                failures.push(Failure::UnlistedTensor {
                    tensor: tensor.clone(),
                    file: file.clone(),
                    reason: "is not in the index; loaders that go by the index never load it"
                        .into(),
                });
            }
        }
        let mut expected = Expected {
            shards: vec![None; ck.files.len()],
            tensors: vec![None; ck.tensors.len()],
        };
        let Some(manifest) = manifest else {
            return expected;
        };
        let file_names: Vec<String> = ck.files.iter().map(|f| f.name()).collect();
        let by_name: std::collections::HashMap<&str, usize> = ck
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.as_str(), i))
            .collect();
        for shard in &manifest.shards {
            let Some(file) = file_names.iter().position(|n| *n == shard.file) else {
                failures.push(Failure::MissingShard {
                    file: shard.file.clone(),
                });
                continue;
            };
            expected.shards[file] = Some(shard);
            if ck.files[file].size != shard.size {
                failures.push(Failure::ShardSize {
                    file: shard.file.clone(),
                    expected: shard.size,
                    actual: ck.files[file].size,
                });
            }
            for record in &shard.tensors {
                let Some(&i) = by_name.get(record.name.as_str()) else {
                    failures.push(Failure::MissingTensor {
                        tensor: record.name.clone(),
                        file: shard.file.clone(),
                        reason: "reshard.json lists it but no file holds it".into(),
                    });
                    continue;
                };
                let t = &ck.tensors[i];
                if t.file != file {
                    failures.push(Failure::TensorMeta {
                        file: file_names[t.file].clone(),
                        tensor: t.name.clone(),
                        reason: format!("reshard.json lists it in {}", shard.file),
                    });
                } else if t.dtype != record.dtype || t.shape != record.shape {
                    failures.push(Failure::TensorMeta {
                        file: shard.file.clone(),
                        tensor: t.name.clone(),
                        reason: format!(
                            "is {} {:?} but reshard.json says {} {:?}",
                            t.dtype, t.shape, record.dtype, record.shape
                        ),
                    });
                }
                expected.tensors[i] = Some(record);
            }
        }
        for (i, t) in ck.tensors.iter().enumerate() {
            if expected.tensors[i].is_none() {
                failures.push(Failure::UnlistedTensor {
                    tensor: t.name.clone(),
                    file: file_names[t.file].clone(),
                    reason: "is not in reshard.json".into(),
                });
            }
        }
        expected
    }

    /// The manifest's record of file `file`, if any.
    pub fn shard(&self, file: usize) -> Option<&'a ShardRecord> {
        self.shards[file]
    }

    /// Compares a tensor's xxh3 with the manifest's, if it lists one.
    pub fn check_tensor(
        &self,
        ck: &Checkpoint,
        tensor: usize,
        xxh3: u64,
        failures: &mut Vec<Failure>,
    ) {
        let Some(record) = self.tensors[tensor] else {
            return;
        };
        let actual = format!("{xxh3:016x}");
        if actual != record.xxh3 {
            let t = &ck.tensors[tensor];
            failures.push(Failure::TensorChecksum {
                file: ck.files[t.file].name(),
                tensor: t.name.clone(),
                expected: record.xxh3.clone(),
                actual,
            });
        }
    }
}

/// The digest of one shard (with the algorithm its record names: BLAKE3,
/// or sha256 in older manifests and with `--sha256`), fed with its bytes in
/// file order.
pub struct ShardCheck<'a> {
    record: Option<&'a ShardRecord>,
    hash: ShardHasher,
    /// Bytes hashed so far: the file position the next bytes must start at.
    pub pos: u64,
}

impl<'a> ShardCheck<'a> {
    /// A check against `record`; without one, nothing is hashed.
    pub fn new(record: Option<&'a ShardRecord>) -> ShardCheck<'a> {
        ShardCheck {
            record,
            hash: ShardHasher::new(record.map_or(DigestAlgo::Blake3, |r| r.digest.algo())),
            pos: 0,
        }
    }

    /// Whether there is a checksum to compare with.
    pub fn active(&self) -> bool {
        self.record.is_some()
    }

    /// Hashes the next bytes of the file.
    pub fn update(&mut self, bytes: &[u8]) {
        if self.record.is_some() {
            self.hash.update(bytes);
            self.pos += bytes.len() as u64;
        }
    }

    /// Compares the digest of everything hashed with the manifest's.
    pub fn finish(self, failures: &mut Vec<Failure>) {
        if let Some(record) = self.record {
            let actual = self.hash.finish();
            if actual != record.digest {
                failures.push(Failure::ShardChecksum {
                    file: record.file.clone(),
                    expected: record.digest.to_string(),
                    actual: actual.to_string(),
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn index_errors_become_failures_naming_the_tensor() {
        let e = FormatError::IndexTensorMissing {
            path: PathBuf::from("/x/model.safetensors.index.json"),
            tensor: "a.weight".into(),
            file: "model-00001-of-00002.safetensors".into(),
        };
        let f = failure_of_open_error(&e).unwrap();
        let text = f.to_string();
        assert!(
            text.contains("a.weight") && text.contains("model-00001-of-00002.safetensors"),
            "{text}"
        );
        assert!(failure_of_open_error(&FormatError::NotFound {
            path: PathBuf::from("/x")
        })
        .is_none());
    }

    #[test]
    fn shard_check_uses_the_recorded_algorithm() {
        for algo in [DigestAlgo::Blake3, DigestAlgo::Sha256] {
            let mut h = ShardHasher::new(algo);
            h.update(b"abc");
            let record = ShardRecord {
                file: "a.safetensors".into(),
                size: 3,
                digest: h.finish(),
                tensors: vec![],
            };
            let mut ok = ShardCheck::new(Some(&record));
            ok.update(b"ab");
            ok.update(b"c");
            let mut failures = vec![];
            ok.finish(&mut failures);
            assert!(failures.is_empty(), "{algo:?}: {failures:?}");
            let mut bad = ShardCheck::new(Some(&record));
            bad.update(b"abd");
            bad.finish(&mut failures);
            match &failures[..] {
                [Failure::ShardChecksum { expected, .. }] => {
                    assert!(expected.starts_with(algo.name()), "{expected}")
                }
                other => panic!("{algo:?}: {other:?}"),
            }
        }
    }
}
