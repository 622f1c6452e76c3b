//! Writes a synthetic Llama-shaped safetensors checkpoint of a chosen size,
//! for benchmarks and tests that need more than the tiny fixtures.
//!
//! ```text
//! cargo run --release --example synth -- OUT_DIR --size 2GB [--dtype bf16|f32] [--shards N] [--hidden 2048]
//! ```
//!
//! Names and shapes follow Llama (`model.layers.N.self_attn.q_proj.weight`,
//! ...); the layer count is chosen to reach the size. Values are small
//! pseudo-random floats, so casts neither overflow nor underflow. Memory use
//! is a few MiB whatever the size.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

struct Args {
    out: PathBuf,
    size: u64,
    dtype: &'static str,
    shards: usize,
    hidden: u64,
}

fn parse_args() -> Args {
    let mut args = Args {
        out: PathBuf::new(),
        size: 1 << 30,
        dtype: "BF16",
        shards: 1,
        hidden: 2048,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = || {
            it.next()
                .unwrap_or_else(|| usage(&format!("{a} needs a value")))
        };
        match a.as_str() {
            "--size" => {
                args.size = value()
                    .parse::<reshard::units::ByteSize>()
                    .unwrap_or_else(|e| usage(&e.to_string()))
                    .0
            }
            "--dtype" => {
                args.dtype = match value().to_ascii_lowercase().as_str() {
                    "bf16" => "BF16",
                    "f16" => "F16",
                    "f32" => "F32",
                    other => usage(&format!("unsupported dtype {other}")),
                }
            }
            "--shards" => {
                args.shards = value()
                    .parse()
                    .unwrap_or_else(|_| usage("--shards takes a number"))
            }
            "--hidden" => {
                args.hidden = value()
                    .parse()
                    .unwrap_or_else(|_| usage("--hidden takes a number"))
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0)
            }
            // An unknown option is an error, never a folder to write 2 GB
            // into (`synth --help` once did that).
            _ if a.starts_with('-') => usage(&format!("unknown option {a}")),
            _ if args.out.as_os_str().is_empty() => args.out = PathBuf::from(a),
            _ => usage(&format!("unexpected argument {a}")),
        }
    }
    if args.out.as_os_str().is_empty() {
        usage("OUT_DIR is required");
    }
    args
}

const USAGE: &str =
    "usage: synth OUT_DIR [--size 2GB] [--dtype bf16|f16|f32] [--shards N] [--hidden 2048]";

fn usage(msg: &str) -> ! {
    eprintln!("error: {msg}\n{USAGE}");
    std::process::exit(2)
}

/// Llama tensor names and shapes for `layers` layers of width `h`.
fn llama(h: u64, layers: u64, vocab: u64) -> Vec<(String, Vec<u64>)> {
    let i = h * 11 / 4;
    let mut t = vec![("model.embed_tokens.weight".to_string(), vec![vocab, h])];
    for l in 0..layers {
        let p = format!("model.layers.{l}");
        for (n, s) in [
            ("input_layernorm.weight", vec![h]),
            ("self_attn.q_proj.weight", vec![h, h]),
            ("self_attn.k_proj.weight", vec![h, h]),
            ("self_attn.v_proj.weight", vec![h, h]),
            ("self_attn.o_proj.weight", vec![h, h]),
            ("post_attention_layernorm.weight", vec![h]),
            ("mlp.gate_proj.weight", vec![i, h]),
            ("mlp.up_proj.weight", vec![i, h]),
            ("mlp.down_proj.weight", vec![h, i]),
        ] {
            t.push((format!("{p}.{n}"), s));
        }
    }
    t.push(("model.norm.weight".into(), vec![h]));
    t.push(("lm_head.weight".into(), vec![vocab, h]));
    t
}

fn main() {
    let args = parse_args();
    let elem: u64 = if args.dtype == "F32" { 4 } else { 2 };
    let h = args.hidden;
    let vocab = 32000;
    let per_layer = (4 * h * h + 3 * h * (h * 11 / 4) + 2 * h) * elem;
    let fixed = (2 * vocab * h + h) * elem;
    let layers = args.size.saturating_sub(fixed).div_ceil(per_layer).max(1);
    let tensors = llama(h, layers, vocab);
    std::fs::create_dir_all(&args.out).unwrap_or_else(|e| usage(&e.to_string()));
    let per_shard = tensors.len().div_ceil(args.shards.max(1));
    let chunks: Vec<_> = tensors.chunks(per_shard).collect();
    let n = chunks.len();
    let mut weight_map = serde_json::Map::new();
    let mut total = 0;
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    for (k, chunk) in chunks.iter().enumerate() {
        let name = if n == 1 {
            "model.safetensors".to_string()
        } else {
            format!("model-{:05}-of-{n:05}.safetensors", k + 1)
        };
        total += write_file(&args.out.join(&name), chunk, args.dtype, elem, &mut rng);
        for (t, _) in chunk.iter() {
            weight_map.insert(t.clone(), serde_json::Value::String(name.clone()));
        }
    }
    if n > 1 {
        let index =
            serde_json::json!({"metadata": {"total_size": total}, "weight_map": weight_map});
        std::fs::write(
            args.out.join("model.safetensors.index.json"),
            serde_json::to_vec_pretty(&index).unwrap_or_default(),
        )
        .unwrap_or_else(|e| usage(&e.to_string()));
    }
    let config = serde_json::json!({"architectures": ["LlamaForCausalLM"], "hidden_size": h, "num_hidden_layers": layers, "dtype": if elem == 4 {"float32"} else {"bfloat16"}});
    std::fs::write(
        args.out.join("config.json"),
        serde_json::to_vec_pretty(&config).unwrap_or_default(),
    )
    .unwrap_or_else(|e| usage(&e.to_string()));
    println!(
        "{}: {layers} layers, {n} files, {total} tensor bytes",
        args.out.display()
    );
}

fn write_file(
    path: &Path,
    tensors: &[(String, Vec<u64>)],
    dtype: &str,
    elem: u64,
    rng: &mut u64,
) -> u64 {
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
    let mut offset = 0;
    for (name, shape) in tensors {
        let len = shape.iter().product::<u64>() * elem;
        header.insert(name.clone(), serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len]}));
        offset += len;
    }
    let mut json = serde_json::to_vec(&header).unwrap_or_default();
    while !json.len().is_multiple_of(8) {
        json.push(b' ');
    }
    let file = File::create(path).unwrap_or_else(|e| usage(&format!("{}: {e}", path.display())));
    let mut w = BufWriter::with_capacity(1 << 20, file);
    let mut chunk = vec![0u8; 4 << 20];
    let result = (|| -> std::io::Result<()> {
        w.write_all(&(json.len() as u64).to_le_bytes())?;
        w.write_all(&json)?;
        let mut left = offset;
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            fill(&mut chunk[..n], elem, rng);
            w.write_all(&chunk[..n])?;
            left -= n as u64;
        }
        w.flush()
    })();
    result.unwrap_or_else(|e| usage(&format!("{}: {e}", path.display())));
    offset
}

/// Small random floats: |x| in [2^-7, 2^-6), random sign (xorshift64).
fn fill(buf: &mut [u8], elem: u64, rng: &mut u64) {
    for c in buf.chunks_exact_mut(4) {
        *rng ^= *rng << 13;
        *rng ^= *rng >> 7;
        *rng ^= *rng << 17;
        let r = *rng as u32;
        let bits = 0x3c00_0000 | (r & 0x807f_ffff);
        if elem == 4 {
            c.copy_from_slice(&bits.to_le_bytes());
        } else {
            let hi = (bits >> 16) as u16;
            let lo = ((r >> 8) as u16 & 0x807f) | 0x3c00;
            c[..2].copy_from_slice(&hi.to_le_bytes());
            c[2..].copy_from_slice(&lo.to_le_bytes());
        }
    }
}
