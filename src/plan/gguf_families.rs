//! The diffusion families a GGUF output recognizes, as data: the tensor
//! names ComfyUI-GGUF's `tools/convert.py` detects each by, the names that
//! mark the diffusers layout it refuses, and what it keeps in high
//! precision or leaves out. `super::gguf_out` applies them.

/// A diffusion family as ComfyUI-GGUF's converter detects it: any one
/// `detect` set whose names are all present (after the wrapper is
/// stripped); `banned` names mark the diffusers layout; names containing
/// a `hiprec` part stay F32; names containing an `ignore` part are left
/// out.
pub(super) struct Family {
    pub arch: &'static str,
    pub detect: &'static [&'static [&'static str]],
    pub banned: &'static [&'static str],
    pub hiprec: &'static [&'static str],
    pub ignore: &'static [&'static str],
}

/// The families in convert.py's detection order (the first match wins).
pub(super) const FAMILIES: &[Family] = &[
    Family {
        arch: "flux",
        detect: &[
            &["transformer_blocks.0.attn.norm_added_k.weight"],
            &["double_blocks.0.img_attn.proj.weight"],
        ],
        banned: &["transformer_blocks.0.attn.norm_added_k.weight"],
        hiprec: &[],
        ignore: &[],
    },
    Family {
        arch: "sd3",
        detect: &[
            &["transformer_blocks.0.attn.add_q_proj.weight"],
            &["joint_blocks.0.x_block.attn.qkv.weight"],
        ],
        banned: &["transformer_blocks.0.attn.add_q_proj.weight"],
        hiprec: &[],
        ignore: &[],
    },
    Family {
        arch: "aura",
        detect: &[
            &["double_layers.3.modX.1.weight"],
            &["joint_transformer_blocks.3.ff_context.out_projection.weight"],
        ],
        banned: &["joint_transformer_blocks.3.ff_context.out_projection.weight"],
        hiprec: &[],
        ignore: &[],
    },
    Family {
        arch: "hidream",
        detect: &[&[
            "caption_projection.0.linear.weight",
            "double_stream_blocks.0.block.ff_i.shared_experts.w3.weight",
        ]],
        banned: &[],
        hiprec: &[".ff_i.gate.weight", "img_emb.emb_pos"],
        ignore: &[],
    },
    Family {
        arch: "cosmos",
        detect: &[&[
            "blocks.0.mlp.layer1.weight",
            "blocks.0.adaln_modulation_cross_attn.1.weight",
        ]],
        banned: &[],
        hiprec: &["pos_embedder"],
        ignore: &["_extra_state", "accum_"],
    },
    Family {
        arch: "ltxv",
        detect: &[&[
            "adaln_single.emb.timestep_embedder.linear_2.weight",
            "transformer_blocks.27.scale_shift_table",
            "caption_projection.linear_2.weight",
        ]],
        banned: &[],
        hiprec: &["scale_shift_table"],
        ignore: &[],
    },
    Family {
        arch: "hyvid",
        detect: &[&[
            "double_blocks.0.img_attn_proj.weight",
            "txt_in.individual_token_refiner.blocks.1.self_attn_qkv.weight",
        ]],
        banned: &[],
        hiprec: &[],
        ignore: &[],
    },
    Family {
        arch: "wan",
        detect: &[&[
            "blocks.0.self_attn.norm_q.weight",
            "text_embedding.2.weight",
            "head.modulation",
        ]],
        banned: &[],
        hiprec: &[".modulation"],
        ignore: &[],
    },
    Family {
        arch: "sdxl",
        detect: &[
            &[
                "down_blocks.0.downsamplers.0.conv.weight",
                "add_embedding.linear_1.weight",
            ],
            &[
                "input_blocks.3.0.op.weight",
                "input_blocks.6.0.op.weight",
                "output_blocks.2.2.conv.weight",
                "output_blocks.5.2.conv.weight",
            ],
            &["label_emb.0.0.weight"],
        ],
        banned: &[],
        hiprec: &[],
        ignore: &[],
    },
    Family {
        arch: "sd1",
        detect: &[
            &["down_blocks.0.downsamplers.0.conv.weight"],
            &[
                "input_blocks.3.0.op.weight",
                "input_blocks.6.0.op.weight",
                "input_blocks.9.0.op.weight",
                "output_blocks.2.1.conv.weight",
                "output_blocks.5.2.conv.weight",
                "output_blocks.8.2.conv.weight",
            ],
        ],
        banned: &[],
        hiprec: &[],
        ignore: &[],
    },
    Family {
        arch: "lumina2",
        detect: &[&[
            "cap_embedder.1.weight",
            "context_refiner.0.attention.qkv.weight",
        ]],
        banned: &[],
        hiprec: &[],
        ignore: &[],
    },
];
