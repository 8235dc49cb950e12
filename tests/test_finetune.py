"""`[finetune]`: what LoRA, QLoRA, DoRA and frozen groups change in memory, FLOPs and
communication, checked by hand against the model's shapes and PEFT's counting."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from search_specs import MOE_MODEL, agreeing_pairs, small_spec

import llmpar
from llmpar import SpecError
from llmpar.dtypes import blockwise_bytes_per_element
from llmpar.finetune.targets import block_linears
from llmpar.footprint.baseline import baseline_footprint
from llmpar.loading.dump import dump_spec

SESSION = llmpar.Session(load_entry_points=False)
EXAMPLES = ("llama-3-8b-fsdp-8-h100", "mixtral-8x7b-ep8-tp2", "llama-3-70b-tp8-pp4-cp2",
            "gpt3-175b-1024-a100", "deepseek-v3-2048-h800")
LLAMA_8B = {"model": "llama-3-8b", "hardware": {"gpu": "h100-sxm"},
            "training": {"sequence_length": 2048, "micro_batch_size": 1}}
# Llama-3-8B's linear shapes (its config.json): h 4096, 32 heads and 8 KV heads of 128,
# ffn 14336, 32 layers.
H, KV, FFN, LAYERS = 4096, 8 * 128, 14336, 32


def spec_with(base: dict, **finetune) -> dict:
    return {**base, "finetune": finetune}


def lora_per_layer(rank: int) -> int:
    """PEFT's r x (in + out) for q, k, v, o, gate, up and down of one Llama-3-8B block."""
    shapes = [(H, H), (H, KV), (H, KV), (H, H), (H, FFN), (H, FFN), (FFN, H)]
    return sum(rank * (i + o) for i, o in shapes)


@pytest.mark.parametrize("name", EXAMPLES)
def test_method_full_is_todays_plan(name):
    path = SESSION.presets.path("examples", name)
    spec = SESSION.load_spec(path)
    plain = SESSION.evaluate(spec)
    full = SESSION.evaluate(SESSION.load_spec(path, overrides={"finetune.method": "full"}))
    assert full.to_dict() == plain.to_dict()
    assert plain.training is not None and plain.training.finetune is None


def test_lora_adapters_are_counted_as_peft_counts_them():
    plan = llmpar.evaluate(spec_with(LLAMA_8B, method="lora", rank=16,
                                     target_modules=["all-linear"]))
    tuned = plan.training.finetune
    # 41,943,040: PEFT's print_trainable_parameters for this config (validation data too).
    assert tuned.adapter_parameters == LAYERS * lora_per_layer(16) == 41_943_040
    assert tuned.trainable_parameters == tuned.adapter_parameters
    assert tuned.frozen_parameters == plan.parameters


def test_gqa_shapes_give_k_and_v_smaller_adapters():
    plan = llmpar.evaluate(spec_with(LLAMA_8B, method="lora", rank=8,
                                     target_modules=["k_proj", "v_proj"]))
    assert plan.training.finetune.adapter_parameters == LAYERS * 2 * 8 * (H + KV)


def test_gradients_and_optimizer_states_only_for_the_adapters():
    plan = llmpar.evaluate(spec_with(LLAMA_8B, method="lora", target_modules=["all-linear"]))
    trainable = plan.training.finetune.trainable_parameters
    assert plan.gradients_bytes == 2 * trainable  # bf16 gradients
    assert plan.optimizer_bytes == 12 * trainable  # mixed-precision Adam
    # Frozen base weights at bf16 beside the adapters' own weights.
    assert plan.weights_bytes == 2 * (plan.parameters + trainable)


def test_zero_shards_adapter_states_and_fsdp_shards_frozen_weights():
    base = {**LLAMA_8B, "hardware": {"gpu": "h100-sxm", "num_gpus": 8}}
    one = llmpar.evaluate(spec_with(LLAMA_8B, method="lora"))
    for zero, sharded in ((1, ("optimizer",)), (2, ("optimizer", "gradients")),
                          (3, ("optimizer", "gradients", "weights"))):
        plan = llmpar.evaluate({**spec_with(base, method="lora"),
                                "parallel": {"data": {"zero": zero}}})
        for component in ("weights", "gradients", "optimizer"):
            expected = getattr(one, f"{component}_bytes") / (8 if component in sharded else 1)
            assert getattr(plan, f"{component}_bytes") == pytest.approx(expected, abs=8)


def test_data_parallel_reductions_carry_trainable_parameters_only():
    spec = {**spec_with(LLAMA_8B, method="lora"), "hardware": {"gpu": "h100-sxm",
                                                              "num_gpus": 8}}
    plan = llmpar.evaluate(spec)
    reduce = next(c for c in plan.collectives if c.name == "data.dense-grad-all-reduce")
    assert reduce.buffer_bytes == 2 * plan.training.finetune.trainable_parameters


def test_everything_frozen_trains_nothing_and_reduces_nothing():
    groups = ["embedding", "attention", "mlp", "norms", "head"]
    spec = {**spec_with(LLAMA_8B, method="frozen", frozen=groups),
            "hardware": {"gpu": "h100-sxm", "num_gpus": 8}}
    plan = llmpar.evaluate(spec)
    assert plan.training.finetune.trainable_parameters == 0
    assert plan.gradients_bytes == plan.optimizer_bytes == 0
    assert all(c.buffer_bytes == 0 for c in plan.collectives if "grad" in c.name)


def test_frozen_layer_range_leaves_the_other_layers_trainable():
    plan = llmpar.evaluate(spec_with(LLAMA_8B, method="frozen",
                                     frozen=["embedding", "layers[0:8]"]))
    groups = plan.parameters_by_group
    # a block's two RMSNorms (h each); the final norm is outside the blocks and trains
    per_layer = (groups["attention"] + groups["mlp"]) / LAYERS + 2 * H
    frozen = groups["embedding"] + 8 * per_layer
    assert plan.training.finetune.trainable_parameters == pytest.approx(
        plan.parameters - frozen, abs=1)


def test_pipeline_stage_of_frozen_layers_holds_no_gradients():
    spec = {**spec_with(LLAMA_8B, method="frozen", frozen=["embedding", "layers[0:16]"]),
            "hardware": {"gpu": "h100-sxm", "num_gpus": 2},
            "parallel": {"pipeline": {"degree": 2}}}
    plan = llmpar.evaluate(spec)
    first, second = plan.stages
    assert first.gradients_bytes == 0
    assert second.gradients_bytes > 0


def test_qlora_stores_the_base_linears_at_nf4_with_block_scales():
    plan = llmpar.evaluate(spec_with(LLAMA_8B, method="qlora", target_modules=["all-linear"]))
    model = SESSION.load_spec(LLAMA_8B).model
    linears = sum(linear.weights for linear in block_linears(model))
    nf4 = blockwise_bytes_per_element("nf4", 64, True)
    assert nf4 == pytest.approx(0.5 + 0.127 / 8, abs=1e-5)  # QLoRA, Sec. 3: 0.127 bits
    adapters = plan.training.finetune.adapter_parameters
    expected = linears * nf4 + 2 * (plan.parameters - linears) + 2 * adapters
    assert plan.weights_bytes == pytest.approx(expected, abs=4)
    # The dequantized copy of the largest base layer (gate/up/down: 4096 x 14336, bf16).
    assert plan.training.finetune.transient_bytes == 2 * H * FFN
    assert plan.buffers_bytes == 2 * H * FFN


def test_frozen_weights_skip_their_weight_gradient_products():
    plain = llmpar.evaluate(LLAMA_8B)
    lora = llmpar.evaluate(spec_with(LLAMA_8B, method="lora", rank=16,
                                     target_modules=["all-linear"]))
    tuned = lora.training.finetune
    s = 2048
    model = SESSION.load_spec(LLAMA_8B).model
    frozen = sum(linear.weights for linear in block_linears(model)) + 128256 * H
    assert tuned.skipped_flops_per_step == pytest.approx(2 * s * frozen)
    assert tuned.adapter_flops_per_step == pytest.approx(6 * s * tuned.adapter_parameters)
    assert lora.training.hardware_flops_per_step == pytest.approx(
        plain.training.hardware_flops_per_step - tuned.skipped_flops_per_step
        + tuned.adapter_flops_per_step)
    assert lora.training.flops_per_step == plain.training.flops_per_step


def test_lora_keeps_the_rank_wide_intermediate_and_with_dropout_the_input():
    # Under Korthikanti et al.'s accounting every linear keeps its input, frozen or not, so
    # the difference is the adapters' own tensors (the fused model also releases what only
    # the frozen weights' gradients needed: tests/test_frozen_inputs.py).
    base = {**LLAMA_8B, "training": {**LLAMA_8B["training"], "activation_model": "korthikanti"}}
    plain = llmpar.evaluate(base).activations_bytes
    lora = llmpar.evaluate(spec_with(base, method="lora", rank=16,
                                     target_modules=["q_proj"])).activations_bytes
    dropout = llmpar.evaluate(spec_with(base, method="lora", rank=16, dropout=0.05,
                                        target_modules=["q_proj"])).activations_bytes
    s = 2048
    assert lora - plain == LAYERS * s * 16 * 2
    assert dropout - lora == LAYERS * s * H * (2 + 1)  # bf16 input + bool mask


def test_dora_adds_a_magnitude_per_output_feature():
    lora = llmpar.evaluate(spec_with(LLAMA_8B, method="lora", target_modules=["q_proj"]))
    dora = llmpar.evaluate(spec_with(LLAMA_8B, method="dora", target_modules=["q_proj"]))
    assert (dora.training.finetune.adapter_parameters
            - lora.training.finetune.adapter_parameters) == LAYERS * H


def test_modules_to_save_trains_a_copy_and_keeps_the_original():
    plan = llmpar.evaluate(spec_with(LLAMA_8B, method="lora", modules_to_save=["lm_head"]))
    tuned = plan.training.finetune
    head = plan.parameters_by_group["head"]
    assert tuned.trainable_parameters == tuned.adapter_parameters + head
    assert plan.weights_bytes == 2 * (plan.parameters + tuned.trainable_parameters)


def test_mixtral_expert_adapters_split_over_expert_ranks():
    base = {"model": "mixtral-8x7b", "hardware": {"gpu": "h100-sxm", "num_gpus": 8},
            "training": {"sequence_length": 1024}}
    lora = {"method": "lora", "target_modules": ["gate_proj", "up_proj", "down_proj"]}
    one = llmpar.evaluate({**base, "finetune": lora, "hardware": {"gpu": "h100-sxm"}})
    ep = llmpar.evaluate({**base, "finetune": lora, "parallel": {"expert": {"degree": 8}}})
    # 8 experts x 3 linears x r (h + ffn) per layer, 32 layers.
    assert one.training.finetune.adapter_parameters == 32 * 8 * 3 * 16 * (4096 + 14336)
    assert ep.gradients_bytes == pytest.approx(one.gradients_bytes / 8, abs=8)


def test_finetune_round_trips_through_toml():
    spec = SESSION.load_spec(spec_with(LLAMA_8B, method="qlora", rank=8, dropout=True,
                                       target_modules=["q_proj", "v_proj"],
                                       modules_to_save=["lm_head"], block_size=128))
    assert SESSION.load_spec(dump_spec(spec)) == spec


@pytest.mark.parametrize(("finetune", "path", "fragment"), [
    ({"method": "lora", "rank": 0}, "$.finetune.rank", "> 0"),
    ({"method": "lora", "target_modules": ["q_prj"]}, "$.finetune.target_modules", "q_proj"),
    ({"method": "lora", "frozen": ["embedding"]}, "$.finetune.frozen", "method = \"frozen\""),
    ({"method": "frozen"}, "$.finetune.frozen", "needs the groups"),
    ({"method": "frozen", "frozen": ["layers[0:40]"]}, "$.finetune.frozen", "num_layers (32)"),
    ({"method": "frozen", "frozen": ["experts"]}, "$.finetune.frozen", "no 'experts'"),
    ({"method": "full", "frozen": ["embedding"]}, "$.finetune.frozen", "method = \"frozen\""),
    ({"method": "qlora", "base_format": "nf5"}, "$.finetune.base_format", "nf4"),
    ({"method": "lora", "dropout": 1.5}, "$.finetune.dropout", "[0, 1)"),
    ({"method": "lora", "bogus": 1}, "$.finetune.bogus", ""),
])
def test_bad_finetune_tables_name_the_key(finetune, path, fragment):
    with pytest.raises(SpecError) as error:
        llmpar.evaluate({**LLAMA_8B, "finetune": finetune})
    problems = [p for p in error.value.problems if p.path == path]
    assert problems and fragment in problems[0].message, error.value.problems


def test_gate_proj_needs_a_gated_mlp_and_adapters_an_architecture():
    with pytest.raises(SpecError) as error:
        llmpar.evaluate({"model": "gpt2", "hardware": {"gpu": "h100-sxm"},
                         "training": {"sequence_length": 512},
                         "finetune": {"method": "lora", "target_modules": ["gate_proj"]}})
    assert "gate_proj" in str(error.value)
    with pytest.raises(SpecError) as error:
        llmpar.evaluate({"model": {"parameters": 7e9}, "hardware": {"gpu": "h100-sxm"},
                         "finetune": {"method": "lora"}})
    assert error.value.problems[0].path == "$.finetune.method"


def test_lora_on_one_24_gb_gpu_fits_where_full_training_does_not():
    base = {"model": "llama-3-8b", "hardware": {"gpu": "rtx-4090"},
            "training": {"sequence_length": 2048, "recompute": "full"}}
    assert not llmpar.evaluate(base).fits
    plan = llmpar.evaluate({**base, "finetune": {"method": "lora"}})
    assert plan.fits and math.isfinite(plan.training.step_seconds)


PEFT_COUNTS = json.loads((Path(__file__).resolve().parent.parent / "validation" / "data"
                          / "peft_counts.json").read_text())


@pytest.mark.parametrize("row", PEFT_COUNTS["rows"], ids=lambda row: (
    f"{row['model']}-{row['method']}-r{row['rank']}-{'+'.join(row['target_modules'])}"))
def test_adapter_counts_equal_peft_measured(row):
    """Measured with validation/measure_peft.py (peft, transformers, torch at full size on the
    meta device; versions in the data file)."""
    spec = SESSION.load_spec({"model": row["model"], "hardware": {"gpu": "h100-sxm"},
                              "training": {"sequence_length": 512},
                              "finetune": {"method": row["method"], "rank": row["rank"],
                                           "target_modules": row["target_modules"]}})
    tuned = baseline_footprint(spec).finetune
    assert tuned is not None
    assert sum(tuned.adapters_by_group.values()) == row["trainable_parameters"]


def test_peft_data_covers_the_measured_architectures():
    measured = {row["model"] for row in PEFT_COUNTS["rows"]}
    assert len(measured) + len(PEFT_COUNTS["not_covered"]) == 15
    assert PEFT_COUNTS["versions"]["peft"]


def test_explain_names_the_trainable_parameters():
    plan = llmpar.evaluate(spec_with(LLAMA_8B, method="lora", target_modules=["all-linear"]))
    trainable = plan.training.finetune.trainable_parameters
    assert plan.derivation("trainable_parameters").value == trainable
    assert plan.derivation("gradients_bytes").inputs["N"] == trainable
    assert "PEFT" in plan.explain("trainable_parameters")
    assert "trainable_parameters" not in {d.quantity for d in llmpar.evaluate(LLAMA_8B)
                                          .derivations}


FINETUNE_SPACES = {
    "lora": small_spec(finetune={"method": "lora", "rank": 8, "target_modules": ["all-linear"],
                                 "dropout": 0.1}),
    "qlora-moe": small_spec(model=MOE_MODEL, finetune={"method": "qlora",
                                                      "target_modules": ["all-linear"],
                                                      "modules_to_save": ["lm_head"]}),
    "frozen-layers": small_spec(finetune={"method": "frozen",
                                          "frozen": ["embedding", "layers[0:3]"]}),
}


@pytest.mark.parametrize("name", sorted(FINETUNE_SPACES))
def test_search_fast_path_agrees_with_evaluating_each_fine_tuning_layout(name):
    assert len(agreeing_pairs(llmpar.default_session(), FINETUNE_SPACES[name], every=3)) > 50


def test_search_ranks_fine_tuning_layouts_as_exhaustive_search_does():
    spec = FINETUNE_SPACES["lora"]
    fast, slow = llmpar.search(spec, top=5), llmpar.search(spec, top=5, exact=True)
    assert [r.choices for r in fast.results] == [r.choices for r in slow.results]
    assert fast.results and all(r.plan.training.finetune is not None for r in slow.results)


def test_fsdp_buffers_hold_the_stored_base_and_trainable_gradients():
    base = {**LLAMA_8B, "hardware": {"gpu": "h100-sxm", "num_gpus": 8},
            "training": {"sequence_length": 2048, "global_batch_size": 16}}
    fsdp = {"data": {"fsdp": True, "reshard_after_forward": False,
                     "gradient_sync": "last-micro-batch"}}
    lora = llmpar.evaluate({**base, "parallel": fsdp,
                            "finetune": {"method": "lora"}}).buffers_bytes
    qlora = llmpar.evaluate({**base, "parallel": fsdp, "finetune": {
        "method": "qlora", "base_format": "bf16"}}).buffers_bytes
    nf4 = llmpar.evaluate({**base, "parallel": fsdp,
                           "finetune": {"method": "qlora"}}).buffers_bytes
    full = llmpar.evaluate({**base, "parallel": fsdp}).buffers_bytes
    assert lora < full  # no frozen gradients accumulated
    assert qlora == lora  # an unquantized QLoRA base is LoRA's
    assert nf4 < lora  # gathered 4-bit weights, plus one dequantized layer


def test_qlora_dequantization_traffic_is_memory_bound_time():
    spec = {**LLAMA_8B, "training": {"sequence_length": 2048, "global_batch_size": 4,
                                     "recompute": "full"}}
    nf4 = llmpar.evaluate(spec_with(spec, method="qlora"))
    bf16 = llmpar.evaluate(spec_with(spec, method="qlora", base_format="bf16"))
    gpu = SESSION.load_spec(spec).hardware.gpu
    model = SESSION.load_spec(spec).model
    linears = sum(linear.weights for linear in block_linears(model))
    moved = linears * (blockwise_bytes_per_element("nf4", 64, True) + 2)  # read nf4, write bf16
    passes = 4 * 3  # 4 micro-batches x (forward, input gradients, recomputed forward)
    expected = passes * moved / (gpu.hbm_bandwidth_bytes_per_s * gpu.memory_efficiency)
    assert nf4.training.compute_seconds - bf16.training.compute_seconds == pytest.approx(
        expected, rel=1e-9)


def test_leading_frozen_blocks_run_no_backward():
    base = {**LLAMA_8B, "training": {"sequence_length": 2048, "activation_model": "fused"}}
    plain = llmpar.evaluate(base)
    # Blocks 0-7 frozen and the embedding too: nothing before block 8 needs a gradient.
    lead = llmpar.evaluate(spec_with(base, method="frozen", frozen=["embedding", "layers[0:8]"]))
    # The embedding trains: blocks 0-7 still pass gradients back to it.
    inner = llmpar.evaluate(spec_with(base, method="frozen", frozen=["layers[0:8]"]))
    assert inner.activations_bytes == plain.activations_bytes
    inventory = baseline_footprint(SESSION.load_spec(base)).activations
    layer = inventory.groups[0].layer_bytes
    token_ids = sum(t.bytes for t in inventory.fixed if t.placement == "embedding")
    # Block 8's input carries no gradient either: its input norm (before the Q/K/V
    # projections' input, the first tensor a trained weight keeps) is recorded by no graph.
    names = [t.name for t in inventory.groups[0].tensors]
    assert names[:3] == ["input norm input", "input norm rstd (fp32)", "attention input"]
    norm = sum(t.bytes for t in inventory.groups[0].tensors[:2])
    assert lead.activations_bytes == pytest.approx(
        plain.activations_bytes - 8 * layer - token_ids - norm, abs=1)
    # Beyond their weight gradients, the 8 blocks skip their input-gradient products and
    # attention's backward (twice its forward).
    model = SESSION.load_spec(base).model
    block = sum(linear.in_features * linear.out_features for linear in block_linears(model))
    attention = baseline_footprint(SESSION.load_spec(base)).forward_flops_per_sequence
    extra = 2 * 2048 * 8 * block + 2 * attention.executed_attention * 8 / LAYERS
    assert (lead.training.finetune.skipped_flops_per_step
            - inner.training.finetune.skipped_flops_per_step) == pytest.approx(extra)


def test_strategies_see_each_stage_s_trainable_parameters():
    from llmpar.evaluation.stages import stages_of
    from llmpar.strategy import Layout, StrategyContext

    spec = SESSION.load_spec({**spec_with(LLAMA_8B, method="frozen",
                                          frozen=["embedding", "layers[0:16]"]),
                              "hardware": {"gpu": "h100-sxm", "num_gpus": 2},
                              "parallel": {"pipeline": {"degree": 2}}})
    footprint = baseline_footprint(spec)
    layout = Layout(degrees={"pipeline": 2, "data": 1}, num_gpus=2)
    ctx = StrategyContext(spec=spec, footprint=footprint, layout=layout)
    pipeline = SESSION.strategies["pipeline"]
    stages = stages_of(spec, [pipeline.transform(spec.parallel["pipeline"], ctx)])
    first, second = (sum(ctx.trainable_in(stage).values()) for stage in stages)
    assert first == 0
    assert second == pytest.approx(sum(footprint.trainable_by_group.values()))
