//! The Hugging Face index: `{"metadata": {"total_size": N}, "weight_map":
//! {tensor: file}}`, with the weight map in layer order so a reader of the
//! index sees the load order. transformers raises without `metadata`.

use crate::plan::Plan;

/// The index JSON for a plan with more than one shard.
pub fn index_json(plan: &Plan) -> Vec<u8> {
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
