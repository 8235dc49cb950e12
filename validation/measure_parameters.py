#!/usr/bin/env python3
"""Measure the exact parameter counts of the preset configs with transformers, on the meta device.

Stand-alone like measure_hf.py (torch and transformers, see requirements.txt; the library and
its tests need neither). For every `validation/configs/<name>.json` that is the source of a
preset (it has `_cite`), the transformers model is built at its full published size on the
`meta` device (no memory, no weights) and its parameters are counted, in total and by group
with measure_hf.py's name rules (plus the module names of Llama 4 and ERNIE 4.5 that those
rules do not know). A multimodal config is measured through its `text_config`, as llmpar reads
it; Kimi K2's `kimi_k2`, which transformers does not register, as the `deepseek_v3` whose
modeling code its checkpoint ships. Writes validation/data/parameters/<name>.json.

Usage:
  python validation/measure_parameters.py               # every preset config
  python validation/measure_parameters.py --only gpt-oss-20b,llama-4-scout
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import platform
import re
import sys
import time
from pathlib import Path

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

HERE = Path(__file__).resolve().parent
CONFIG_DIR = HERE / "configs"
OUT_DIR = HERE / "data" / "parameters"
sys.path.insert(0, str(HERE))

from measure_hf import GROUP_RULES, GROUPS  # noqa: E402

EXTRA_RULES = [
    # the recurrent token mixers: Qwen3-Next's gated DeltaNet, Granite 4's Mamba-2
    ("linear_attention", r"\.linear_attn\."),
    ("mamba", r"\.mamba\."),
    # Nemotron-H: every block's one module is `mixer`, of the kind its layer is
    ("mamba", r"\.mixer\.(in_proj|out_proj|conv1d|norm)\.|\.mixer\.(dt_bias|A_log|D)$"),
    ("attention", r"\.mixer\.[qkvo]_proj\."),
    ("mlp", r"\.mixer\.(up|down)_proj\."),
    ("embedding", r"^(model|backbone)\.embeddings\."),
    # Qwen2-MoE and Qwen3-Next: the shared expert's gate belongs with the shared expert
    ("shared_experts", r"\.shared_expert_gate\."),
    # Granite 4: the shared MLP beside the experts, the router's `layer`
    ("shared_experts", r"\.shared_mlp\."),
    ("router", r"\.block_sparse_moe\.router\."),
    ("experts", r"\.block_sparse_moe\.experts\."),
    # ERNIE 4.5: the router's correction bias is a parameter of Ernie4_5_MoeStatics
    ("router", r"\.moe_statics\.e_score_correction_bias$"),
    # Llama 4: the block's MLP is `feed_forward` (experts, shared_expert and router inside)
    ("experts", r"\.feed_forward\.experts\."),
    ("shared_experts", r"\.feed_forward\.shared_expert\."),
    ("router", r"\.feed_forward\.router\.(weight|bias)$"),
    ("mlp", r"\.feed_forward\."),
]
ALL_GROUPS = list(GROUPS)
"""measure_hf.py's groups (the recurrent mixers' among them), in llmpar's order."""
RULES = [(group, re.compile(pattern)) for group, pattern in EXTRA_RULES + GROUP_RULES]
MODEL_TYPES = {"kimi_k2": "deepseek_v3"}
"""model_types transformers does not register, and the one whose code the checkpoint runs."""


def group_of(name: str) -> str:
    return next((group for group, rule in RULES if rule.search(name)), "other")


def preset_configs() -> list[Path]:
    return [path for path in sorted(CONFIG_DIR.glob("*.json"))
            if "_cite" in json.loads(path.read_text(encoding="utf-8"))]


def measure(path: Path) -> dict:
    raw = json.loads(path.read_text(encoding="utf-8"))
    values = {k: v for k, v in raw.items() if not k.startswith("_")}
    values.pop("quantization_config", None)  # meta tensors in the checkpoint's dtype
    read = "$"
    if isinstance(values.get("text_config"), dict) and values.get("vision_config"):
        values, read = dict(values["text_config"]), "$.text_config"
    removed = []
    scaling = values.get("rope_scaling")
    if isinstance(scaling, dict) and scaling.get("type") == "longrope" and (
            "long_factor" not in scaling):
        # abridged in the config (its _note says so); RoPE scaling changes no count
        values.pop("rope_scaling")
        removed.append("rope_scaling")
    model_type = values.pop("model_type")
    built = MODEL_TYPES.get(model_type, model_type)
    config = AutoConfig.for_model(built, **values)
    start = time.perf_counter()
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    counts: collections.Counter[str] = collections.Counter()
    for name, parameter in model.named_parameters():  # tied weights once
        counts[group_of(name)] += parameter.numel()
    total = sum(parameter.numel() for parameter in model.parameters())
    assert total == sum(counts.values())
    return {
        "name": path.stem,
        "published_config_file": f"validation/configs/{path.name}",
        "read": read,
        "removed_keys": removed,
        "model_type": model_type,
        "built_as": built,
        "model_class": type(model).__name__,
        "generated_at": datetime.datetime.now(datetime.UTC).isoformat(
            timespec="seconds"),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "python": platform.python_version()},
        "total_params": total,
        "by_group_params": {group: counts[group] for group in ALL_GROUPS if counts[group]},
        "seconds": round(time.perf_counter() - start, 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated config names")
    args = parser.parse_args()
    paths = preset_configs()
    if args.only:
        wanted = {name.strip() for name in args.only.split(",")}
        paths = [path for path in paths if path.stem in wanted]
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for path in paths:
        result = measure(path)
        (OUT_DIR / f"{path.stem}.json").write_text(json.dumps(result, indent=1) + "\n",
                                                   encoding="utf-8")
        print(f"{path.stem}: {result['model_class']} {result['total_params']:,}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
