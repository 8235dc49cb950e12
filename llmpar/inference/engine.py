"""What a serving engine adds to a forward step beyond the roofline of its operations
(`[inference] engine`, a profile under specs/engines/ with its version and sources):

- weight kernels: a matrix product that reads weights of a format reaches the share of HBM
  bandwidth the engine's kernel for that format was measured at (cuBLAS for 16-bit,
  Marlin for int8/int4 weight-only), in place of the GPU's memory_efficiency;
- custom all-reduce: a small all-reduce inside one NVLink domain runs the engine's own
  kernel, one-shot (each GPU reads every peer's buffer: 1 step, (n - 1) x B read) or
  two-shot (reduce-scatter then all-gather: 2 steps, 2 (n - 1) / n x B read), at the
  latency and bandwidth fitted on its measurements (`llmpar.spec.inference.CustomAllReduce`);
- attention kernels: the engine's decode (paged; for multi-head latent attention its
  latent-space kernel) and prefill attention kernels take a fixed time per call plus
  their rooflines at the bandwidth and peak shares fitted on their kernel-level
  measurements (`llmpar.spec.inference.AttentionKernel`), the prefill's share growing
  with the keys each query attends;
- FP8 block-scaled products: with FP8 weights in the blocks its kernel runs (DeepGEMM's 128
  x 128), the projections, MLPs and experts take the kernel's fixed time per call plus
  their rooflines at its bandwidth share and at a share of the peak that grows with the
  rows of each call and the depth of its products (`llmpar.spec.inference.GemmKernel`);
- host time: with CUDA graphs, the step waits for the engine's scheduling, input
  preparation and sampling, step_overhead_seconds + step_overhead_per_sequence_seconds x
  sequences; without them, the host also launches every kernel, layers x kernels_per_layer
  x kernel_launch_seconds, and the GPU runs behind the launches (the CPU runs ahead of the
  GPU, so launches cost time only where they outlast the kernels they launch).

Without an engine none of this applies: the plan is the roofline alone.
"""

from __future__ import annotations

from llmpar.communication.collectives import INTRA_NODE, link_of
from llmpar.inference.serving import Serving
from llmpar.spec.inference import AttentionKernel, GemmKernel
from llmpar.strategy import Collective

ENGINE_TRUST = ("not yet checked against published serving runs: each phase is a roofline of "
                "its operations with the engine profile's measured weight and attention "
                "kernels, custom all-reduce and host time per step (llmpar.inference.engine); "
                "its constants come from kernel and trace measurements, not from runs")
"""What a serving plan's times rest on when an engine profile is named."""


def weight_efficiency(serving: Serving, weights: str) -> float | None:
    """Share of HBM bandwidth the engine's kernel reads weights of `weights` at; None: the
    GPU's memory_efficiency (no engine, or the format not measured)."""
    engine = serving.inference.engine
    if engine is None:
        return None
    return engine.weight_memory_efficiency.get(weights)


def attention_kernel(serving: Serving, phase: str) -> AttentionKernel | None:
    """The engine's attention kernel for `phase` ("prefill" or "decode"; a latent-attention
    model decodes through its MLA kernel, never the paged one); None: the roofline at the
    GPU's efficiencies (no engine, or no kernel measured)."""
    engine = serving.inference.engine
    if engine is None:
        return None
    if phase != "decode":
        return engine.prefill_attention
    if serving.spec.model.mla is not None:
        return engine.mla_decode_attention
    return engine.decode_attention


def kernel_compute_efficiency(kernel: AttentionKernel, keys: float) -> float | None:
    """Share of the peak `kernel` reaches at `keys` keys per query:
    compute_efficiency x k / (k + half_keys) (`AttentionKernel`); None: the GPU's."""
    if kernel.compute_efficiency is None or keys <= 0:
        return None
    return kernel.compute_efficiency * keys / (keys + kernel.half_keys)


def gemm_kernel(serving: Serving, weights: str) -> GemmKernel | None:
    """The engine's FP8 block-scaled product kernel, where it runs products with weights
    of `weights` (fp8 in its blocks); None: the weight efficiencies and the GPU's."""
    engine = serving.inference.engine
    kernel = engine.block_fp8_gemm if engine is not None else None
    if (kernel is None or weights != "fp8"
            or serving.inference.weights_group_size != kernel.group_size):
        return None
    return kernel


def gemm_depth_factor(kernel: GemmKernel, matrices: list[tuple[float, float]]) -> float:
    """The share k / (k + half_depth) of one operation's products (weights, depth k),
    weighted as their times add: sum of weights over sum of weights x (k + half_depth) / k
    (`GemmKernel`)."""
    total = sum(weights for weights, _ in matrices)
    slowed = sum(weights * (depth + kernel.half_depth) / depth for weights, depth in matrices)
    return total / slowed if slowed > 0 else 1.0


def gemm_compute_efficiency(kernel: GemmKernel, rows: float, depth_factor: float) -> float:
    """Share of the peak `kernel` reaches on calls of `rows` rows whose products have the
    depth share `depth_factor`: compute_efficiency x m / (m + half_rows) x depth share."""
    rows = max(rows, 1e-9)
    return kernel.compute_efficiency * rows / (rows + kernel.half_rows) * depth_factor


def custom_all_reduce_seconds(serving: Serving, collective: Collective) -> float | None:
    """Seconds of one call of `collective` through the engine's custom all-reduce; None
    when it does not take it (no engine or no kernel, not an all-reduce, a group larger
    than the kernel's or leaving the node, a buffer above max_bytes)."""
    engine = serving.inference.engine
    kernel = engine.custom_all_reduce if engine is not None else None
    n, size = collective.group_size, float(collective.buffer_bytes)
    if (kernel is None or collective.operation != "all-reduce" or n > kernel.max_group_size
            or size > kernel.max_bytes
            or link_of(collective, serving.spec.hardware).tier != INTRA_NODE):
        return None
    if n * size < kernel.one_shot_max_total_bytes:
        steps, read = 1, (n - 1) * size
    else:
        steps, read = 2, 2 * (n - 1) / n * size
    return steps * kernel.latency_seconds + read / kernel.bandwidth_bytes_per_s


def launch_seconds(serving: Serving) -> float:
    """Host time to launch one step's kernels without CUDA graphs (0 with them)."""
    engine = serving.inference.engine
    if engine is None or serving.inference.cuda_graphs or engine.kernel_launch_seconds is None:
        return 0.0
    layers = serving.spec.model.num_layers or 0
    return layers * engine.kernels_per_layer * engine.kernel_launch_seconds


def host_seconds(serving: Serving, sequences: float) -> float:
    """The engine's host time per step around the kernels, for `sequences` in the step."""
    engine = serving.inference.engine
    if engine is None:
        return 0.0
    return ((engine.step_overhead_seconds or 0.0)
            + engine.step_overhead_per_sequence_seconds * sequences)


def step_overhead_seconds(serving: Serving, sequences: float, gpu_seconds: float) -> float:
    """What one step adds to `gpu_seconds` of kernels and collectives: the host time, and
    the launches' time beyond the kernels' (eager mode)."""
    if serving.inference.engine is None:
        return 0.0
    return (host_seconds(serving, sequences)
            + max(0.0, launch_seconds(serving) - gpu_seconds))


def engine_label(serving: Serving) -> str | None:
    """The profile in words for the plan: name, version, CUDA graphs or eager."""
    engine = serving.inference.engine
    if engine is None:
        return None
    mode = "CUDA graphs" if serving.inference.cuda_graphs else "eager, no CUDA graphs"
    return f"{engine.name} {engine.version} ({mode})"


def engine_warnings(serving: Serving) -> list[str]:
    """What the profile does not cover for this plan."""
    engine = serving.inference.engine
    if engine is None:
        return []
    found = []
    gpu = serving.spec.hardware.gpu.name
    measured = engine.weight_memory_efficiency_gpu
    if engine.weight_memory_efficiency and measured is not None and measured != gpu:
        found.append(f"engine {engine.name!r}: its weight kernels' efficiencies were measured "
                     f"on {measured}, applied here to {gpu}")
    for kernel in (attention_kernel(serving, "prefill"), attention_kernel(serving, "decode")):
        if kernel is not None and kernel.gpu is not None and kernel.gpu != gpu:
            found.append(f"engine {engine.name!r}: its attention kernel {kernel.name!r} was "
                         f"measured on {kernel.gpu}, applied here to {gpu}")
    inference = serving.inference
    gemm = next((kernel for kernel in (gemm_kernel(serving, inference.weights),
                                       gemm_kernel(serving, inference.expert_weights or ""))
                 if kernel is not None), None)
    if gemm is not None and gemm.gpu is not None and gemm.gpu != gpu:
        found.append(f"engine {engine.name!r}: its FP8 product kernel {gemm.name!r} was "
                     f"measured on {gemm.gpu}, applied here to {gpu}")
    if engine.step_overhead_seconds is None:
        found.append(f"engine {engine.name!r} states no step_overhead_seconds: no host time "
                     "per step counted")
    if not serving.inference.cuda_graphs and engine.kernel_launch_seconds is None:
        found.append(f"engine {engine.name!r} states no kernel_launch_seconds: launches "
                     "without CUDA graphs not counted")
    return found
