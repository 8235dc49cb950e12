"""FLOPs of a step and of the run, and how long they take."""

from __future__ import annotations

import attrs

from llmpar.footprint.baseline import Footprint
from llmpar.footprint.flops import BACKWARD_TO_FORWARD, six_nd_flops
from llmpar.plan import Derivation
from llmpar.spec import Spec
from llmpar.strategy import Transform

TIME_SOURCE = ("T = C / (n * F_peak * MFU), the founding document's training-time rule; "
               "Narayanan et al. 2021 (arXiv:2104.04473), Sec. 5.1")
SIX_ND_SOURCE = "C = 6 N D, Kaplan et al. 2020 (arXiv:2001.08361), Sec. 2.1"
EXACT_SOURCE = ("2 FLOPs per multiply-accumulate of every matrix product, backward = 2 x "
                "forward: Narayanan et al. 2021 (arXiv:2104.04473), Sec. 5.1")


@attrs.frozen(kw_only=True)
class Compute:
    """FLOPs and time of a step and of the whole run, with their derivations."""

    global_batch_size: int
    micro_batches_per_step: int
    tokens_per_step: int
    flops_per_step: float
    flops_per_step_6nd: float
    flops_method: str
    hardware_flops_per_step: float
    step_seconds: float | None
    tokens_per_second: float | None
    mfu: float | None
    hfu: float | None
    train_tokens: float | None
    train_steps: float | None
    train_flops: float | None
    train_seconds: float | None
    gpu_hours: float | None
    warnings: tuple[str, ...]
    derivations: tuple[Derivation, ...]


def _micro_batches(transforms: list[Transform]) -> int:
    counts = [t.micro_batches_per_step for t in transforms if t.micro_batches_per_step]
    return counts[0] if counts else 1


def _utilization(spec: Spec) -> tuple[float | None, str]:
    if spec.training.mfu is not None:
        return spec.training.mfu, "assumed: [training] mfu"
    gpu = spec.hardware.gpu
    if gpu.achievable_mfu is not None:
        return gpu.achievable_mfu, f"GPU preset {gpu.name!r}: {gpu.achievable_mfu_source}"
    return None, ""


def step_compute(spec: Spec, footprint: Footprint, layout_data_degree: int,
                 transforms: list[Transform]) -> Compute:
    """FLOPs per step from the footprint; time from the utilization the spec states."""
    training, hardware = spec.training, spec.hardware
    n_params = footprint.parameters.total
    global_batch = training.global_batch_size or training.micro_batch_size * layout_data_degree
    tokens_per_step = global_batch * training.sequence_length
    active = footprint.parameters.active
    flops_6nd = six_nd_flops(active, tokens_per_step)
    per_sequence = footprint.train_flops_per_sequence()
    derivations, warnings = [], []
    if per_sequence is None:
        flops, method = flops_6nd, "6nd"
        derivations.append(Derivation(
            quantity="flops_per_step", value=flops, unit="FLOP",
            rule="6 * N_active * tokens_per_step",
            source=SIX_ND_SOURCE, inputs={"N_active": active, "tokens_per_step": tokens_per_step}))
    else:
        flops, method = per_sequence * global_batch, "exact"
        fwd = footprint.forward_flops_per_sequence
        assert fwd is not None
        derivations.append(Derivation(
            quantity="flops_per_step", value=flops, unit="FLOP",
            rule="3 * (projections + attention + logits) per sequence * global_batch",
            source=EXACT_SOURCE + f"; attention counted {training.attention_flops}",
            inputs={"projections": fwd.projections, "attention": fwd.attention,
                    "logits": fwd.logits, "global_batch": global_batch}))
    extra = sum(t.extra_flops_per_step for t in transforms)
    forward = footprint.forward_flops_per_sequence
    if training.recompute == "full" and forward is not None:
        # Full recomputation reruns each layer's forward, not the output layer's
        # (Narayanan et al. 2021, Eq. 3 with recomputation: 96 B s L h^2 (...)).
        extra += (forward.projections + forward.attention) * global_batch
    elif training.recompute == "selective" and forward is not None:
        # Selective recomputation reruns Q.K^T, softmax, dropout and scores.V; the
        # paper counts it as doubling the attention term, s/(6h) -> s/(3h), which
        # is 2.7% for GPT-3 175B (Korthikanti et al. 2022, arXiv:2205.05198, Sec. 5).
        extra += (1.0 + BACKWARD_TO_FORWARD) * forward.attention * global_batch
    hardware_flops = flops + extra

    peak = hardware.gpu.peak_flops_per_s(spec.precision.compute)
    mfu, mfu_source = _utilization(spec)
    step = None
    if peak is None:
        warnings.append(f"GPU {hardware.gpu.name!r} states no {spec.precision.compute} peak; "
                        "no step time")
    elif mfu is None:
        warnings.append("no utilization known: set [training] mfu, or use a GPU preset with "
                        "achievable_mfu; no step time")
    else:
        step = flops / (hardware.num_gpus * peak * mfu)
        derivations.append(Derivation(
            quantity="step_seconds", value=step, unit="s",
            rule="flops_per_step / (num_gpus * peak * mfu)",
            source=f"{TIME_SOURCE}; mfu {mfu_source}",
            inputs={"flops_per_step": flops, "num_gpus": hardware.num_gpus,
                    f"peak_{spec.precision.compute}_flops_per_s": peak, "mfu": mfu}))
    run = _run_length(spec, n_params, tokens_per_step, flops, step, derivations)
    hfu = None if step is None or peak is None else hardware_flops / (
        hardware.num_gpus * peak * step)
    return Compute(
        global_batch_size=global_batch, micro_batches_per_step=_micro_batches(transforms),
        tokens_per_step=tokens_per_step, flops_per_step=flops, flops_per_step_6nd=flops_6nd,
        flops_method=method, hardware_flops_per_step=hardware_flops, step_seconds=step,
        tokens_per_second=None if step is None else tokens_per_step / step,
        mfu=mfu if step is not None else None, hfu=hfu, warnings=tuple(warnings),
        derivations=tuple(derivations), **run)


def _run_length(spec: Spec, n_params: float, tokens_per_step: int, flops_per_step: float,
                step: float | None, derivations: list[Derivation]) -> dict:
    training = spec.training
    if training.tokens is not None:
        tokens, rule = float(training.tokens), "[training] tokens"
    elif training.tokens_per_parameter is not None:
        tokens = training.tokens_per_parameter * n_params
        rule = "tokens_per_parameter * N (Hoffmann et al. 2022, arXiv:2203.15556: D = 20 N)"
    else:
        return dict(train_tokens=None, train_steps=None, train_flops=None,
                    train_seconds=None, gpu_hours=None)
    steps = tokens / tokens_per_step
    train_flops = flops_per_step * steps
    seconds = None if step is None else steps * step
    derivations.append(Derivation(
        quantity="train_flops", value=train_flops, unit="FLOP",
        rule="flops_per_step * train_tokens / tokens_per_step",
        source=f"train_tokens from {rule}",
        inputs={"flops_per_step": flops_per_step, "train_tokens": tokens,
                "tokens_per_step": tokens_per_step}))
    if seconds is not None:
        derivations.append(Derivation(
            quantity="train_seconds", value=seconds, unit="s",
            rule="train_tokens / tokens_per_step * step_seconds (fractional last step)",
            source=TIME_SOURCE, inputs={"train_steps": steps, "step_seconds": step}))
    hours = None if seconds is None else seconds * spec.hardware.num_gpus / 3600
    return dict(train_tokens=tokens, train_steps=steps, train_flops=train_flops,
                train_seconds=seconds, gpu_hours=hours)
