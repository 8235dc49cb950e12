"""The host's time to issue a training step's kernels, and the part of it the GPU waits for.

A kernel launch returns to the host before the kernel runs (CUDA C++ Programming Guide,
"Asynchronous Concurrent Execution"), so while the host issues work faster than the GPU
runs it, the host's time hides behind the kernels already queued; the GPU idles only for
what the host takes beyond the GPU's own time. The measured rows in
validation/published/kernels/host_launch_overheads.toml show both regimes with PyTorch's
eager path on an A100: 8 us per operator back to back for an add whose kernel is shorter
(host-bound), and the kernel's own 149 us for one whose kernel is longer (GPU-bound, the
host's 8 us hidden). Per micro-batch on one GPU (each GPU issues every micro-batch of its
stage, and the queue drains at micro-batch boundaries no later than at the step's end):

    issue     = launches x host_seconds_per_kernel + layer passes x host_seconds_per_layer
                (cuda_graphs = "none", the eager path)
              = layer passes x graph_launch_seconds
                + the output layer's launches x host_seconds_per_kernel
                (cuda_graphs = "layers": each layer's forward and backward one graph
                replay, as Transformer Engine's make_graphed_callables captures them)
              = graph_launch_seconds / micro-batches (cuda_graphs = "step": the whole
                iteration one replay)
    exposed   = max(0, micro-batches x issue - compute)          per step

Launches: the products and attention kernels of `llmpar.evaluation.matmuls` (forward,
two backward products each: input and weight gradient, and the reruns recomputation
adds; one fused attention kernel per layer and pass) plus the profile's
`elementwise_kernels_per_layer` (norms, rotary embedding, activation, residual adds: the
kernels its fusions leave), each run again by its backward (autograd runs one backward
node per forward operation: torch/csrc/autograd/function.h, `Node`). Layer passes: each
layer's forward, backward and rerun. With every host term 0 the step is unchanged.
"""

from __future__ import annotations

from typing import Any

from llmpar.arrays import Value, maximum, where
from llmpar.evaluation.matmuls import RankShape, launches_per_micro_batch
from llmpar.spec import Spec
from llmpar.spec.framework import Framework

SOURCE = ("kernel launches are asynchronous (CUDA C++ Programming Guide, Asynchronous "
          "Concurrent Execution); measured host times per launch and per graph replay in "
          "validation/published/kernels/host_launch_overheads.toml")


def issues_host_time(profile: Framework) -> bool:
    """Whether the profile states any host time of its launches."""
    return bool(profile.host_seconds_per_kernel or profile.host_seconds_per_layer
                or profile.graph_launch_seconds)


def layer_passes(recompute: Any, recomputed_fraction: Any) -> Value:
    """Passes over a layer per micro-batch: forward, backward and the rerun of full
    recomputation."""
    return 2.0 + where(recompute == "full", recomputed_fraction, 0.0)


def issue_seconds_per_micro_batch(spec: Spec, shape: RankShape, recompute: Any,
                                  recomputed_fraction: Any, materialized_scores: bool,
                                  stages: int) -> Value:
    """Host seconds to issue one micro-batch's kernels on one GPU of a stage (`stages`
    split the layers evenly)."""
    profile = spec.training.profile
    if not issues_host_time(profile):
        return 0.0
    layers = float(spec.model.num_layers or 0)
    passes = layer_passes(recompute, recomputed_fraction)
    in_layers, outside = launches_per_micro_batch(spec, shape, recompute,
                                                  recomputed_fraction, materialized_scores)
    # Each forward run of an elementwise kernel (the forward and its rerun) and one
    # backward kernel for it: as many as the layer's passes.
    elementwise = profile.elementwise_kernels_per_layer * layers * passes
    per_kernel, per_layer = profile.host_seconds_per_kernel, profile.host_seconds_per_layer
    if profile.cuda_graphs == "step":
        return 0.0
    if profile.cuda_graphs == "layers":
        along = layers * passes * profile.graph_launch_seconds + outside * per_kernel
    else:
        along = ((in_layers + outside + elementwise) * per_kernel
                 + layers * passes * per_layer)
    return along / stages


def step_issue_seconds(spec: Spec, issue_per_micro_batch: Value, micro_batches: Value
                       ) -> Value:
    """Host seconds to issue a step's kernels on one GPU: every micro-batch's, and one
    graph replay per step under `cuda_graphs = "step"`."""
    profile = spec.training.profile
    issue = issue_per_micro_batch * micro_batches
    if profile.cuda_graphs == "step":
        return issue + profile.graph_launch_seconds
    return issue


def exposed_issue_seconds(issue: Value, compute: Value) -> Value:
    """Seconds of a step the GPU waits for the host to issue its kernels: what issuing
    them takes beyond the step's compute, behind which it otherwise runs."""
    return maximum(issue - compute, 0.0)
