#!/usr/bin/env python3
"""Measure ground truth for llmpar's predictions with PyTorch + transformers on the CPU.

Stand-alone script: the llmpar library never imports it, and the library's tests do not need torch.
Every model is built from a config (validation/configs/<name>.json, values of the published
config.json) with random weights; nothing is downloaded from the Hugging Face hub.

For each architecture it writes validation/data/<name>.json with
  1. exact parameter counts at the full published config (model built on the `meta` device),
     in total and per group (embedding, attention, mlp, experts, shared_experts, router, norms,
     head);
  2. bytes saved for backward by one training forward pass (bf16 weights, labels given so the loss
     is included), measured with torch.autograd.graph.saved_tensors_hooks, for 1 and 2 layers,
     b in {1, 2}, s in {128, 256, 512}, attention "eager" and "sdpa"; plus a per-tensor inventory
     (shape, dtype, module, autograd node) at b=1, s=256;
  3. FLOPs of forward and of backward with torch.utils.flop_counter.FlopCounterMode, in total and
     per operator, for 1 and 2 layers, b=1, s in {256, 512}, eager and sdpa.

Usage:
  python validation/measure_hf.py               # every architecture
  python validation/measure_hf.py --only gpt2   # one (or a comma-separated list)
  python validation/measure_hf.py --only gemma-3-1b --variants mixed_layers_small_window
                                                # these variants of one architecture, merged
                                                # into its existing file
  python validation/measure_hf.py --list
See validation/README.md for what every number means and the caveats.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime
import gc
import json
import platform
import re
import sys
import time
import traceback
from pathlib import Path

import torch
import transformers
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import (
    FlopCounterMode,
    flop_registry,
    sdpa_backward_flop_count,
    sdpa_flop_count,
)
from transformers import AutoConfig, AutoModelForCausalLM

HERE = Path(__file__).resolve().parent
CONFIG_DIR = HERE / "configs"
DATA_DIR = HERE / "data"

SCHEMA_VERSION = 1
SEED = 0
DTYPE = torch.bfloat16
LAYER_COUNTS = (1, 2)
SAVED_SHAPES = [(b, s) for b in (1, 2) for s in (128, 256, 512)]
FLOP_SEQS = (256, 512)
INVENTORY_SHAPE = (1, 256)
ATTN_IMPLS = ("eager", "sdpa")

# --------------------------------------------------------------------------------------------
# Architectures and their measured variants
# --------------------------------------------------------------------------------------------
# A variant is a set of config overrides measured as its own grid.  Keys:
#   overrides        config keys changed from the published values (recorded in the output)
#   zero_dropout     set every dropout probability of the config to 0 (default True)
#   experts          experts implementations to measure (MoE only; None = not a MoE variant)
#   saved_shapes     (b, s) for the saved-bytes runs
#   flop_seqs        s for the FLOP runs (b=1)
#   inventory        keep the per-tensor listing at INVENTORY_SHAPE
#   force_attn       bypass transformers' own attention-implementation check (see gemma-2)
#   config_part      (of the architecture) the key of the published config.json whose
#                    values are measured: the language model of a multimodal model
#                    (Mistral 3's text_config), without its vision tower
#   layer_pattern    (config key, unit): the layers are given as a pattern of one letter per
#                    layer (Nemotron-H's hybrid_override_pattern); the runs of "1 and 2 layers"
#                    repeat the unit once and twice (per layer = per unit)
MOE_EXTRA = {
    # The experts "eager" loop (a Python loop over the hit experts), measured at one shape:
    # FlopCounterMode does not count aten._grouped_mm (used by the default "grouped_mm" experts
    # implementation), so this variant is where the expert matmul FLOPs of the forward are counted
    # by FlopCounterMode itself.  Its backward is not run: indexing the fused (E, 2I, H) expert
    # parameter per expert makes select_backward materialise a zero tensor of the whole parameter
    # for every expert hit; on this 24 GiB machine that was killed by the OOM killer for
    # mixtral-8x7b at 1 layer, s=256, and takes minutes for qwen3-30b-a3b (128 experts).
    "experts": ["eager"],
    "saved_shapes": [(1, 256)],
    "flop_seqs": (256,),
    "inventory": False,
    "flop_backward": False,
}

V32_WIDTHS = {
    # DeepSeek-V3.2-Exp's layers at small widths (see "deepseek-v3.2-exp" below): the
    # published structure (MLA with both latents, the indexer, 8 expert groups of which
    # 4 are chosen, top-8, one shared expert) with every width cut
    "hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 4,
    "q_lora_rank": 96, "kv_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16,
    "v_head_dim": 32, "index_n_heads": 4, "index_head_dim": 32, "intermediate_size": 512,
    "moe_intermediate_size": 128, "n_routed_experts": 16, "vocab_size": 16384,
}

ARCHS: dict[str, dict] = {
    "llama-2-7b": {},
    "llama-3-8b": {},
    "mistral-7b": {},
    "mixtral-8x7b": {
        "variants": [
            {"variant": "main", "experts": ["grouped_mm"]},
            {"variant": "experts_eager", **MOE_EXTRA},
        ]
    },
    "qwen2.5-7b": {},
    "qwen3-4b": {},
    "qwen3-8b": {},
    "qwen3-30b-a3b": {
        "variants": [
            {"variant": "main", "experts": ["grouped_mm"]},
            {"variant": "experts_eager", **MOE_EXTRA},
        ]
    },
    "deepseek-v3": {
        "remove_keys": ["quantization_config"],
        "variants": [
            # every measured layer is a MoE layer (MLA attention + shared expert + routed experts)
            {
                "variant": "moe_layers",
                "overrides": {"first_k_dense_replace": 0, "n_routed_experts": 32},
                "experts": ["grouped_mm"],
            },
            {
                "variant": "moe_layers_experts_eager",
                "overrides": {"first_k_dense_replace": 0, "n_routed_experts": 32},
                **MOE_EXTRA,
            },
            # every measured layer is a dense layer (MLA attention + dense MLP), as the published
            # first_k_dense_replace=3 makes layers 0..2 dense
            {"variant": "dense_layers", "overrides": {"first_k_dense_replace": 3}},
        ],
    },
    "gemma-2-9b": {
        "variants": [
            {"variant": "main"},
            # Gemma2ForCausalLM declares _supports_sdpa = False (SDPA has no logit soft-capping);
            # this variant forces the sdpa code path with attn_logit_softcapping=None.  It is NOT
            # the published model's math; it shows what SDPA would save for these shapes.
            {
                "variant": "sdpa_forced_no_attn_softcap",
                "overrides": {"attn_logit_softcapping": None},
                "attn_impls": ["sdpa"],
                "force_attn": True,
            },
        ]
    },
    "phi-3-mini": {},
    # Phi-4-mini's layer (Phi3ForCausalLM: fused qkv_proj and gate_up_proj) with RoPE on
    # partial_rotary_factor 0.75 of each head (apply_rotary_pos_emb rotates q[..., :96] and
    # concatenates the rest; longrope's short factors below 4096 tokens), at a width of
    # 1024 (8 heads and 4 kv heads of the published 128), 1024 in the MLP and a
    # 16384-token vocabulary (the layers' tensors scale with each; the test builds the
    # same widths)
    "phi-4-mini": {
        "variants": [
            {"variant": "main",
             "overrides": {"hidden_size": 1024, "num_attention_heads": 8,
                           "num_key_value_heads": 4, "intermediate_size": 1024,
                           "vocab_size": 16384, "pad_token_id": None, "bos_token_id": None,
                           "eos_token_id": None}},
        ]
    },
    "gpt2": {
        "variants": [
            {"variant": "main"},
            {"variant": "default_dropout", "zero_dropout": False},
        ]
    },
    "gpt2-xl": {},
    "olmo-2-7b": {},
    # Mamba-2 mixers alone (no attention: eager and sdpa run the same code); FLOPs are
    # measure_flops.py's
    "mamba-codestral-7b": {"variants": [{"variant": "main", "flop_seqs": ()}]},
    # Nemotron-H's Mamba-2 layers alone ("M" per layer: NemotronHMamba2Mixer's torch path);
    # FLOPs are measure_flops.py's
    # and its experts ("E") and attention ("*") alone, and the three as one unit ("ME*")
    "nemotron-3-nano-30b-a3b": {
        "variants": [
            {"variant": "mamba_layers", "layer_pattern": ("hybrid_override_pattern", "M"),
             "flop_seqs": ()},
            {"variant": "experts_layers", "layer_pattern": ("hybrid_override_pattern", "E"),
             "experts": ["grouped_mm"], "flop_seqs": ()},
            {"variant": "attention_layers", "layer_pattern": ("hybrid_override_pattern", "*"),
             "flop_seqs": ()},
            {"variant": "hybrid_units", "layer_pattern": ("hybrid_override_pattern", "ME*"),
             "experts": ["grouped_mm"], "flop_seqs": (), "inventory": False},
        ]
    },
    # Granite 4.0-H's two layer kinds (GraniteMoeHybridDecoderLayer: a Mamba-2 mixer or an
    # attention, then the experts and the shared MLP), each alone
    "granite-4.0-h-small": {
        "variants": [
            {"variant": "mamba_layers", "layer_pattern": ("layer_types", ["mamba"]),
             "experts": ["grouped_mm"], "flop_seqs": ()},
            {"variant": "attention_layers", "layer_pattern": ("layer_types", ["attention"]),
             "experts": ["grouped_mm"], "flop_seqs": ()},
        ]
    },
    # Falcon-H1's parallel hybrid: every layer an attention and a Mamba-2 mixer side by side,
    # then the MLP, with its muP multipliers
    "falcon-h1-0.5b": {"variants": [{"variant": "main", "flop_seqs": ()}]},
    # Qwen3-Next's two layer kinds (Qwen3NextDecoderLayer: a gated DeltaNet, on the torch
    # path of the chunked gated delta rule, or a gated attention, then the experts beside a
    # gated shared expert), each alone, with 32 of the 512 routed experts (the saved tensors
    # of the experts do not depend on their number but for the int32 offsets); FLOPs are
    # measure_flops.py's
    "qwen3-next-80b-a3b": {
        "variants": [
            {"variant": "linear_attention_layers", "overrides": {"num_experts": 32},
             "layer_pattern": ("layer_types", ["linear_attention"]),
             "experts": ["grouped_mm"], "flop_seqs": ()},
            {"variant": "attention_layers", "overrides": {"num_experts": 32},
             "layer_pattern": ("layer_types", ["full_attention"]),
             "experts": ["grouped_mm"], "flop_seqs": ()},
        ]
    },
    # gpt-oss's two layer kinds (GptOssDecoderLayer: an attention with learned sinks over a
    # sliding window of 128 or over the whole sequence, then 32 experts of the clamped
    # SwiGLU with biases behind a top-4 router with a bias), each alone, its MXFP4
    # quantization_config removed (the weights bf16); GptOssPreTrainedModel declares
    # _supports_sdpa = False, so the SDPA runs record transformers' refusal
    "gpt-oss-20b": {
        "remove_keys": ["quantization_config"],
        "variants": [
            {"variant": "sliding_attention_layers",
             "layer_pattern": ("layer_types", ["sliding_attention"]),
             "experts": ["grouped_mm"], "flop_seqs": ()},
            {"variant": "full_attention_layers",
             "layer_pattern": ("layer_types", ["full_attention"]),
             "experts": ["grouped_mm"], "flop_seqs": ()},
        ],
    },
    # SmolLM3's two layer kinds (SmolLM3Attention: RoPE, or none where no_rope_layers holds
    # 0, every fourth layer in the published model), each alone; layer_types follows from
    # no_rope_layers (SmolLM3Config, no sliding window)
    "smollm3-3b": {
        "variants": [
            {"variant": "rope_layers", "overrides": {"layer_types": None},
             "layer_pattern": ("no_rope_layers", [1]), "flop_seqs": ()},
            {"variant": "nope_layers", "overrides": {"layer_types": None},
             "layer_pattern": ("no_rope_layers", [0]), "flop_seqs": ()},
        ]
    },
    # Ministral 3's language model (Ministral3ForCausalLM, the text_config of
    # Mistral3ForConditionalGeneration, without the vision tower and its projector): Mistral's
    # layers with the queries scaled per position (get_llama_4_attn_scale)
    "ministral-3-8b": {"config_part": "text_config",
                       "variants": [{"variant": "main", "flop_seqs": ()}]},
    # Llama 4 Scout's language model (Llama4ForCausalLM, the text_config of
    # Llama4ForConditionalGeneration, without the vision tower and its projector): its two
    # layer kinds (Llama4TextAttention with the complex RoPE, the L2 q/k norm and the chunked
    # mask, or a NoPE layer with the attention temperature and the full causal mask, every
    # fourth layer of the published model), each alone, then the top-1 sigmoid router, the
    # experts run on every expert's copy of the tokens and the shared expert; 4 of the 16
    # experts at 1024 of their 8192 intermediate width and a 16384-token vocabulary keep the
    # CPU runs short (the layers' tensors scale with each; the test builds the same widths);
    # no_rope_layers follows from no_rope_layer_interval; FLOPs are measure_flops.py's
    "llama-4-scout": {
        "config_part": "text_config",
        "variants": [
            {"variant": "rope_layers",
             "overrides": {"num_local_experts": 4, "intermediate_size": 1024,
                           "vocab_size": 16384, "pad_token_id": None, "no_rope_layers": None,
                           "no_rope_layer_interval": 4},
             "flop_seqs": ()},
            {"variant": "nope_layers",
             "overrides": {"num_local_experts": 4, "intermediate_size": 1024,
                           "vocab_size": 16384, "pad_token_id": None, "no_rope_layers": None,
                           "no_rope_layer_interval": 1},
             "flop_seqs": ()},
            # a RoPE (chunked) and a NoPE (global) layer as one unit, with chunks of 128
            # that the sequence reaches (s = 128) and passes (s = 256), where the chunked
            # layers get the chunked mask and the global ones is_causal; at a width of 256
            # with 8 heads and 2 kv heads of 128
            {"variant": "chunked_and_nope_layers",
             "overrides": {"num_local_experts": 4, "intermediate_size": 1024,
                           "vocab_size": 16384, "pad_token_id": None, "hidden_size": 256,
                           "num_attention_heads": 8, "num_key_value_heads": 2,
                           "attention_chunk_size": 128, "no_rope_layer_interval": 2},
             "layer_pattern": ("no_rope_layers", [1, 0]),
             "saved_shapes": [(1, 128), (1, 256), (2, 256)], "flop_seqs": ()},
        ],
    },
    # Llama 4 Maverick's language model: its dense layers (Llama4TextMLP of
    # intermediate_size_mlp; no layer has experts when interleave_moe_layer_step exceeds
    # the layers) and its MoE layers (every layer one with interleave_moe_layer_step 1, 4 of
    # the 128 experts at 1024 of their 8192 width), each alone, both RoPE (chunked) layers
    # without the L2 q/k norm (use_qk_norm false); a 16384-token vocabulary; FLOPs are
    # measure_flops.py's
    "llama-4-maverick": {
        "config_part": "text_config",
        "variants": [
            {"variant": "dense_layers",
             "overrides": {"moe_layers": None, "interleave_moe_layer_step": 3,
                           "vocab_size": 16384, "pad_token_id": None, "no_rope_layers": None,
                           "no_rope_layer_interval": 4},
             "flop_seqs": ()},
            {"variant": "moe_layers",
             "overrides": {"moe_layers": None, "interleave_moe_layer_step": 1,
                           "num_local_experts": 4, "intermediate_size": 1024,
                           "vocab_size": 16384, "pad_token_id": None, "no_rope_layers": None,
                           "no_rope_layer_interval": 4},
             "flop_seqs": ()},
        ],
    },
    # ERNIE 4.5's two layer kinds (Ernie4_5_MoeDecoderLayer: attention with the interleaved
    # fp32 RoPE, then its fp32 softmax router with the correction bias, the 64 experts and
    # the shared experts from layer 1 on, a dense MLP before), each alone; FLOPs are
    # measure_flops.py's
    "ernie-4.5-21b-a3b": {
        "variants": [
            {"variant": "moe_layers", "overrides": {"moe_layer_start_index": 0},
             "experts": ["grouped_mm"], "flop_seqs": ()},
            {"variant": "dense_layers", "overrides": {"moe_layer_start_index": 2},
             "flop_seqs": ()},
        ]
    },
    # GLM-4.5-Air's two layer kinds (Glm4MoeDecoderLayer: attention with Q/K/V biases and
    # RoPE on half of each head, then DeepSeek-V3's sigmoid router with the correction bias,
    # the experts and the shared expert from layer 1 on, a dense MLP before), each alone,
    # with 32 of the 128 routed experts; FLOPs are measure_flops.py's
    "glm-4.5-air": {
        "variants": [
            {"variant": "moe_layers",
             "overrides": {"first_k_dense_replace": 0, "n_routed_experts": 32},
             "experts": ["grouped_mm"], "flop_seqs": ()},
            {"variant": "dense_layers", "overrides": {"first_k_dense_replace": 2},
             "flop_seqs": ()},
        ]
    },
    # MiniMax-M2's one layer kind (MiniMaxM2DecoderLayer: attention with RMSNorm over the
    # whole query and key projections and RoPE on half of each head, then the sigmoid
    # router with the correction bias and the experts), with 32 of the 256 routed experts;
    # FLOPs are measure_flops.py's
    "minimax-m2": {
        "variants": [
            {"variant": "main", "overrides": {"num_local_experts": 32},
             "experts": ["grouped_mm"], "flop_seqs": ()},
        ]
    },
    # Gemma 3's two layer kinds (Gemma3DecoderLayer: sandwich norms, per-head QK norms and
    # an attention over a sliding window of 512 with the local RoPE base, or over the whole
    # sequence with the global one), each alone; FLOPs are measure_flops.py's
    "gemma-3-1b": {
        "variants": [
            {"variant": "sliding_attention_layers",
             "layer_pattern": ("layer_types", ["sliding_attention"]), "flop_seqs": ()},
            {"variant": "full_attention_layers",
             "layer_pattern": ("layer_types", ["full_attention"]), "flop_seqs": ()},
            # a windowed and a global layer as one unit, with a window of 128 that the
            # sequence reaches (s = 128) and passes (s = 256), where the windowed layers get
            # the sliding mask and the global ones is_causal; at a width of 256, 1024 in the
            # MLP and a 16384-token vocabulary (the layers' tensors scale with each; the
            # test builds the same widths)
            {"variant": "mixed_layers_small_window",
             "overrides": {"sliding_window": 128, "hidden_size": 256,
                           "intermediate_size": 1024, "vocab_size": 16384},
             "layer_pattern": ("layer_types", ["sliding_attention", "full_attention"]),
             "saved_shapes": [(1, 128), (1, 256), (2, 256)], "flop_seqs": ()},
        ]
    },
    # Qwen3.5's language models (Qwen3_5ForCausalLM and Qwen3_5MoeForCausalLM, the
    # text_config of their multimodal configs, without the vision tower): Qwen3-Next's
    # gated DeltaNet and gated attention layers, each alone, then a dense MLP (27B) or
    # 32 of the 256 routed experts beside the gated shared expert (35B-A3B); FLOPs are
    # measure_flops.py's
    "qwen3.5-27b": {
        "config_part": "text_config",
        "variants": [
            {"variant": "linear_attention_layers",
             "layer_pattern": ("layer_types", ["linear_attention"]), "flop_seqs": ()},
            {"variant": "attention_layers",
             "layer_pattern": ("layer_types", ["full_attention"]), "flop_seqs": ()},
        ]
    },
    "qwen3.5-35b-a3b": {
        "config_part": "text_config",
        "variants": [
            {"variant": "linear_attention_layers", "overrides": {"num_experts": 32},
             "layer_pattern": ("layer_types", ["linear_attention"]),
             "experts": ["grouped_mm"], "flop_seqs": ()},
            {"variant": "attention_layers", "overrides": {"num_experts": 32},
             "layer_pattern": ("layer_types", ["full_attention"]),
             "experts": ["grouped_mm"], "flop_seqs": ()},
        ]
    },
    # DeepSeek-V3.2-Exp's two layer kinds (DeepseekV32DecoderLayer: DeepSeek-V3's MLA with
    # the lightning indexer, DeepseekV32Indexer, whose top-k token indices are scattered
    # into the attention mask; then the experts beside the shared expert, or a dense MLP
    # in the first three layers), each alone, its FP8 quantization_config removed (the
    # weights bf16).  At DeepSeek's widths one layer's weights and the 129280-token head
    # do not fit beside five other engineers' jobs on this machine, so the layers are
    # measured at small widths (V32_WIDTHS: hidden 256, 4 heads, 16 of the 256 experts
    # in the published 8 groups, a 16384-token vocabulary; every saved tensor scales with
    # one of them, and the test builds the same widths); the published index_topk 2048
    # exceeds every measured s, so the selection keeps every earlier key, and one more
    # variant selects 64 keys (the saved tensors do not depend on it); FLOPs at s 256 and
    # 512 (forward and backward, the indexer has no backward: torch.no_grad)
    "deepseek-v3.2-exp": {
        "remove_keys": ["quantization_config"],
        "variants": [
            {"variant": "moe_layers",
             "overrides": {**V32_WIDTHS, "first_k_dense_replace": 0},
             "experts": ["grouped_mm"]},
            {"variant": "dense_layers",
             "overrides": {**V32_WIDTHS, "first_k_dense_replace": 3}},
            {"variant": "moe_layers_top_64",
             "overrides": {**V32_WIDTHS, "first_k_dense_replace": 0, "index_topk": 64},
             "experts": ["grouped_mm"], "saved_shapes": [(1, 256), (2, 512)],
             "flop_seqs": (), "inventory": False},
            # query and value heads of one width (16 + 16 and 32): SDPA takes its fused
            # kernel with the mask the model always passes, where the published widths
            # (192 and 128) take the math path; not DeepSeek's model, a check of that path
            {"variant": "moe_layers_equal_head_widths",
             "overrides": {**V32_WIDTHS, "first_k_dense_replace": 0, "qk_nope_head_dim": 16},
             "experts": ["grouped_mm"], "attn_impls": ["sdpa"], "flop_seqs": ()},
        ],
    },
    # Nemotron-H's MLP alone ("-", squared ReLU)
    "nemotron-h-8b": {
        "variants": [{"variant": "mlp_layers", "layer_pattern": ("hybrid_override_pattern", "-"),
                      "flop_seqs": ()}]
    },
    "bert-large": {
        "bert": True,
        "variants": [
            {"variant": "main"},
            {"variant": "default_dropout", "zero_dropout": False},
        ],
    },
}

# --------------------------------------------------------------------------------------------
# Parameter grouping by name.  First matching rule wins.
# --------------------------------------------------------------------------------------------
GROUP_RULES: list[tuple[str, str]] = [
    # attention: everything under self_attn / attn (q/k/v/o, fused qkv, biases, q_norm/k_norm,
    # MLA q_a/q_b/kv_a/kv_b projections and their norms); BERT self-attention and its output dense
    ("attention", r"\.(self_attn|attn)\."),
    ("attention", r"\.attention\.self\.|\.attention\.output\.dense\."),
    # Mamba-2 mixers (Mamba2ForCausalLM: every block's one module is `mixer`)
    ("mamba", r"\.mixer\.(in_proj|out_proj|conv1d|norm)\.|\.mixer\.(dt_bias|A_log|D)$"),
    # Nemotron-H: every block's one module is `mixer`, of the kind its layer is
    ("attention", r"\.mixer\.[qkvo]_proj\."),
    ("mlp", r"\.mixer\.(up|down)_proj\."),
    ("embedding", r"^(model|backbone)\.embeddings\."),
    # Qwen3-Next: the gated DeltaNet `linear_attn` (its gated norm included) and the
    # shared expert's sigmoid gate
    ("linear_attention", r"\.linear_attn\."),
    ("shared_experts", r"\.shared_expert_gate\."),
    # ERNIE 4.5: the router's correction bias (Ernie4_5_MoeStatics under the gate)
    ("router", r"\.gate\.moe_statics\."),
    # Granite 4: the Mamba-2 mixer `mamba`, the shared MLP beside the experts, the router
    ("mamba", r"\.mamba\."),
    ("shared_experts", r"\.shared_mlp\."),
    ("router", r"\.block_sparse_moe\.router\."),
    ("experts", r"\.block_sparse_moe\.experts\."),
    ("experts", r"\.experts\."),  # routed experts (fused 3-D tensors in transformers 5)
    ("shared_experts", r"\.shared_experts?\."),
    ("router", r"\.(gate|router)\.(weight|bias|e_score_correction_bias)$"),
    (
        "embedding",
        r"(embed_tokens|\.wte\.|\.wpe\.|word_embeddings|position_embeddings|token_type_embeddings)",
    ),
    ("norms", r"(norm|LayerNorm|\.ln_\d+\.|\.ln_f\.)"),
    ("mlp", r"\.(mlp|intermediate)\.|\.output\.dense\."),
    ("mlp", r"\.feed_forward\."),  # Falcon-H1's MLP
    ("head", r"^(lm_head|cls)\."),
    ("pooler", r"pooler\."),
]
_COMPILED_RULES = [(g, re.compile(p)) for g, p in GROUP_RULES]
GROUPS = [
    "embedding",
    "attention",
    "linear_attention",
    "mamba",
    "mlp",
    "experts",
    "shared_experts",
    "router",
    "norms",
    "head",
    "pooler",
    "other",
]


def param_group(name: str) -> str:
    for group, rx in _COMPILED_RULES:
        if rx.search(name):
            return group
    return "other"


# --------------------------------------------------------------------------------------------
# Config helpers
# --------------------------------------------------------------------------------------------
DROPOUT_KEY_RX = re.compile(r"(dropout|pdrop|drop_prob|dropout_prob)")


def load_published(name: str) -> tuple[dict, dict]:
    raw = json.loads((CONFIG_DIR / f"{name}.json").read_text())
    meta = {k: v for k, v in raw.items() if k.startswith("_")}
    pub = {k: v for k, v in raw.items() if not k.startswith("_")}
    return meta, pub


def layer_key(pub: dict) -> str:
    return "n_layer" if "n_layer" in pub else "num_hidden_layers"


def make_config(pub: dict, overrides: dict, remove: list[str]):
    d = {k: v for k, v in pub.items() if k not in remove}
    d.update(overrides)
    model_type = d.pop("model_type")
    return AutoConfig.for_model(model_type, **d)


def dropout_keys(cfg) -> dict:
    out = {}
    for k, v in cfg.to_dict().items():
        if DROPOUT_KEY_RX.search(k) and isinstance(v, (int, float)) and not isinstance(v, bool):
            out[k] = v
    return out


def jsonable(obj):
    return json.loads(json.dumps(obj, default=str))


# --------------------------------------------------------------------------------------------
# Model helpers
# --------------------------------------------------------------------------------------------
def model_class(spec: dict):
    if spec.get("bert"):
        return transformers.BertForMaskedLM
    return AutoModelForCausalLM


def build_model(spec: dict, cfg, **kwargs):
    cls = model_class(spec)
    if spec.get("bert"):
        return cls._from_config(cfg, **kwargs)
    return cls.from_config(cfg, **kwargs)


def class_name_for(spec: dict, cfg) -> str:
    if spec.get("bert"):
        return "BertForMaskedLM"
    return AutoModelForCausalLM._model_mapping[type(cfg)].__name__


def decoder_layers(model):
    best = None
    for name, mod in model.named_modules():
        if (
            isinstance(mod, torch.nn.ModuleList)
            and re.search(r"(layers|\.h|\.layer)$", name)
            and best is None
        ):
            best = (name, mod)
    return best


def count_params(model) -> dict:
    by_group = collections.Counter()
    unmatched = []
    names_by_group = collections.defaultdict(list)
    for name, p in model.named_parameters():  # remove_duplicate=True: tied weights once
        g = param_group(name)
        by_group[g] += p.numel()
        if g == "other":
            unmatched.append(name)
        generic = re.sub(r"\.\d+\.", ".N.", name)
        if generic not in names_by_group[g]:
            names_by_group[g].append(generic)
    total = sum(p.numel() for p in model.parameters())
    assert total == sum(by_group.values()), (total, by_group)
    layers = decoder_layers(model)
    per_layer = {}
    if layers is not None:
        lname, lmod = layers
        idxs = sorted({0, len(lmod) - 1})
        for i in idxs:
            c = collections.Counter()
            for n, p in lmod[i].named_parameters():
                c[param_group(f"{lname}.{i}.{n}")] += p.numel()
            per_layer[str(i)] = {
                "total_params": sum(c.values()),
                "by_group_params": {g: c[g] for g in GROUPS if c[g]},
            }
    tied = None
    try:
        out_emb = model.get_output_embeddings()
        in_emb = model.get_input_embeddings()
        if out_emb is not None:
            tied = out_emb.weight is in_emb.weight
    except Exception:  # noqa: BLE001
        pass
    return {
        "total_params": total,
        "by_group_params": {g: by_group[g] for g in GROUPS},
        "param_names_by_group": dict(names_by_group),
        "unmatched_param_names": unmatched,
        "word_embeddings_tied": tied,
        "per_layer_params": per_layer,
    }


def full_param_counts(spec: dict, pub: dict, remove: list[str]) -> dict:
    cfg = make_config(pub, {}, remove)
    res = {}
    with torch.device("meta"):
        model = build_model(spec, cfg)
    res = {"model_class": type(model).__name__, **count_params(model)}
    del model
    if spec.get("bert"):
        with torch.device("meta"):
            base = transformers.BertModel(cfg)  # add_pooling_layer=True, as published BertModel
        res["base_model"] = {"model_class": "BertModel", **count_params(base)}
        del base
    res["num_hidden_layers"] = pub.get(layer_key(pub))
    return res


class ModuleStack:
    """Tracks the innermost module currently running its forward."""

    def __init__(self, model):
        self.stack: list[str] = []
        self.handles = []
        for name, mod in model.named_modules():
            self.handles.append(mod.register_forward_pre_hook(self._pre(name)))
            self.handles.append(mod.register_forward_hook(self._post(name), always_call=True))

    def _pre(self, name):
        def hook(mod, args):
            self.stack.append(name or "<root>")

        return hook

    def _post(self, name):
        def hook(mod, args, out):
            if self.stack:
                self.stack.pop()

        return hook

    @property
    def current(self) -> str:
        return self.stack[-1] if self.stack else "<outside>"

    def remove(self):
        for h in self.handles:
            h.remove()


class RoutingRecorder:
    """Counts tokens routed to each expert (forward pre-hook on the *Experts modules)."""

    def __init__(self, model):
        self.counts: dict[str, list[int]] = {}
        self.top_k = None
        self.handles = []
        for name, mod in model.named_modules():
            if type(mod).__name__.endswith("Experts") and hasattr(mod, "num_experts"):
                self.handles.append(
                    mod.register_forward_pre_hook(self._hook(name), with_kwargs=True)
                )

    def _hook(self, name):
        def hook(mod, args, kwargs):
            idx = args[1] if len(args) > 1 else kwargs.get("top_k_index")
            if idx is None:
                return
            self.top_k = int(idx.shape[-1])
            c = torch.bincount(idx.reshape(-1).to(torch.int64), minlength=mod.num_experts)
            self.counts[name] = [int(x) for x in c.tolist()]

        return hook

    def reset(self):
        self.counts = {}

    def remove(self):
        for h in self.handles:
            h.remove()


class SDPARecorder:
    """Wraps torch.nn.functional.scaled_dot_product_attention to record how it is called and which
    backend torch._fused_sdp_choice picks for those arguments on this device."""

    def __init__(self):
        self.calls = collections.OrderedDict()
        self._orig = None

    def __enter__(self):
        self._orig = torch.nn.functional.scaled_dot_product_attention
        orig = self._orig

        def wrapper(
            query,
            key,
            value,
            attn_mask=None,
            dropout_p=0.0,
            is_causal=False,
            scale=None,
            enable_gqa=False,
        ):
            try:
                choice = torch._fused_sdp_choice(
                    query,
                    key,
                    value,
                    attn_mask,
                    dropout_p,
                    is_causal,
                    scale=scale,
                    enable_gqa=enable_gqa,
                )
                backend = torch.nn.attention.SDPBackend(choice).name
            except Exception as e:  # noqa: BLE001
                backend = f"unknown ({type(e).__name__})"
            sig = (
                tuple(query.shape),
                tuple(key.shape),
                tuple(value.shape),
                None if attn_mask is None else (tuple(attn_mask.shape), str(attn_mask.dtype)),
                bool(is_causal),
                float(dropout_p),
                bool(enable_gqa),
                backend,
            )
            self.calls[sig] = self.calls.get(sig, 0) + 1
            return orig(
                query,
                key,
                value,
                attn_mask=attn_mask,
                dropout_p=dropout_p,
                is_causal=is_causal,
                scale=scale,
                enable_gqa=enable_gqa,
            )

        torch.nn.functional.scaled_dot_product_attention = wrapper
        return self

    def __exit__(self, *exc):
        torch.nn.functional.scaled_dot_product_attention = self._orig

    def summary(self):
        return [
            {
                "query_shape": list(q),
                "key_shape": list(k),
                "value_shape": list(v),
                "attn_mask": None if m is None else {"shape": list(m[0]), "dtype": m[1]},
                "is_causal": c,
                "dropout_p": d,
                "enable_gqa": g,
                "fused_sdp_choice": be,
                "calls": n,
            }
            for (q, k, v, m, c, d, g, be), n in self.calls.items()
        ]


class OpLog(TorchDispatchMode):
    """Counts every aten op (and custom op) dispatched, and records the attention / grouped-mm
    kernels with the FLOPs FlopCounterMode would give them (or does not give them)."""

    def __init__(self):
        super().__init__()
        self.counts = collections.Counter()
        self.special = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func)
        self.counts[name] += 1
        out = func(*args, **kwargs)
        try:
            if (
                "scaled_dot_product" in name
                or "flash_attention" in name
                or "efficient_attention" in name
            ):
                self._attention(func, name, args, kwargs)
            elif "grouped_mm" in name:
                self._grouped(func, name, args, kwargs, out)
        except Exception as e:  # noqa: BLE001
            self.special.append({"op": name, "error": repr(e)})
        return out

    def _attention(self, func, name, args, kwargs):
        tens = [a for a in args if isinstance(a, torch.Tensor)]
        counted = func.overloadpacket in flop_registry
        entry = {
            "op": name,
            "counted_by_FlopCounterMode": counted,
            "tensor_arg_shapes": [list(t.shape) for t in tens[:4]],
        }
        if "backward" in name:
            go, q, k, v = tens[0], tens[1], tens[2], tens[3]
            entry["sdpa_formula_flops"] = sdpa_backward_flop_count(
                go.shape, q.shape, k.shape, v.shape
            )
        else:
            q, k, v = tens[0], tens[1], tens[2]
            entry["sdpa_formula_flops"] = sdpa_flop_count(q.shape, k.shape, v.shape)
        self.special.append(entry)

    def _grouped(self, func, name, args, kwargs, out):
        a, b = args[0], args[1]
        offs = kwargs.get("offs", args[2] if len(args) > 2 else None)
        used = int(offs[-1]) if isinstance(offs, torch.Tensor) and offs.numel() else None
        if a.dim() == 2 and b.dim() == 3:  # (M,K) x (G,K,N) -> (M,N)
            m = used if used is not None else a.shape[0]
            flops = 2 * m * a.shape[1] * b.shape[2]
        elif a.dim() == 2 and b.dim() == 2:  # (K,S) x (S,N) grouped over S -> (G,K,N)
            s = used if used is not None else a.shape[1]
            flops = 2 * a.shape[0] * s * b.shape[1]
        elif a.dim() == 3 and b.dim() == 2:  # (G,M,K) x (K,N) grouped over N
            n = used if used is not None else b.shape[1]
            flops = 2 * a.shape[1] * a.shape[2] * n
        else:
            flops = 2 * a.shape[0] * a.shape[1] * a.shape[2] * b.shape[-1]
        self.special.append(
            {
                "op": name,
                "counted_by_FlopCounterMode": func.overloadpacket in flop_registry,
                "a_shape": list(a.shape),
                "b_shape": list(b.shape),
                "rows_covered_by_offs": used,
                "out_shape": list(out.shape),
                "matmul_flops_computed_here": int(flops),
            }
        )

    def summary(self):
        specials = collections.OrderedDict()
        for e in self.special:
            k = json.dumps(e, sort_keys=True)
            specials[k] = specials.get(k, 0) + 1
        spec_list = []
        for k, n in specials.items():
            d = json.loads(k)
            d["calls"] = n
            spec_list.append(d)
        uncounted = sum(
            e.get("sdpa_formula_flops", 0) + e.get("matmul_flops_computed_here", 0)
            for e in self.special
            if e.get("counted_by_FlopCounterMode") is False
        )
        return {
            "op_call_counts": dict(sorted(self.counts.items())),
            "attention_and_grouped_mm_calls": spec_list,
            "uncounted_kernel_flops_computed_here": int(uncounted),
        }


# --------------------------------------------------------------------------------------------
# Measurements
# --------------------------------------------------------------------------------------------
def make_ids(vocab: int, b: int, s: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * b + s)
    return torch.randint(0, vocab, (b, s), generator=g)


def graph_saved_by(loss: torch.Tensor) -> dict:
    """Walks the autograd graph from the loss and maps each saved tensor to the nodes saving it."""
    found = collections.defaultdict(set)

    def key(t):
        return (
            t.untyped_storage().data_ptr(),
            t.storage_offset(),
            tuple(t.shape),
            tuple(t.stride()),
            str(t.dtype),
        )

    def visit(val, nodename):
        if isinstance(val, torch.Tensor):
            found[key(val)].add(nodename)
        elif isinstance(val, (list, tuple)):
            for v in val:
                visit(v, nodename)

    seen = set()
    stack = [loss.grad_fn]
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        nodename = fn.name()
        for attr in dir(fn):
            if attr.startswith("_saved_"):
                with contextlib.suppress(Exception):
                    visit(getattr(fn, attr), nodename)
        if hasattr(fn, "saved_tensors"):
            with contextlib.suppress(Exception):
                visit(tuple(fn.saved_tensors), nodename)
        for nf, _ in fn.next_functions:
            if nf is not None:
                stack.append(nf)
    return found


def saved_run(model, ids, ctx, want_detail: bool) -> tuple[dict, list | None]:
    """One training forward with labels under saved_tensors_hooks.  Returns the summary and, if
    want_detail, the per-tensor rows."""
    param_ptrs, buffer_ptrs = ctx["param_ptrs"], ctx["buffer_ptrs"]
    tracker, routing = ctx["tracker"], ctx["routing"]
    ids_ptr = ids.untyped_storage().data_ptr()
    entries: list[dict] = []
    by_ptr: dict[int, dict] = {}
    rows: list = []
    tensor_bytes_no_dedup = collections.Counter()
    n_pack = 0

    def pack(t):
        nonlocal n_pack
        n_pack += 1
        st = t.untyped_storage()
        ptr = st.data_ptr()
        nb = st.nbytes()
        if ptr in param_ptrs:
            kind = "param"
        elif ptr in buffer_ptrs:
            kind = "buffer"
        elif ptr == ids_ptr:
            kind = "input"
        else:
            kind = "activation"
        e = by_ptr.get(ptr)
        new = False
        if e is None or e["ref"].expired() or ptr == 0:
            # a dead storage's address can be reused: only a live storage is a duplicate
            e = {
                "idx": len(entries),
                "nbytes": nb,
                "kind": kind,
                "module": tracker.current,
                "dtype": str(t.dtype),
                "ref": StorageWeakRef(st),
            }
            entries.append(e)
            by_ptr[ptr] = e
            new = True
        tb = t.numel() * t.element_size()
        tensor_bytes_no_dedup[kind] += tb
        if want_detail:
            rows.append(
                [
                    tracker.current,
                    list(t.shape),
                    str(t.dtype).replace("torch.", ""),
                    tb,
                    nb,
                    e["idx"],
                    new,
                    kind,
                    (ptr, t.storage_offset(), tuple(t.shape), tuple(t.stride()), str(t.dtype)),
                ]
            )
        # detach(): same storage, no grad_fn.  Returning t itself makes a saved output hold its own
        # grad_fn, a C++/Python reference cycle that is never reclaimed when backward is not run
        # (pytorch/pytorch#115255): every run's whole graph, params' views included, would leak
        # and dead branches of the graph would stay alive and be counted.
        return t.detach()

    routing.reset()
    t0 = time.time()
    with SDPARecorder() as sdpa_rec, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(input_ids=ids, labels=ids)
    elapsed = time.time() - t0
    loss = out.loss
    logits = out.logits
    logits_info = {
        "shape": list(logits.shape),
        "dtype": str(logits.dtype),
        "bytes": logits.numel() * logits.element_size(),
    }
    del logits
    out = None
    saved_by = graph_saved_by(loss) if want_detail else None
    gc.collect()

    live = collections.Counter()
    freed = collections.Counter()
    act_by_dtype = collections.Counter()
    act_by_module = collections.Counter()
    n_live_act = 0
    for e in entries:
        if e["ref"].expired():
            freed[e["kind"]] += e["nbytes"]
            e["live"] = False
            continue
        e["live"] = True
        live[e["kind"]] += e["nbytes"]
        if e["kind"] == "activation":
            n_live_act += 1
            act_by_dtype[e["dtype"].replace("torch.", "")] += e["nbytes"]
            act_by_module[e["module"]] += e["nbytes"]
    summary = {
        "saved_activation_bytes": live["activation"],
        "saved_input_ids_bytes": live["input"],
        "saved_buffer_bytes": live["buffer"],
        "saved_param_storage_bytes": live["param"],
        "saved_then_freed_in_forward_bytes": sum(freed.values()),
        "saved_activation_tensor_bytes_without_storage_dedup": tensor_bytes_no_dedup["activation"],
        "saved_activation_bytes_by_dtype": dict(act_by_dtype),
        "saved_activation_bytes_by_first_module": dict(sorted(act_by_module.items())),
        "pack_hook_calls": n_pack,
        "live_activation_storages": n_live_act,
        "output_logits": logits_info,
        "loss": float(loss.detach().float()),
        "forward_seconds": round(elapsed, 3),
        "sdpa_calls": sdpa_rec.summary(),
    }
    if routing.counts:
        summary["tokens_per_expert_by_layer"] = dict(routing.counts)
    detail = None
    if want_detail:
        detail = []
        for r in rows:
            k = r.pop()
            e = entries[r[5]]
            r.insert(1, ",".join(sorted(saved_by.get(k, ()))))
            r.append(bool(e.get("live")))
            detail.append(r)
    del loss
    entries.clear()
    by_ptr.clear()
    gc.collect()
    return summary, detail


def flop_run(model, ids, ctx, backward: bool = True) -> dict:
    routing = ctx["routing"]
    routing.reset()
    t0 = time.time()
    log_f, log_b = OpLog(), OpLog()
    with FlopCounterMode(display=False) as fc_f, log_f:
        out = model(input_ids=ids, labels=ids)
    loss = out.loss
    out = None
    if backward:
        with FlopCounterMode(display=False) as fc_b, log_b:
            loss.backward()
    del loss
    model.zero_grad(set_to_none=True)
    gc.collect()

    def by_op(fc):
        return {
            str(k): int(v)
            for k, v in sorted(
                fc.get_flop_counts().get("Global", {}).items(), key=lambda kv: str(kv[0])
            )
        }

    f = int(fc_f.get_total_flops())
    res = {"forward_flops": f, "forward_flops_by_op": by_op(fc_f), "forward_ops": log_f.summary()}
    if backward:
        b = int(fc_b.get_total_flops())
        res.update(
            {
                "backward_flops": b,
                "forward_backward_flops": f + b,
                "backward_flops_by_op": by_op(fc_b),
                "backward_ops": log_b.summary(),
            }
        )
    else:
        res["backward"] = "not run (see MOE_EXTRA in measure_hf.py)"
    res["seconds"] = round(time.time() - t0, 3)
    if routing.counts:
        res["tokens_per_expert_by_layer"] = dict(routing.counts)
    return res


class FastNormalInit:
    """Speeds up building big random models: while active, transformers' normal_ init of a tensor
    with more than POOL_MIN elements copies std * (a pool of 2**24 standard-normal values taken at
    random offsets) + mean instead of drawing every value (torch draws ~1e8 normals/s here, so a
    1e9-parameter vocabulary would take ~10 s per build).  Smaller tensors (router weights, norms,
    biases) are drawn normally.  Values do not change any measured byte or FLOP count."""

    POOL = 1 << 24
    POOL_MIN = 1 << 22

    def __init__(self, seed: int = SEED):
        self.gen = torch.Generator().manual_seed(seed)
        self.pool = torch.randn(2 * self.POOL, generator=self.gen)
        self.scaled = {}
        import transformers.initialization as hf_init

        self.hf_init = hf_init
        self.orig = hf_init.TORCH_INIT_FUNCTIONS["normal_"]

    def normal_(self, tensor, mean=0.0, std=1.0, generator=None):
        n = tensor.numel()
        if n <= self.POOL_MIN or tensor.device.type != "cpu" or not tensor.is_contiguous():
            return self.orig(tensor, mean=mean, std=std, generator=generator)
        key = (float(mean), float(std), tensor.dtype)
        if key not in self.scaled:
            self.scaled[key] = self.pool.mul(std).add_(mean).to(tensor.dtype)
        pool = self.scaled[key]
        with torch.no_grad():
            flat = tensor.view(-1)
            for start in range(0, n, self.POOL):
                k = min(self.POOL, n - start)
                off = int(torch.randint(0, self.POOL, (1,), generator=self.gen))
                flat[start : start + k].copy_(pool[off : off + k])
        return tensor

    def __enter__(self):
        self.hf_init.TORCH_INIT_FUNCTIONS["normal_"] = self.normal_
        # torch's own constructor-time init of Linear/Embedding is redundant: transformers'
        # post_init() re-initialises every weight (checked after each build, see check_init)
        self.saved_resets = (torch.nn.Linear.reset_parameters, torch.nn.Embedding.reset_parameters)
        torch.nn.Linear.reset_parameters = lambda mod: None
        torch.nn.Embedding.reset_parameters = lambda mod: None
        return self

    def __exit__(self, *exc):
        self.hf_init.TORCH_INIT_FUNCTIONS["normal_"] = self.orig
        torch.nn.Linear.reset_parameters, torch.nn.Embedding.reset_parameters = self.saved_resets


def check_init(model) -> dict:
    """Every parameter must be finite and every >=2-D weight non-constant (i.e. initialised)."""
    bad = []
    for name, p in model.named_parameters():
        sample = p.detach().reshape(-1)[: 1 << 20].float()
        if not torch.isfinite(sample).all() or (p.dim() >= 2 and float(sample.std()) == 0.0):
            bad.append(name)
    return {"all_finite_and_initialised": not bad, "suspicious_params": bad}


def force_attn_impl(model, impl: str):
    seen = set()
    for mod in model.modules():
        cfg = getattr(mod, "config", None)
        if cfg is not None and id(cfg) not in seen:
            seen.add(id(cfg))
            cfg._attn_implementation_internal = impl


def layer_kinds(model, cfg) -> list:
    layers = decoder_layers(model)
    if layers is None:
        return []
    out = []
    types = getattr(cfg, "layer_types", None)
    for i, layer in enumerate(layers[1]):
        d = {"index": i}
        for attr in ("mlp", "block_sparse_moe", "intermediate"):
            if hasattr(layer, attr):
                d["mlp_class"] = type(getattr(layer, attr)).__name__
                break
        for attr in ("self_attn", "attn", "attention"):
            if hasattr(layer, attr):
                d["attention_class"] = type(getattr(layer, attr)).__name__
                break
        if types is not None and i < len(types):
            d["layer_type"] = types[i]
        out.append(d)
    return out


def measure_variant(name: str, spec: dict, pub: dict, var: dict, log) -> dict:
    remove = spec.get("remove_keys", [])
    lkey = layer_key(pub)
    overrides = dict(var.get("overrides", {}))
    overrides["use_cache"] = False
    zero = var.get("zero_dropout", True)
    base_cfg = make_config(pub, overrides, remove)
    drops = dropout_keys(base_cfg)
    if zero:
        for k, v in drops.items():
            if v:
                overrides[k] = 0.0
    attn_impls = var.get("attn_impls", list(ATTN_IMPLS))
    experts_impls = var.get("experts") or [None]
    saved_shapes = var.get("saved_shapes", SAVED_SHAPES)
    flop_seqs = var.get("flop_seqs", FLOP_SEQS)
    want_inventory = var.get("inventory", True)

    changes = {
        lkey: {"published": pub.get(lkey), "used": list(LAYER_COUNTS)},
    }
    pattern = var.get("layer_pattern")
    if pattern is not None:
        changes[pattern[0]] = {"published": pub.get(pattern[0]),
                               "used": {str(L): pattern[1] * L for L in LAYER_COUNTS}}
    for k, v in overrides.items():
        changes[k] = {
            "published": pub.get(
                k,
                "<absent: transformers default "
                + json.dumps(drops.get(k, getattr(base_cfg, k, None)), default=str)
                + ">",
            ),
            "used": v,
        }
    for k in remove:
        if k in pub:
            changes[k] = {"published": pub[k], "used": "<removed>"}
    result = {
        "variant": var["variant"],
        "changes_from_published": jsonable(changes),
        "dropout_keys_in_config": drops,
        "dropout_zeroed": zero,
        "attn_implementations": attn_impls,
        "experts_implementations": experts_impls,
        "configs_used": {},
        "layers": {},
        "param_dtypes_numel": {},
        "saved_runs": [],
        "flop_runs": [],
        "inventory": [],
        "errors": [],
    }
    for L in LAYER_COUNTS:
        by_pattern = ({pattern[0]: pattern[1] * L, lkey: len(pattern[1]) * L}
                      if pattern is not None else {})
        cfg = make_config(pub, {**overrides, lkey: L, **by_pattern}, remove)
        torch.manual_seed(SEED)
        t0 = time.time()
        try:
            kwargs = {"dtype": DTYPE, "attn_implementation": "eager"}
            with FastNormalInit(SEED):
                model = build_model(spec, cfg, **kwargs)
        except Exception as e:  # noqa: BLE001
            result["errors"].append(
                {"num_layers": L, "stage": "build", "error": f"{type(e).__name__}: {e}"}
            )
            log(f"  build L={L} failed: {e}")
            continue
        model.train()
        log(f"  [{var['variant']}] built L={L} {type(model).__name__} in {time.time() - t0:.1f}s")
        result["configs_used"][str(L)] = jsonable(model.config.to_dict())
        result["layers"][str(L)] = layer_kinds(model, model.config)
        dt = collections.Counter()
        for p in model.parameters():
            dt[str(p.dtype).replace("torch.", "")] += p.numel()
        result["param_dtypes_numel"][str(L)] = dict(dt)
        result.setdefault("init_check", {})[str(L)] = check_init(model)
        # free each parameter's gradient as soon as it is accumulated (memory); FLOPs unchanged
        # (a frozen parameter, such as ERNIE 4.5's e_score_correction_bias, has none)
        for p in model.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(lambda p: setattr(p, "grad", None))
        ctx = {
            "param_ptrs": {p.untyped_storage().data_ptr() for p in model.parameters()},
            "buffer_ptrs": {b.untyped_storage().data_ptr() for b in model.buffers()},
            "tracker": ModuleStack(model),
            "routing": RoutingRecorder(model),
        }
        vocab = model.config.vocab_size
        for ex in experts_impls:
            if ex is not None:
                try:
                    model.set_experts_implementation(ex)
                except Exception as e:  # noqa: BLE001
                    result["errors"].append(
                        {
                            "num_layers": L,
                            "experts_implementation": ex,
                            "stage": "set_experts",
                            "error": f"{type(e).__name__}: {e}",
                        }
                    )
                    continue
                ex_used = model.config._experts_implementation
            else:
                ex_used = None
            for impl in attn_impls:
                try:
                    if var.get("force_attn"):
                        force_attn_impl(model, impl)
                    else:
                        model.set_attn_implementation(impl)
                except Exception as e:  # noqa: BLE001
                    result["errors"].append(
                        {
                            "num_layers": L,
                            "attn_implementation": impl,
                            "stage": "set_attn_implementation",
                            "error": f"{type(e).__name__}: {e}",
                        }
                    )
                    log(f"    attn {impl}: {type(e).__name__}: {e}")
                    continue
                impl_used = model.config._attn_implementation
                tag = {
                    "attn_implementation": impl_used,
                    "experts_implementation": ex_used,
                    "num_layers": L,
                }
                for b, s in saved_shapes:
                    detail_wanted = want_inventory and (b, s) == INVENTORY_SHAPE
                    try:
                        summ, detail = saved_run(model, make_ids(vocab, b, s), ctx, detail_wanted)
                    except Exception as e:  # noqa: BLE001
                        result["errors"].append(
                            {
                                **tag,
                                "batch": b,
                                "seq": s,
                                "stage": "saved_run",
                                "error": f"{type(e).__name__}: {e}",
                                "trace": traceback.format_exc()[-1500:],
                            }
                        )
                        log(f"    saved L={L} {impl} b={b} s={s} failed: {type(e).__name__}: {e}")
                        continue
                    result["saved_runs"].append({**tag, "batch": b, "seq": s, **summ})
                    log(
                        f"    saved L={L} {impl}{'/' + ex_used if ex_used else ''} b={b} s={s}: "
                        f"{summ['saved_activation_bytes']:,} B ({summ['forward_seconds']}s)"
                    )
                    if detail is not None:
                        result["inventory"].append({**tag, "batch": b, "seq": s, "tensors": detail})
                for s in flop_seqs:
                    try:
                        fr = flop_run(
                            model,
                            make_ids(vocab, 1, s),
                            ctx,
                            backward=var.get("flop_backward", True),
                        )
                    except Exception as e:  # noqa: BLE001
                        result["errors"].append(
                            {
                                **tag,
                                "batch": 1,
                                "seq": s,
                                "stage": "flop_run",
                                "error": f"{type(e).__name__}: {e}",
                                "trace": traceback.format_exc()[-1500:],
                            }
                        )
                        log(f"    flops L={L} {impl} s={s} failed: {type(e).__name__}: {e}")
                        continue
                    result["flop_runs"].append({**tag, "batch": 1, "seq": s, **fr})
                    log(
                        f"    flops L={L} {impl}{'/' + ex_used if ex_used else ''} s={s}: "
                        f"fwd {fr['forward_flops']:.4g} "
                        f"bwd {fr.get('backward_flops', float('nan')):.4g}"
                        f" ({fr['seconds']}s)"
                    )
        ctx["tracker"].remove()
        ctx["routing"].remove()
        del model, ctx
        gc.collect()
    result["per_layer_saved"] = per_layer(
        result["saved_runs"], ["saved_activation_bytes"], ("batch", "seq")
    )
    result["per_layer_flops"] = per_layer(
        result["flop_runs"],
        ["forward_flops", "backward_flops", "forward_backward_flops"],
        ("batch", "seq"),
    )
    return result


def per_layer(runs: list, keys: list, shape_keys: tuple) -> list:
    """per_layer = value(2 layers) - value(1 layer); fixed = value(1 layer) - per_layer."""
    idx = {}
    for r in runs:
        k = (
            r["attn_implementation"],
            r["experts_implementation"],
            *(r[s] for s in shape_keys),
            r["num_layers"],
        )
        idx[k] = r
    out = []
    for k, r1 in idx.items():
        if k[-1] != 1:
            continue
        r2 = idx.get(k[:-1] + (2,))
        if r2 is None:
            continue
        d = {"attn_implementation": k[0], "experts_implementation": k[1]}
        d.update({s: r1[s] for s in shape_keys})
        for key in keys:
            if key not in r1 or key not in r2:
                continue
            unit = key.rsplit("_", 1)[-1]
            base = key[: -len(unit) - 1]
            pl = r2[key] - r1[key]
            d[f"{base}_per_layer_{unit}"] = pl
            d[f"{base}_fixed_{unit}"] = r1[key] - pl
        out.append(d)
    return out


INVENTORY_FIELDS = [
    "module",
    "saved_by_autograd_nodes",
    "shape",
    "dtype",
    "tensor_bytes",
    "storage_bytes",
    "storage_index",
    "first_save_of_storage",
    "kind",
    "storage_live_after_forward",
]


def measure(name: str, log, checkpoint=None, only_variants=None, existing=None) -> dict:
    """`name`'s measurements; with `only_variants`, those variants alone, measured into
    `existing` (the architecture's file as written before), each with its own date."""
    spec = ARCHS[name]
    meta, pub = load_published(name)
    part = spec.get("config_part")
    if part is not None:  # the language model of a multimodal config.json
        pub = pub[part]
    remove = spec.get("remove_keys", [])
    t0 = time.time()
    log(f"== {name} ({pub['model_type']})")
    out = {
        "schema_version": SCHEMA_VERSION,
        "name": name,
        "model_type": pub["model_type"],
        "source_repo": meta.get("_source"),
        "published_config_file": f"validation/configs/{name}.json",
        **({"published_config_part": part} if part is not None else {}),
        "generated_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
        },
        "machine": {
            "device": "cpu",
            "torch_threads": torch.get_num_threads(),
            "processor": platform.processor(),
        },
        "measurement_setup": {
            "dtype": str(DTYPE).replace("torch.", ""),
            "weights": (
                "random: <Class>.from_config(config, dtype=bfloat16) after torch.manual_seed(0);"
                " transformers' normal_ init of tensors > 4Mi elements copies from a 16Mi-value"
                " normal pool at random offsets (FastNormalInit)"
            ),
            "mode": "model.train(); forward model(input_ids=ids, labels=ids); no attention_mask",
            "input_ids": "torch.randint(0, vocab_size, (b, s)), fixed generator seed per (b, s)",
            "layer_counts": list(LAYER_COUNTS),
            "saved_shapes_default": [list(x) for x in SAVED_SHAPES],
            "flop_batch": 1,
            "flop_seqs_default": list(FLOP_SEQS),
            "inventory_shape": list(INVENTORY_SHAPE),
        },
    }
    if pub["model_type"] not in transformers.CONFIG_MAPPING:
        out["skipped"] = (
            f"model_type {pub['model_type']} not in transformers {transformers.__version__}"
        )
        return out
    out["model_class"] = class_name_for(spec, make_config(pub, {}, remove))
    pc = full_param_counts(spec, pub, remove)
    pc["group_rules"] = [list(r) for r in GROUP_RULES] + [["other", "anything else"]]
    out["parameters_full_config"] = pc
    log(f"  params {pc['total_params']:,}")
    variants = spec.get("variants") or [{"variant": "main"}]
    out["variants"] = []
    if only_variants is not None:
        unknown = set(only_variants) - {var["variant"] for var in variants}
        if unknown:
            raise ValueError(f"unknown variants of {name}: {sorted(unknown)}")
        kept = {v["variant"]: v for v in (existing or {}).get("variants", ())}
        out = {**existing, "versions": out["versions"]} if existing else out
        out["variants"] = [kept[var["variant"]] for var in variants
                           if var["variant"] in kept and var["variant"] not in only_variants]
        variants = [var for var in variants if var["variant"] in only_variants]
    for var in variants:
        vt = time.time()
        res = measure_variant(name, spec, pub, var, log)
        res["seconds"] = round(time.time() - vt, 1)
        if only_variants is not None:
            res["generated_at"] = datetime.datetime.now(datetime.UTC).isoformat(
                timespec="seconds")
        out["variants"].append(res)
        if checkpoint is not None:  # a process killed later (e.g. out of memory) keeps this much
            checkpoint({**out, "incomplete": "written after variant " + var["variant"]})
    order = [var["variant"] for var in spec.get("variants") or [{"variant": "main"}]]
    out["variants"].sort(key=lambda v: order.index(v["variant"]))
    out["inventory_fields"] = INVENTORY_FIELDS
    out["moe"] = moe_summary(pub, out)
    if only_variants is None:
        out["seconds"] = round(time.time() - t0, 1)
    return out


def moe_summary(pub: dict, out: dict):
    keys = [
        "num_local_experts",
        "num_experts",
        "n_routed_experts",
        "num_experts_per_tok",
        "n_shared_experts",
        "moe_intermediate_size",
        "first_k_dense_replace",
        "n_group",
        "topk_group",
        "decoder_sparse_step",
        "mlp_only_layers",
    ]
    if not any(k in pub for k in ("num_local_experts", "num_experts", "n_routed_experts")):
        return None
    return {
        "published": {k: pub[k] for k in keys if k in pub},
        "top_k": pub.get("num_experts_per_tok"),
        "routing_note": (
            "Which expert a token goes to depends on the data and on the random router weights; "
            "tokens_per_expert_by_layer in each run gives the actual count per expert "
            "(sum = tokens * top_k). "
            "transformers has no capacity factor here, so no token is dropped and the total routed "
            "tokens per layer is exactly b*s*top_k."
        ),
    }


def compact_result(res: dict) -> dict:
    """Keeps the files small (< 300 KB): the per-op call counts of a FLOP run are kept only at the
    shortest measured sequence of its variant (the same ops run at s=512, more of them only where
    the MoE routing hits more experts), and the saved bytes by module only at batch 1.
    Idempotent; --recompact applies it to existing files."""
    for var in res.get("variants", ()):
        for r in var.get("saved_runs", ()):
            if r.get("batch") != 1:
                r.pop("saved_activation_bytes_by_first_module", None)
        runs = var.get("flop_runs", ())
        if not runs:
            continue
        shortest = min(r["seq"] for r in runs)
        for r in runs:
            if r["seq"] == shortest:
                continue
            for key in ("forward_ops", "backward_ops"):
                ops = r.get(key)
                if isinstance(ops, dict) and "op_call_counts" in ops:
                    del ops["op_call_counts"]
                    ops["op_call_counts_omitted"] = f"kept at seq={shortest} only"
    return res


def write_result(path: Path, res: dict) -> None:
    path.write_text(dump_json(compact_result(jsonable(res))) + "\n")


def _inline(x, depth: int = 0) -> bool:
    """Scalars, lists (up to two levels deep) of scalars and dicts of scalars go on one line."""
    if isinstance(x, dict):
        return depth == 0 and all(not isinstance(v, (dict, list)) for v in x.values())
    if isinstance(x, list):
        return depth < 2 and all(_inline(y, depth + 1) for y in x)
    return True


def dump_json(obj, level: int = 0) -> str:
    """JSON with one key per line, but short lists (inventory rows, shapes, counts) on one line."""
    pad = " " * level
    compact = json.dumps(obj, separators=(",", ":"))
    if _inline(obj) or len(compact) <= 120:
        return compact
    if isinstance(obj, dict):
        items = [f"{pad} {json.dumps(k)}: {dump_json(v, level + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    return "[\n" + ",\n".join(pad + " " + dump_json(x, level + 1) for x in obj) + "\n" + pad + "]"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--only", help="comma-separated architecture names (default: all)")
    ap.add_argument("--list", action="store_true", help="list architecture names and exit")
    ap.add_argument("--variants", help="comma-separated variants of the one --only "
                    "architecture: measured alone and merged into its existing file")
    ap.add_argument("--out-dir", default=str(DATA_DIR))
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    ap.add_argument(
        "--in-process",
        action="store_true",
        help="measure several architectures in this one process",
    )
    ap.add_argument(
        "--recompact",
        action="store_true",
        help="rewrite the existing files of --out-dir through compact_result (no measuring)",
    )
    args = ap.parse_args(argv)
    if args.recompact:
        for path in sorted(Path(args.out_dir).glob("*.json")):
            write_result(path, json.loads(path.read_text()))
            print(f"{path}: {path.stat().st_size / 1024:.0f} KiB")
        return 0
    if args.list:
        print("\n".join(ARCHS))
        return 0
    names = list(ARCHS) if not args.only else [n.strip() for n in args.only.split(",") if n.strip()]
    bad = [n for n in names if n not in ARCHS]
    if bad:
        print(f"unknown architecture(s): {bad}; known: {list(ARCHS)}", file=sys.stderr)
        return 2
    only_variants = None
    if args.variants:
        if len(names) != 1:
            print("--variants needs exactly one --only architecture", file=sys.stderr)
            return 2
        only_variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if args.threads:
        torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    def log(msg):
        print(msg, flush=True)

    t0 = time.time()
    failed = []
    if len(names) > 1 and not args.in_process:
        # one fresh process per architecture: memory freed by one model build is not always
        # returned by the allocator, and a large MoE build should not start on a fragmented heap
        import subprocess

        for n in names:
            cmd = [
                sys.executable,
                str(Path(__file__).resolve()),
                "--only",
                n,
                "--out-dir",
                str(out_dir),
            ]
            if args.threads:
                cmd += ["--threads", str(args.threads)]
            rc = subprocess.call(cmd)
            if rc != 0:
                failed.append(n)
        log(f"all done in {time.time() - t0:.0f}s; failed: {failed}")
        return 1 if failed else 0
    for n in names:
        path = out_dir / f"{n}.json"
        existing = (json.loads(path.read_text()) if only_variants is not None and path.exists()
                    else None)
        try:
            res = measure(
                n,
                log,
                checkpoint=lambda r, path=path: write_result(path, r),
                only_variants=only_variants,
                existing=existing,
            )
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            failed.append(n)
            res = {
                "schema_version": SCHEMA_VERSION,
                "name": n,
                "failed": f"{type(e).__name__}: {e}",
            }
        write_result(path, res)
        log(f"  wrote {path} ({path.stat().st_size / 1024:.0f} KiB) in {res.get('seconds')}s")
    log(f"done in {time.time() - t0:.0f}s; failed: {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
