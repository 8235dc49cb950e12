"""What is run: number formats and the training workload."""

from __future__ import annotations

import typing
from typing import Literal

import attrs

from llmpar.errors import did_you_mean
from llmpar.spec import validators as v
from llmpar.spec.framework import DEFAULT_FRAMEWORK, FP8_SCALINGS, Fp8Scaling, Framework
from llmpar.spec.quantities import ByteRate, Count, Seconds

Recompute = Literal["none", "selective", "full"]
RECOMPUTE: tuple[Recompute, ...] = typing.get_args(Recompute)
RecomputeModule = Literal["core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe",
                          "shared_experts"]
RECOMPUTE_MODULES: tuple[RecomputeModule, ...] = typing.get_args(RecomputeModule)
"""Megatron-Core's `recompute_modules` (megatron/core/transformer/transformer_config.py,
core_r0.14): the submodules selective recomputation can rerun."""
DEFAULT_RECOMPUTE_MODULES: tuple[RecomputeModule, ...] = ("core_attn",)
"""Megatron-Core's default: selective recomputation of the core attention alone."""
RecomputePolicy = Literal["op", "op-all-matmuls"]
RECOMPUTE_POLICIES: tuple[RecomputePolicy, ...] = typing.get_args(RecomputePolicy)
"""Op-level selective checkpointing as torchtitan runs it (`llmpar.footprint.op_checkpoint`):
"op" saves the outputs of the listed ops but every second matrix product, "op-all-matmuls"
every matrix product's."""


def _recompute_modules(_instance: object, attribute: object,
                       value: tuple[str, ...] | None) -> None:
    """None, or a non-empty list of Megatron-Core's module names."""
    name = getattr(attribute, "name", "recompute_modules")
    if value is None:
        return
    if not value:
        raise v.FieldError(name, "must list at least one module (leave it out for "
                                 "Megatron-Core's default, core_attn alone)")
    listed = ", ".join(repr(m) for m in RECOMPUTE_MODULES)
    for item in value:
        if item not in RECOMPUTE_MODULES:
            raise v.FieldError(name, f"must list modules among {listed}, got {item!r}"
                                     f"{did_you_mean(str(item), RECOMPUTE_MODULES)}")


def _known_activation_model(instance: object, attribute: object, value: str) -> None:
    """A name: llmpar's models or a plugin's (the session checks which it has)."""
    if not isinstance(value, str) or not value:
        raise v.FieldError(getattr(attribute, "name", "activation_model"),
                           f"must name an activation model, got {value!r}")
PARAM_DTYPES = ("bf16", "fp16", "fp32")
"""The formats a framework's weight gathers can cast to (`Framework.weight_gather_in_compute`):
FSDP2's `MixedPrecisionPolicy.param_dtype` is a torch floating dtype; fp8 gathers are
torchao's and are stated with `[precision] weight_gather`."""
AttentionFlops = Literal["full", "causal"]
ATTENTION_FLOP_CONVENTIONS: tuple[AttentionFlops, ...] = typing.get_args(AttentionFlops)


@attrs.frozen(kw_only=True, cache_hash=True)
class Precision:
    """Storage formats; `compute` picks which peak rate of the GPU applies."""

    weights: str = attrs.field(default="bf16", validator=v.dtype)
    """Format the weights are stored in on the GPU."""
    gradients: str = attrs.field(default="bf16", validator=v.dtype)
    """"fp32" gives Megatron-style fp32 main gradients."""
    activations: str = attrs.field(default="bf16", validator=v.dtype)
    """Format of the activations kept for backward."""
    compute: str = attrs.field(
        default=attrs.Factory(lambda self: self.activations, takes_self=True),
        validator=v.dtype,
    )
    """Format of the matrix math. Default: the activations' format."""
    linear: str | None = attrs.field(default=None, validator=attrs.validators.optional(v.dtype))
    """Format of the linear layers' products (projections, MLP, experts, output layer):
    "fp8-tensorwise", "fp8-rowwise", "fp8-blockwise" or "mxfp8" for FP8 training as
    Transformer Engine and torchao run it (attention stays in `attention`'s format).
    Default: `compute`. Model FLOPs are counted the same; MFU and HFU stay against the
    peak of `compute`."""
    attention: str | None = attrs.field(default=None,
                                        validator=attrs.validators.optional(v.dtype))
    """Format of attention's products (Q.K^T and scores.V). Default: `compute`. In an
    fp8 format the attention kernel runs in fp8 forward and backward (Transformer
    Engine's `fp8_dpa` on cuDNN's fp8 attention): queries, keys, values, the output and
    its gradient are cast to fp8 around it (`llmpar.evaluation.casts`)."""
    weight_gather: str | None = attrs.field(default=None,
                                            validator=attrs.validators.optional(v.dtype))
    """Format the data strategy's weight all-gathers carry and its gathered weights are
    held in (ZeRO-3 / FSDP's per-layer gathers, ZeRO-1/2's gather of the updated shards):
    "fp8-tensorwise" casts each shard to fp8 before it is gathered, as torchao's
    `enable_fsdp_float8_all_gather` (torchtitan's float8 converter) and Megatron-Core's
    `--fp8-param-gather` do. Default: the compute format under a framework profile
    whose gathers cast to it (`weight_gather_in_compute`: pytorch-fsdp2 and torchtitan,
    FSDP2's `MixedPrecisionPolicy(param_dtype)`, so fp32 weights with bf16 compute gather
    bf16), else the weights' format (megatron-core, deepspeed: the 16-bit model
    parameters are gathered, not the optimizer's fp32 copies)."""
    fp8_scaling: Fp8Scaling | None = attrs.field(
        default=None, validator=attrs.validators.optional(v.one_of(*FP8_SCALINGS)))
    """How "fp8-tensorwise" casts find their scale: "delayed" (from the amax history of
    earlier steps, found in the cast's own pass) or "current" (each cast first reads
    its input once more to find its amax: Transformer Engine's `Float8CurrentScaling`,
    torchao.float8). Row-, block- and MX-scaled formats find their scales in the cast's
    pass whatever this says. Default: the framework profile's `fp8_scaling`
    (megatron-core: "delayed", Transformer Engine's default recipe on Hopper)."""

    @property
    def linear_format(self) -> str:
        """The linear layers' format: `linear`, else `compute`."""
        return self.compute if self.linear is None else self.linear

    def weight_gather_under(self, framework: Framework) -> str:
        """The weight all-gathers' format under `framework`: `weight_gather`, else
        `compute` where the profile's gathers cast to it
        (`Framework.weight_gather_in_compute`) and `compute` is a format they can cast
        to (FSDP2's param_dtype: bf16, fp16 or fp32), else `weights`."""
        if self.weight_gather is not None:
            return self.weight_gather
        if framework.weight_gather_in_compute and self.compute in PARAM_DTYPES:
            return self.compute
        return self.weights

    @property
    def attention_format(self) -> str:
        """Attention's format: `attention`, else `compute`."""
        return self.compute if self.attention is None else self.attention


LLAMA3_INTERRUPTIONS_PER_GPU_DAY = 419 / (54 * 16_384)
"""Unexpected interruptions of the Llama 3 405B pre-training: 419 in a 54-day snapshot on
16,384 H100 GPUs (Llama Team 2024, arXiv:2407.21783, Sec. 3.3.4): 4.7e-4 per GPU per day,
one interruption about every three hours of the whole job."""


@attrs.frozen(kw_only=True)
class Goodput:
    """What a long run loses beside its steps: writing checkpoints, and after each
    interruption the work since the last checkpoint and the restart (`[training.goodput]`).
    Without this table `train_seconds` counts steps only."""

    storage_bandwidth_bytes_per_s: ByteRate = attrs.field(validator=v.positive)
    """Write (and read-back) bandwidth of the checkpoint storage, all GPUs together (the
    Llama 3 paper's Tectonic file system sustained 2 TB/s, Sec. 3.3.4)."""
    checkpoint_interval_seconds: Seconds | None = attrs.field(default=None,
                                                              validator=v.positive)
    """Training time between two checkpoints. Default: Young's optimum, sqrt(2 x write
    time x mean time between interruptions) (Young 1974, doi:10.1145/361147.361115)."""
    interruptions_per_gpu_day: float = attrs.field(default=LLAMA3_INTERRUPTIONS_PER_GPU_DAY,
                                                   validator=v.non_negative)
    """Unexpected interruptions per GPU per day; a job stops when any of its GPUs does.
    Default: the Llama 3 405B run's 419 in 54 days on 16,384 H100 (4.7e-4)."""
    restart_seconds: Seconds = attrs.field(default=Seconds(0.0), validator=v.non_negative)
    """Time from an interruption until the job runs again, before it reads the checkpoint
    back (detection, rescheduling, initialisation). Default 0: give your cluster's."""
    asynchronous: bool = False
    """Checkpoints written in the background (PyTorch Distributed Checkpoint's
    `async_save`, Megatron-LM's `--async-save`): training stops only while each GPU copies
    its states to host memory, over `[hardware] host_bandwidth_bytes_per_s`."""


@attrs.frozen(kw_only=True, cache_hash=True)
class Training:
    """One training run: shape of a step and length of the run."""

    sequence_length: int = attrs.field(default=2048, validator=v.positive)
    """Tokens per sequence (s). Past model.max_position_embeddings: see there."""
    micro_batch_size: int = attrs.field(default=1, validator=v.positive)
    """Sequences per GPU per forward/backward pass (b)."""
    global_batch_size: int | None = attrs.field(default=None, validator=v.positive)
    """Sequences per optimizer step. Default: one micro-batch per data-parallel replica."""
    tokens: Count | None = attrs.field(default=None, validator=v.positive)
    """Tokens of the whole run."""
    tokens_per_parameter: float | None = attrs.field(default=None, validator=v.positive)
    """Run length as tokens per parameter (Chinchilla: 20)."""
    mfu: float | None = attrs.field(default=None, validator=v.fraction)
    """Assume this model FLOPs utilization instead of modelling it. At most model FLOPs /
    hardware FLOPs: recomputation reruns work, and the HFU an mfu implies (mfu x hardware /
    model FLOPs) may not exceed 1; a higher one is an error naming the largest possible."""
    recompute: Recompute = attrs.field(default="none", validator=v.one_of(*RECOMPUTE))
    """Activation recomputation: none, selective (attention scores, or the modules
    `recompute_modules` names) or full (whole layers)."""
    recompute_modules: tuple[str, ...] | None = attrs.field(
        default=None, converter=attrs.converters.optional(tuple),
        validator=_recompute_modules)
    """With recompute = "selective": the submodules to recompute, by Megatron-Core's names
    (`--recompute-granularity selective --recompute-modules ...`): "core_attn" (the
    attention scores and softmax: what recompute = "selective" alone drops), "layernorm"
    (the outputs of the input and pre-MLP norms, kept for the next linear), "mlp" (the
    dense MLP's inner tensors, from its input), "moe" (the whole MoE block's tensors:
    router, permuted tokens, experts, shared experts), "moe_act" (the experts'
    activation outputs, fc2's inputs), "shared_experts" (the shared experts' inner
    tensors) and "mla_up_proj" (MLA's query, key and value, rerun from the latents).
    Each drops what its recomputation frees and reruns its forward: the matrix products
    of mlp, moe, shared_experts and mla_up_proj, the attention products of core_attn; the
    elementwise layernorm and moe_act rerun no product, their tensors are written again
    in the backward. Modules other than core_attn need activation_model "korthikanti" or
    "fused", whose tensors say which module keeps them, and must exist in the model (mlp
    needs dense layers, moe and moe_act MoE layers, shared_experts shared experts,
    mla_up_proj MLA and the fused model's latents, layernorm a norm before attention and
    MLP): one that would recompute nothing is an error. Default: Megatron-Core's,
    core_attn alone."""
    recompute_policy: RecomputePolicy | None = attrs.field(
        default=None, validator=attrs.validators.optional(v.one_of(*RECOMPUTE_POLICIES)))
    """With recompute = "selective": op-level selective checkpointing as torchtitan runs
    it (`activation_checkpoint.mode = "selective"`, `selective_ac_option = "op"`) instead
    of Megatron's module recomputation. Each layer keeps its input and the outputs of the
    ops torchtitan's save list names (matrix products, scaled-dot-product attention's
    output and log-sum-exp); the rest of the layer (norms, RoPE, the activation, the
    products not saved) is recomputed in the backward. "op": torchtitan's policy, which
    saves every other matrix product of a layer (the 1st, 3rd, 5th... in forward order:
    wq, wv, w1, w2 of a Llama block) and recomputes the others (wk, wo, w3); "op-all-
    matmuls": every matrix product saved. An MoE block recomputes its router gate and its
    routed experts' grouped products (not in the save list) and saves the top-k routing and,
    under expert parallelism, the all-to-alls' outputs; its shared experts join the count.
    Needs activation_model "fused" and attention layers with a dense MLP or an MoE block
    (recurrent and sparse-attention layers are not modelled).
    Default: none (recompute_modules' meaning of selective)."""
    recompute_layer_interval: int | None = attrs.field(default=None, validator=v.positive)
    """With recompute = "full": recompute only every N-th layer of each pipeline stage
    (the N-th, 2N-th... of its layers: floor(layers / N) of them) and keep every
    activation of the others: torchtitan's layer-level selective checkpointing
    (`activation_checkpoint.mode = "selective"`, `selective_ac_option = "N"`, which
    wraps every N-th block of a stage in a full checkpoint). Not with recompute_layers.
    Default: every layer."""
    recompute_layers: int | None = attrs.field(default=None, validator=v.positive)
    """With recompute = "full": recompute only the first N layers of each pipeline stage
    and keep every activation of the others (Megatron-LM's --recompute-method block
    --recompute-num-layers N). Default: every layer."""
    activation_offload_layers: int | None = attrs.field(default=None, validator=v.positive)
    """Keep the saved activations of the first N layers of each pipeline stage in host
    memory between their forward and backward passes (Megatron-Core's --cpu-offloading
    --cpu-offloading-num-layers N, activations only; PyTorch's
    `torch.autograd.graph.save_on_cpu`). Each layer's tensors are copied out after its
    forward and back before its backward, over `[hardware] host_bandwidth_bytes_per_s`,
    behind the other layers' compute; the last layer of a stage is never offloaded
    (its backward starts at once). Default: none."""
    hidden_dropout: float = attrs.field(default=0.0, validator=v.share_below_one)
    """Dropout probability on the residual stream: after the embedding and after each
    layer's attention and MLP (Megatron-LM's `--hidden-dropout`, whose default is 0.1:
    megatron/training/arguments.py; 0 in Llama-style pretraining and torchtitan). Above
    0, each dropout keeps a mask of one byte per element of b x s x h for the backward
    (Korthikanti et al. 2022, Sec. 4.1; Megatron-Core's fused bias-dropout-add,
    megatron/core/fusions/fused_bias_dropout.py, runs torch's dropout, whose backward
    needs its boolean mask). Read by the "fused" activation model; "korthikanti" always
    counts these masks (its Table 2 has dropout), the Hugging Face models follow the
    model's code. Attention dropout needs no mask under a fused attention kernel, which
    regenerates it from the random generator's state in the backward (Dao et al. 2022,
    FlashAttention, arXiv:2205.14135, Sec. 3.1). Default 0."""
    multi_token_prediction: bool = False
    """Train the model's multi-token-prediction modules beside it (`[model] mtp_layers`
    depths; DeepSeek-AI 2024, arXiv:2412.19437, Sec. 2.2: DeepSeek-V3 trained with depth 1;
    Megatron-Core's --mtp-num-layers). Each depth's block, projection and norms are
    parameters, gradients and optimizer states of the last pipeline stage, where
    Megatron-Core builds them (megatron/core/models/gpt/gpt_model.py: the MTP block on the
    post-process stage, megatron/core/transformer/multi_token_prediction.py); each depth
    adds a block of the last layer's kind, the projection (2h x h) and one more pass of the
    output layer with its loss to the FLOPs (counted as model FLOPs, as Megatron-LM's
    num_floating_point_operations does: MTP eh proj and logits x (mtp_num_layers + 1)),
    and its block's saved tensors with a second copy of the output layer's (logits and
    loss) to the last stage's activations. Needs a model with mtp_layers >= 1; not with
    [finetune]. Default: off (the main model alone, as the modules were not trained)."""
    framework: Framework | None = None
    """The software stack: a framework profile's name (`specs/frameworks/`, `llmpar
    presets frameworks`), or a table (`preset = "..."` or `file = "x.toml"` plus fields
    to override, or the whole profile). It sets the defaults that follow the stack: the
    activation model (from its attention kernel), its overlaps and its host overheads.
    Unset: "megatron-core" (fused attention timed by its kernel); "megatron-core-legacy"
    gives llmpar's numbers from before that default."""
    activation_model: str = attrs.field(
        default=attrs.Factory(lambda self: self.profile.default_activation_model,
                              takes_self=True),
        validator=_known_activation_model)
    """How activations are counted: "korthikanti" (Korthikanti et al. 2022), "fused"
    (FlashAttention and fused kernels), "hf-eager" / "hf-sdpa" (what Hugging Face
    transformers keeps), or "coefficient" (the founding document's k*b*s*L*h*d).
    Default: the framework profile's (megatron-core: "fused", from its cuDNN kernel;
    megatron-core-legacy: "korthikanti")."""
    activation_coefficient: float = attrs.field(default=30.0, validator=v.positive)
    """The founding document's k (measured there at about 30)."""
    attention_flops: AttentionFlops = attrs.field(
        default="full", validator=v.one_of(*ATTENTION_FLOP_CONVENTIONS)
    )
    """How model FLOPs count attention's Q.K^T and scores.V: over the full s x s square
    (Megatron's convention) or only the causal half. A reporting convention: it changes
    flops_per_step and MFU only. Hardware FLOPs, HFU and the step time count what the
    attention kernel executes, whatever the convention: the full square for eager
    attention (activation models that keep the scores: korthikanti, hf-eager), about
    half of it plus the diagonal tiles for a fused kernel on a causal model
    (FlashAttention; activation models fused, hf-sdpa, coefficient)."""
    goodput: Goodput | None = None
    """Checkpoints and interruptions over the whole run (`[training.goodput]`); without it
    the run's time counts its steps only."""

    @property
    def selective_modules(self) -> tuple[str, ...]:
        """The modules recompute = "selective" reruns: `recompute_modules`, or
        Megatron-Core's default (core_attn alone); none under an op-level
        `recompute_policy`, which reruns ops, not modules (attention's output is saved)."""
        if self.recompute_policy is not None:
            return ()
        modules = self.recompute_modules
        return DEFAULT_RECOMPUTE_MODULES if modules is None else modules

    @property
    def recomputed_modules(self) -> tuple[str, ...]:
        """The modules this run reruns: `selective_modules` under recompute =
        "selective", none otherwise."""
        return self.selective_modules if self.recompute == "selective" else ()

    def with_recompute(self, recompute: Recompute, **changes: object) -> Training:
        """This table under another recomputation mode (the search's choice): the modules
        `recompute_modules` names and the op-level `recompute_policy` stay with selective
        recomputation only, `recompute_layer_interval` with full recomputation."""
        selective = recompute == "selective"
        kept: dict[str, object] = {
            "recompute": recompute,
            "recompute_modules": self.recompute_modules if selective else None,
            "recompute_policy": self.recompute_policy if selective else None,
            "recompute_layer_interval": (self.recompute_layer_interval if recompute == "full"
                                         else None)}
        return attrs.evolve(self, **kept, **changes)  # type: ignore[arg-type]

    @property
    def profile(self) -> Framework:
        """The framework profile in force: `framework`, else megatron-core's defaults."""
        return DEFAULT_FRAMEWORK if self.framework is None else self.framework
