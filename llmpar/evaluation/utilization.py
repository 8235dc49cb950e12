"""What an assumed MFU implies for the hardware: HFU may not exceed 1.

An assumed-MFU step time is model FLOPs / (n * peak * mfu). The GPUs execute more than
the model FLOPs when layers are recomputed (and a strategy may add FLOPs of its own), so
the compute alone runs at mfu x hardware FLOPs / model FLOPs of peak: an mfu above
model FLOPs / hardware FLOPs asks the GPUs for more than their peak (Narayanan et al.
2021, arXiv:2104.04473, Sec. 5.1, on MFU and HFU). A modelled step time needs no such
check: its compute takes hardware FLOPs / (n * peak * matmul_efficiency) at least.

Every number may be an array over a search node (`llmpar.arrays`).
"""

from __future__ import annotations

import math

from llmpar.arrays import Value, where
from llmpar.errors import Problem, SpecError
from llmpar.evaluation.compose import Composition
from llmpar.evaluation.facts import TrainingFacts
from llmpar.evaluation.step_time import TimeCore, executed_flops, model_flops
from llmpar.spec import Spec

MFU_PATH = "$.training.mfu"
PRESET_MFU_PATH = "$.hardware.gpu.achievable_mfu"


def assumed_hfu(time: TimeCore, facts: TrainingFacts, composition: Composition
                ) -> Value | None:
    """mfu x executed FLOPs / model FLOPs: the HFU of the compute under an assumed MFU;
    None for a modelled (or no) step time."""
    if time.mfu is None:
        return None
    model = model_flops(facts, composition)
    return where(model > 0, time.mfu * executed_flops(facts, composition)
                 / where(model > 0, model, 1.0), 0.0)


def mfu_path(spec: Spec) -> str:
    """The key the assumed MFU comes from: `[training] mfu`, else the GPU preset's."""
    return MFU_PATH if spec.training.mfu is not None else PRESET_MFU_PATH


def utilization_problem(spec: Spec, time: TimeCore, facts: TrainingFacts,
                        composition: Composition) -> Problem | None:
    """A problem when the assumed MFU puts one layout's HFU above 1 (plain numbers)."""
    hfu = assumed_hfu(time, facts, composition)
    if hfu is None or not hfu > 1.0:
        return None
    assert time.mfu is not None
    ratio = float(hfu) / time.mfu
    largest = math.floor(1000 / ratio) / 1000  # rounded down: giving it passes
    added = []
    if spec.training.recompute != "none":
        added.append(f"recompute = {spec.training.recompute!r}")
    if composition.sum_of("extra_flops_per_step"):
        added.append("the strategies' extra FLOPs")
    why = " and ".join(added) or "the strategies"
    given = (f"mfu ({time.mfu:g})" if spec.training.mfu is not None
             else f"the GPU's achievable_mfu ({time.mfu:g})")
    return Problem(mfu_path(spec),
                   f"{given} implies a hardware FLOPs utilization (HFU) of {float(hfu):.1%}: "
                   f"with {why} the GPUs execute {ratio:.3f} x the model FLOPs, so an mfu "
                   f"above {largest:g} asks for more than their peak; give [training] mfu "
                   f"<= {largest:g}")


def check_utilization(spec: Spec, time: TimeCore, facts: TrainingFacts,
                      composition: Composition) -> None:
    """Raise SpecError when the assumed MFU puts HFU above 1."""
    problem = utilization_problem(spec, time, facts, composition)
    if problem is not None:
        raise SpecError([problem], spec.source)
