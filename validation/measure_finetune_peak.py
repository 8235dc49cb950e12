#!/usr/bin/env python3
"""Measure the memory peak of one real fine-tuning step on the CPU: LoRA with Hugging Face
PEFT and frozen parameter groups, for llmpar's `[finetune]` (ground truth you can redo).

Stand-alone script: the llmpar library never imports it, and the library's tests need
neither torch nor peft. The model, the probe and the step are validation/measure_peak.py's
(validation/peak_probe.py: a small Llama-like transformers model from a config with
random bf16 weights, the second of two steps measured by counting live tensor storages
after every operator), with:

- LoRA: `peft.get_peft_model(model, LoraConfig(r, target_modules, lora_dropout=0.0),
  autocast_adapter_dtype=False)`, so that the adapters stay in bf16 like the base (PEFT's
  default would upcast them to fp32); torch.optim.AdamW(foreach=True) over the trainable
  parameters only;
- frozen: `requires_grad_(False)` on the embedding and the first block, AdamW over the
  rest.

bitsandbytes' 4-bit layers need a GPU: QLoRA is not measured here.

Usage (in the measuring environment of validation/requirements.txt):
  python validation/measure_finetune_peak.py   # writes validation/data/finetune_peak.json
"""

from __future__ import annotations

import sys
from pathlib import Path

import peft
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peak_probe  # noqa: E402

HERE = Path(__file__).resolve().parent
OUT = HERE / "data" / "finetune_peak.json"
SHAPES = ((4, 512), (2, 1024))
RUNS = tuple(
    [{"method": "lora", "rank": r, "target_modules": targets, "micro_batch_size": b,
      "sequence_length": s} for r, targets in ((16, ["q_proj", "v_proj"]),
                                               (64, ["all-linear"]))
     for b, s in SHAPES]
    + [{"method": "frozen", "frozen": ["embedding", "layers[0:1]"], "micro_batch_size": b,
        "sequence_length": s} for b, s in SHAPES])


def build(run: dict):
    config, model = peak_probe.llama("sdpa")
    model = model.to(peak_probe.DTYPES["bf16"])
    if run["method"] == "lora":
        targets = run["target_modules"]
        lora = peft.LoraConfig(r=run["rank"], lora_alpha=2 * run["rank"], lora_dropout=0.0,
                               target_modules="all-linear" if targets == ["all-linear"]
                               else targets, task_type="CAUSAL_LM")
        model = peft.get_peft_model(model, lora, autocast_adapter_dtype=False)
    else:
        model.model.embed_tokens.requires_grad_(False)
        model.model.layers[0].requires_grad_(False)
    model.train()
    return config, model


def measure(run: dict) -> dict:
    config, model = build(run)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-4, foreach=True)
    ids = torch.randint(0, config.vocab_size, (run["micro_batch_size"], run["sequence_length"]))

    def step(probe: peak_probe.LiveStorages | None) -> None:
        peak_probe.train_step(model, optimizer, 1,
                              lambda: model(input_ids=ids, labels=ids).loss, probe)

    probe, start = peak_probe.second_step(
        step, lambda: peak_probe.model_and_states(model, optimizer))
    return {**run, "parameters": sum(p.numel() for p in model.parameters()),
            "trainable_parameters": sum(p.numel() for p in trainable),
            **peak_probe.peak_fields(probe, start)}


def main() -> None:
    rows = [measure(run) for run in RUNS]
    for row in rows:
        print(f"{row['method']} b={row['micro_batch_size']} s={row['sequence_length']}: "
              f"trainable {row['trainable_parameters']:,}, peak "
              f"{row['peak_allocated_bytes'] / 2**20:,.1f} MiB in {row['peak_phase']}")
    peak_probe.write_measured(OUT, {
        "what": "allocated memory peak of one fine-tuning step (the second), live tensor "
                "storages counted after every operator (validation/measure_finetune_peak.py)",
        "config": peak_probe.CONFIG, "dtype": "bf16",
        "optimizer": "torch.optim.AdamW(foreach=True) over the trainable parameters, states "
        "in bf16", "attention": "sdpa",
        "loss": "transformers ForCausalLMLoss (logits.float())",
        "adapters": "peft.get_peft_model(..., autocast_adapter_dtype=False): bf16, "
                    "lora_dropout 0"}, rows, peft=peft.__version__)


if __name__ == "__main__":
    main()
