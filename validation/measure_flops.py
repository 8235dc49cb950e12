#!/usr/bin/env python3
"""Measure forward and backward FLOPs of the 2025 model types with FlopCounterMode, on the CPU.

Stand-alone like measure_hf.py, whose FLOP run it reuses (torch.utils.flop_counter.FlopCounterMode,
plus the grouped expert and CPU attention kernels it has no formula for, counted from their
shapes). Each model of MODELS is built from its preset config (validation/configs/<name>.json;
a multimodal config's text_config) with 1 and 2 layers, random bf16 weights, eager attention
and transformers' default experts code, in training mode; per-layer lists of the config
(layer_types, no_rope_layers, moe_layers) are cut to the layers built, and the changes of
CHANGES make a 2-layer model hold one layer of each kind at a size the CPU can hold. The
config each run used is written with it, to validation/data/flops/<name>.json, so that
tests/test_model_catalogue.py rebuilds exactly that model through llmpar's importer.

Usage:
  python validation/measure_flops.py                 # every model of MODELS
  python validation/measure_flops.py --only gpt-oss-20b
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
from pathlib import Path

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

HERE = Path(__file__).resolve().parent
OUT_DIR = HERE / "data" / "flops"
sys.path.insert(0, str(HERE))

from measure_hf import (  # noqa: E402
    DTYPE,
    SEED,
    FastNormalInit,
    RoutingRecorder,
    flop_run,
    make_ids,
)

SHAPES = ((1, 256), (1, 512))
"""(batch, sequence) of every run."""
CHANGES: dict[str, dict] = {
    "gpt-oss-20b": {"num_local_experts": 8},
    "llama-4-maverick": {"num_local_experts": 8},       # layer 0 dense, layer 1 MoE
    "glm-4.5-air": {"n_routed_experts": 16},            # layer 0 dense, layer 1 MoE
    "ernie-4.5-21b-a3b": {"moe_num_experts": 16},       # layer 0 dense, layer 1 MoE
    "minimax-m2": {"num_local_experts": 16},
    "smollm3-3b": {},
    "ministral-3-8b": {},
    "qwen3-next-80b-a3b": {"num_experts": 16, "full_attention_interval": 2},  # L, then A
    "deepseek-v3.2-exp": {"n_routed_experts": 16, "first_k_dense_replace": 1},
    "granite-4.0-h-small": {"num_local_experts": 16, "layer_types": ["mamba", "attention"]},
    "qwen3.5-27b": {"layer_types": ["linear_attention", "full_attention"]},  # L, then A
    "qwen3.5-35b-a3b": {"num_experts": 16, "layer_types": ["linear_attention",
                                                           "full_attention"]},
    "falcon-h1-1.5b": {},                       # attention and Mamba-2 in every layer
    "falcon-h1-0.5b": {},                       # ... without the gated norm
    # one module a layer: Mamba-2, attention, then an MLP alone (3 layers: one of each)
    "nemotron-h-8b": {"hybrid_override_pattern": "M*-"},
    # Mamba-2 mixers alone, without attention or MLP
    "mamba-codestral-7b": {},
    # Mamba-2, the experts alone, attention (3 layers: one of each)
    "nemotron-3-nano-30b-a3b": {"n_routed_experts": 16, "hybrid_override_pattern": "ME*"},
    # a windowed layer, then a global one (layer_types in place of sliding_window_pattern 6)
    "gemma-3-1b": {"layer_types": ["sliding_attention", "full_attention"]},
    # a RoPE (chunked) layer, then a NoPE (global) one; 4 of the 16 experts at 1024 of their
    # 8192 width and a 16384-token vocabulary, as validation/measure_hf.py measures it
    "llama-4-scout": {"num_local_experts": 4, "intermediate_size": 1024, "vocab_size": 16384,
                      "pad_token_id": None, "no_rope_layers": None,
                      "no_rope_layer_interval": 2},
}
"""The models measured and what each changes from its published config."""
PER_LAYER = ("layer_types", "no_rope_layers", "hybrid_override_pattern")
LAYER_COUNTS = {"nemotron-h-8b": (1, 3), "nemotron-3-nano-30b-a3b": (1, 3)}
"""Layers built where a model needs more than 2 to hold one of each kind (default 1, 2)."""


def config_used(name: str, layers: int) -> dict:
    """The config.json values of `name` as measured with `layers` layers."""
    raw = json.loads((HERE / "configs" / f"{name}.json").read_text(encoding="utf-8"))
    values = {k: v for k, v in raw.items() if not k.startswith("_")}
    values.pop("quantization_config", None)
    if isinstance(values.get("text_config"), dict) and values.get("vision_config"):
        values = dict(values["text_config"])
    values.update(CHANGES[name], num_hidden_layers=layers, use_cache=False)
    for key in PER_LAYER:
        if isinstance(values.get(key), list | str):
            values[key] = values[key][:layers]
    if isinstance(values.get("moe_layers"), list):
        values["moe_layers"] = [i for i in values["moe_layers"] if i < layers]
    return values


def measure(name: str) -> dict:
    runs = []
    for layers in LAYER_COUNTS.get(name, (1, 2)):
        values = config_used(name, layers)
        kwargs = {k: v for k, v in values.items() if k != "model_type"}
        config = AutoConfig.for_model(values["model_type"], **kwargs)
        torch.manual_seed(SEED)
        with FastNormalInit(SEED):
            model = AutoModelForCausalLM.from_config(config, dtype=DTYPE,
                                                     attn_implementation="eager")
        model.train()
        for parameter in model.parameters():  # grads freed once accumulated (memory)
            if parameter.requires_grad:  # not ERNIE 4.5's frozen correction bias
                parameter.register_post_accumulate_grad_hook(lambda p: setattr(p, "grad", None))
        ctx = {"routing": RoutingRecorder(model)}
        for batch, seq in SHAPES:
            ids = make_ids(model.config.vocab_size, batch, seq)
            run = flop_run(model, ids, ctx)
            runs.append({"num_layers": layers, "batch": batch, "seq": seq,
                         "attn_implementation": model.config._attn_implementation,
                         "model_class": type(model).__name__, "config_used": values,
                         "forward_flops": run["forward_flops"],
                         "forward_backward_flops": run["forward_backward_flops"],
                         "uncounted_kernel_flops_computed_here":
                             run["forward_ops"]["uncounted_kernel_flops_computed_here"],
                         "forward_flops_by_op": run["forward_flops_by_op"],
                         "backward_flops_by_op": run["backward_flops_by_op"],
                         "backward_uncounted_kernel_flops_computed_here":
                             run["backward_ops"]["uncounted_kernel_flops_computed_here"],
                         "parameters": sum(p.numel() for p in model.parameters())})
            print(f"{name} L={layers} b={batch} s={seq}: {run['forward_flops']:,}", flush=True)
        del model
    return {"name": name, "published_config_file": f"validation/configs/{name}.json",
            "changes": CHANGES[name],
            "generated_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                         "python": platform.python_version()},
            "runs": runs}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated names of MODELS")
    args = parser.parse_args()
    names = list(CHANGES) if not args.only else [n.strip() for n in args.only.split(",")]
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for name in names:
        result = measure(name)
        (OUT_DIR / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n",
                                              encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
