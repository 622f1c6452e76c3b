//! The output-format seam: everything that depends on which format a plan
//! writes, behind one trait.
//!
//! [`ShardFormat`] extends the planner's [`ShardLayout`] (file names, the
//! index name, where each tensor of a shard goes, the metadata each shard
//! carries) with the bytes only a writer makes: a shard's header and the
//! index file. exec, convert and fit ask [`of`] for the format of
//! a plan's `options.format` and go through it; nothing else in the crate
//! knows a safetensors header or index from another format's.
//!
//! [`Safetensors`] is the first implementation: `<prefix>.safetensors`
//! alone, or `<prefix>-00001-of-0000N.safetensors` with
//! `<prefix>.safetensors.index.json`; tensors grouped by descending
//! alignment so every offset is a multiple of its element size with no
//! holes; `"format": "pt"` in `__metadata__`, which transformers and
//! accelerate ask for. A new format (GGUF) is one more implementation here
//! and one more [`OutputFormat`] tag: [`super::gguf::Gguf`].

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use super::WriteError;
use crate::plan::{OutputFormat, Plan, PlannedTensor, ShardLayout, ShardPlan};

pub use super::shard_format::ShardFormat;

/// The format a plan's `options.format` names.
pub fn of(format: OutputFormat) -> &'static dyn ShardFormat {
    match format {
        OutputFormat::Safetensors => &Safetensors,
        OutputFormat::Gguf => &super::gguf::Gguf,
    }
}

/// Plans the conversion of `ck` under `options` in the output format
/// `options.format` names: [`Plan::build`] with that format's layout.
pub fn plan(
    ck: &crate::format::Checkpoint,
    options: &crate::plan::PlanOptions,
) -> Result<Plan, crate::plan::PlanError> {
    Plan::build(ck, options, of(options.format).layout())
}

/// The format `plan` writes.
pub fn of_plan(plan: &Plan) -> &'static dyn ShardFormat {
    of(plan.options.format)
}

/// Builds every shard's header of `plan` once, and drops it: a header its
/// format's reader would refuse (over its size limit) is refused before
/// anything is written, naming the shard.
pub fn check_headers(plan: &Plan) -> Result<(), WriteError> {
    let format = of_plan(plan);
    for s in &plan.shards {
        format.header_bytes(Path::new(&s.file), plan, s)?;
    }
    Ok(())
}

/// safetensors shards with a Hugging Face index.
pub struct Safetensors;

impl ShardLayout for Safetensors {
    fn shard_name(&self, prefix: &str, n: usize, count: usize) -> String {
        if count <= 1 {
            format!("{prefix}.safetensors")
        } else {
            format!("{prefix}-{:05}-of-{count:05}.safetensors", n + 1)
        }
    }

    fn index_name(&self, prefix: &str, count: usize) -> Option<String> {
        (count > 1).then(|| format!("{prefix}.safetensors.index.json"))
    }

    /// Layer order, stably regrouped by descending alignment so every
    /// offset is a multiple of its element size, no holes; a tensor with
    /// `after` sits right after that tensor where its own offset and every
    /// later one stay aligned, and in its alignment group otherwise.
    fn lay_out(&self, tensors: &mut [PlannedTensor]) -> u64 {
        let order = aligned_order(tensors);
        let mut sorted: Vec<PlannedTensor> = order.iter().map(|&i| tensors[i].clone()).collect();
        let mut offset = 0u64;
        for t in sorted.iter_mut() {
            t.offset = offset;
            offset = offset.saturating_add(t.len);
        }
        tensors.clone_from_slice(&sorted);
        offset
    }

    fn shard_metadata(&self, source: &BTreeMap<String, String>) -> BTreeMap<String, String> {
        let mut metadata = source.clone();
        metadata.insert("format".into(), "pt".into());
        metadata
    }
}

impl ShardFormat for Safetensors {
    fn layout(&self) -> &dyn ShardLayout {
        self
    }

    fn header_bytes(
        &self,
        path: &Path,
        plan: &Plan,
        shard: &ShardPlan,
    ) -> Result<Vec<u8>, WriteError> {
        safetensors_header(path, shard, &plan.metadata)
    }

    fn index_bytes(&self, plan: &Plan) -> Vec<u8> {
        index_json(plan)
    }
}

/// The header of a shard: 8-byte little-endian length, then JSON padded with
/// spaces to a multiple of 8 so the data section starts 8-aligned.
///
/// Built through the safetensors crate's `Metadata`, which checks the
/// offsets, and serialized in our order (the crate's `serialize_to_file`
/// would re-sort by dtype and name).
fn safetensors_header(
    path: &Path,
    shard: &ShardPlan,
    metadata: &std::collections::BTreeMap<String, String>,
) -> Result<Vec<u8>, WriteError> {
    use safetensors::tensor::{Metadata, TensorInfo};
    let bad = |reason: String| WriteError::Header {
        path: path.to_path_buf(),
        reason,
    };
    check_metadata_len(path, metadata)?;
    let metadata_bytes = metadata_len(metadata);
    let tensors = shard
        .tensors
        .iter()
        .map(|t| {
            let shape = t
                .shape
                .iter()
                .map(|&d| usize::try_from(d))
                .collect::<Result<Vec<_>, _>>();
            let begin = usize::try_from(t.offset);
            let end = usize::try_from(t.offset + t.len);
            match (shape, begin, end) {
                (Ok(shape), Ok(b), Ok(e)) => Ok((
                    t.name.clone(),
                    TensorInfo {
                        dtype: t.dtype.to_safetensors(),
                        shape,
                        data_offsets: (b, e),
                    },
                )),
                _ => Err(bad(format!(
                    "tensor {:?} does not fit this platform's usize",
                    t.name
                ))),
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    let meta: HashMap<String, String> = metadata
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let metadata = Metadata::new(Some(meta), tensors).map_err(|e| bad(e.to_string()))?;
    let json = serde_json::to_vec(&metadata).map_err(|e| bad(e.to_string()))?;
    let mut json = sorted_metadata(json).map_err(|e| bad(e.to_string()))?;
    while json.len() % 8 != 0 {
        json.push(b' ');
    }
    let max = crate::format::safetensors::MAX_HEADER;
    if json.len() as u64 > max {
        return Err(WriteError::HeaderTooLarge {
            path: path.to_path_buf(),
            len: json.len() as u64,
            max,
            what: format!(
                "{} tensor entries and a __metadata__ of {} bytes",
                shard.tensors.len(),
                metadata_bytes
            ),
        });
    }
    let mut out = Vec::with_capacity(8 + json.len());
    out.extend_from_slice(&(json.len() as u64).to_le_bytes());
    out.extend_from_slice(&json);
    Ok(out)
}

/// Refuses, before any JSON is built, metadata whose keys and values alone
/// are longer than the reader's header limit (the merged `__metadata__` of
/// several source shards), naming its largest key.
fn check_metadata_len(path: &Path, metadata: &BTreeMap<String, String>) -> Result<(), WriteError> {
    let len = metadata_len(metadata);
    let max = crate::format::safetensors::MAX_HEADER;
    if len <= max {
        return Ok(());
    }
    let (key, value) = metadata
        .iter()
        .max_by_key(|&(k, v)| k.len().saturating_add(v.len()))
        .map_or(("", 0), |(k, v)| (k.as_str(), v.len()));
    Err(WriteError::HeaderTooLarge {
        path: path.to_path_buf(),
        len,
        max,
        what: format!(
            "its __metadata__ ({} keys, merged from the source) holds {len} bytes; the largest is {:?} ({value} bytes)",
            metadata.len(),
            crate::names::escape(key)
        ),
    })
}

/// Bytes of `metadata`'s keys and values: less than its JSON.
fn metadata_len(metadata: &BTreeMap<String, String>) -> u64 {
    metadata
        .iter()
        .map(|(k, v)| (k.len() as u64).saturating_add(v.len() as u64))
        .fold(0, u64::saturating_add)
}

/// The order of `tensors` in a safetensors shard (see
/// [`Safetensors::lay_out`]). Without `after` links this is the stable sort
/// by descending alignment, which keeps every offset aligned because each
/// group's total length is a multiple of its alignment and alignments are
/// powers of two. A follower goes right after its tensor when its offset
/// there is aligned and its length keeps the next tensor's alignment (the
/// largest of all later ones); otherwise it joins its alignment group.
/// Should a combination still misalign a tensor, every follower joins its
/// group: the plain sort, always valid.
fn aligned_order(tensors: &[PlannedTensor]) -> Vec<usize> {
    let align = |i: usize| tensors[i].dtype.alignment().max(1);
    let by_align = |mut v: Vec<usize>| {
        v.sort_by_key(|&i| std::cmp::Reverse(align(i)));
        v
    };
    let index: HashMap<&str, usize> = tensors
        .iter()
        .enumerate()
        .map(|(i, t)| (t.name.as_str(), i))
        .collect();
    // A follower of a tensor in this shard that is not a follower itself.
    let target = |i: usize| {
        let t = index.get(tensors[i].after.as_deref()?).copied()?;
        tensors[t].after.is_none().then_some(t)
    };
    let (followers, base): (Vec<usize>, Vec<usize>) =
        (0..tensors.len()).partition(|&i| target(i).is_some());
    if followers.is_empty() {
        return by_align(base);
    }
    let base = by_align(base);
    let mut after: HashMap<usize, Vec<usize>> = HashMap::new();
    for &f in &followers {
        if let Some(t) = target(f) {
            after.entry(t).or_default().push(f);
        }
    }
    let mut placed = Vec::with_capacity(tensors.len());
    let mut deferred = Vec::new();
    let mut offset = 0u64;
    for (k, &i) in base.iter().enumerate() {
        placed.push(i);
        offset = offset.saturating_add(tensors[i].len);
        let next = base.get(k + 1).map_or(1, |&n| align(n));
        for &f in after.get(&i).map_or(&[][..], Vec::as_slice) {
            let len = tensors[f].len;
            if offset.is_multiple_of(align(f)) && len.is_multiple_of(next) {
                placed.push(f);
                offset = offset.saturating_add(len);
            } else {
                deferred.push(f);
            }
        }
    }
    // Each deferred follower joins the end of its alignment group (one
    // merge: a shard may hold a follower per tensor).
    let deferred = by_align(deferred);
    let mut merged = Vec::with_capacity(placed.len() + deferred.len());
    let mut rest = deferred.into_iter().peekable();
    for i in placed {
        while let Some(&f) = rest.peek() {
            if align(f) <= align(i) {
                break;
            }
            merged.push(f);
            rest.next();
        }
        merged.push(i);
    }
    merged.extend(rest);
    let placed = merged;
    let mut offset = 0u64;
    for &i in &placed {
        if !offset.is_multiple_of(align(i)) {
            return by_align((0..tensors.len()).collect());
        }
        offset = offset.saturating_add(tensors[i].len);
    }
    placed
}

/// The header JSON with its `__metadata__` keys in sorted order. The
/// safetensors crate keeps metadata in a `HashMap`, whose order differs
/// from one map to the next: with more than one key, two runs wrote
/// different bytes for the same plan. Tensors keep the plan's order
/// (serde_json's `preserve_order`), and the text is serde_json's compact
/// form, as the crate writes it.
fn sorted_metadata(json: Vec<u8>) -> Result<Vec<u8>, serde_json::Error> {
    let mut value: serde_json::Value = serde_json::from_slice(&json)?;
    let Some(meta) = value
        .get_mut(crate::names::METADATA_KEY)
        .and_then(serde_json::Value::as_object_mut)
    else {
        return Ok(json);
    };
    if meta.len() < 2 {
        return Ok(json);
    }
    meta.sort_keys();
    serde_json::to_vec(&value)
}

/// The Hugging Face index: `{"metadata": {"total_size": N}, "weight_map":
/// {tensor: file}}`, with the weight map in layer order so a reader of the
/// index sees the load order. transformers raises without `metadata`.
fn index_json(plan: &Plan) -> Vec<u8> {
    let file_of: std::collections::HashMap<&str, &str> = plan
        .shards
        .iter()
        .flat_map(|s| {
            s.tensors
                .iter()
                .map(move |t| (t.name.as_str(), s.file.as_str()))
        })
        .collect();
    let mut weight_map = serde_json::Map::new();
    for name in &plan.layer_order {
        if let Some(file) = file_of.get(name.as_str()) {
            weight_map.insert(name.clone(), serde_json::Value::String((*file).to_string()));
        }
    }
    let value = serde_json::json!({
        "metadata": { "total_size": plan.total_size },
        "weight_map": weight_map,
    });
    let mut bytes = serde_json::to_vec_pretty(&value).unwrap_or_default();
    bytes.push(b'\n');
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::Dtype;
    use crate::plan::TensorInput;

    fn shard() -> ShardPlan {
        let t = |name: &str, offset: u64| PlannedTensor {
            name: name.into(),
            input: TensorInput::Source { tensor: 0 },
            source_dtype: Dtype::F32,
            dtype: Dtype::F32,
            shape: vec![2],
            len: 8,
            offset,
            after: None,
        };
        ShardPlan {
            file: "model.safetensors".into(),
            tensors: vec![t("b", 0), t("a", 8)],
            data_len: 16,
            first_block: None,
            last_block: None,
        }
    }

    #[test]
    fn headers_are_the_same_bytes_every_time_with_metadata_sorted() {
        let metadata: BTreeMap<String, String> = (0..8)
            .map(|i| (format!("key{i}"), format!("value {i}")))
            .collect();
        let first = safetensors_header(Path::new("m"), &shard(), &metadata).unwrap();
        for _ in 0..20 {
            let again = safetensors_header(Path::new("m"), &shard(), &metadata).unwrap();
            assert_eq!(again, first);
        }
        let text = String::from_utf8_lossy(&first[8..]).trim_end().to_string();
        let at = |k: &str| text.find(k).unwrap();
        assert!((0..7).all(|i| at(&format!("key{i}")) < at(&format!("key{}", i + 1))));
        // Tensors stay in the plan's order, not sorted.
        assert!(at("\"b\"") < at("\"a\""), "{text}");
    }

    fn tensor(name: &str, dtype: Dtype, len: u64, after: Option<&str>) -> PlannedTensor {
        PlannedTensor {
            name: name.into(),
            input: TensorInput::Source { tensor: 0 },
            source_dtype: dtype,
            dtype,
            shape: vec![len / dtype.alignment()],
            len,
            offset: 0,
            after: after.map(str::to_string),
        }
    }

    /// Lays `tensors` out and checks what every layout must hold: each
    /// tensor once, offsets aligned and contiguous. Returns the names in
    /// file order.
    fn lay_out(mut tensors: Vec<PlannedTensor>) -> Vec<String> {
        let names: std::collections::BTreeSet<String> =
            tensors.iter().map(|t| t.name.clone()).collect();
        let total: u64 = tensors.iter().map(|t| t.len).sum();
        assert_eq!(Safetensors.lay_out(&mut tensors), total);
        let mut offset = 0;
        for t in &tensors {
            assert_eq!(t.offset, offset, "{} leaves a hole", t.name);
            assert_eq!(t.offset % t.dtype.alignment(), 0, "{} misaligned", t.name);
            offset += t.len;
        }
        let order: Vec<String> = tensors.iter().map(|t| t.name.clone()).collect();
        assert_eq!(
            order
                .iter()
                .cloned()
                .collect::<std::collections::BTreeSet<_>>(),
            names
        );
        order
    }

    #[test]
    fn a_scale_follows_its_weight_where_alignment_allows() {
        // An F8 weight of 12 bytes ends 4-aligned: its F32 scale goes
        // right after it, then the next F8 weight.
        let order = lay_out(vec![
            tensor("norm", Dtype::F32, 16, None),
            tensor("a.weight", Dtype::F8_E4M3, 12, None),
            tensor("a.weight_scale", Dtype::F32, 4, Some("a.weight")),
            tensor("b.weight", Dtype::F8_E4M3, 12, None),
        ]);
        assert_eq!(order, ["norm", "a.weight", "a.weight_scale", "b.weight"]);
    }

    #[test]
    fn a_scale_after_a_weight_of_odd_length_joins_its_alignment_group() {
        // 7 bytes of F8 end at an odd offset: the scale would be misaligned
        // there (and shards have no holes), so it sits with the F32s.
        let order = lay_out(vec![
            tensor("norm", Dtype::F32, 16, None),
            tensor("a.weight", Dtype::F8_E4M3, 7, None),
            tensor("a.weight_scale", Dtype::F32, 4, Some("a.weight")),
            tensor("b.weight", Dtype::F8_E4M3, 9, None),
            tensor("b.weight_scale", Dtype::F32, 4, Some("b.weight")),
        ]);
        // b.weight then ends 7 + 4 + 9 = 20 bytes past the first F32: a
        // multiple of 4, so its scale follows it.
        assert_eq!(
            order,
            [
                "norm",
                "a.weight_scale",
                "a.weight",
                "b.weight",
                "b.weight_scale"
            ]
        );
    }

    #[test]
    fn a_follower_never_breaks_a_later_tensor_alignment() {
        // A 2-byte BF16 follower after an F32 tensor would leave the next
        // F32 at offset 6: it joins the BF16 group instead.
        let order = lay_out(vec![
            tensor("w", Dtype::F32, 4, None),
            tensor("w.s", Dtype::BF16, 2, Some("w")),
            tensor("x", Dtype::F32, 4, None),
            tensor("y", Dtype::BF16, 2, None),
        ]);
        assert_eq!(order, ["w", "x", "y", "w.s"]);
        // Without followers the layout is the plain descending-alignment
        // sort of the layer order, as before followers existed.
        let order = lay_out(vec![
            tensor("e", Dtype::BF16, 2, None),
            tensor("f", Dtype::F64, 8, None),
            tensor("g", Dtype::U8, 3, None),
            tensor("h", Dtype::F32, 4, None),
        ]);
        assert_eq!(order, ["f", "h", "e", "g"]);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]
        /// Any mix of dtypes, lengths and followers lays out every tensor
        /// once, aligned, without holes (checked by `lay_out`).
        #[test]
        fn any_shard_with_followers_stays_aligned(
            spec in proptest::collection::vec((0usize..5, 0u64..6, proptest::option::of(0usize..12)), 1..12)
        ) {
            let dtypes = [Dtype::U8, Dtype::BF16, Dtype::F32, Dtype::F64, Dtype::F8_E4M3];
            let n = spec.len();
            let tensors = spec
                .iter()
                .enumerate()
                .map(|(i, &(d, count, after))| {
                    let dtype = dtypes[d];
                    let after = after.filter(|&a| a < n && a != i).map(|a| format!("t{a}"));
                    tensor(&format!("t{i}"), dtype, count * dtype.alignment(), after.as_deref())
                })
                .collect();
            lay_out(tensors);
        }
    }

    #[test]
    fn a_header_the_reader_would_refuse_is_never_built() {
        let max = crate::format::safetensors::MAX_HEADER as usize;
        let mut metadata = Safetensors.shard_metadata(&BTreeMap::new());
        // Within the limit alone, over it once the tensor entries are added.
        metadata.insert("big".into(), "v".repeat(max - 40));
        let err = safetensors_header(Path::new("m"), &shard(), &metadata).unwrap_err();
        assert!(
            matches!(&err, WriteError::HeaderTooLarge { what, .. } if what.starts_with("2 tensor entries and a __metadata__ of ")),
            "{err}"
        );
        // Over it in the metadata alone: refused before any JSON is made.
        metadata.insert("bigger".into(), "v".repeat(max));
        let err = safetensors_header(Path::new("m"), &shard(), &metadata).unwrap_err();
        assert!(
            err.to_string().contains("the largest is \"bigger\""),
            "{err}"
        );
        metadata.remove("bigger");
        metadata.insert("big".into(), "v".repeat(max - 200));
        let header = safetensors_header(Path::new("m"), &shard(), &metadata);
        assert!(header.unwrap().len() <= max + 8);
    }

    #[test]
    fn one_metadata_key_is_written_as_the_safetensors_crate_writes_it() {
        let metadata = Safetensors.shard_metadata(&BTreeMap::new());
        let header = safetensors_header(Path::new("m"), &shard(), &metadata).unwrap();
        let text = String::from_utf8_lossy(&header[8..]).trim_end().to_string();
        assert_eq!(
            text,
            r#"{"__metadata__":{"format":"pt"},"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}"#
        );
    }
}
