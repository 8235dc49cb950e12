"""Selective recomputation by module (`[training] recompute_modules`, Megatron-Core's
--recompute-granularity selective --recompute-modules ...): each module drops the tensors
its recomputation frees and reruns its forward."""

from __future__ import annotations

import glob
import tomllib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import parallel_training_specs

import llmpar
from llmpar import SpecError
from llmpar.evaluation.stages import recomputed
from llmpar.footprint.baseline import baseline_footprint
from llmpar.footprint.flops import mla_up_projection_weights
from llmpar.testing.fast_form import disagreements

SESSION = llmpar.Session(load_entry_points=False)
PATH = "$.training.recompute_modules"


def gpt3(*modules: str, activation_model: str = "korthikanti") -> dict[str, Any]:
    """GPT-3 175B on 64 A100, TP8 x PP8, 2K sequences (Korthikanti et al. 2022, Table 3)."""
    training: dict[str, Any] = {"sequence_length": 2048, "micro_batch_size": 1,
                                "global_batch_size": 64, "recompute": "selective",
                                "activation_model": activation_model}
    if modules:
        training["recompute_modules"] = list(modules)
    return {"model": "gpt-3-175b", "hardware": {"cluster": "dgx-a100", "num_gpus": 64},
            "training": training,
            "parallel": {"tensor": {"degree": 8}, "sequence": {}, "pipeline": {"degree": 8}}}


def layer_sbh(spec: dict[str, Any]) -> float:
    """Bytes one unsplit layer keeps under the spec's recomputation, per s*b*h."""
    loaded = SESSION.load_spec(spec)
    inventory = recomputed(baseline_footprint(loaded).activations, loaded)
    (group,) = inventory.groups
    model, training = loaded.model, loaded.training
    return group.layer_bytes / (training.sequence_length * training.micro_batch_size
                                * model.hidden_size)


def training_examples() -> list[str]:
    found = []
    for path in sorted(glob.glob("specs/examples/*.toml")):
        with open(path, "rb") as file:
            if "training" in tomllib.load(file):
                found.append(path)
    return found


def as_table(path: str, **training: Any) -> dict[str, Any]:
    with open(path, "rb") as file:
        table = tomllib.load(file)
    # the examples' op-level policy (torchtitan's) stands beside recompute_modules: left out
    merged = {**table["training"], "recompute_policy": None, **training}
    table["training"] = {key: value for key, value in merged.items() if value is not None}
    return table


@pytest.mark.parametrize("path", training_examples())
def test_core_attn_alone_is_selective_recomputation_exactly(path):
    # Megatron-Core's default recompute_modules is ["core_attn"]: recompute = "selective"
    # keeps its meaning and every number with it.
    selective = SESSION.evaluate(as_table(path, recompute="selective",
                                          recompute_modules=None))
    named = SESSION.evaluate(as_table(path, recompute="selective",
                                      recompute_modules=["core_attn"]))
    assert numbers(named) == numbers(selective)


def numbers(plan: llmpar.Plan) -> dict[str, Any]:
    """A plan's JSON with each derivation as its value (naming the modules is extra text,
    and a derivation of the modules' FLOPs is extra)."""
    data = plan.to_dict()
    data["derivations"] = {d["quantity"]: d["value"] for d in data["derivations"]
                           if d["quantity"] != "hardware_flops_per_step"}
    return data


def test_korthikanti_terms_per_module():
    # Korthikanti et al. 2022 (arXiv:2205.05198), Sec. 4.1 with 16-bit activations and
    # dropout: a GPT layer keeps sbh (34 + 5as/h); core_attn drops the 5as/h scores;
    # layernorm the two norm outputs (the Q/K/V and fc1 inputs, 2sbh each); mlp the GELU's
    # input and output (8sbh each) and keeps its input and the dropout mask after it.
    assert layer_sbh(gpt3()) == pytest.approx(34.0)
    assert layer_sbh(gpt3("core_attn", "layernorm")) == pytest.approx(30.0)
    assert layer_sbh(gpt3("core_attn", "mlp")) == pytest.approx(18.0)
    assert layer_sbh(gpt3("core_attn", "layernorm", "mlp")) == pytest.approx(14.0)
    # Without core_attn the scores stay: 34 + 5as/h - 16 for mlp alone.
    a, s, h = 96, 2048, 12288
    assert layer_sbh(gpt3("mlp")) == pytest.approx(34.0 + 5 * a * s / h - 16)


def test_mlp_reruns_its_two_products_once():
    # GPT-3's MLP is two h x 4h matrices: 2 x 8h^2 FLOPs per token and layer forward.
    base = SESSION.evaluate(gpt3())
    plan = SESSION.evaluate(gpt3("core_attn", "mlp"))
    h, layers, tokens = 12288, 96, 64 * 2048
    assert plan.hardware_flops_per_step - base.hardware_flops_per_step == pytest.approx(
        2 * 8 * h * h * layers * tokens, rel=1e-12)
    assert plan.flops_per_step == base.flops_per_step  # model FLOPs do not move


def test_elementwise_modules_rerun_no_products_but_take_time():
    base = SESSION.evaluate(gpt3())
    plan = SESSION.evaluate(gpt3("core_attn", "layernorm"))
    assert plan.hardware_flops_per_step == base.hardware_flops_per_step
    assert plan.activations_bytes < base.activations_bytes
    assert plan.compute_seconds > base.compute_seconds  # the norms run again


def test_without_core_attn_attention_is_not_rerun():
    base = SESSION.evaluate(gpt3("core_attn", "mlp"))
    plan = SESSION.evaluate(gpt3("mlp"))
    assert plan.hardware_flops_per_step < base.hardware_flops_per_step
    assert plan.activations_bytes > base.activations_bytes


def deepseek(*modules: str) -> dict[str, Any]:
    training: dict[str, Any] = {"sequence_length": 4096, "global_batch_size": 64,
                                "recompute": "selective", "activation_model": "fused"}
    if modules:
        training["recompute_modules"] = list(modules)
    return {"model": "deepseek-v3", "hardware": {"cluster": "dgx-h100", "num_gpus": 256},
            "training": training,
            "parallel": {"tensor": {"degree": 4}, "sequence": {}, "expert": {"degree": 16},
                         "data": {"zero": 1}}}


def test_mla_up_proj_drops_query_key_value_and_reruns_the_up_projections():
    base, plan = SESSION.evaluate(deepseek()), SESSION.evaluate(deepseek("core_attn",
                                                                         "mla_up_proj"))
    loaded = SESSION.load_spec(deepseek())
    model = loaded.model
    tokens = 64 * 4096
    assert plan.hardware_flops_per_step - base.hardware_flops_per_step == pytest.approx(
        2 * mla_up_projection_weights(model) * model.num_layers * tokens, rel=1e-12)
    inventory = baseline_footprint(loaded).activations
    kept = {t.name for g in recomputed(inventory, SESSION.load_spec(
        deepseek("core_attn", "mla_up_proj"))).groups for t in g.tensors}
    assert not {"query", "key", "value"} & kept
    assert {"query latent", "key/value latent"} <= kept


def test_moe_frees_what_its_parts_free():
    by = {m: SESSION.evaluate(deepseek("core_attn", *m)) for m in
          [(), ("moe_act",), ("shared_experts",), ("moe",), ("moe", "moe_act")]}
    moe = by[("moe",)]
    for part in [("moe_act",), ("shared_experts",)]:
        assert moe.stages[0].activations_bytes <= by[part].stages[0].activations_bytes
        assert by[part].stages[0].activations_bytes < by[()].stages[0].activations_bytes
    # moe_act lies inside moe: naming both is moe.
    assert numbers(by[("moe", "moe_act")]) == numbers(moe)
    assert (by[("shared_experts",)].hardware_flops_per_step
            < moe.hardware_flops_per_step)
    assert by[("moe_act",)].hardware_flops_per_step == by[()].hardware_flops_per_step


def applicable(model: dict[str, Any]) -> list[str]:
    """The modules a drawn architecture has."""
    found = ["core_attn", "layernorm"]
    moe = model.get("moe")
    if moe is None or moe["dense_layers"]:
        found.append("mlp")
    if moe is not None:
        found += ["moe", "moe_act"]
        if moe["num_shared_experts"]:
            found.append("shared_experts")
    return found


@given(parallel_training_specs(), st.sampled_from(["korthikanti", "fused"]), st.data())
def test_one_more_module_never_adds_memory_nor_removes_flops(spec, activation_model, data):
    names = applicable(spec["model"])
    chosen = data.draw(st.lists(st.sampled_from(names), min_size=1, unique=True))
    extra = data.draw(st.sampled_from(names))
    training = {**spec["training"], "recompute": "selective",
                "activation_model": activation_model}
    training.pop("mfu")
    fewer = SESSION.evaluate({**spec, "training": {**training,
                                                   "recompute_modules": chosen}})
    more = SESSION.evaluate({**spec, "training": {**training,
                                                  "recompute_modules": [*chosen, extra]}})
    for before, after in zip(fewer.stages, more.stages, strict=True):
        assert after.activations_bytes <= before.activations_bytes * (1 + 1e-12)
    assert more.hardware_flops_per_step >= fewer.hardware_flops_per_step * (1 - 1e-12)
    assert more.flops_per_step == fewer.flops_per_step
    assert more.compute_seconds >= fewer.compute_seconds * (1 - 1e-12)


@pytest.mark.parametrize(("training", "expected"), [
    ({"recompute_modules": ["core_atn"]}, "did you mean 'core_attn'"),
    ({"recompute_modules": []}, "at least one module"),
    ({"recompute_modules": ["mlp"], "recompute": "full"}, "recompute = 'selective'"),
    ({"recompute_modules": ["moe"]}, "no MoE layers"),
    ({"recompute_modules": ["moe_act"]}, "no MoE layers"),
    ({"recompute_modules": ["mla_up_proj"]}, "no MLA"),
    ({"recompute_modules": ["mlp"], "activation_model": "hf-eager"}, "'korthikanti' or "
                                                                      "'fused'"),
])
def test_bad_modules_name_the_key(training, expected):
    spec = gpt3()
    spec["training"].update(training)
    with pytest.raises(SpecError) as caught:
        SESSION.evaluate(spec)
    (problem,) = caught.value.problems
    assert problem.path == PATH and expected in problem.message


def test_mla_up_proj_needs_the_latents_in_the_inventory():
    spec = deepseek("mla_up_proj")
    spec["training"]["activation_model"] = "korthikanti"
    with pytest.raises(SpecError, match="keeps no MLA latents"):
        SESSION.evaluate(spec)


def test_shared_experts_needs_shared_experts():
    spec = {"model": "mixtral-8x7b", "hardware": {"cluster": "dgx-h100", "num_gpus": 8},
            "training": {"recompute": "selective", "activation_model": "fused",
                         "recompute_modules": ["core_attn", "shared_experts"]},
            "parallel": {"expert": {"degree": 8}}}
    with pytest.raises(SpecError, match="no shared experts"):
        SESSION.evaluate(spec)
    spec["training"]["recompute_modules"] = ["core_attn", "moe", "moe_act"]
    assert SESSION.evaluate(spec).activations_bytes > 0


def calls(plan: llmpar.Plan, name: str) -> float:
    (found,) = [c.calls_per_step for c in plan.collectives if c.name == name]
    return found


def test_a_recomputed_block_reruns_the_collectives_inside_it():
    # Megatron-Core's mlp and moe checkpoints wrap the whole block: under sequence
    # parallelism its all-gather before fc1 and reduce-scatter after fc2 run again (and
    # the MoE block's token dispatch and combine).
    base = SESSION.evaluate(gpt3())
    plan = SESSION.evaluate(gpt3("core_attn", "mlp"))
    # All-gathers: 4 per layer and micro-batch (two forward, two backward), 5 with the
    # MLP rerun; forward reduce-scatters: 2, then 3.
    assert calls(plan, "sequence.all-gather") == pytest.approx(
        calls(base, "sequence.all-gather") * 5 / 4)
    assert calls(plan, "sequence.reduce-scatter") == pytest.approx(
        calls(base, "sequence.reduce-scatter") * 3 / 2)
    moe, moe_base = SESSION.evaluate(deepseek("core_attn", "moe")), SESSION.evaluate(deepseek())
    # dispatch + combine forward and backward: 4, and 2 more in the rerun.
    assert calls(moe, "expert.all-to-all") == pytest.approx(
        calls(moe_base, "expert.all-to-all") * 6 / 4)
    assert calls(SESSION.evaluate(deepseek("core_attn", "moe_act")), "expert.all-to-all") == (
        calls(moe_base, "expert.all-to-all"))


def concepts() -> str:
    with open("docs/concepts.md", encoding="utf-8") as file:
        return file.read()


@pytest.mark.parametrize("modules", [None, ["core_attn", "layernorm"], ["core_attn", "mlp"],
                                     ["core_attn", "layernorm", "mlp"]])
def test_concepts_table_is_what_llmpar_computes(modules):
    training = {} if modules is None else {"recompute_modules": modules}
    plan = SESSION.evaluate(as_table("specs/examples/gpt3-175b-1024-a100.toml", **training))
    label = "`selective` (= `[\"core_attn\"]`)" if modules is None else (
        "`[" + ", ".join(f'"{m}"' for m in modules) + "]`")
    row = (f"| {label} | {plan.activations_bytes / 1e9:.2f} | "
           f"{plan.hardware_flops_per_step / plan.flops_per_step:.3f} | "
           f"{plan.step_seconds:.2f} |")
    assert row in concepts()


def test_deepseek_example_recomputes_what_its_report_says():
    path = "specs/examples/deepseek-v3-recompute-modules-h800.toml"
    plan = SESSION.evaluate(path)
    kept = SESSION.evaluate(as_table(path, recompute_modules=["core_attn"]))
    assert f"{plan.activations_bytes / 1e9:.2f} GB of activations per GPU instead of " \
           f"{kept.activations_bytes / 1e9:.2f} GB" in concepts().replace("\n  ", " ")


@pytest.mark.parametrize("spec", [gpt3("core_attn", "layernorm", "mlp"),
                                  deepseek("mla_up_proj", "moe", "layernorm")])
def test_the_search_fast_form_agrees_and_keeps_modules_to_selective(spec):
    # The search tries every recomputation mode; the modules go with "selective" only.
    loaded = SESSION.load_spec(spec)
    assert list(disagreements(SESSION, loaded)) == []
    assert loaded.training.with_recompute("full").recompute_modules is None
    assert loaded.training.with_recompute("selective") == loaded.training
