#!/usr/bin/env python3
"""Count Hugging Face PEFT's trainable parameters of LoRA and DoRA adapters, as ground truth
for llmpar's adapter counts (`[finetune]`).

Stand-alone script: the llmpar library never imports it, and the library's tests do not need
torch, transformers or peft. Every model is built from a config (validation/configs/<name>.json,
the published config.json values) at full size on the `meta` device (no memory, no download),
wrapped with `peft.get_peft_model(model, LoraConfig(...))`, and PEFT's own count is read
(`PeftModel.get_nb_trainable_parameters()`, what `print_trainable_parameters` prints).

It writes validation/data/peft_counts.json: for each architecture and target set, rank and
method, the trainable parameters, with the versions used.

Covered: architectures whose blocks use the Llama-style module names q_proj / k_proj / v_proj /
o_proj / gate_proj / up_proj / down_proj. For MoE models only the attention targets are
compared: transformers 5 stores routed experts as fused 3-D parameters (gate_up_proj), which
PEFT's `target_modules` does not reach. Not covered (their module names differ): gpt2 and
gpt2-xl (fused Conv1D c_attn), phi-3-mini (fused qkv_proj and gate_up_proj), bert-large
(query / key / value), deepseek-v3 (MLA projections).

Usage (in a separate virtual environment; see validation/requirements.txt):
  python validation/measure_peft.py
"""

from __future__ import annotations

import datetime
import json
import platform
from pathlib import Path

import peft
import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

HERE = Path(__file__).resolve().parent
CONFIG_DIR = HERE / "configs"
OUT = HERE / "data" / "peft_counts.json"

DENSE = ("llama-2-7b", "llama-3-8b", "mistral-7b", "qwen2.5-7b", "qwen3-4b", "qwen3-8b",
         "olmo-2-7b", "gemma-2-9b")
MOE = ("mixtral-8x7b", "qwen3-30b-a3b")
NOT_COVERED = {
    "gpt2": "fused Conv1D c_attn / c_fc / c_proj, not the Llama-style names",
    "gpt2-xl": "fused Conv1D c_attn / c_fc / c_proj, not the Llama-style names",
    "phi-3-mini": "fused qkv_proj and gate_up_proj",
    "bert-large": "query / key / value / dense",
    "deepseek-v3": "MLA projections (q_a_proj, kv_a_proj_with_mqa, ...)",
}
ATTENTION_SETS = (("q_proj", "v_proj"), ("q_proj", "k_proj", "v_proj", "o_proj"))
DENSE_SETS = ATTENTION_SETS + (("gate_proj", "up_proj", "down_proj"), ("all-linear",))
RANKS = (8, 64)


def config_of(name: str):
    raw = json.loads((CONFIG_DIR / f"{name}.json").read_text())
    published = {k: v for k, v in raw.items() if not k.startswith("_")}
    published.pop("quantization_config", None)
    return AutoConfig.for_model(published.pop("model_type"), **published)


def trainable(name: str, targets: tuple[str, ...], rank: int, dora: bool) -> int:
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config_of(name))
        modules = "all-linear" if targets == ("all-linear",) else list(targets)
        config = peft.LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=modules,
                                 lora_dropout=0.0, use_dora=dora, task_type="CAUSAL_LM")
        wrapped = peft.get_peft_model(model, config)
    count, _ = wrapped.get_nb_trainable_parameters()
    return int(count)


def main() -> None:
    rows = []
    for name in DENSE + MOE:
        sets = DENSE_SETS if name in DENSE else ATTENTION_SETS
        for targets in sets:
            for rank in RANKS:
                for method in ("lora", "dora"):
                    if method == "dora" and rank != RANKS[0]:
                        continue
                    count = trainable(name, targets, rank, method == "dora")
                    rows.append({"model": name, "method": method, "rank": rank,
                                 "target_modules": list(targets),
                                 "trainable_parameters": count})
                    print(name, method, rank, ",".join(targets), count, flush=True)
    data = {
        "schema_version": 1,
        "what": "PEFT's trainable parameters (get_nb_trainable_parameters) of LoRA / DoRA "
                "adapters, models built at full size on the meta device from "
                "validation/configs/<model>.json",
        "measured_at": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d"),
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__, "peft": peft.__version__},
        "lora_config": "LoraConfig(r, lora_alpha=2r, lora_dropout=0, use_dora, "
                       "task_type='CAUSAL_LM'); no bias, no modules_to_save",
        "not_covered": NOT_COVERED,
        "moe_note": "MoE models: attention targets only (transformers 5's fused expert "
                    "parameters are not nn.Linear modules)",
        "rows": rows,
    }
    OUT.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
