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
"""

from __future__ import annotations

from typing import Any

from llmpar import HostWork, Layout, Offload, Problem, Spec, Strategy, StrategyContext, Transform
from llmpar.dtypes import bytes_per_element

from llmpar_offload.config import OffloadConfig

PATH = "$.parallel.offload"


def gradients_dtype(spec: Spec) -> str:
    """The gradients' format: the optimizer's own where it keeps fp32 gradients."""
    return getattr(spec, "gradients_dtype", None) or spec.precision.gradients


def micro_batches_per_step(spec: Spec, layout: Layout) -> int:
    """Micro-batches each replica runs per step: global / (micro-batch x data degree)."""
    training = spec.training
    if training.global_batch_size is None:
        return 1
    return max(1, training.global_batch_size // (training.micro_batch_size
                                                 * layout.degree("data")))


class OffloadStrategy(Strategy):
    name = "offload"
    config_type = OffloadConfig
    phase = 60

    def neutral_config(self, layout: Layout) -> OffloadConfig:
        return OffloadConfig(optimizer=False, gradients=False, weights=False)

    def check(self, config: OffloadConfig, spec: Spec, layout: Layout) -> list[Problem]:
        if not (config.optimizer or config.gradients or config.weights):
            return []
        problems = []
        if getattr(spec, "inference", None) is not None:
            problems.append(Problem(PATH, "offloading plans training (optimizer states, "
                                          "gradients); this spec is [inference]"))
        for field in ("gradients", "weights"):
            if getattr(config, field) and not config.optimizer:
                problems.append(Problem(f"{PATH}.{field}", f"{field} = true needs optimizer = "
                                        "true: the host's optimizer step is what uses them"))
        stage = getattr(spec.parallel.get("data"), "stage", 0)
        if config.optimizer and layout.degree("data") > 1 and stage == 0:
            problems.append(Problem(f"{PATH}.optimizer", "offloading the optimizer over "
                                    f"{layout.degree('data')} data ranks needs ZeRO "
                                    "([parallel.data] zero >= 1) so that each GPU offloads "
                                    "its own partition, as DeepSpeed's offload_optimizer does"))
        if config.weights and stage != 3:
            problems.append(Problem(f"{PATH}.weights", "streaming weights from the host needs "
                                    "ZeRO-3 ([parallel.data] zero = 3 or fsdp = true), as "
                                    f"DeepSpeed's offload_param does; zero is {stage}"))
        return problems

    def transform(self, config: OffloadConfig, ctx: StrategyContext) -> Transform:
        moved = [c for c in ("optimizer", "gradients", "weights") if getattr(config, c)]
        if not moved:
            return Transform(strategy=self.name)
        offloads = tuple(Offload(component=c, reason=f"[parallel.offload] {c} = true")
                         for c in moved)
        work = []
        if config.optimizer:
            work.append(HostWork(
                strategy=self.name, name="offload.host-optimizer-step", component="optimizer",
                seconds_per_parameter=1 / config.cpu_optimizer_parameters_per_s,
                overlap=1.0 if config.delayed_parameter_update else 0.0,
                reason=f"CPU Adam at {config.cpu_optimizer_parameters_per_s:.3g} parameters/s "
                       "per GPU (ZeRO-Offload Sec. 4.1; a stated assumption)"))
        bandwidth = ctx.spec.hardware.host_bandwidth_bytes_per_s
        warnings = []
        if bandwidth is None:
            warnings.append("no hardware.host_bandwidth_bytes_per_s: host-link copies are not "
                            "costed (set it, or use a cluster preset)")
        else:
            work += self._copies(config, ctx, bandwidth * config.host_link_efficiency)
        return Transform(strategy=self.name, offloads=offloads, host_work=tuple(work),
                         notes=(f"offloads {', '.join(moved)} to host memory",),
                         warnings=tuple(warnings))

    def _copies(self, config: OffloadConfig, ctx: StrategyContext,
                link: float) -> list[HostWork]:
        spec = ctx.spec
        grad_size = bytes_per_element(gradients_dtype(spec))
        weight_size = bytes_per_element(spec.precision.weights)
        m = micro_batches_per_step(spec, ctx.layout)
        delayed = 1.0 if config.delayed_parameter_update else 0.0
        common: dict[str, Any] = {"strategy": self.name}
        copies = [HostWork(
            name="offload.gradients-to-host", component="optimizer",
            seconds_per_parameter=grad_size / link, passes_per_step=m if config.gradients else 1,
            overlap=1.0, reason=f"{gradients_dtype(spec)} gradients of the GPU's partition over "
                                f"{link / 1e9:.3g} GB/s, behind the backward pass", **common)]
        if config.weights:
            forward = 2 if spec.training.recompute == "full" else 1
            copies.append(HostWork(
                name="offload.weights-from-host", component="weights",
                seconds_per_parameter=weight_size / link, passes_per_step=m * (forward + 1),
                overlap=1.0, reason="each ZeRO-3 shard fetched for every forward and backward "
                                    "pass, prefetched (ZeRO-Infinity Sec. 6.2)", **common))
        else:
            copies.append(HostWork(
                name="offload.weights-to-gpu", component="optimizer",
                seconds_per_parameter=weight_size / link, overlap=delayed,
                reason=f"updated {spec.precision.weights} weights of the partition back to the "
                       "GPU after the host's step", **common))
        return copies
