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
