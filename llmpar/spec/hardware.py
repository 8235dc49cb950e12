"""GPUs and the machines they sit in."""

from __future__ import annotations

from typing import Any

import attrs

from llmpar.dtypes import math_format
from llmpar.spec import validators as v
from llmpar.spec.quantities import ByteRate, Bytes, FlopRate, MemorySize, Seconds

ARCHITECTURES = ("", "volta", "turing", "ampere", "ada", "hopper", "blackwell",
                 "cdna2", "cdna3", "cdna4")
"""GPU designs (`Gpu.architecture`): NVIDIA's by name, AMD Instinct's by CDNA generation
(MI250X: CDNA2, MI300X and MI325X: CDNA3, MI355X: CDNA4)."""
COLLECTIVE_ALGORITHMS = ("ring", "nccl")
FUSED_ATTENTION_KERNELS = ("sdpa-flash", "flash-attention-2", "flash-attention-3", "cudnn",
                          "aiter")
"""The framework profiles' attention kernels that never materialize the scores
(`llmpar.spec.framework.ATTENTION_KERNELS`): the ones a measured rate can be stated for."""
ATTENTION_PASSES = ("forward", "backward")
ATTENTION_WIDTH = 128
"""Head width at which `AttentionKernelRate.compute_efficiency` is stated: the width the
kernel benchmarks measure and nearly every trained model uses."""


@attrs.frozen(kw_only=True)
class AttentionKernelRate:
    """The measured rate of one fused attention kernel's pass on this GPU (a row of the
    preset's `attention_kernels`; kernel-level data under validation/published/kernels/,
    fitted by validation/fit_attention_kernels.py). One call over k keys per query at
    head width d reaches, with w = half_width,

        compute_efficiency x k / (k + half_keys) x min(1, d (128 + w) / (128 (d + w)))

    of the dense peak: each tile of queries pays a fixed prologue and epilogue (loading Q,
    writing O and the log-sum-exp) beside its pass over the key tiles, so the share grows
    as k / (k + half_keys) (FlashAttention-2, Dao 2023, arXiv:2307.08691, Sec. 3.1: one
    tile of queries per thread block, looping over the key tiles); and each score costs
    the non-matrix work of the online softmax (exp, max, rescale) beside its 2 d
    multiply-adds per product (Sec. 3.1: the A100's matmul throughput is 16x its
    non-matmul one), so narrower heads reach a smaller share, as d / (d + half_width),
    stated relative to head width 128 and never above it (no measurement above 128 is
    fitted). FLOPs as the benchmarks count them: the backward runs 5 products of the
    forward's size against the forward's 2 (it recomputes the scores), 2.5x the forward's
    FLOPs (Sec. 4.1)."""

    kernel: str = attrs.field(validator=v.one_of(*FUSED_ATTENTION_KERNELS))
    """The attention kernel (`[training] framework`'s `attention_kernel`): "flash-attention-2",
    "flash-attention-3", "cudnn", "sdpa-flash" or "aiter" (AMD's AITER flash attention)."""
    direction: str = attrs.field(validator=v.one_of(*ATTENTION_PASSES))
    """The pass: "forward" or "backward" (the backward's FLOPs 2.5x the forward's)."""
    compute_efficiency: float = attrs.field(validator=v.fraction)
    """Share of the dense peak it approaches with many keys per query, at head width 128."""
    half_keys: float = attrs.field(default=0.0, validator=v.non_negative)
    """Keys per query at which it reaches half of compute_efficiency."""
    half_width: float = attrs.field(default=0.0, validator=v.non_negative)
    """Head width at which the share of the softmax's work equals the products' (0: none)."""
    source: str = ""
    """The kernel-level measurements and their fit."""

    def efficiency(self, keys: Any, head_dim: float) -> Any:
        """Share of the peak at `keys` keys per query (a number or an array) and head width
        `head_dim`."""
        w = self.half_width
        width = min(1.0, head_dim * (ATTENTION_WIDTH + w) / (ATTENTION_WIDTH * (head_dim + w)))
        return self.compute_efficiency * width * keys / (keys + self.half_keys)


@attrs.frozen(kw_only=True, cache_hash=True)
class Gpu:
    """One accelerator. Peak rates are dense (no structured sparsity)."""

    name: str = "custom"
    """Preset name or a label."""
    architecture: str = attrs.field(default="", validator=v.one_of(*ARCHITECTURES))
    """The GPU's generation ("volta", "turing", "ampere", "ada", "hopper", "blackwell"),
    which picks the generation's constants of NCCL's tuning model (`[hardware]
    collective_algorithms = "nccl"`: the LL protocol's bandwidth cap, NVLS's efficiency).
    Unset: Ampere's constants, and no NVLS."""
    source: str = ""
    """Datasheet the numbers come from."""
    memory_bytes: MemorySize = attrs.field(validator=v.positive)
    """On-device memory (HBM), as the datasheet states it."""
    usable_memory_bytes: MemorySize | None = attrs.field(default=None, validator=v.positive)
    """Memory the device reports as its total (nvidia-smi's total, CUDA's
    `total_memory`, rocminfo's VRAM pool): what the frameworks allocate from, and what a
    plan must fit in. It differs from the datasheet's figure, which rounds: an H100's
    "80 GB" is reported as 81,559 MiB (85.5 GB). Unset: memory_bytes."""
    usable_memory_source: str = ""
    """Where `usable_memory_bytes` was read (a published device log)."""
    peak_fp32_flops_per_s: FlopRate | None = attrs.field(default=None, validator=v.positive)
    """Dense peak of fp32 matrix math, FLOP per second (no structured sparsity)."""
    peak_tf32_flops_per_s: FlopRate | None = attrs.field(default=None, validator=v.positive)
    """Dense peak of tf32 matrix math, FLOP per second (no structured sparsity)."""
    peak_bf16_flops_per_s: FlopRate | None = attrs.field(default=None, validator=v.positive)
    """Dense peak of bf16 matrix math, FLOP per second (no structured sparsity)."""
    peak_fp16_flops_per_s: FlopRate | None = attrs.field(default=None, validator=v.positive)
    """Dense peak of fp16 matrix math, FLOP per second (no structured sparsity)."""
    peak_fp8_flops_per_s: FlopRate | None = attrs.field(default=None, validator=v.positive)
    """Dense peak of fp8 matrix math, FLOP per second (no structured sparsity)."""
    peak_fp4_flops_per_s: FlopRate | None = attrs.field(default=None, validator=v.positive)
    """Dense peak of block-scaled fp4 matrix math (NVFP4, MXFP4: Blackwell's fifth-generation
    tensor cores), FLOP per second (no structured sparsity). None: no fp4 tensor cores."""
    hbm_bandwidth_bytes_per_s: ByteRate | None = attrs.field(default=None, validator=v.positive)
    """Memory bandwidth."""
    nvlink_bandwidth_bytes_per_s: ByteRate | None = attrs.field(
        default=None, validator=v.positive
    )
    """Total intra-node link bandwidth per GPU (both directions, as datasheets state)."""
    matmul_efficiency: float | None = attrs.field(default=None, validator=v.fraction)
    """Share of the dense peak that a training step's matrix products reach; with
    `memory_efficiency` it lets llmpar model step time instead of assuming an MFU."""
    fp8_matmul_efficiency: float | None = attrs.field(default=None, validator=v.fraction)
    """`matmul_efficiency` for products run in fp8 (the fp8 peak's share): the calibrated
    `matmul_efficiency` times the ratio of the maximum achievable fp8 to bf16 matmul
    efficiency measured on this GPU (validation/published/gemm/stas00_mamf_fp8_table.toml).
    Unset: `matmul_efficiency`, and a plan with fp8 products says so."""
    fp8_matmul_efficiency_source: str = ""
    """How `fp8_matmul_efficiency` was derived."""
    memory_efficiency: float | None = attrs.field(default=None, validator=v.fraction)
    """Share of HBM bandwidth that memory-bound kernels (norms, activations, softmax,
    the optimizer step) reach."""
    matmul_fixed_seconds: Seconds | None = attrs.field(default=None, validator=v.non_negative)
    """Time every matrix product takes besides its work: launch and the first tile's
    latency. Unset: none."""
    efficiency_source: str = ""
    """Where the efficiencies and `matmul_fixed_seconds` come from."""
    efficiency_uncertainty: float | None = attrs.field(default=None, validator=v.fraction)
    """How far a step time modelled with these efficiencies may be off, as a fraction
    (0.2: expect within about +-20%): for a calibrated GPU its largest error on the runs it
    was calibrated on, for one scaled from kernel measurements or from a sibling GPU the
    estimate its `efficiency_source` explains. Unset: not stated."""
    streaming_multiprocessors: int | None = attrs.field(default=None, validator=v.positive)
    """Streaming multiprocessors (compute units) of the die as shipped: what a
    communication kernel that runs on some of them takes from the products it overlaps
    (DeepEP's normal kernels, `[parallel.expert] dispatcher = "deepep"`). Unset: such
    kernels are taken to cost no compute."""
    streaming_multiprocessors_source: str = ""
    """Where `streaming_multiprocessors` was read."""
    achievable_mfu: float | None = attrs.field(default=None, validator=v.fraction)
    """Model FLOPs utilization that large training runs reach on this GPU; held to the
    same limit as `[training] mfu` (the HFU it implies at most 1)."""
    achievable_mfu_source: str = ""
    """The published run behind `achievable_mfu`."""
    attention_kernels: tuple[AttentionKernelRate, ...] = ()
    """Measured rates of fused attention kernels on this GPU, a forward and a backward row
    per kernel (`[[hardware.gpu.attention_kernels]]`): a training step under a framework
    profile that times attention by its kernel (`attention_timing = "kernel"`) and whose
    `attention_kernel` has rows here, with fused attention, runs attention at its kernel's
    rates instead of `matmul_efficiency` (`llmpar.evaluation.attention`). Empty: every
    attention product at matmul_efficiency."""

    def attention_rate(self, kernel: str, direction: str) -> AttentionKernelRate | None:
        """The row of `kernel`'s `direction` pass, or None when none is stated."""
        for rate in self.attention_kernels:
            if rate.kernel == kernel and rate.direction == direction:
                return rate
        return None

    @property
    def usable_bytes(self) -> int:
        """The memory a plan may use: `usable_memory_bytes`, else `memory_bytes`."""
        usable = self.usable_memory_bytes
        return int(self.memory_bytes if usable is None else usable)

    def peak_flops_per_s(self, dtype: str) -> float | None:
        """Dense peak for math in `dtype` (on its tensor cores: `math_format`), or None
        when the datasheet gives none."""
        value: float | None = getattr(self, f"peak_{math_format(dtype)}_flops_per_s", None)
        return value

    def matmul_efficiency_for(self, dtype: str) -> float | None:
        """`matmul_efficiency`, or `fp8_matmul_efficiency` for products in an fp8 format
        where the preset states it."""
        if math_format(dtype) == "fp8" and self.fp8_matmul_efficiency is not None:
            return self.fp8_matmul_efficiency
        return self.matmul_efficiency


@attrs.frozen(kw_only=True)
class Hardware:
    """How many GPUs, how they are grouped into nodes, and the links between them.

    Bandwidths are per GPU and per direction, as a collective uses them. A
    `cluster` preset fills these; keys given beside it override it.
    """

    gpu: Gpu
    num_gpus: int = attrs.field(default=1, validator=v.positive)
    """GPUs of the whole job."""
    gpus_per_node: int = attrs.field(default=8, validator=v.positive)
    """GPUs that share one node's fast interconnect (NVLink / NVSwitch domain)."""
    cluster: str | None = None
    """The cluster preset these values came from, if any."""
    intra_node_bandwidth_bytes_per_s: ByteRate | None = attrs.field(
        default=None, validator=v.positive)
    """GPU-to-GPU inside a node, one direction. Default: half the GPU's NVLink figure
    (datasheets state both directions together)."""
    intra_node_latency_seconds: Seconds = attrs.field(
        default=Seconds(2e-6), validator=v.non_negative)
    """Per step of a ring inside a node. Default 2 us: an assumed order of magnitude for
    NVLink, not a measurement; set it from nccl-tests on your system. The ring model's
    (`collective_algorithms = "ring"`); NCCL's model uses NCCL's latencies."""
    inter_node_bandwidth_bytes_per_s: ByteRate | None = attrs.field(
        default=None, validator=v.positive)
    """Network bandwidth per GPU, one direction (e.g. "400 Gb/s" for one NDR NIC per GPU)."""
    inter_node_latency_seconds: Seconds = attrs.field(
        default=Seconds(5e-6), validator=v.non_negative)
    """Per step of a ring across nodes. Default 5 us: an assumed order of magnitude for
    InfiniBand, not a measurement; set it from nccl-tests on your system. The ring model's
    (`collective_algorithms = "ring"`); NCCL's model uses NCCL's latencies."""
    host_bandwidth_bytes_per_s: ByteRate | None = attrs.field(default=None, validator=v.positive)
    """GPU to host memory and back, per GPU and one direction, as the link states it:
    PCIe Gen4 x16 31.5 GB/s and Gen5 x16 63 GB/s (16 and 32 GT/s x 16 lanes, 128b/130b;
    PCI-SIG); NVLink-C2C 900 GB/s both directions per Grace CPU (NVIDIA GH200 and GB200
    datasheets), shared by two GPUs on GB200. What offloading (ZeRO-Offload) moves over."""
    host_memory_bytes: MemorySize | None = attrs.field(default=None, validator=v.positive)
    """CPU memory of one node, which the offloaded states of its GPUs share."""
    collective_efficiency: float = attrs.field(default=0.8, validator=v.fraction)
    """Share of link bandwidth a collective reaches (NCCL's bus bandwidth over the link's).
    Default 0.8: assumed, not measured here; nccl-tests reports bus bandwidth to set it."""
    collective_algorithms: str = attrs.field(default="ring",
                                             validator=v.one_of(*COLLECTIVE_ALGORITHMS))
    """How a ring-type collective (all-reduce, all-gather, reduce-scatter) is costed.
    "ring": a ring, traffic / (link bandwidth x `collective_efficiency`) + steps x the
    tier's latency (Thakur et al. 2005). "nccl": the least time over the algorithms and
    protocols NCCL's tuning model considers (ring, double binary tree, NVLS and NVLS
    tree x LL, LL128, Simple) with NCCL's own latencies and bandwidth factors on the
    same links (`llmpar.communication.nccl`; NVIDIA NCCL v2.30.7 src/graph/tuning.cc);
    there the tiers' latencies above are not used. The plan's collective records name
    the algorithm chosen. All-to-all and send-recv are costed alike in both."""
    nvls: bool = False
    """Whether the node's NVSwitch reduces in the switch (NVLink SHARP, NVLS: third-generation
    NVSwitch with Hopper or later GPUs, as in DGX/HGX H100, H200 and B200 and GB200 NVL72),
    so that NCCL may run its NVLS and NVLS-tree all-reduce (`collective_algorithms = "nccl"`
    only)."""
    memory_headroom_bytes: Bytes = attrs.field(default=Bytes(0), validator=v.non_negative)
    """Memory held back on each GPU in training: a plan fits when its peak is at most the
    GPU's usable memory less this. Default 0, so the margin is the user's to state: the
    CUDA context, NCCL's buffers and the allocator's fragmentation (together often 2-6 GB)
    are not yet counted in a training plan's memory. Serving holds back
    `[inference] memory_utilization` instead."""
    gpu_hour_cost: float | None = attrs.field(default=None, validator=v.positive)
    """Dollars per GPU-hour, for `llmpar search --objective cost`; None: unknown."""
    source: str = ""
    """Where the cluster's numbers come from (its preset's datasheets)."""

    @property
    def intra_node_bandwidth(self) -> float | None:
        """Bytes/s inside a node, from the field or from the GPU's NVLink figure."""
        if self.intra_node_bandwidth_bytes_per_s is not None:
            return self.intra_node_bandwidth_bytes_per_s
        nvlink = self.gpu.nvlink_bandwidth_bytes_per_s
        return None if nvlink is None else nvlink / 2

    @property
    def capacity_bytes(self) -> int:
        """What a training plan must fit in on each GPU: usable memory less the headroom."""
        return int(self.gpu.usable_bytes - self.memory_headroom_bytes)

    @property
    def num_nodes(self) -> int:
        """Nodes used, counting a partly filled node as one."""
        return -(-self.num_gpus // self.gpus_per_node)
