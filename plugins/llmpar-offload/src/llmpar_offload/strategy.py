"""ZeRO-Offload and ZeRO-Infinity as an llmpar strategy.

Memory: the offloaded components leave each GPU after every sharding strategy has
split them (`Offload`), so under ZeRO each GPU offloads its own partition, as
DeepSpeed does (ZeRO-Offload, Ren et al. 2021, arXiv:2101.06840, Sec. 4.1-4.2).

Time (`HostWork`, each a cost per parameter the evaluator multiplies by the
parameters one GPU holds after shards; B is the host link's bandwidth times
`host_link_efficiency`, one direction):
- gradients to the host: bytes(gradients) / B per parameter of the GPU's optimizer
  partition, once per micro-batch when gradients live on the host (they accumulate
  there), else once per step; behind the backward pass (Sec. 4.1).
- the host's optimizer step: 1 / cpu_optimizer_parameters_per_s per parameter of the
  partition, once per step; on the critical path unless the update is delayed
  one step (Sec. 4.2).
- updated weights back to the GPU: bytes(weights) / B per parameter of the partition,
  once per step, on the critical path unless delayed; not when the weights live on
  the host (the host updates them in place).
- weights streamed from the host (ZeRO-Infinity, Rajbhandari et al. 2021,
  arXiv:2104.07857, Sec. 6): bytes(weights) / B per parameter of the GPU's ZeRO-3
  shard, for every forward pass (two under full recomputation) and the backward pass
  of each micro-batch, prefetched behind compute (Sec. 6.2). The gathered layers sit
  in ZeRO-3's own prefetch buffers ([parallel.data]).

The fast form: `transform` and `rules` are written once, with `llmpar.arrays`, so the
flags may be arrays over a search node (`vectorised = True`); the search then varies
what is offloaded as fast as it varies the built-in strategies' settings.
"""

from __future__ import annotations

from typing import Any

from llmpar import (
    HostWork,
    Layout,
    Offload,
    Rule,
    Spec,
    Strategy,
    StrategyContext,
    Transform,
)
from llmpar.arrays import anywhere, is_array, logical_and, logical_not, logical_or, where
from llmpar.strategies.common import bytes_per_element, micro_batches_per_step

from llmpar_offload.config import OffloadConfig

PATH = "$.parallel.offload"
COMPONENTS = ("optimizer", "gradients", "weights")
ZERO_STAGE = "data.zero_stage"
"""The ZeRO stage data parallelism shares through the layout."""


def offloads_anything(config: OffloadConfig) -> Any:
    return logical_or(logical_or(config.optimizer, config.gradients), config.weights)


class OffloadStrategy(Strategy[OffloadConfig]):
    name = "offload"
    config_type = OffloadConfig
    phase = 60
    vectorised = True

    def neutral_config(self, layout: Layout) -> OffloadConfig:
        return OffloadConfig(optimizer=False, gradients=False, weights=False)

    def rules(self, config: OffloadConfig, spec: Spec, layout: Layout) -> list[Rule]:
        stage = layout.setting(ZERO_STAGE, 0)
        data = layout.degree("data")
        found = [Rule(PATH, logical_and(offloads_anything(config),
                                        getattr(spec, "inference", None) is not None),
                      lambda: "offloading plans training (optimizer states, gradients); this "
                              "spec is [inference]")]
        for field in ("gradients", "weights"):
            found.append(Rule(f"{PATH}.{field}",
                              logical_and(getattr(config, field), logical_not(config.optimizer)),
                              lambda field=field: f"{field} = true needs optimizer = true: the "
                                                  "host's optimizer step is what uses them"))
        found.append(Rule(f"{PATH}.optimizer",
                          logical_and(config.optimizer, logical_and(data > 1, stage == 0)),
                          lambda: f"offloading the optimizer over {data} data ranks needs ZeRO "
                                  "([parallel.data] zero >= 1) so that each GPU offloads its "
                                  "own partition, as DeepSpeed's offload_optimizer does"))
        found.append(Rule(f"{PATH}.weights", logical_and(config.weights, stage != 3),
                          lambda: "streaming weights from the host needs ZeRO-3 ([parallel.data] "
                                  "zero = 3 or fsdp = true), as DeepSpeed's offload_param does; "
                                  f"zero is {stage}"))
        return found

    def transform(self, config: OffloadConfig, ctx: StrategyContext) -> Transform:
        if not anywhere(offloads_anything(config)):
            return Transform(strategy=self.name)
        offloads = tuple(Offload(component=c, active=getattr(config, c),
                                 reason=f"[parallel.offload] {c} = true") for c in COMPONENTS)
        work = [HostWork(
            strategy=self.name, name="offload.host-optimizer-step", component="optimizer",
            seconds_per_parameter=1 / config.cpu_optimizer_parameters_per_s,
            passes_per_step=where(config.optimizer, 1.0, 0.0),
            overlap=1.0 if config.delayed_parameter_update else 0.0,
            reason=f"CPU Adam at {config.cpu_optimizer_parameters_per_s:.3g} parameters/s per "
                   "GPU (ZeRO-Offload Sec. 4.1; a stated assumption)")]
        bandwidth = ctx.spec.hardware.host_bandwidth_bytes_per_s
        warnings = []
        if bandwidth is None:
            warnings.append("no hardware.host_bandwidth_bytes_per_s: host-link copies are not "
                            "costed (set it, or use a cluster preset)")
        else:
            work += self._copies(config, ctx, bandwidth * config.host_link_efficiency)
        if not is_array(config.optimizer):  # one layout: state only what it does
            offloads = tuple(o for o in offloads if o.active)
            work = [w for w in work if w.passes_per_step]
        moved = ", ".join(c for c in COMPONENTS if getattr(config, c) is True)
        return Transform(strategy=self.name, offloads=offloads, host_work=tuple(work),
                         notes=(f"offloads {moved} to host memory",) if moved else (),
                         warnings=tuple(warnings))

    def _copies(self, config: OffloadConfig, ctx: StrategyContext,
                link: float) -> list[HostWork]:
        spec = ctx.spec
        grad_size = bytes_per_element(spec.gradients_dtype)
        weight_size = bytes_per_element(spec.precision.weights)
        m = micro_batches_per_step(spec, ctx.layout)
        on = where(config.optimizer, 1.0, 0.0)
        forward = where(spec.training.recompute == "full", 2, 1)
        common: dict[str, Any] = {"strategy": self.name}
        return [
            HostWork(name="offload.gradients-to-host", component="optimizer",
                     seconds_per_parameter=grad_size / link,
                     passes_per_step=on * where(config.gradients, m, 1),
                     overlap=1.0, reason=f"{spec.gradients_dtype} gradients of the GPU's "
                                         f"partition over {link / 1e9:.3g} GB/s, behind the "
                                         "backward pass", **common),
            HostWork(name="offload.weights-from-host", component="weights",
                     seconds_per_parameter=weight_size / link,
                     passes_per_step=on * where(config.weights, m * (forward + 1), 0),
                     overlap=1.0, reason="each ZeRO-3 shard fetched for every forward and "
                                         "backward pass, prefetched (ZeRO-Infinity Sec. 6.2)",
                     **common),
            HostWork(name="offload.weights-to-gpu", component="optimizer",
                     seconds_per_parameter=weight_size / link,
                     passes_per_step=on * where(config.weights, 0, 1),
                     overlap=1.0 if config.delayed_parameter_update else 0.0,
                     reason=f"updated {spec.precision.weights} weights of the partition back to "
                            "the GPU after the host's step", **common),
        ]
