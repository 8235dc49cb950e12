"""Mamba-2 alone (Mamba2ForCausalLM: a stack of mixers, no attention, no MLP) and Nemotron-H's
experts alone ("E" layers, NemotronHMoE; NVIDIA Nemotron 3 Nano), as transformers 5.24 builds
them: parameters by hand, what serving keeps, the fused inventory per kind, the strategies'
splits (tensor parallelism of the Mamba-2 heads, expert parallelism of the "E" layers) and
what stays refused."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest
from inventories import fused_groups

import llmpar
from llmpar.footprint.parameters import count_parameters

SESSION = llmpar.Session(load_entry_points=False)
GPU = {"gpu": "h100-sxm"}
CONFIGS = Path(__file__).resolve().parents[1] / "validation" / "configs"
SMALL = {"num_layers": 4, "hidden_size": 256, "num_attention_heads": 4,
         "ffn_hidden_size": 512, "vocab_size": 1000,
         "mamba": {"num_heads": 8, "head_dim": 64, "state_size": 16, "num_groups": 1}}
EXPERTS = {"num_experts": 4, "experts_per_token": 2, "expert_ffn_hidden_size": 128}


def preset(name: str) -> llmpar.spec.Model:
    return SESSION.load_spec({"model": name, "hardware": GPU}).model


def config_of(name: str) -> dict:
    raw = json.loads((CONFIGS / f"{name}.json").read_text(encoding="utf-8"))
    return {k: v for k, v in raw.items() if not k.startswith("_")}


def mamba_layer(h: int, heads: int, head_dim: int, groups: int, state: int) -> int:
    # Mamba2Mixer (transformers 5.24): in_proj h x (z, x, B, C, dt), conv1d over x, B and C
    # (4 taps and a bias), dt_bias, A_log and D per head, the gated norm, out_proj
    inner, conv = heads * head_dim, heads * head_dim + 2 * groups * state
    return (h * (inner + conv + heads) + conv * 5 + 3 * heads + inner + inner * h)


def test_mamba_codestral_by_hand():
    # Mamba2ForCausalLM: 64 blocks of an RMSNorm and a Mamba2Mixer (h 4096, 128 heads of 64,
    # 8 groups of state 128), norm_f, untied embedding and output layer of 32768 x h: the
    # model card's 7,285,403,648
    model = preset("mamba-codestral-7b")
    assert model.mixer_pattern == "m" and model.num_attention_heads is None
    assert model.ffn_hidden_size is None and model.num_attention_layers == 0
    h = 4096
    groups = count_parameters(model).by_group
    assert groups["mamba"] == 64 * mamba_layer(h, 128, 64, 8, 128)
    assert groups["norms"] == (64 + 1) * h
    assert groups["embedding"] == groups["head"] == 32768 * h
    assert groups["attention"] == groups["mlp"] == 0
    assert count_parameters(model).total == 7_285_403_648


def test_a_model_of_mixers_alone_needs_no_attention_or_mlp_sizes():
    table = {k: v for k, v in SMALL.items() if k not in ("num_attention_heads",
                                                          "ffn_hidden_size")}
    model = SESSION.load_spec({"model": {**table, "mixer_pattern": "m"},
                               "hardware": GPU}).model
    assert model.has_architecture
    # an attention layer needs its heads, an MLP layer its width
    for pattern, missing in (("ma", "num_attention_heads"), ("m-", "ffn_hidden_size")):
        with pytest.raises(llmpar.SpecError) as caught:
            SESSION.load_spec({"model": {**table, "mixer_pattern": pattern},
                               "hardware": GPU})
        [problem] = caught.value.problems
        assert problem.path == "$.model" and missing in problem.message


def test_mamba2_config_errors_name_the_key():
    config = config_of("mamba-codestral-7b")
    with pytest.raises(llmpar.SpecError) as caught:
        llmpar.model_from_hf({**config, "num_heads": 100})  # 100 x 64 != 2 x 4096
    assert [p.path for p in caught.value.problems] == ["$.expand"]
    with pytest.raises(llmpar.SpecError) as caught:
        llmpar.model_from_hf({k: v for k, v in config.items() if k != "num_heads"})
    assert [p.path for p in caught.value.problems] == ["$.num_heads"]


def test_mamba2_serving_keeps_states_and_no_tokens():
    # 2 sequences, bf16: each of the 64 layers keeps 128 states of 64 x 128 and 3 inputs of
    # the 10240 convolved channels per sequence, whatever the sequence length
    def cache(prompt: int) -> int:
        plan = SESSION.evaluate({"model": "mamba-codestral-7b", "hardware": GPU,
                                 "inference": {"batch_size": 2, "prompt_tokens": prompt,
                                               "generated_tokens": 1, "weights": "bf16",
                                               "kv_cache": "bf16"}})
        return plan.kv_cache_bytes
    state = 2 * 64 * (128 * 64 * 128 + 3 * (8192 + 2 * 8 * 128)) * 2
    assert cache(1024) == cache(8192) == state


def test_fused_inventory_of_mixers_alone_and_its_tensor_split():
    groups = fused_groups("mamba-codestral-7b")
    assert {kind: g.count for kind, g in groups.items()} == {"none mamba": 64}
    names = [t.name for t in groups["none mamba"].tensors]
    assert "mlp input" not in names and "query" not in names
    # tensor parallelism splits the heads: the projections' outputs halve, B and C of 8
    # groups too, the block's input norm does not
    split = fused_groups("mamba-codestral-7b", tensor={"degree": 2})["none mamba"]
    by_name = {t.name: t for t in split.tensors}
    for name in ("z, x and dt", "B and C", "scan output"):
        assert "tensor" in by_name[name].splits
    assert "tensor" not in by_name["input norm input"].splits


def test_tensor_parallelism_splits_the_mamba_heads():
    def weights(tensor: int) -> int:
        plan = SESSION.evaluate({"model": "mamba-codestral-7b",
                                 "hardware": {**GPU, "num_gpus": tensor},
                                 "parallel": {"tensor": {"degree": tensor}},
                                 "training": {"sequence_length": 2048,
                                              "activation_model": "fused"}})
        return plan.weights_bytes
    # every Mamba-2 weight but the norms' splits across the heads (2 bytes each); the
    # embedding and output layer split by vocabulary
    model = preset("mamba-codestral-7b")
    groups = count_parameters(model).by_group
    unsplit = groups["norms"] * 2
    assert weights(2) - unsplit / 2 == pytest.approx((weights(1) - unsplit) / 2, rel=1e-3)


def test_context_parallelism_is_refused_for_mixers_alone():
    with pytest.raises(llmpar.SpecError) as caught:
        SESSION.evaluate({"model": "mamba-codestral-7b", "hardware": {**GPU, "num_gpus": 2},
                          "parallel": {"context": {"degree": 2}},
                          "training": {"sequence_length": 4096}})
    assert "$.parallel.context.degree" in [p.path for p in caught.value.problems]


def test_nemotron_3_nano_by_hand():
    # NemotronHForCausalLM (transformers 5.24), Nemotron 3 Nano 30B-A3B: h 2688, 52 blocks of
    # one RMSNorm and one module: 23 Mamba-2 (64 heads of 64, 8 groups of state 128), 23 MoE
    # (NemotronHMoE: 128 relu2 experts of 1856, up and down, no bias; a router of 128 rows;
    # one shared MLP of 3712) and 6 attention (32 heads and 2 key/value heads of 128)
    model = preset("nemotron-3-nano-30b-a3b")
    assert model.num_layers == 52 and model.moe is not None
    assert model.mixers_in(0, 52) == {"mamba": 23, "attention": 6}
    assert model.num_moe_layers == 23 and model.num_dense_layers == 0
    written = config_of("nemotron-3-nano-30b-a3b")["hybrid_override_pattern"]
    assert [i for i in range(52) if model.is_moe_layer(i)] == [
        i for i, letter in enumerate(written) if letter == "E"]
    h = 2688
    groups = count_parameters(model).by_group
    assert groups["mamba"] == 23 * mamba_layer(h, 64, 64, 8, 128)
    assert groups["attention"] == 6 * (2 * h * 4096 + 2 * h * 256)
    assert groups["experts"] == 23 * 128 * 2 * h * 1856
    assert groups["shared_experts"] == 23 * 2 * h * 3712
    assert groups["router"] == 23 * 128 * h
    assert groups["norms"] == (52 + 1) * h
    # a token passes through 6 of the 128 experts
    count = count_parameters(model)
    assert count.total - count.active == 23 * (128 - 6) * 2 * h * 1856


def test_experts_alone_are_one_module_behind_one_norm():
    groups = fused_groups("nemotron-3-nano-30b-a3b")
    assert {kind: g.count for kind, g in groups.items()} == {
        "none mamba": 23, "moe none": 23, "none attention": 6}
    experts = [t.name for t in groups["moe none"].tensors]
    assert "mlp input" in experts and "permuted tokens" in experts
    assert "mixer input" not in experts and "post-attention norm input" not in experts


def test_expert_parallelism_splits_the_experts_layers():
    def plan(expert: int):
        return SESSION.evaluate({"model": "nemotron-3-nano-30b-a3b",
                                 "hardware": {**GPU, "num_gpus": 8},
                                 "parallel": {"expert": {"degree": expert}},
                                 "training": {"sequence_length": 4096,
                                              "activation_model": "fused"}})
    one, eight = plan(1), plan(8)
    experts = count_parameters(preset("nemotron-3-nano-30b-a3b")).by_group["experts"]
    # bf16 weights: the routed experts split eightfold, the rest stays whole
    assert one.weights_bytes - eight.weights_bytes == experts * 2 * 7 // 8
    assert any(c.operation == "all-to-all" for c in eight.collectives)


def test_experts_layers_need_experts_and_place_them():
    table = {**SMALL, "mixer_pattern": "mE"}
    with pytest.raises(llmpar.SpecError) as caught:
        SESSION.load_spec({"model": table, "hardware": GPU})
    assert [p.path for p in caught.value.problems] == ["$.model.moe"]
    placed = {**table, "moe": {**EXPERTS, "layer_frequency": 2}}
    with pytest.raises(llmpar.SpecError) as caught:
        SESSION.load_spec({"model": placed, "hardware": GPU})
    [problem] = caught.value.problems
    assert problem.path == "$.model.moe" and "layer_frequency" in problem.message
    model = SESSION.load_spec({"model": {**table, "moe": EXPERTS}, "hardware": GPU}).model
    assert [model.is_moe_layer(i) for i in range(4)] == [False, True, False, True]


def test_nemotron_h_experts_in_every_spelling_give_one_pattern():
    config = config_of("nemotron-3-nano-30b-a3b")
    model = llmpar.model_from_hf(config)
    kinds = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
    pattern = config.pop("hybrid_override_pattern")
    listed = {**config, "layers_block_type": [kinds[letter] for letter in pattern]}
    assert llmpar.model_from_hf(listed) == model
    renamed = {("num_local_experts" if k == "n_routed_experts" else k): v
               for k, v in config.items()}
    assert llmpar.model_from_hf({**renamed, "hybrid_override_pattern": pattern}) == model


def hf_inventory_of(name: str, activation_model: str, b: int = 1, s: int = 256):
    from llmpar.footprint.activation_models import ACTIVATION_MODELS

    spec = SESSION.load_spec({"model": name, "hardware": GPU,
                              "training": {"sequence_length": s, "micro_batch_size": b,
                                           "activation_model": activation_model}})
    return ACTIVATION_MODELS[activation_model](spec)


def test_hf_eager_lists_the_mamba_mixers_torch_path():
    # validation/data/mamba-codestral-7b.json (torch 2.13.0, transformers 5.24.0): a layer
    # keeps 271,458,312 bytes at b = 1, s = 256 (one chunk of 256): its RMSNorm (fp32
    # input, rsqrt, bf16 normalized and in_proj's input) and the mixer's torch path
    inventory = hf_inventory_of("mamba-codestral-7b", "hf-eager")
    [group] = inventory.groups
    assert (group.kind, group.count) == ("none mamba", 64)
    assert group.layer_bytes == 271_458_312
    # the within-chunk decay L and the scores G = C.B^T: 128 heads x 256 x 256 fp32 each
    by_name = {t.name: t.bytes for t in group.tensors}
    assert by_name["decay within chunks L"] == by_name["scores G = C.B^T"] == 4 * 128 * 256**2
    # two chunks at s = 512: the einsum copies B, C and the discretized x once more
    two = {t.name for t in hf_inventory_of("mamba-codestral-7b", "hf-eager",
                                           s=512).groups[0].tensors}
    assert "B, C and the discretized x once more" in two - set(by_name)


def test_hf_sdpa_of_a_model_that_never_attends_says_so():
    plan = SESSION.evaluate({"model": "mamba-codestral-7b", "hardware": GPU,
                             "training": {"sequence_length": 256,
                                          "activation_model": "hf-sdpa"}})
    assert any("no SDPA path" in w for w in plan.warnings)


DATA = Path(__file__).resolve().parents[1] / "validation" / "data"


HYBRID_RUNS = {
    # validation/data/<name>.json (torch 2.13.0, transformers 5.24.0, eager and sdpa, b 1-2,
    # s 128-512, 1 and 2 layers or units of each kind): NemotronHMamba2Mixer and Granite's
    # GraniteMoeHybridMambaLayer run Mamba2Mixer's torch path; NemotronHBlock keeps a bf16
    # residual and NemotronHRMSNorm multiplies by the weight in fp32, keeping x_hat and the
    # weight's fp32 copy; NemotronHTopkRouter is DeepSeek-V3's; Granite's router takes the
    # top-k of the fp32 logits, then a softmax over the k
    "nemotron-3-nano-30b-a3b": ("mamba_layers", "experts_layers", "attention_layers",
                                "hybrid_units"),
    "nemotron-h-8b": ("mlp_layers",),
    "granite-4.0-h-small": ("mamba_layers", "attention_layers"),
    # FalconH1Mixer without its gated norm (mamba_rms_norm = false): scan_output * silu(z)
    "falcon-h1-0.5b": ("main",),
}


@pytest.mark.parametrize(("name", "variants"), HYBRID_RUNS.items())
def test_hf_eager_and_sdpa_list_the_hybrids_layers_exactly(name, variants):
    from llmpar.footprint.activations.hf import measured as M

    data = M.load(DATA / f"{name}.json")
    runs = list(M.measured_runs(data))
    assert {run.variant for run in runs} == set(variants)
    assert {run.attention for run in runs} == {"eager", "sdpa"}
    for run in runs:
        comparison = M.compare(data, run, DATA.parents[1])
        if (name, run.variant, run.batch, run.sequence) == ("granite-4.0-h-small",
                                                             "mamba_layers", 2, 256):
            # Granite's mixer has Mamba-Codestral's shape (128 heads of 64, state 128,
            # chunks of 256) and, as there, two sequences of one chunk come out over: by
            # exactly one chunk state per sequence (2 x 128 x 64 x 128 fp32 = 8,388,608
            # bytes, 1.1% of the layer), a copy the rule counts and torch's einsum avoids
            assert comparison.per_layer_bytes - run.per_layer_bytes == 2 * 128 * 64 * 128 * 4
            continue
        assert comparison.per_layer_bytes == run.per_layer_bytes, run.label
        assert comparison.total_bytes == run.total_bytes, run.label


def test_nemotron_h_norm_keeps_x_hat_and_the_weight_in_fp32():
    # NemotronHRMSNorm: (weight.float() * x_hat).to(dtype); Mamba2RMSNorm: weight *
    # x_hat.to(dtype). At b 1, s 256 and h 2688 the norm keeps 2 bytes more per element of
    # x_hat and 4 bytes per channel for the weight's copy
    from llmpar.footprint.activations.hf import HfRun, hf_inventory
    from llmpar.footprint.activations.hf.family import FAMILIES

    config = {**config_of("nemotron-3-nano-30b-a3b"), "hybrid_override_pattern": "M",
              "num_hidden_layers": 1}
    from llmpar.hf import model_table_from_hf

    spec = SESSION.load_spec({"model": model_table_from_hf(config), "hardware": GPU,
                              "training": {"sequence_length": 256, "micro_batch_size": 1}})
    [layer] = hf_inventory(spec, HfRun(attention="eager")).groups
    as_mamba2 = attrs.evolve(spec, model=attrs.evolve(
        spec.model, source="counted as transformers' Mamba2ForCausalLM"))
    [other] = hf_inventory(as_mamba2, HfRun(attention="eager")).groups
    assert FAMILIES["NemotronHForCausalLM"].norm == "fp32-weight"
    assert layer.layer_bytes - other.layer_bytes == 2 * 256 * 2688 + 4 * 2688


def test_a_whole_hybrid_is_its_measured_layer_kinds_and_outside():
    # NVIDIA Nemotron 3 Nano at b 1, s 256: 23 "M", 23 "E" and 6 "*" layers, each kind's
    # bytes per layer and the bytes outside the layers as measured (2 - 1 layers, 1 layer
    # - per layer) in validation/data/nemotron-3-nano-30b-a3b.json
    from llmpar.footprint.activations.hf import measured as M

    data = M.load(DATA / "nemotron-3-nano-30b-a3b.json")
    measured = {(run.variant, run.attention): run for run in M.measured_runs(data)
                if (run.batch, run.sequence) == (1, 256)}
    for attention in ("eager", "sdpa"):
        inventory = hf_inventory_of("nemotron-3-nano-30b-a3b", f"hf-{attention}")
        counts = {group.kind: group.count for group in inventory.groups}
        assert counts == {"none mamba": 23, "moe none": 23, "none attention": 6}
        per_layer = {kind: measured[variant, attention].per_layer_bytes for kind, variant in
                     (("none mamba", "mamba_layers"), ("moe none", "experts_layers"),
                      ("none attention", "attention_layers"))}
        fixed = measured["mamba_layers", attention].fixed_bytes
        assert inventory.total_bytes == fixed + sum(counts[k] * per_layer[k] for k in counts)


def test_recurrent_mixers_without_a_measured_torch_path_stay_refused():
    # a gated DeltaNet whose modeling code no source names (Qwen3.5's layers without its
    # transformers class, Qwen3_5ForCausalLM, whose torch chunked path is measured): no
    # family lists it, and hf-eager says so
    from llmpar.footprint.activation_models import ACTIVATION_MODELS

    spec = SESSION.load_spec({"model": {"preset": "qwen3.5-27b", "source": "a custom model"},
                              "hardware": GPU, "training": {"sequence_length": 256,
                                                            "micro_batch_size": 1}})
    with pytest.raises(Exception, match="no inventory of the tensors the model's "
                       "linear_attention layers"):
        ACTIVATION_MODELS["hf-eager"](spec)
