//! The names a plan writes: every output name, read or derived, passes the
//! reader's rules before anything is written.
//!
//! The reader refuses a source whose names a safetensors header cannot hold
//! ([`crate::format::tensor_names`]). The planner derives names the reader
//! never saw: a component prefix stripped (`--split-components`), a
//! scheme's suffix rule (gpt-oss's `*_blocks` dropping `_blocks`), a GGUF
//! name mapped to Hugging Face's, a scale named after its weight. Each
//! such rule used to guard only what it thought of; here one pass over the
//! planned tensors applies the reader's two rules to all of them, so a new
//! rule cannot write `__metadata__`, `""` or a name twice.

use super::{PlanError, PlannedTensor};
use crate::format::tensor_names::{first_repeat, unholdable};
use crate::format::Checkpoint;

/// Refuses the first planned tensor whose name a header cannot hold, then
/// the first name two planned tensors share, naming the source file and
/// the source tensor each is made from.
pub(crate) fn check(ck: &Checkpoint, planned: &[PlannedTensor]) -> Result<(), PlanError> {
    let source = |t: &PlannedTensor| {
        let s = &ck.tensors[t.input.primary()];
        (ck.file_of(s).name(), s.name.clone())
    };
    if let Some((t, reason)) = planned
        .iter()
        .find_map(|t| unholdable(&t.name).map(|r| (t, r)))
    {
        let (file, tensor) = source(t);
        return Err(PlanError::BadOutputName {
            file,
            tensor,
            name: t.name.clone(),
            reason,
        });
    }
    let Some((a, b)) = first_repeat(planned.len(), |i| (planned[i].name.as_str(), i)) else {
        return Ok(());
    };
    let ((file, first), (_, second)) = (source(&planned[a]), source(&planned[b]));
    Err(PlanError::OutputNameTwice {
        file,
        first,
        second,
        name: planned[a].name.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{DataRef, Dtype, Format, Layout, SourceFile, Tensor};
    use crate::plan::TensorInput;

    fn ck() -> Checkpoint {
        let tensor = |name: &str| Tensor {
            name: name.into(),
            dtype: Dtype::U8,
            shape: vec![1],
            len: 1,
            file: 0,
            data: DataRef::Contiguous { offset: 0 },
        };
        Checkpoint {
            dir: "m".into(),
            format: Format::Safetensors,
            layout: Layout::Single,
            prefix: "model".into(),
            files: vec![SourceFile {
                path: "m/model.safetensors".into(),
                size: 2,
                mtime_ns: 0,
            }],
            tensors: vec![tensor("a_blocks"), tensor("b")],
            metadata: Default::default(),
            findings: Vec::new(),
        }
    }

    fn planned(name: &str, tensor: usize) -> PlannedTensor {
        PlannedTensor {
            name: name.into(),
            input: TensorInput::Source { tensor },
            source_dtype: Dtype::U8,
            dtype: Dtype::U8,
            shape: vec![1],
            len: 1,
            offset: 0,
            after: None,
        }
    }

    #[test]
    fn derived_names_pass_the_readers_rules_naming_the_source() {
        let ck = ck();
        check(&ck, &[planned("a", 0), planned("b", 1)]).unwrap();
        for bad in ["", "__metadata__"] {
            let err = check(&ck, &[planned(bad, 0), planned("b", 1)]).unwrap_err();
            assert!(
                matches!(&err, PlanError::BadOutputName { file, tensor, name, .. }
                    if file == "model.safetensors" && tensor == "a_blocks" && name == bad),
                "{err}"
            );
        }
        let err = check(&ck, &[planned("b", 0), planned("b", 1)]).unwrap_err();
        assert!(
            matches!(&err, PlanError::OutputNameTwice { first, second, .. }
                if first == "a_blocks" && second == "b"),
            "{err}"
        );
    }
}
