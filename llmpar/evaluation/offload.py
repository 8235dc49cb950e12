"""Offloaded model states: the host memory they take, and the time their host work adds.

Strategies say which components live in host memory (`Transform.offloads`) and what
each step does with them outside the GPU (`Transform.host_work`, a cost per
parameter); the evaluator knows how many parameters of each component one GPU holds
after every strategy's shards, so it composes:

    host_bytes      = the offloaded components' bytes on one GPU (busiest stage)
    offload_seconds = sum over host work of passes_per_step * P * seconds_per_parameter
    exposed         = offload_seconds - min(its overlappable share, compute)

as ZeRO-Offload (Ren et al. 2021, arXiv:2101.06840, Sec. 4) and ZeRO-Infinity
(Rajbhandari et al. 2021, arXiv:2104.07857, Sec. 6) schedule it: copies and the host's
optimizer step beside the GPU's compute where the schedule allows, else after it.
"""

from __future__ import annotations

import attrs

from llmpar.evaluation.memory import component_bytes, stage_parameters, stages_of
from llmpar.footprint.baseline import Footprint
from llmpar.plan import Derivation
from llmpar.spec import Spec
from llmpar.strategy import Stage, Transform

OFFLOAD_SOURCE = ("ZeRO-Offload (Ren et al. 2021, arXiv:2101.06840, Sec. 4) and ZeRO-Infinity "
                  "(Rajbhandari et al. 2021, arXiv:2104.07857, Sec. 6); per-parameter costs "
                  "from the strategies: ")


@attrs.frozen(kw_only=True)
class OffloadTime:
    """Host work of one step on one GPU of the busiest stage."""

    seconds: float = 0.0
    overlappable_seconds: float = 0.0
    """The part that can run behind the GPU's compute."""
    derivations: tuple[Derivation, ...] = ()

    def exposed(self, compute_seconds: float) -> float:
        """Seconds the step waits for: what cannot overlap, and what compute cannot hide."""
        return self.seconds - min(self.overlappable_seconds, compute_seconds)


def offloaded_share(spec: Spec, footprint: Footprint, stage: Stage,
                    transforms: list[Transform], component: str) -> float:
    """Share of a component's parameters on one GPU of `stage` kept in host memory."""
    parameters = stage_parameters(spec, footprint, stage)
    held = component_bytes(parameters, 1.0, component, transforms)
    if held <= 0:
        return 0.0
    offloads = [o for t in transforms for o in t.offloads if o.component == component]
    moved = {g: n for g, n in parameters.items() if any(o.applies_to(g) for o in offloads)}
    return component_bytes(moved, 1.0, component, transforms) / held


def host_work_time(spec: Spec, footprint: Footprint, transforms: list[Transform]) -> OffloadTime:
    """The strategies' host work, costed on the stage where it takes longest."""
    work = [w for t in transforms for w in t.host_work]
    if not work:
        return OffloadTime()
    best: list[tuple[float, float]] = []
    best_total, best_stage = -1.0, 0
    for stage in stages_of(spec, transforms):
        parameters = stage_parameters(spec, footprint, stage)
        costed = [(w.passes_per_step * component_bytes(parameters, 1.0, w.component, transforms)
                   * w.seconds_per_parameter, w.overlap) for w in work]
        total = sum(seconds for seconds, _ in costed)
        if total > best_total:
            best, best_total, best_stage = costed, total, stage.index
    overlappable = sum(seconds * overlap for seconds, overlap in best)
    derivation = Derivation(
        quantity="offload_seconds", value=best_total, unit="s",
        rule=("sum over host work of passes_per_step * P * seconds_per_parameter, P the "
              "component's parameters on one GPU after shards; exposed = total - "
              "min(overlappable part, compute)"),
        source=OFFLOAD_SOURCE + "; ".join(f"{w.name}: {w.reason}" for w in work),
        inputs={**{f"{w.name}_seconds": seconds for w, (seconds, _) in zip(work, best)},
                "overlappable_seconds": overlappable, "stage": best_stage})
    return OffloadTime(seconds=best_total, overlappable_seconds=overlappable,
                       derivations=(derivation,))


def host_memory_warning(spec: Spec, host_bytes: int) -> list[str]:
    """A warning when the offloaded states of a node's GPUs exceed its host memory."""
    hardware = spec.hardware
    capacity = hardware.host_memory_bytes
    if not host_bytes or capacity is None:
        return []
    gpus = min(hardware.gpus_per_node, hardware.num_gpus)
    needed = host_bytes * gpus
    if needed <= capacity:
        return []
    return [f"offloaded states need {needed / 2**30:,.1f} GiB of host memory per node "
            f"({gpus} GPUs x {host_bytes / 2**30:,.2f} GiB), has {capacity / 2**30:,.1f} GiB"]
