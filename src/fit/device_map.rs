//! The placement of a "make it fit" candidate as the programs take it: an
//! accelerate-style `device_map` (transformers, diffusers) with the first
//! blocks on GPU 0 in the layer order `convert --order forward` writes and
//! the rest on `cpu`, and llama.cpp's `--n-gpu-layers`.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::plan::order::{block_of, sort_indices, Order};

/// The module a tensor belongs to, as accelerate names it: its block
/// (`model.layers.3`), or its own path without the parameter name.
fn module_of(tensor: &str) -> String {
    match block_of(tensor) {
        Some(b) => b.name(),
        None => tensor
            .rsplit_once('.')
            .map_or(tensor, |(module, _)| module)
            .to_string(),
    }
}

/// `device_map` for `tensors` with the first `blocks_on_gpu` numbered
/// blocks (and every module before them, in forward order) on GPU 0 and the
/// rest on `cpu`; `None`: every module on GPU 0, `Some(0)`: every module on
/// `cpu` (no block fits, and fit counts nothing on the GPU then).
pub fn device_map(tensors: &[&str], blocks_on_gpu: Option<u64>) -> BTreeMap<String, Value> {
    let mut map = BTreeMap::new();
    let mut blocks_seen: Vec<String> = Vec::new();
    let mut on_cpu = blocks_on_gpu == Some(0);
    for i in sort_indices(tensors, Order::Forward) {
        let name = tensors[i];
        if let Some(b) = block_of(name) {
            let b = b.name();
            if !blocks_seen.contains(&b) {
                blocks_seen.push(b);
            }
            if blocks_on_gpu.is_some_and(|n| blocks_seen.len() as u64 > n) {
                on_cpu = true;
            }
        } else if blocks_on_gpu.is_some_and(|n| n > 0 && blocks_seen.len() as u64 >= n) {
            // After the last block on the GPU (the final norm, the head):
            // fit counts them off the GPU, as it counts whole blocks.
            on_cpu = true;
        }
        let module = module_of(name);
        // A module split across the switch (a tied or shared one) stays on
        // the device it was first given.
        map.entry(module).or_insert_with(|| match on_cpu {
            true => Value::from("cpu"),
            false => Value::from(0),
        });
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leading_blocks_go_to_the_gpu_and_the_rest_to_the_cpu() {
        let names = [
            "lm_head.weight",
            "model.norm.weight",
            "model.layers.1.mlp.up_proj.weight",
            "model.layers.0.self_attn.q_proj.weight",
            "model.layers.0.mlp.up_proj.weight",
            "model.embed_tokens.weight",
            "model.layers.2.mlp.up_proj.weight",
        ];
        let map = device_map(&names, Some(2));
        let want: BTreeMap<String, Value> = [
            ("model.embed_tokens", Value::from(0)),
            ("model.layers.0", Value::from(0)),
            ("model.layers.1", Value::from(0)),
            ("model.layers.2", Value::from("cpu")),
            ("model.norm", Value::from("cpu")),
            ("lm_head", Value::from("cpu")),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        assert_eq!(map, want);
        assert!(device_map(&names, None)
            .values()
            .all(|v| v == &Value::from(0)));
        // Every block fits but not the head: what follows the blocks goes
        // to the CPU.
        let all = device_map(&names, Some(3));
        assert_eq!(all["model.layers.2"], Value::from(0));
        assert_eq!(all["model.norm"], Value::from("cpu"));
        assert_eq!(all["lm_head"], Value::from("cpu"));
        // No block fits: nothing is put on the GPU, the embeddings neither.
        assert!(device_map(&names, Some(0))
            .values()
            .all(|v| v == &Value::from("cpu")));
    }
}
