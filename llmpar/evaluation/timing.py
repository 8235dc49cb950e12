"""FLOPs of a step and of the whole run."""

from __future__ import annotations

import attrs

from llmpar.footprint.baseline import Footprint
from llmpar.footprint.flops import (
    BACKWARD_TO_FORWARD,
    module_rerun_flops_per_sequence,
    six_nd_flops,
)
from llmpar.footprint.op_checkpoint import SOURCE as OP_SOURCE
from llmpar.footprint.op_checkpoint import rerun_flops_per_sequence as op_rerun_flops_per_sequence
from llmpar.footprint.op_checkpoint import rerun_products
from llmpar.plan import Derivation
from llmpar.spec import Spec

SIX_ND_SOURCE = "C = 6 N D, Kaplan et al. 2020 (arXiv:2001.08361), Sec. 2.1"
EXACT_SOURCE = ("2 FLOPs per multiply-accumulate of every matrix product, backward = 2 x "
                "forward: Narayanan et al. 2021 (arXiv:2104.04473), Sec. 5.1")


@attrs.frozen(kw_only=True)
class StepFlops:
    """Model FLOPs (what MFU counts) and hardware FLOPs (what the GPUs execute, what HFU
    counts: attention as its kernel runs it, recomputation included) of a step."""

    global_batch_size: int
    tokens_per_step: int
    flops_per_step: float
    flops_per_step_6nd: float
    flops_method: str
    hardware_flops_per_step: float
    attention_hardware_flops_per_step: float
    """The attention products' part (Q.K^T and scores.V, reruns included): what ring
    context parallelism's exchange hides behind."""
    derivations: tuple[Derivation, ...]


def recompute_flops_per_sequence(spec: Spec, footprint: Footprint,
                                 full_fraction: float = 1.0) -> float:
    """Hardware FLOPs recomputation adds to one sequence (attention as its kernel
    executes it); `full_fraction` is the share of layers full recomputation reruns;
    selective recomputation reruns the modules `[training] recompute_modules` names."""
    forward = footprint.forward_flops_per_sequence
    if forward is None:
        return 0.0
    if spec.training.recompute == "full":
        # Full recomputation reruns each layer's forward, not the output layer's
        # (Narayanan et al. 2021, Eq. 3 with recomputation: 96 B s L h^2 (...)).
        return (forward.projections + forward.executed_attention) * full_fraction
    if spec.training.recompute == "selective":
        policy = spec.training.recompute_policy
        if policy is not None:
            # torchtitan's op-level policy reruns the products it does not save, once;
            # attention is saved (llmpar.footprint.op_checkpoint).
            return op_rerun_flops_per_sequence(spec.model, spec.training.sequence_length,
                                               policy)
        modules = spec.training.selective_modules
        # core_attn reruns Q.K^T, softmax, dropout and scores.V; the paper counts it as
        # doubling the attention term, s/(6h) -> s/(3h), which is 2.7% for GPT-3 175B
        # (Korthikanti et al. 2022, arXiv:2205.05198, Sec. 5).
        attention = ((1.0 + BACKWARD_TO_FORWARD) * forward.executed_attention
                     if "core_attn" in modules else 0.0)
        if spec.training.recompute_modules is None:
            return attention
        # The other modules rerun their forward products once (Megatron-Core's
        # --recompute-modules: mlp, moe, shared_experts, mla_up_proj).
        return attention + module_rerun_flops_per_sequence(
            spec.model, spec.training.sequence_length, modules)
    return 0.0


def step_flops(spec: Spec, footprint: Footprint, data_degree: int,
               extra_flops: float = 0.0, full_fraction: float = 1.0,
               workload_flops: float = 0.0, explain: bool = True) -> StepFlops:
    """FLOPs of one optimizer step: exact from the architecture, or 6ND from a size;
    `workload_flops` are a workload's other models' (a frozen reference's forward),
    counted in both the model and the hardware FLOPs. Their derivations only when
    `explain`."""
    training = spec.training
    global_batch = training.global_batch_size or training.micro_batch_size * data_degree
    tokens = global_batch * training.sequence_length
    active = footprint.parameters.active
    flops_6nd = six_nd_flops(active, tokens)
    per_sequence = footprint.train_flops_per_sequence()
    if per_sequence is None:
        flops, method = flops_6nd, "6nd"
    else:
        flops, method = per_sequence * global_batch, "exact"
    rerun = recompute_flops_per_sequence(spec, footprint, full_fraction)
    executed = footprint.executed_train_flops_per_sequence()
    hardware = ((flops if executed is None else executed * global_batch)
                + rerun * global_batch + extra_flops + workload_flops)
    derivations = (_flops_derivations(spec, footprint, flops, hardware, rerun, global_batch,
                                      extra_flops, workload_flops) if explain else ())
    flops += workload_flops
    return StepFlops(global_batch_size=global_batch, tokens_per_step=tokens,
                     flops_per_step=flops, flops_per_step_6nd=flops_6nd, flops_method=method,
                     hardware_flops_per_step=hardware,
                     attention_hardware_flops_per_step=attention_hardware_flops_per_sequence(
                         spec, footprint, full_fraction) * global_batch,
                     derivations=derivations)


def _flops_derivations(spec: Spec, footprint: Footprint, flops: float, hardware: float,
                       rerun: float, global_batch: int, extra_flops: float,
                       workload_flops: float) -> tuple[Derivation, ...]:
    """How `step_flops` counted the model's FLOPs (`flops`, before the workload's),
    their 6ND estimate and the executed FLOPs."""
    training = spec.training
    tokens = global_batch * training.sequence_length
    active = footprint.parameters.active
    flops_6nd = six_nd_flops(active, tokens)
    if footprint.train_flops_per_sequence() is None:
        derivation = Derivation(
            quantity="flops_per_step", value=flops, unit="FLOP",
            rule="6 * N_active * tokens_per_step", source=SIX_ND_SOURCE,
            inputs={"N_active": active, "tokens_per_step": tokens})
    else:
        fwd = footprint.forward_flops_per_sequence
        assert fwd is not None
        derivation = Derivation(
            quantity="flops_per_step", value=flops, unit="FLOP",
            rule="3 * (projections + attention + logits) per sequence * global_batch",
            source=EXACT_SOURCE + f"; attention counted {training.attention_flops}; "
            f"hardware FLOPs execute it as a {footprint.attention_kernel} kernel does",
            inputs={"projections": fwd.projections, "attention": fwd.attention,
                    "logits": fwd.logits, "global_batch": global_batch})
        if footprint.mtp_by_group:
            derivation = attrs.evolve(derivation, source=derivation.source + (
                "; with the trained multi-token-prediction modules: each depth's block, "
                "2h x h projection and output-layer pass (llmpar.footprint.mtp)"))
    executed = footprint.executed_train_flops_per_sequence()
    if workload_flops:
        derivation = attrs.evolve(
            derivation, value=flops + workload_flops,
            rule=derivation.rule + " + the workload's other models' FLOPs",
            inputs={**derivation.inputs, "workload_flops_per_step": workload_flops})
    six_nd = Derivation(quantity="flops_per_step_6nd", value=flops_6nd, unit="FLOP",
                        rule="6 * N_active * tokens_per_step", source=SIX_ND_SOURCE,
                        inputs={"N_active": active, "tokens_per_step": tokens})
    executed_rule = ("model FLOPs" if executed is None
                     else "executed FLOPs per sequence (attention as its kernel runs it)")
    executing = Derivation(
        quantity="hardware_flops_per_step", value=hardware, unit="FLOP",
        rule=f"{executed_rule} * global_batch + recomputed FLOPs per sequence * global_batch"
             " + the strategies' extra FLOPs - skipped FLOPs",
        source=EXACT_SOURCE + f"; recompute = {training.recompute!r}",
        inputs={"global_batch": global_batch, "recomputed_flops_per_sequence": rerun,
                "strategy_flops_per_step": extra_flops,
                **({"workload_flops_per_step": workload_flops} if workload_flops else {})})
    if training.recompute_modules is not None and training.recompute == "selective":
        # The modules' reruns, module by module, in place of the generic rule.
        executing = module_rerun_derivation(spec, footprint, hardware, rerun, global_batch)
    if training.recompute_policy is not None and training.recompute == "selective":
        executing = attrs.evolve(executing, rule=executing.rule + (
            f"; recompute_policy = {training.recompute_policy!r}: the recomputed FLOPs are "
            f"2 x tokens x the weights of the products the policy does not save "
            f"({', '.join(rerun_products(spec.model, training.recompute_policy))}), once "
            f"per layer; attention and the saved products are not rerun"),
            source=executing.source + "; " + OP_SOURCE)
    return derivation, six_nd, executing


def module_rerun_derivation(spec: Spec, footprint: Footprint, hardware: float,
                            rerun_per_sequence: float, global_batch: int) -> Derivation:
    """How the modules `recompute_modules` names add to the hardware FLOPs, module by
    module (each alone: moe includes its shared experts)."""
    modules = spec.training.selective_modules
    forward = footprint.forward_flops_per_sequence
    inputs: dict[str, float | int | str] = {"global_batch": global_batch,
                                "rerun_per_sequence": rerun_per_sequence}
    for module in modules:
        if module == "core_attn":
            attention = 0.0 if forward is None else forward.executed_attention
            inputs["core_attn"] = (1.0 + BACKWARD_TO_FORWARD) * attention
        else:
            inputs[module] = module_rerun_flops_per_sequence(
                spec.model, spec.training.sequence_length, (module,))
    return Derivation(
        quantity="hardware_flops_per_step", value=hardware, unit="FLOP",
        rule=("executed model FLOPs + rerun_per_sequence * global_batch (+ strategies' "
              "FLOPs); recompute_modules = " + ", ".join(modules) + ": core_attn reruns "
              "the attention products (counted as the paper does, 3x their forward), "
              "mlp/moe/shared_experts/mla_up_proj their forward products once, layernorm "
              "and moe_act no product (a memory-bound pass in the step time)"),
        source=("Megatron-Core --recompute-modules (transformer_config.py, "
                "transformer_layer.py, moe_layer.py, multi_latent_attention.py); "
                "Korthikanti et al. 2022 (arXiv:2205.05198), Sec. 5 for core_attn"),
        inputs=inputs)


def attention_hardware_flops_per_sequence(spec: Spec, footprint: Footprint,
                                          full_fraction: float = 1.0) -> float:
    """Q.K^T and scores.V of one sequence in a training pass, with their reruns, as the
    attention kernel executes them."""
    forward = footprint.forward_flops_per_sequence
    if forward is None:
        return 0.0
    selective = (1.0 + BACKWARD_TO_FORWARD
                 if "core_attn" in spec.training.selective_modules else 0.0)
    rerun = {"full": full_fraction, "selective": selective}.get(spec.training.recompute, 0.0)
    return (1.0 + BACKWARD_TO_FORWARD + rerun) * forward.executed_attention


@attrs.frozen(kw_only=True)
class RunLength:
    train_tokens: float | None = None
    train_steps: float | None = None
    train_flops: float | None = None
    train_seconds: float | None = None
    gpu_hours: float | None = None
    derivations: tuple[Derivation, ...] = ()


def train_tokens(spec: Spec, parameters: float) -> tuple[float, str] | None:
    """Tokens of the whole run and the rule that gives them; None when the spec states
    neither `[training] tokens` nor `tokens_per_parameter`."""
    training = spec.training
    if training.tokens is not None:
        return float(training.tokens), "[training] tokens"
    if training.tokens_per_parameter is not None:
        return (training.tokens_per_parameter * parameters,
                "tokens_per_parameter * N (Hoffmann et al. 2022, arXiv:2203.15556: D = 20 N)")
    return None


def run_length(spec: Spec, parameters: float, flops: StepFlops,
               step_seconds: float | None, time_source: str,
               explain: bool = True) -> RunLength:
    """Tokens, steps, FLOPs, time and GPU-hours of the whole run; their derivations only
    when `explain`."""
    found = train_tokens(spec, parameters)
    if found is None:
        return RunLength()
    tokens, rule = found
    steps = tokens / flops.tokens_per_step
    train_flops = flops.flops_per_step * steps
    if not explain:
        seconds = None if step_seconds is None else steps * step_seconds
        return RunLength(train_tokens=tokens, train_steps=steps, train_flops=train_flops,
                         train_seconds=seconds, gpu_hours=None if seconds is None
                         else seconds * spec.hardware.num_gpus / 3600)
    derivations = [Derivation(
        quantity="train_tokens", value=tokens, unit="tokens", rule=rule,
        source="the spec", inputs={"N": parameters}), Derivation(
        quantity="train_steps", value=steps, unit="steps",
        rule="train_tokens / tokens_per_step (fractional last step)", source=f"from {rule}",
        inputs={"train_tokens": tokens, "tokens_per_step": flops.tokens_per_step}), Derivation(
        quantity="train_flops", value=train_flops, unit="FLOP",
        rule="flops_per_step * train_tokens / tokens_per_step",
        source=f"train_tokens from {rule}",
        inputs={"flops_per_step": flops.flops_per_step, "train_tokens": tokens,
                "tokens_per_step": flops.tokens_per_step})]
    if step_seconds is None:
        return RunLength(train_tokens=tokens, train_steps=steps, train_flops=train_flops,
                         derivations=tuple(derivations))
    seconds = steps * step_seconds
    gpu_hours = seconds * spec.hardware.num_gpus / 3600
    derivations.append(Derivation(
        quantity="train_seconds", value=seconds, unit="s",
        rule="train_tokens / tokens_per_step * step_seconds (fractional last step)",
        source=time_source, inputs={"train_steps": steps, "step_seconds": step_seconds}))
    derivations.append(Derivation(
        quantity="gpu_hours", value=gpu_hours, unit="GPU-hours",
        rule="train_seconds * num_gpus / 3600", source="every GPU of the job for the run",
        inputs={"train_seconds": seconds, "num_gpus": spec.hardware.num_gpus}))
    return RunLength(train_tokens=tokens, train_steps=steps, train_flops=train_flops,
                     train_seconds=seconds, gpu_hours=gpu_hours,
                     derivations=tuple(derivations))
