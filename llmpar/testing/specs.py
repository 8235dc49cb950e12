"""Valid specs for tests: Hypothesis strategies that draw spec tables, and a few fixed
reference specs.

Every table these produce loads (`Session.load_spec`) with llmpar's own presets and
strategies. Tables are plain dicts, as TOML gives them, so a test can change a key
before loading: `{**spec, "parallel": {"mine": {"degree": 2}}}`.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

GPUS = ("v100-sxm2-16gb", "a100-sxm-80gb", "h100-sxm", "b300")
"""GPU presets the drawn specs run on: old and new, small and large memory."""


@st.composite
def architectures(draw: st.DrawFn, *, layers_multiple_of: int = 1) -> dict[str, Any]:
    """A consistent dense transformer: heads split into whole KV groups, `head_dim` times
    heads is the hidden size, the MLP width is a multiple of 256, and `num_layers` a
    multiple of `layers_multiple_of` (for pipeline stages)."""
    head_dim = draw(st.sampled_from([32, 64, 128]))
    kv_heads = draw(st.sampled_from([1, 2, 4, 8]))
    group = draw(st.sampled_from([1, 2, 4]))
    heads = kv_heads * group
    return {
        "num_layers": layers_multiple_of * draw(st.integers(1, max(1, 96 // layers_multiple_of))),
        "hidden_size": heads * head_dim,
        "num_attention_heads": heads,
        "num_kv_heads": kv_heads,
        "head_dim": head_dim,
        "ffn_hidden_size": draw(st.integers(1, 64)) * 256,
        "ffn_activation": draw(st.sampled_from(["gelu", "relu", "swiglu", "geglu"])),
        "vocab_size": draw(st.integers(1000, 260_000)),
        "tie_embeddings": draw(st.booleans()),
        "norm": draw(st.sampled_from(["layernorm", "rmsnorm"])),
        "qkv_bias": draw(st.booleans()),
        "qk_norm": draw(st.booleans()),
    }


@st.composite
def moe_architectures(draw: st.DrawFn, *, layers_multiple_of: int = 1) -> dict[str, Any]:
    """An architecture from `architectures` with a `[model.moe]` table: 4 to 16 routed
    experts, top-1 or top-2, optionally a shared expert and leading dense layers."""
    model = draw(architectures(layers_multiple_of=layers_multiple_of))
    num_experts = draw(st.sampled_from([4, 8, 16]))
    model["moe"] = {
        "num_experts": num_experts,
        "experts_per_token": draw(st.sampled_from([1, 2])),
        "expert_ffn_hidden_size": draw(st.integers(1, 16)) * 256,
        "num_shared_experts": draw(st.sampled_from([0, 0, 1])),
        "dense_layers": draw(st.integers(0, min(2, model["num_layers"] - 1))),
    }
    return model


@st.composite
def training_specs(draw: st.DrawFn, model: Any = None) -> dict[str, Any]:
    """A whole training run on 1, 2, 8 or 64 GPUs, data parallel only; `model` (a preset
    name or table) replaces the drawn architecture."""
    num_gpus = draw(st.sampled_from([1, 2, 8, 64]))
    micro_batch = draw(st.integers(1, 8))
    accumulation = draw(st.integers(1, 4))
    return {
        "model": draw(architectures()) if model is None else model,
        "hardware": {"gpu": draw(st.sampled_from(GPUS)), "num_gpus": num_gpus},
        "optimizer": draw(st.sampled_from(["adam", "adam-fp32", "sgd-momentum"])),
        "training": {
            "sequence_length": draw(st.sampled_from([128, 512, 2048, 4096, 8192])),
            "micro_batch_size": micro_batch,
            "global_batch_size": micro_batch * num_gpus * accumulation,
            # At most 0.5: recomputation makes the GPUs execute up to 2x the model FLOPs
            # (selective: under 1 + attention share; full: under 4/3), and an assumed mfu
            # above model / hardware FLOPs is an error; tests change recompute freely.
            "mfu": draw(st.floats(0.05, 0.5)),
            "recompute": draw(st.sampled_from(["none", "selective", "full"])),
            "activation_model": draw(st.sampled_from(["korthikanti", "coefficient"])),
            "tokens": draw(st.floats(1e9, 1e13)),
        },
    }


@st.composite
def parallel_training_specs(draw: st.DrawFn) -> dict[str, Any]:
    """A training run under a drawn layout of llmpar's own strategies: tensor (with or
    without sequence parallelism), pipeline (1F1B), context (ring or all-to-all),
    ZeRO stage (with hybrid sharding and the edge units' reshard under ZeRO-3), a rank
    order and, for an MoE model, expert parallelism (NCCL or DeepEP dispatch, experts
    folded into the tensor ranks or not). Every degree divides what it must (heads,
    layers, sequence, experts), so the spec loads and plans."""
    pipeline = draw(st.sampled_from([1, 2, 4]))
    moe = draw(st.booleans())
    drawn = moe_architectures if moe else architectures
    model = draw(drawn(layers_multiple_of=pipeline))
    heads, kv = model["num_attention_heads"], model["num_kv_heads"]
    tensor = draw(st.sampled_from([t for t in (1, 2, 4) if heads % t == 0
                                   and (kv % t == 0 or t % kv == 0)]))
    context = draw(st.sampled_from([1, 2]))
    kind = draw(st.sampled_from(["ring", "all-to-all"]))
    if kind == "all-to-all" and heads % (context * tensor):
        kind = "ring"
    data = draw(st.sampled_from([1, 2, 4]))
    sequence = tensor > 1 and draw(st.booleans())
    order = draw(st.sampled_from(["tp-cp-ep-dp-pp", "tp-pp-cp-ep-dp", "tp-ep-dp-cp-pp"]))
    # Folding expert ranks into the tensor ranks needs sequence parallelism and the
    # tensor ranks right inside the data x context ranks.
    fold = moe and sequence and order != "tp-pp-cp-ep-dp" and draw(st.booleans())
    ranks = data * context * (tensor if fold else 1)
    expert = draw(st.sampled_from([e for e in (1, 2, 4) if ranks % e == 0
                                   and model["moe"]["num_experts"] % e == 0])) if moe else 1
    spec = draw(training_specs(model=model))
    micro_batch = spec["training"]["micro_batch_size"]
    accumulation = draw(st.integers(1, 4))
    spec["hardware"] = {"cluster": draw(st.sampled_from(["dgx-a100", "dgx-h100"])),
                        "num_gpus": tensor * pipeline * context * data}
    spec["training"].update(sequence_length=draw(st.sampled_from([512, 2048, 4096])),
                            global_batch_size=micro_batch * data * pipeline * accumulation)
    zero = draw(st.integers(0, 3))
    parallel: dict[str, Any] = {"data": {"degree": data, "zero": zero}}
    if zero == 3:
        # Hybrid sharding: the replicas (data / shard_degree) must divide the expert-data
        # ranks that shard the expert weights.
        shards = [s for s in (1, 2) if data % s == 0 and s < data
                  and (ranks // expert) % (data // s) == 0]
        shard = draw(st.sampled_from([None, *shards]))
        if shard is not None:
            parallel["data"]["shard_degree"] = shard
        # FSDP2's own reshard of the embeddings and the output layer, apart from the blocks.
        edge = draw(st.sampled_from([None, True, False]))
        if edge is not None:
            parallel["data"]["edge_reshard_after_forward"] = edge
    for name, degree in (("tensor", tensor), ("pipeline", pipeline)):
        if degree > 1:
            parallel[name] = {"degree": degree}
    if context > 1:
        parallel["context"] = {"degree": context, "kind": kind}
    if expert > 1:
        parallel["expert"] = {"degree": expert,
                              "dispatcher": draw(st.sampled_from(["all-to-all", "deepep"]))}
        if fold:
            parallel["expert"]["tensor_degree"] = 1
    if sequence:
        parallel["sequence"] = {}
    parallel["order"] = order
    spec["parallel"] = parallel
    return spec


def _reference(model: Any, num_gpus: int, parallel: dict[str, Any], *,
               cluster: str = "dgx-h100", sequence_length: int = 4096,
               global_batch_size: int = 64) -> dict[str, Any]:
    return {"model": model, "hardware": {"cluster": cluster, "num_gpus": num_gpus},
            "training": {"sequence_length": sequence_length, "micro_batch_size": 1,
                         "global_batch_size": global_batch_size, "tokens": 1e12},
            "parallel": parallel}


REFERENCE_SPECS: tuple[dict[str, Any], ...] = (
    _reference("llama-3-8b", 1, {}),
    _reference("llama-3-8b", 8, {"data": {"zero": 1}}),
    _reference("llama-3-8b", 16, {"tensor": {"degree": 2}, "sequence": {},
                                  "pipeline": {"degree": 2}}),
    _reference("llama-3-8b", 16, {"context": {"degree": 2}, "data": {"zero": 3}},
               sequence_length=16384),
    _reference("llama-3-8b", 16, {"data": {"fsdp": True, "shard_degree": 4}}),
    _reference("mixtral-8x7b", 16, {"tensor": {"degree": 2}, "sequence": {},
                                    "expert": {"degree": 4}}),
    _reference({"parameters": 7e9}, 8, {}, cluster="dgx-a100"),
)
"""Fixed specs the contract suite runs on by default: one GPU; ZeRO-1 data parallel;
tensor + sequence + pipeline; context parallel with FSDP; hybrid sharding (FSDP
inside groups of 4 data ranks); a mixture of experts with
expert parallelism; and a model given only by its size (no activation estimate)."""
