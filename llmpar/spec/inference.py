"""`[inference]`: a serving workload, in place of `[training]`.

The parallel strategies come from the same `[parallel.*]` tables as in training:
tensor, pipeline, expert and context split one replica; data is the number of
replicas, each serving `batch_size` sequences.
"""

from __future__ import annotations

from typing import Any

import attrs

from llmpar.errors import did_you_mean
from llmpar.spec import validators as v
from llmpar.spec.quantities import ByteRate, Bytes, Seconds

WEIGHT_FORMATS = ("fp32", "bf16", "fp16", "fp8", "int8", "int4", "nvfp4", "mxfp4")
"""Formats the blocks' linear weights may be stored in."""
KV_CACHE_FORMATS = ("fp32", "bf16", "fp16", "fp8", "int8")
"""Formats of the key/value cache (vLLM's kv_cache_dtype "auto" or "fp8")."""
QUANTIZED_FORMATS = ("fp8", "int8", "int4", "nvfp4", "mxfp4")
"""Formats that keep only the blocks' linear layers quantized; embeddings, output layer,
norms and router stay in `[precision] activations` (see llmpar.inference.formats)."""




def _efficiencies(_instance: Any, attribute: Any, value: dict[str, float]) -> None:
    """Each key a weight format, each value in (0, 1]."""
    for key, efficiency in value.items():
        if key not in WEIGHT_FORMATS:
            listed = ", ".join(repr(f) for f in WEIGHT_FORMATS)
            raise v.FieldError(f"{attribute.name}.{key}", f"must be a weight format, one of "
                               f"{listed}{did_you_mean(str(key), WEIGHT_FORMATS)}")
        if not isinstance(efficiency, float | int) or not 0 < efficiency <= 1:
            raise v.FieldError(f"{attribute.name}.{key}",
                               f"must be in (0, 1], got {efficiency!r}")


@attrs.frozen(kw_only=True)
class CustomAllReduce:
    """An engine's own all-reduce for small messages inside one NVLink domain (vLLM's
    custom_all_reduce.cuh, TensorRT-LLM's allReduceKernels.cu): each GPU reads its peers'
    buffers directly. One-shot: every GPU reads all n - 1 peers' whole buffers and sums
    them, one step; two-shot: a reduce-scatter then an all-gather over the same peer
    reads, 2 (n - 1) / n of the buffer in two steps.

    seconds = steps x latency_seconds + bytes read from peers / bandwidth_bytes_per_s
    """

    max_bytes: Bytes = attrs.field(validator=v.positive)
    """Largest buffer the engine sends through it; larger ones go to NCCL."""
    one_shot_max_total_bytes: Bytes = attrs.field(validator=v.positive)
    """One-shot while group size x buffer bytes stays below this, two-shot above (vLLM:
    one-shot under 512 KiB at 4 GPUs and under 256 KiB at 8, 2 MiB either way)."""
    max_group_size: int = attrs.field(default=8, validator=v.positive)
    """Most GPUs it runs on (one NVLink domain)."""
    latency_seconds: Seconds = attrs.field(validator=v.positive)
    """Fixed time of one step (kernel launch, flag exchange between the GPUs)."""
    bandwidth_bytes_per_s: ByteRate = attrs.field(validator=v.positive)
    """Peer bytes one GPU reads per second inside the kernel."""
    source: str = ""
    """Where the constants come from (kernel-level measurements)."""


@attrs.frozen(kw_only=True)
class AttentionKernel:
    """An engine's attention kernel as measured on its own (the kernel tables of
    validation/published/kernels/attention_*.toml): a fixed time per call beside its
    rooflines at the bandwidth and peak shares fitted on those measurements.

    One call (one layer, one step) takes

        fixed_seconds + max(FLOPs / (peak x compute_efficiency x k / (k + half_keys)),
                            bytes / (HBM bandwidth x memory_efficiency))

    with k the keys each query attends on average. Decode: a fixed time (launch, split-KV
    combine, the tail of the last wave) and a bandwidth share the cache reads reach once
    they fill the GPU, so the achieved share bytes / (bandwidth x seconds) saturates with
    batch x context x KV heads (Flash-Decoding's split over the keys, Dao et al. 2023,
    crfm.stanford.edu/2023/10/12/flashdecoding.html). Prefill: each tile of queries pays a
    fixed prologue and epilogue beside its pass over k keys, so the share of the peak
    grows as k / (k + half_keys) (FlashAttention-2, Dao 2023, arXiv:2307.08691, Sec. 3.1:
    one tile of queries per thread block, looping over the key tiles)."""

    name: str
    """The kernel (flash-attention-2-paged, flashmla, ...)."""
    memory_efficiency: float | None = attrs.field(default=None, validator=v.fraction)
    """Share of HBM bandwidth its reads of the cache reach when large; None: the GPU's
    memory_efficiency."""
    compute_efficiency: float | None = attrs.field(default=None, validator=v.fraction)
    """Share of the peak its products reach with many keys per query; None: the GPU's
    matmul_efficiency (and half_keys unused)."""
    half_keys: float = attrs.field(default=0.0, validator=v.non_negative)
    """Keys per query at which it reaches half of compute_efficiency (0: no tile cost)."""
    fixed_seconds: Seconds = attrs.field(default=Seconds(0.0), validator=v.non_negative)
    """Time of one call beyond its rooflines (launch, combine, tail)."""
    gpu: str | None = None
    """The GPU preset it was measured on (the plan warns on another)."""
    source: str = ""
    """Where the constants come from (kernel-level measurements and their fit)."""


@attrs.frozen(kw_only=True)
class GemmKernel:
    """An engine's matrix-product kernel for FP8 weights in blocks sharing one scale
    (DeepGEMM's, 128 x 128 weight blocks and 1 x 128 activation groups), as measured on
    its own (validation/published/kernels/deepgemm_fp8_h800.toml). One call of an m x k
    by k x n product (m tokens, or one expert's tokens in a grouped call) takes

        fixed_seconds + max(FLOPs / (peak x compute_efficiency x m / (m + half_rows)
                                     x k / (k + half_depth)),
                            bytes / (HBM bandwidth x memory_efficiency))

    Each output tile loops over the k / 128 blocks of its depth, promoting its FP8
    partial sums with their scales once per block, and pays a prologue and epilogue per
    tile: a fixed cost per tile beside work in m rows and in k depth, so the share of the
    peak grows as m / (m + half_rows) and k / (k + half_depth) (DeepGEMM README, "Fully
    JIT design", its promotion of the FP8 accumulators every 128 channels: DeepSeek-V3
    report, arXiv:2412.19437, Sec. 3.3.2); fixed_seconds is the call's fill and drain.
    The constants are the least-squares fit of this law on the kernel's own table."""

    name: str
    """The kernel (deepgemm-fp8, ...)."""
    group_size: int = attrs.field(default=16384, validator=v.positive)
    """Weights sharing one scale that the kernel runs (`[inference] weights_group_size`):
    128 x 128."""
    compute_efficiency: float = attrs.field(validator=v.fraction)
    """Share of the FP8 peak it approaches with many rows and a deep product."""
    half_rows: float = attrs.field(default=0.0, validator=v.non_negative)
    """Rows (tokens per call, per expert in a grouped call) at which it reaches half of
    compute_efficiency."""
    half_depth: float = attrs.field(default=0.0, validator=v.non_negative)
    """Depth k (input channels) at which it reaches half of compute_efficiency."""
    memory_efficiency: float = attrs.field(validator=v.fraction)
    """Share of HBM bandwidth its reads and writes reach."""
    fixed_seconds: Seconds = attrs.field(default=Seconds(0.0), validator=v.non_negative)
    """Time of one call beyond its rooflines (the pipeline's fill and drain)."""
    gpu: str | None = None
    """The GPU preset it was measured on (the plan warns on another)."""
    source: str = ""
    """Where the constants come from (kernel-level measurements and their fit)."""


@attrs.frozen(kw_only=True)
class ElementwiseKernel:
    """An engine's small elementwise kernels (norms, rotary embedding, the FP8 quantization
    of a product's input, the activation between two products, the router's top-k), as
    timed on their own inside a CUDA graph (validation/published/kernels/
    elementwise_h100.toml). One kernel moving `bytes` takes

        fixed_seconds + bytes / (HBM bandwidth x memory_efficiency)

    fixed_seconds: its launch inside the graph, the fill of its first wave and the drain
    of its last, what a decode step's many small kernels pay whatever their bytes. The
    constants are the least-squares fit of this law on the kernels' own table
    (validation/fit_elementwise_kernel.py)."""

    name: str
    """The kernels measured (flashinfer-and-sgl-kernel-elementwise, ...)."""
    fixed_seconds: Seconds = attrs.field(validator=v.non_negative)
    """Time of one kernel beyond its bytes' (launch, fill and drain)."""
    memory_efficiency: float = attrs.field(validator=v.fraction)
    """Share of HBM bandwidth its reads and writes reach."""
    gpu: str | None = None
    """The GPU preset it was measured on (the plan warns on another)."""
    source: str = ""
    """Where the constants come from (kernel-level measurements and their fit)."""


@attrs.frozen(kw_only=True)
class Engine:
    """A serving engine's profile (`[inference] engine = "vllm"`, a preset under
    specs/engines/): what it adds to each step beyond the roofline of the operations, as
    measured on its kernels, for one version."""

    name: str
    """The profile's name (its file name under specs/engines/)."""
    version: str
    """The engine version the constants were measured on."""
    source: str
    """Where the profile's numbers come from."""
    step_overhead_seconds: Seconds | None = attrs.field(default=None,
                                                        validator=v.non_negative)
    """Host time per forward step the GPU waits on with CUDA graphs on: scheduling,
    input preparation, sampling and output processing. None: not measured (counted as
    nothing; the plan warns)."""
    step_overhead_per_sequence_seconds: Seconds = attrs.field(default=Seconds(0.0),
                                                              validator=v.non_negative)
    """Host time per step added by each sequence of the step."""
    kernel_launch_seconds: Seconds | None = attrs.field(default=None,
                                                        validator=v.non_negative)
    """Host time to launch one kernel without CUDA graphs; the GPU waits when the launches
    of a step take longer than its kernels. None: not measured."""
    kernels_per_layer: int = attrs.field(default=12, validator=v.positive)
    """Kernels one transformer layer launches in a forward step."""
    weight_memory_efficiency: dict[str, float] = attrs.field(
        factory=dict, validator=_efficiencies, hash=False)
    """Share of HBM bandwidth the engine's matrix-vector kernels reach when reading
    weights of each format (memory-bound, small batch); a format not listed reads at the
    GPU's memory_efficiency."""
    weight_memory_efficiency_gpu: str | None = None
    """The GPU preset those efficiencies were measured on (the plan warns on another)."""
    custom_all_reduce: CustomAllReduce | None = None
    """The engine's own all-reduce for small messages; None: NCCL for all."""
    decode_attention: AttentionKernel | None = None
    """Its paged decode attention kernel (one query token per sequence); None: the roofline
    at the GPU's efficiencies."""
    mla_decode_attention: AttentionKernel | None = None
    """Its decode attention kernel for multi-head latent attention (absorbed, in the latent
    space); None: the roofline at the GPU's efficiencies."""
    prefill_attention: AttentionKernel | None = None
    """Its prefill (variable-length) attention kernel; None: the roofline at the GPU's
    efficiencies."""
    block_fp8_gemm: GemmKernel | None = None
    """Its kernel for the products with FP8 weights in blocks sharing one scale (`weights`
    or `expert_weights` "fp8" with `weights_group_size` its group_size): projections,
    MLPs, shared and routed experts; None: those read at the fp8 share of
    weight_memory_efficiency and compute at the GPU's matmul_efficiency."""
    activation_kernel: bool = False
    """Whether the activation between an MLP's (or an expert's) two products runs as a
    kernel of its own: it reads the first product's output (gate and up) from HBM and
    writes its 16-bit result for the second to read, a memory-bound pass beside the
    products rather than inside them (`llmpar.inference.elementwise`). False: the plan
    counts those bytes in the products'."""
    quantization_kernel: bool = False
    """Whether, with block_fp8_gemm, each product's 16-bit input is quantized to FP8 by a
    kernel of its own (reading it, writing 1 byte a value and a 4-byte scale per group of
    128) before the product (`llmpar.inference.elementwise`). False: not counted."""
    expert_permutation_kernel: bool = False
    """Whether, with block_fp8_gemm and DeepEP's dispatch (`[parallel.expert] dispatcher =
    "deepep"`), a prefill's routed experts run on their tokens permuted into one block of
    rows per expert by kernels of their own: a scatter reading each received token once
    and writing a copy per local expert it picked (FP8 with its scales), and a gather
    reading each copy's output and writing each token's weighted sum in 16 bits
    (`llmpar.inference.elementwise`). False: not counted."""
    elementwise_kernels: ElementwiseKernel | None = None
    """Its small elementwise kernels' fixed time and bandwidth share: with it, each
    elementwise operation of a step (norms and residual adds, the embedding lookup, the
    activation, quantization and permutation kernels, the router's product and top-k,
    and in multi-head latent attention's decode its latent norms, rotary embedding, cache
    write and the quantization of the absorbed products' inputs) takes fixed_seconds a
    kernel it runs beside its bytes at memory_efficiency (`llmpar.inference.elementwise`).
    None: their bytes at the GPU's memory_efficiency, no time per kernel."""
    max_num_batched_tokens: int | None = attrs.field(default=None, validator=v.positive)
    """Tokens one step processes at most under continuous batching (vLLM's
    max_num_batched_tokens, SGLang's chunked_prefill_size): the default prefill chunk."""
    max_num_seqs: int | None = attrs.field(default=None, validator=v.positive)
    """Sequences one step holds at most (vLLM's max_num_seqs, SGLang's
    max_running_requests): the largest continuous batch."""


@attrs.frozen(kw_only=True)
class Speculative:
    """Speculative decoding with draft heads (`[inference.speculative]`): each step a head
    of `draft_layers` transformer layers of the target's shape, sharing its embedding and
    output layer (EAGLE, Li et al. 2024, arXiv:2401.15077: one decoder layer; DeepSeek-V3's
    multi-token prediction module, arXiv:2412.19437 Sec. 2.2), proposes `draft_tokens`
    tokens one after another, and the target verifies them in one forward step."""

    draft_tokens: int = attrs.field(validator=v.positive)
    """Tokens the head proposes per step (k)."""
    acceptance_rate: float = attrs.field(validator=v.fraction)
    """Probability that the target accepts each proposed token, as measured for the head
    and the data (alpha of Leviathan et al. 2023, arXiv:2211.17192); stated, not derived."""
    draft_layers: int = attrs.field(default=1, validator=v.positive)
    """Transformer layers of the draft head, each of the shape of the target's last layer."""


def _degrees(_instance: Any, attribute: Any, value: dict[str, int]) -> None:
    """Each value a positive degree (data may be -1: filled from the pool's GPUs)."""
    for key, degree in value.items():
        if not isinstance(degree, int) or isinstance(degree, bool) or not (
                degree > 0 or (key == "data" and degree == -1)):
            raise v.FieldError(f"{attribute.name}.{key}",
                               f"must be a positive degree, got {degree!r}")


@attrs.frozen(kw_only=True)
class Disaggregated:
    """Disaggregated prefill and decode (`[inference.disaggregated]`, xPyD): one pool of
    GPUs prefills each prompt, sends its key/value cache over the link between the pools,
    and another pool decodes (Zhong et al. 2024, DistServe, arXiv:2401.09670; Patel et al.
    2024, Splitwise, arXiv:2311.18284). Each pool's layout is the spec's `[parallel.*]`
    tables (their options, such as the expert dispatcher) with the pool's own degrees;
    the data degree, its replicas, fills the pool's GPUs. `[hardware] num_gpus` is both
    pools together."""

    prefill_gpus: int = attrs.field(validator=v.positive)
    """GPUs of the prefill pool (placed first: ranks 0 .. prefill_gpus - 1)."""
    decode_gpus: int = attrs.field(validator=v.positive)
    """GPUs of the decode pool (the ranks after the prefill pool's)."""
    prefill_layout: dict[str, int] = attrs.field(factory=dict, validator=_degrees,
                                                 hash=False)
    """Degrees of the prefill pool by strategy (`{ tensor = 8 }`); a strategy not named
    keeps its `[parallel.*]` degree; data fills the pool unless named."""
    decode_layout: dict[str, int] = attrs.field(factory=dict, validator=_degrees, hash=False)
    """Degrees of the decode pool by strategy, as prefill_layout."""
    kv_transfer_bandwidth_bytes_per_s: ByteRate | None = attrs.field(
        default=None, validator=v.positive)
    """Bytes per second one GPU sends its share of a prompt's cache at (one direction).
    None: the link between the pools, `[hardware] inter_node_bandwidth_bytes_per_s` when
    they span nodes, the intra-node bandwidth when both fit in one node."""


def _hit_rate(_instance: Any, attribute: Any, value: float) -> None:
    if not isinstance(value, float | int) or not 0 <= value < 1:
        raise v.FieldError(attribute.name, f"must be in [0, 1), got {value!r}")


def _one_workload(instance: Inference, attribute: Any, value: float | None) -> None:
    """A concurrency or a request rate, not both (the loader also refuses either beside
    a batch_size: `llmpar.loading.loader`)."""
    if value is not None and instance.concurrency is not None:
        raise v.FieldError(attribute.name, "give concurrency or request_rate_per_s, not both")


def _default_group_size(instance: Inference) -> int | None:
    return 128 if instance.weights == "int4" else None


@attrs.frozen(kw_only=True)
class Inference:
    """One serving workload: how many sequences at once, how long, and in what formats."""

    batch_size: int = attrs.field(default=1, validator=v.positive)
    """Sequences each replica serves at once (one data-parallel rank; the whole cluster
    serves batch_size x data degree)."""
    prompt_tokens: int = attrs.field(validator=v.positive)
    """Tokens of each prompt (the prefill)."""
    generated_tokens: int = attrs.field(validator=v.positive)
    """Tokens each sequence generates, the first one included (it comes from the prefill)."""
    weights: str = attrs.field(default="bf16", validator=v.one_of(*WEIGHT_FORMATS))
    """Format of the blocks' linear weights; fp8, int8 and int4 keep embeddings, output
    layer, norms and router in `[precision] activations`."""
    weights_group_size: int | None = attrs.field(
        default=attrs.Factory(_default_group_size, takes_self=True), validator=v.positive)
    """Weights sharing one quantization scale (and, for int formats, one zero point), as in
    GPTQ/AWQ checkpoints. Default: 128 for int4; None: per-channel or per-tensor scales,
    counted as nothing."""
    expert_weights: str | None = attrs.field(default=None,
                                             validator=attrs.validators.optional(
                                                 v.one_of(*WEIGHT_FORMATS)))
    """Format of the routed experts' weights when it differs from `weights` (gpt-oss ships
    its experts in mxfp4 and the rest in bf16: `weights = "bf16"`, `expert_weights =
    "mxfp4"`); their products run in that format's math (`llmpar.inference.formats`).
    None: the experts are in `weights`."""
    kv_cache: str = attrs.field(default="bf16", validator=v.one_of(*KV_CACHE_FORMATS))
    """Format of the key/value cache."""
    kv_block_tokens: int | None = attrs.field(default=None, validator=v.positive)
    """Paged cache: each sequence's cache is allocated in blocks of this many tokens (vLLM's
    block_size, 16 by default); None: exactly the tokens held."""
    sliding_window: bool | None = None
    """Whether windowed layers keep only the model's sliding_window tokens in the cache.
    None: when the model has a window; true requires one; false caches every token."""
    prefill_chunk_tokens: int | None = attrs.field(default=None, validator=v.positive)
    """Tokens per prefill step (chunked prefill, vLLM's max_num_batched_tokens). None: the
    whole batch's prompts in one step. Under continuous batching: the tokens one step holds,
    decode tokens included (None: the engine's max_num_batched_tokens, else no limit)."""
    memory_utilization: float = attrs.field(default=0.9, validator=v.fraction)
    """Share of GPU memory the serving engine may use (vLLM's gpu_memory_utilization); the
    rest is headroom for allocator slack and fragmentation."""
    runtime_overhead_bytes: Bytes | None = attrs.field(default=None, validator=v.non_negative)
    """CUDA context, libraries and communication buffers on each GPU. None: llmpar's stated
    allowance (see llmpar.inference.overhead)."""

    engine: Engine | None = None
    """The serving engine's profile: a preset name under specs/engines/ ("vllm",
    "sglang", "trt-llm", "deepseek-infra") or a table. None: the roofline alone, no
    engine's step costs."""
    cuda_graphs: bool = True
    """Whether decode steps replay CUDA graphs (vLLM's enforce_eager = false, SGLang's
    default); false: each kernel is launched from the host (the engine's
    kernel_launch_seconds)."""

    concurrency: int | None = attrs.field(default=None, validator=v.positive)
    """Continuous batching at a concurrency: requests in flight across all replicas (a
    closed loop: each finished request is replaced at once), each of prompt_tokens in and
    generated_tokens out. None: static batching (batch_size), unless request_rate_per_s."""
    request_rate_per_s: float | None = attrs.field(default=None,
                                                   validator=[v.positive, _one_workload])
    """Continuous batching at a request rate: requests arriving per second across all
    replicas (Poisson arrivals), each of prompt_tokens in and generated_tokens out. None:
    static batching, unless concurrency."""

    speculative: Speculative | None = None
    """Speculative decoding with draft heads; None: one token per sequence a step."""
    disaggregated: Disaggregated | None = None
    """Separate prefill and decode pools with the cache sent between them; None: every
    replica prefills and decodes."""
    two_batch_overlap: bool = False
    """Split each forward step's sequences into two micro-batches and run the expert
    all-to-all of one behind the other's computation (SGLang's --enable-two-batch-overlap;
    DeepSeek's dual micro-batch overlap, DeepSeek-V3 technical report, arXiv:2412.19437,
    Sec. 3.4): the MoE layers run on SGLang's schedules, the prefill's lockstep and the
    decode's five stages, each transfer hidden only behind the stages that run while it
    travels (`llmpar.inference.overlap`); every weight is read once per micro-batch. A step
    of one sequence runs whole."""
    prefix_cache_hit_rate: float = attrs.field(default=0.0, validator=_hit_rate)
    """Share of each prompt's tokens whose keys and values a prefix cache already holds
    (vLLM's automatic prefix caching, SGLang's RadixAttention: Zheng et al. 2023,
    arXiv:2312.07104): the prefill computes only the rest, attending the cached prefix.
    0: every prompt token is computed."""

    @property
    def continuous(self) -> bool:
        """Whether the workload is continuous batching (a concurrency or a request rate)."""
        return self.concurrency is not None or self.request_rate_per_s is not None

    @property
    def cached_prompt_tokens(self) -> int:
        """Prompt tokens found in the prefix cache: the hit rate's share, rounded down, the
        last token always computed (its logits give the first output token)."""
        return self.cached_tokens_of(self.prompt_tokens)

    def cached_tokens_of(self, prompt: int) -> int:
        """`cached_prompt_tokens` of a prompt of `prompt` tokens."""
        if not self.prefix_cache_hit_rate:
            return 0
        return min(int(self.prefix_cache_hit_rate * prompt), prompt - 1)

    @property
    def computed_prompt_tokens(self) -> int:
        """Prompt tokens the prefill computes: the prompt less its cached prefix."""
        return self.computed_tokens_of(self.prompt_tokens)

    def computed_tokens_of(self, prompt: int) -> int:
        """`computed_prompt_tokens` of a prompt of `prompt` tokens."""
        return prompt - self.cached_tokens_of(prompt)

    @property
    def context_tokens(self) -> int:
        """Tokens a sequence holds at the end: prompt + generated."""
        return self.prompt_tokens + self.generated_tokens
