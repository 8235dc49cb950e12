"""Models whose layers mix attention with recurrent token mixers: gated DeltaNet (Qwen3-Next,
Qwen3.5), Mamba-2 (Granite 4) and both side by side in one layer (Falcon-H1). Their layer
pattern, parameters by hand, what serving keeps per sequence, and what tensor and context
parallelism can split."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

import llmpar
from llmpar.footprint.flops import forward_flops_per_sequence, recurrent_mixer_flops_per_token
from llmpar.footprint.parameters import count_parameters
from llmpar.spec.model import MIXERS, mixer_parts

SESSION = llmpar.Session(load_entry_points=False)
GPU = {"gpu": "h100-sxm"}


def preset(name: str) -> llmpar.spec.Model:
    return SESSION.load_spec({"model": name, "hardware": GPU}).model


@given(pattern=st.text(alphabet="ALMP", min_size=1, max_size=6),
       first=st.integers(0, 40), count=st.integers(0, 60))
def test_mixer_counts_in_closed_form_are_the_layers_counted_one_by_one(pattern, first, count):
    # a parallel hybrid layer ("P") counts under both of its mixers
    model = llmpar.spec.Model(mixer_pattern=pattern)
    counted: dict[str, int] = {}
    for index in range(first, first + count):
        for kind in mixer_parts(MIXERS[pattern[index % len(pattern)]]):
            counted[kind] = counted.get(kind, 0) + 1
    assert model.mixers_in(first, count) == counted
    assert all(model.mixer_of(i) == MIXERS[pattern[i % len(pattern)]] for i in range(first,
                                                                                    first + 3))


def test_qwen3_next_by_hand():
    # Qwen3NextGatedDeltaNet (transformers 5.24): h 2048; 16 key heads and 32 value heads
    # of 128. in_proj_qkvz h x (2 x 2048 + 2 x 4096), in_proj_ba h x 64, out_proj 4096 x h,
    # conv1d 8192 x 4, dt_bias and A_log 32 each, the gated norm 128. Gated attention:
    # q_proj h x 2 x 16 x 256 (the output gate), k/v h x 2 x 256, o_proj, q/k norms 256.
    model = preset("qwen3-next-80b-a3b")
    assert model.mixer_pattern == "LLLA"
    h = 2048
    linear = h * (2 * 2048 + 2 * 4096) + h * 64 + 4096 * h + 8192 * 4 + 2 * 32 + 128
    attention = h * 2 * 4096 + 2 * h * 512 + 4096 * h + 2 * 256
    groups = count_parameters(model).by_group
    assert groups["linear_attention"] == 36 * linear
    assert groups["attention"] == 12 * attention


def test_qwen3_5_by_hand():
    # Qwen3_5GatedDeltaNet (transformers 5.24), Qwen3.5-27B: h 5120; 16 key heads and 48
    # value heads of 128. in_proj_qkv h x (2 x 2048 + 6144), in_proj_z h x 6144, in_proj_b
    # and in_proj_a h x 48 each, out_proj 6144 x h, conv1d 10240 x 4, dt_bias and A_log 48
    # each, the gated norm 128. Qwen3_5Attention: q_proj h x 2 x 24 x 256 (the output gate),
    # k/v h x 4 x 256, o_proj 6144 x h, q/k norms 256. A dense SwiGLU MLP of 17408 in every
    # layer.
    model = preset("qwen3.5-27b")
    assert model.mixer_pattern == "LLLA" and model.moe is None
    h = 5120
    linear = (h * (2 * 2048 + 6144) + h * 6144 + 2 * h * 48 + 6144 * h + 10240 * 4 + 2 * 48
              + 128)
    attention = h * 2 * 6144 + 2 * h * 1024 + 6144 * h + 2 * 256
    groups = count_parameters(model).by_group
    assert groups["linear_attention"] == 48 * linear
    assert groups["attention"] == 16 * attention
    assert groups["mlp"] == 64 * 3 * h * 17408


def test_qwen3_5_moe_has_experts_in_every_layer():
    # Qwen3_5MoeSparseMoeBlock in every layer: 256 experts of 512 behind a router of h x
    # 256, a shared expert of 512 behind a sigmoid gate of h x 1 (Qwen3.5-35B-A3B, h 2048).
    model = preset("qwen3.5-35b-a3b")
    h = 2048
    groups = count_parameters(model).by_group
    assert model.num_moe_layers == 40 and groups["mlp"] == 0
    assert groups["experts"] == 40 * 256 * 3 * h * 512
    assert groups["shared_experts"] == 40 * (3 * h * 512 + h)
    assert groups["router"] == 40 * 256 * h


def test_qwen3_5_reads_its_language_model_in_either_config():
    # the multimodal config (qwen3_5_moe) and its text_config alone (qwen3_5_moe_text, as
    # a text-only checkpoint writes it) are the same language model
    config = config_of("qwen3.5-35b-a3b")
    wrapped = llmpar.model_from_hf(config)
    alone = llmpar.model_from_hf(config["text_config"])
    assert count_parameters(wrapped) == count_parameters(alone)
    assert "without the vision tower" in wrapped.source
    assert "multi-token-prediction modules" in alone.source
    assert alone.mtp_layers == wrapped.mtp_layers == 1
    text = {k: v for k, v in config["text_config"].items() if k != "moe_intermediate_size"}
    with pytest.raises(llmpar.SpecError) as caught:
        llmpar.model_from_hf({**config, "text_config": text})
    assert [p.path for p in caught.value.problems] == ["$.text_config.moe_intermediate_size"]


def test_granite_4_mamba_layers_by_hand():
    # GraniteMoeHybridMambaLayer: h 4096, 128 heads of 64 (inner 8192), one group of state
    # 128: in_proj h x (8192 + 8448 + 128), conv1d 8448 x 4 with bias, dt_bias, A_log, D,
    # the gated norm 8192, out_proj 8192 x h.
    model = preset("granite-4.0-h-small")
    h, inner, conv = 4096, 8192, 8192 + 2 * 128
    mamba = h * (inner + conv + 128) + conv * 5 + 3 * 128 + inner + inner * h
    groups = count_parameters(model).by_group
    assert groups["mamba"] == 36 * mamba
    assert "linear_attention" not in groups and groups["attention"] == 4 * (
        2 * h * 4096 + 2 * h * 1024)


def test_falcon_h1_parallel_layers_by_hand():
    # FalconH1DecoderLayer (transformers 5.24), Falcon-H1-7B: h 3072, in every layer Llama
    # attention (12 query heads and 2 key/value heads of 128: q and o 3072 x 1536, k and v
    # 3072 x 256) beside a FalconH1Mixer (24 heads of 128, inner 3072, one group of state 256:
    # in_proj h x (3072 + 3584 + 24), conv1d 3584 x 4 with bias, dt_bias, A_log, D; no gated
    # norm, mamba_rms_norm false; out_proj 3072 x h), a SwiGLU MLP of 12288 and two norms.
    model = preset("falcon-h1-7b")
    assert model.mixer_pattern == "P" and model.recurrent_mixer == "mamba"
    assert model.num_attention_layers == 44 and model.mixers_in(0, 44) == {"attention": 44,
                                                                          "mamba": 44}
    h, conv = 3072, 3072 + 2 * 256
    mamba = h * (3072 + conv + 24) + conv * 5 + 3 * 24 + 3072 * h
    groups = count_parameters(model).by_group
    assert groups["mamba"] == 44 * mamba
    assert groups["attention"] == 44 * (2 * h * 1536 + 2 * h * 256)
    assert groups["mlp"] == 44 * 3 * h * 12288 and groups["norms"] == (2 * 44 + 1) * h
    with_norm = attrs.evolve(model, mamba=attrs.evolve(model.mamba, gated_norm=True))
    assert count_parameters(with_norm).by_group["mamba"] == 44 * (mamba + 3072)


@pytest.mark.parametrize(("change", "path"), [
    ({"projectors_bias": True}, "$.projectors_bias"),        # out_proj biased, in_proj not
    ({"mamba_d_head": 96}, "$.mamba_d_head"),                # 24 x 96 is not mamba_d_ssm
    ({"layers_block_type": ["hybrid", "mamba"] * 22}, "$.layers_block_type"),
])
def test_falcon_h1_config_errors_name_the_key(change, path):
    with pytest.raises(llmpar.SpecError) as caught:
        llmpar.model_from_hf({**config_of("falcon-h1-7b"), **change})
    assert [p.path for p in caught.value.problems] == [path]


def test_falcon_h1_default_head_width_and_layer_list():
    # mamba_d_head "auto" is mamba_d_ssm / mamba_n_heads (FalconH1Config.__post_init__); a
    # layer list of "hybrid" (transformers 5's layer_types) is the same model
    config = config_of("falcon-h1-7b")
    model = llmpar.model_from_hf(config)
    assert llmpar.model_from_hf({**config, "mamba_d_head": "auto"}) == model
    assert llmpar.model_from_hf({**config, "layer_types": ["hybrid"] * 44}) == model


def test_parallel_layers_keep_their_tokens_and_a_state():
    # Falcon-H1-7B, 2 sequences of 1024 + 1 tokens, bf16: every one of the 44 layers keeps
    # its keys and values (2 x 2 heads x 128 per token) and its Mamba-2 state (24 heads of
    # 128 x 256, and 3 inputs of the 3584 convolved channels).
    tokens = 2 * 44 * 1025 * 2 * 2 * 128 * 2
    state = 2 * 44 * (24 * 128 * 256 + 3 * 3584) * 2
    assert serving_cache("falcon-h1-7b", 1024) == tokens + state


def test_parallel_layers_count_both_mixers_flops():
    # every layer has an s x s attention square and the Mamba-2 scan's products, linear in s
    model = preset("falcon-h1-7b")
    only_attention = attrs.evolve(model, mixer_pattern=None, mamba=None)
    for s in (2048, 4096):
        both, plain = forward_flops_per_sequence(model, s), forward_flops_per_sequence(
            only_attention, s)
        assert both.attention - plain.attention == pytest.approx(
            44 * s * recurrent_mixer_flops_per_token(model, "mamba", s))


def test_fused_parallel_layers_keep_both_mixers_tensors_and_their_input_once():
    from llmpar.footprint.baseline import baseline_footprint

    def inventory(model):
        spec = SESSION.load_spec({"model": model, "hardware": GPU,
                                  "training": {"sequence_length": 4096,
                                               "activation_model": "fused"}})
        found = baseline_footprint(spec).activations
        assert found is not None
        return {g.kind: g for g in found.groups}
    [group] = inventory("falcon-h1-7b").values()
    assert group.kind == "dense attention+mamba" and group.count == 44
    names = [t.name for t in group.tensors]
    assert "attention input" in names and "mixer input" not in names
    assert {"z, x and dt", "B and C", "scan output"} <= set(names)
    assert "gated norm rstd (fp32)" not in names  # mamba_rms_norm false: no gated norm
    # the layer keeps what an attention layer keeps plus the Mamba-2 kernel's own tensors
    path_of = SESSION.presets.path("models", "falcon-h1-7b")
    table = tomllib.loads(path_of.read_text(encoding="utf-8"))
    plain = {k: v for k, v in table.items() if k not in ("mixer_pattern", "mamba")}
    [attention] = inventory(plain).values()
    mamba = [t for t in group.tensors if t.name in ("z, x and dt", "B and C", "scan output")]
    assert group.layer_bytes == attention.layer_bytes + sum(t.bytes for t in mamba)


def test_every_layer_attending_is_the_model_without_a_pattern():
    # mixer_pattern "A" is every layer attention: the same plan, training and serving.
    plain = {"model": "qwen3-8b", "hardware": GPU,
             "training": {"sequence_length": 2048, "activation_model": "fused"}}
    base = SESSION.load_spec(plain)
    spec = attrs.evolve(base, model=attrs.evolve(base.model, mixer_pattern="A"))
    assert SESSION.evaluate(spec).to_dict() == SESSION.evaluate(base).to_dict()
    serving = {"model": "qwen3-8b", "hardware": GPU,
               "inference": {"batch_size": 4, "prompt_tokens": 1024, "generated_tokens": 64}}
    base = SESSION.load_spec(serving)
    spec = attrs.evolve(base, model=attrs.evolve(base.model, mixer_pattern="A"))
    assert SESSION.evaluate(spec).to_dict() == SESSION.evaluate(base).to_dict()


def serving_cache(model: str, prompt: int, batch: int = 2) -> int:
    plan = SESSION.evaluate({"model": model, "hardware": GPU,
                             "inference": {"batch_size": batch, "prompt_tokens": prompt,
                                           "generated_tokens": 1, "weights": "bf16",
                                           "kv_cache": "bf16"}})
    assert plan.kv_cache_bytes is not None
    return plan.kv_cache_bytes


def test_recurrent_layers_keep_a_state_not_tokens():
    # Qwen3-Next: only its 12 attention layers grow with the context (2 kv heads x 256, K
    # and V, 2 bytes); its 36 gated DeltaNet layers each keep 32 states of 128 x 128 and 3
    # inputs of the 8192 convolved channels per sequence, whatever its length (the prompt
    # and the one generated token).
    per_token_layer = 2 * 2 * 256 * 2
    assert (serving_cache("qwen3-next-80b-a3b", 3072) - serving_cache("qwen3-next-80b-a3b", 1024)
            == 2 * 2048 * 12 * per_token_layer)
    state = (32 * 128 * 128 + 3 * 8192) * 2
    assert serving_cache("qwen3-next-80b-a3b", 1024) == 2 * (12 * 1025 * per_token_layer
                                                             + 36 * state)
    # Granite 4: 128 heads of 64 x 128 and 3 inputs of 8448 channels per Mamba-2 layer.
    state = (128 * 64 * 128 + 3 * 8448) * 2
    per_token_layer = 2 * 8 * 128 * 2
    assert serving_cache("granite-4.0-h-small", 512, batch=1) == (4 * 513 * per_token_layer
                                                                  + 36 * state)


def test_tensor_ranks_split_the_states_by_heads():
    # two tensor ranks: each keeps one of the two KV heads and half of every state
    def cache(tensor: int) -> int:
        plan = SESSION.evaluate({"model": "qwen3-next-80b-a3b",
                                 "hardware": {**GPU, "num_gpus": tensor},
                                 "parallel": {"tensor": {"degree": tensor}},
                                 "inference": {"batch_size": 8, "prompt_tokens": 4096,
                                               "generated_tokens": 256}})
        assert plan.kv_cache_bytes is not None
        return plan.kv_cache_bytes
    assert cache(2) == cache(1) / 2


def test_context_parallelism_refuses_recurrent_layers():
    for name, kind in (("qwen3-next-80b-a3b", "linear_attention"),
                       ("granite-4.0-h-small", "mamba")):
        with pytest.raises(llmpar.SpecError) as caught:
            SESSION.evaluate({"model": name, "hardware": {**GPU, "num_gpus": 2},
                              "training": {"sequence_length": 4096},
                              "parallel": {"context": {"degree": 2}}})
        [problem] = [p for p in caught.value.problems if p.path == "$.parallel.context.degree"]
        assert f"{kind} layers" in problem.message


def test_tensor_degree_must_divide_the_recurrent_heads():
    base = SESSION.load_spec({"model": "qwen3-next-80b-a3b", "hardware": GPU})
    linear = attrs.evolve(base.model.linear_attention, num_key_heads=6, num_value_heads=12)
    spec = attrs.evolve(base, model=attrs.evolve(base.model, linear_attention=linear))
    layout = attrs.evolve(spec, hardware=attrs.evolve(spec.hardware, num_gpus=4))
    with pytest.raises(llmpar.SpecError) as caught:
        SESSION.evaluate(layout, {"parallel.tensor.degree": 4})
    assert any("model.linear_attention.num_key_heads (6)" in p.message
               for p in caught.value.problems)


def test_mamba_weights_split_with_one_group_copied():
    # one group of B and C on every tensor rank (vLLM's MambaMixer2): the Mamba-2 weights
    # split a little less than t ways.
    from llmpar.strategies.tensor import mamba_divisor

    spec = SESSION.load_spec({"model": "granite-4.0-h-small", "hardware": GPU})
    h, inner, n = 4096, 8192, 128
    split, grouped = 2 * h * inner + h * 128 + inner * h, 2 * h * n
    assert mamba_divisor(spec, 4) == pytest.approx((split + grouped) / (split / 4 + grouped))
    assert 1 < mamba_divisor(spec, 4) < 4


def test_activation_models_without_recurrent_layers_say_so():
    plan = SESSION.evaluate({"model": "qwen3-next-80b-a3b", "hardware": GPU,
                             "training": {"sequence_length": 4096,
                                          "activation_model": "korthikanti"}})
    assert any("linear_attention layers keep for backward" in w for w in plan.warnings)
    for model in ("fused", "coefficient"):
        sized = SESSION.evaluate({"model": "qwen3-next-80b-a3b", "hardware": GPU,
                                  "training": {"sequence_length": 4096,
                                               "activation_model": model}})
        assert sized.activations_bytes > 0


def test_flops_count_only_the_attention_layers_squares():
    # the s x s products belong to the 12 attention layers; the 36 recurrent layers add
    # their chunked products, linear in s.
    model = preset("qwen3-next-80b-a3b")
    short, long = (forward_flops_per_sequence(model, s) for s in (2048, 4096))
    square = 2.0 * (16 * 256 + 16 * 256) * 12  # per s^2: Q.K^T and scores.V
    per_token = (long.attention - 4096 ** 2 * square) / 4096
    assert short.attention - 2048 ** 2 * square == pytest.approx(2048 * per_token)
    assert per_token == pytest.approx(36 * recurrent_mixer_flops_per_token(
        model, "linear_attention", 4096))


@pytest.mark.parametrize(("change", "path"), [
    ({"mixer_pattern": "LLLLA"}, "$.model.mixer_pattern"),        # 5 does not divide 48
    ({"mixer_pattern": "LLLA", "linear_attention": None}, "$.model.linear_attention"),
    ({"mixer_pattern": "A"}, "$.model.linear_attention"),         # a table no layer uses
    ({"mixer_pattern": "LLLP"}, "$.model.mamba"),                  # P needs [model.mamba]
])
def test_mixer_pattern_errors_name_the_key(change, path):
    path_of = SESSION.presets.path("models", "qwen3-next-80b-a3b")
    table = tomllib.loads(path_of.read_text(encoding="utf-8"))
    table.update(change)
    table = {k: v for k, v in table.items() if v is not None}
    with pytest.raises(llmpar.SpecError) as caught:
        SESSION.load_spec({"model": table, "hardware": GPU})
    assert path in [p.path for p in caught.value.problems]


def config_of(name: str) -> dict:
    path = Path(__file__).resolve().parents[1] / "validation" / "configs" / f"{name}.json"
    return {k: v for k, v in json.loads(path.read_text(encoding="utf-8")).items()
            if not k.startswith("_")}


def test_layer_lists_in_every_spelling_give_one_pattern():
    # transformers 5 writes Qwen3-Next's layer_types in place of full_attention_interval,
    # and reads Granite 4's "mamba"/"attention" (layer_types or layers_block_type) as
    # "linear_attention"/"full_attention".
    qwen = config_of("qwen3-next-80b-a3b")
    listed = {**qwen, "layer_types": ["linear_attention"] * 3 + ["full_attention"]}
    listed["layer_types"] *= 12
    del listed["full_attention_interval"]
    assert llmpar.model_from_hf(listed) == llmpar.model_from_hf(qwen)
    granite = config_of("granite-4.0-h-small")
    renamed = {"mamba": "linear_attention", "attention": "full_attention"}
    for key, kinds in (("layer_types", [renamed[k] for k in granite["layer_types"]]),
                       ("layers_block_type", granite["layer_types"])):
        other = {k: v for k, v in granite.items() if k != "layer_types"} | {key: kinds}
        assert llmpar.model_from_hf(other) == llmpar.model_from_hf(granite)
    with pytest.raises(llmpar.SpecError) as caught:
        llmpar.model_from_hf({**granite, "layer_types": ["mamba", "moe"] * 20})
    assert caught.value.problems[0].path == "$.layer_types"


def test_the_models_measured_for_their_flops_count_as_transformers_builds_them():
    # validation/data/flops/<name>.json (validation/measure_flops.py) records the
    # parameters of each model it ran (1 and 2 layers, fewer experts)
    folder = Path(__file__).resolve().parents[1] / "validation" / "data" / "flops"
    names = ("qwen3-next-80b-a3b", "granite-4.0-h-small", "deepseek-v3.2-exp", "qwen3.5-27b",
             "qwen3.5-35b-a3b", "falcon-h1-1.5b")
    for name in names:
        runs = json.loads((folder / f"{name}.json").read_text(encoding="utf-8"))["runs"]
        for run in runs:
            model = llmpar.model_from_hf(run["config_used"])
            assert count_parameters(model).total == run["parameters"], (name, run["num_layers"])


def test_lora_on_attention_adapts_only_the_attention_layers():
    # r = 16 on q/k/v/o of the 12 attention layers (q_proj 2048 -> 2 x 4096 with its gate,
    # k/v 2048 -> 512, o 4096 -> 2048): r x (in + out) each
    from llmpar.footprint.baseline import baseline_footprint

    spec = SESSION.load_spec({"model": "qwen3-next-80b-a3b", "hardware": GPU,
                              "training": {"sequence_length": 1024,
                                           "activation_model": "coefficient"},
                              "finetune": {"method": "lora", "rank": 16,
                                           "target_modules": ["q_proj", "k_proj", "v_proj",
                                                              "o_proj"]}})
    tuned = baseline_footprint(spec).finetune
    assert tuned is not None
    per_layer = 16 * ((2048 + 8192) + 2 * (2048 + 512) + (4096 + 2048))
    assert tuned.adapters_by_group == {"attention_adapters": 12 * per_layer}


def fused_inventory(name: str, **parallel):
    from llmpar.footprint.baseline import baseline_footprint

    spec = SESSION.load_spec({"model": name, "hardware": {**GPU, "num_gpus": 4},
                              "training": {"sequence_length": 4096,
                                           "activation_model": "fused"},
                              "parallel": parallel})
    return spec, baseline_footprint(spec)


def test_fused_recurrent_layers_keep_what_their_kernels_save():
    # Qwen3-Next, b 1, s 4096, bf16: per token the projection's input (2048), the
    # convolution's input (8192), q and k (2048 each) with fp32 rstd for 2 x 16 heads, v
    # (4096), fp32 g and beta for 32 value heads, the UT matrix (32 x 64), z, the gated
    # norm's input (4096 each) and fp32 rstd (32), out_proj's input (4096).
    _, footprint = fused_inventory("qwen3-next-80b-a3b")
    inventory = footprint.activations
    assert inventory is not None
    groups = {group.kind: group for group in inventory.groups}
    assert {kind: g.count for kind, g in groups.items()} == {"moe linear_attention": 36,
                                                              "moe attention": 12}
    per_token = (2 * (2048 + 8192 + 2048 + 2048 + 4096 + 32 + 32 * 64 + 4096 + 4096 + 4096)
                 + 4 * (2 * 16 + 32 + 32))
    names = {"mixer input", "convolution input", "query (normalized)", "key (normalized)",
             "query and key rstd (fp32)", "value", "decay g (fp32)", "beta", "UT transform A",
             "output gate z", "gated norm input", "gated norm rstd (fp32)",
             "output projection input"}
    mixer = [t for t in groups["moe linear_attention"].tensors if t.name in names]
    assert len(mixer) == len(names)
    assert sum(t.bytes for t in mixer) == 4096 * per_token
    # Granite 4's Mamba-2: zxbcdt (2 x 8192 + 128 + 2 x 128), the scan output (8192) and
    # one fp32 rstd per token, with the projection's input (4096)
    _, footprint = fused_inventory("granite-4.0-h-small")
    inventory = footprint.activations
    assert inventory is not None
    mamba = next(g for g in inventory.groups if g.kind == "moe mamba")
    names = {"mixer input", "z, x and dt", "B and C", "scan output", "gated norm rstd (fp32)"}
    assert sum(t.bytes for t in mamba.tensors if t.name in names) == 4096 * (
        2 * (4096 + 2 * 8192 + 128 + 256 + 8192) + 4)


def test_pipeline_stages_hold_their_layers_of_each_kind():
    from llmpar.evaluation.stages import stage_inventory
    from llmpar.strategies.pipeline import PipelineConfig, stage_layer_counts

    spec, footprint = fused_inventory("qwen3-next-80b-a3b", pipeline={"degree": 4})
    first = 0
    for count in stage_layer_counts(PipelineConfig(degree=4), 48):
        stage = llmpar.strategy.Stage(index=0, first_layer=first, num_layers=count,
                                      has_embedding=first == 0, has_head=False,
                                      micro_batches_in_flight=1.0)
        held = {g.kind: g.count for g in stage_inventory(spec, footprint, stage).groups}
        assert held == {"moe linear_attention": 9, "moe attention": 3}
        first += count


def test_attention_adapters_keep_tensors_only_in_the_attention_layers():
    from llmpar.footprint.baseline import baseline_footprint

    def groups(finetune):
        table = {"model": "qwen3-next-80b-a3b", "hardware": GPU,
                 "training": {"sequence_length": 1024, "activation_model": "fused"}}
        if finetune:
            table["finetune"] = {"method": "lora", "rank": 16,
                                 "target_modules": ["q_proj", "v_proj"]}
        inventory = baseline_footprint(SESSION.load_spec(table)).activations
        assert inventory is not None
        return {g.kind: g.tensors for g in inventory.groups}
    plain, tuned = groups(False), groups(True)
    # the linear-attention layers gain no adapter tensor; they only lose what they kept
    # for their frozen weights' gradients alone (llmpar.finetune.activations)
    assert tuned["moe linear_attention"] == tuple(
        t for t in plain["moe linear_attention"] if not t.weights_only)
    assert any("LoRA" in t.name for t in tuned["moe attention"])
