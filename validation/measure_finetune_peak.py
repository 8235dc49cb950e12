#!/usr/bin/env python3
"""Measure the memory peak of one real fine-tuning step on the CPU: LoRA with Hugging Face
PEFT and frozen parameter groups, for llmpar's `[finetune]` (ground truth you can redo).

Stand-alone script: the llmpar library never imports it, and the library's tests need
neither torch nor peft. The model, the probe and the step are validation/measure_peak.py's
(a small Llama-like transformers model from a config with random bf16 weights, the second
of two steps measured by counting live tensor storages after every operator), with:

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

import datetime
import gc
import json
import platform
import sys
from pathlib import Path

import peft
import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measure_peak import CONFIG, DTYPE, SEED, LiveStorages  # noqa: E402

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
    torch.manual_seed(SEED)
    config = LlamaConfig(**{k: v for k, v in CONFIG.items()
                            if k not in ("model_type", "architectures")})
    config._attn_implementation = "sdpa"
    model = LlamaForCausalLM(config).to(DTYPE)
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

    def step(probe: LiveStorages | None) -> None:
        if probe is not None:
            probe.enter("forward 0")
        loss = model(input_ids=ids, labels=ids).loss
        if probe is not None:
            probe.enter("backward 0")
        loss.backward()
        del loss
        if probe is not None:
            probe.enter("optimizer step")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step(None)  # the first step creates the optimizer's states
    gc.collect()
    tensors = [p for p in model.parameters()] + [b for b in model.buffers()]
    tensors += [t for state in optimizer.state.values() for t in state.values()
                if isinstance(t, torch.Tensor)]
    with LiveStorages(tensors) as probe:
        start = probe.current
        step(probe)
    return {**run, "parameters": sum(p.numel() for p in model.parameters()),
            "trainable_parameters": sum(p.numel() for p in trainable),
            "start_bytes": start, "peak_allocated_bytes": probe.peak,
            "peak_phase": probe.peak_phase, "peak_by_phase": probe.peak_by_phase}


def main() -> None:
    rows = [measure(run) for run in RUNS]
    for row in rows:
        print(f"{row['method']} b={row['micro_batch_size']} s={row['sequence_length']}: "
              f"trainable {row['trainable_parameters']:,}, peak "
              f"{row['peak_allocated_bytes'] / 2**20:,.1f} MiB in {row['peak_phase']}")
    OUT.write_text(json.dumps({
        "what": "allocated memory peak of one fine-tuning step (the second), live tensor "
                "storages counted after every operator (validation/measure_finetune_peak.py)",
        "config": CONFIG, "dtype": "bf16", "optimizer": "torch.optim.AdamW(foreach=True) "
        "over the trainable parameters, states in bf16", "attention": "sdpa",
        "loss": "transformers ForCausalLMLoss (logits.float())",
        "adapters": "peft.get_peft_model(..., autocast_adapter_dtype=False): bf16, "
                    "lora_dropout 0", "versions": {
            "torch": torch.__version__, "transformers": transformers.__version__,
            "peft": peft.__version__, "python": platform.python_version()},
        "measured": datetime.date.today().isoformat(), "runs": rows}, indent=2) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
