"""The evaluation hooks: a wrapper over the finished plan, activation models, a
collective cost model and report sections, each through pluggy, a failing one set aside."""

from __future__ import annotations

import attrs
import pytest
from search_specs import small_spec

import llmpar
from llmpar.communication.collectives import seconds_of
from llmpar.footprint.activations import korthikanti
from llmpar.report import text_report
from llmpar.report.tables import Table

SPEC = {"model": "llama-2-7b", "hardware": {"cluster": "dgx-h100", "num_gpus": 16},
        "training": {"sequence_length": 1024, "global_batch_size": 32},
        "parallel": {"tensor": {"degree": 8}}}


def session_with(*plugins: object) -> llmpar.Session:
    return llmpar.Session(load_entry_points=False, plugins=plugins)


class Stamps:
    @llmpar.hookimpl(wrapper=True)
    def llmpar_plan(self, spec, layout):
        plan = yield
        return plan.evolve(warnings=(*plan.warnings, f"seen on {spec.hardware.num_gpus} GPUs"))


class Raises:
    @llmpar.hookimpl(wrapper=True)
    def llmpar_plan(self, spec, layout):
        yield
        raise RuntimeError("boom")


class Replaces:
    @llmpar.hookimpl(tryfirst=True)
    def llmpar_plan(self, spec, layout):
        return None if spec.hardware.num_gpus != 8 else "a plan of its own"


def test_a_wrapper_sees_and_changes_the_finished_plan():
    plan = session_with(Stamps()).evaluate(SPEC)
    assert plan.warnings[-1] == "seen on 16 GPUs"
    assert attrs.evolve(plan, warnings=plan.warnings[:-1]) == session_with().evaluate(SPEC)


def test_a_wrapper_that_raises_is_named_and_set_aside():
    session = session_with(Raises(), Stamps())
    plan = session.evaluate(SPEC)
    assert any("plugin 'Raises' failed in llmpar_plan and was set aside: RuntimeError: boom"
               in w for w in plan.warnings)
    assert "seen on 16 GPUs" in plan.warnings  # the other wrapper still ran
    statuses = {info.name: info.status for info in session.plugins()}
    assert statuses["Raises"] == "broken" and statuses["Stamps"] == "loaded"
    assert not any("Raises" in w for w in session.evaluate(SPEC).warnings)  # gone for good


def test_a_plugin_may_answer_first_for_the_specs_it_knows():
    session = session_with(Replaces())
    assert session.evaluate(SPEC).total_bytes > 0  # 16 GPUs: llmpar's evaluation
    assert session.evaluate({**SPEC, "hardware": {"cluster": "dgx-h100", "num_gpus": 8}}) == (
        "a plan of its own")


def halved(spec):
    inventory = korthikanti(spec)
    return inventory.map_layers(lambda group: group.replace(group.tensors[: len(
        group.tensors) // 2]))


class HalfActivations:
    @llmpar.hookimpl
    def llmpar_register_activation_models(self, register):
        register("half-korthikanti", halved)


def test_a_plugin_activation_model_is_selected_by_name():
    session = session_with(HalfActivations())
    plain = session.evaluate(SPEC)
    half = session.evaluate({**SPEC, "training": {**SPEC["training"],
                                                  "activation_model": "half-korthikanti"}})
    assert 0 < half.activations_bytes < plain.activations_bytes
    with pytest.raises(llmpar.SpecError, match="half-korthikanti"):
        session_with().load_spec({**SPEC, "training": {"activation_model": "half-korthikanti"}})


def test_an_activation_model_may_not_take_a_name_llmpar_has():
    class Clash:
        @llmpar.hookimpl
        def llmpar_register_activation_models(self, register):
            register("korthikanti", halved)

    session = session_with(Clash())
    (info,) = [info for info in session.plugins() if info.status == "broken"]
    assert "registered by both 'llmpar' and 'Clash'" in info.error


class SlowNetwork:
    """Inter-node collectives take twice llmpar's time (a congested fabric)."""

    @llmpar.hookimpl
    def llmpar_collective_seconds(self, collective, hardware, buffer_bytes):
        seconds, tier = seconds_of(collective, hardware, buffer_bytes)
        if tier != "inter-node" or seconds is None:
            return None
        return seconds * 2, tier


def test_a_collective_cost_model_reaches_evaluation_and_search():
    slow = session_with(SlowNetwork())
    plan, plain = slow.evaluate(SPEC), session_with().evaluate(SPEC)
    pairs = list(zip(plain.collectives, plan.collectives))
    assert any(p.tier == "inter-node" for p, _ in pairs)
    for before, after in pairs:
        assert after.seconds == pytest.approx(before.seconds * (2 if before.tier ==
                                                               "inter-node" else 1))
    fast = llmpar.search(small_spec(), top=3, session=slow)
    exact = llmpar.search(small_spec(), top=3, session=slow, exact=True)
    assert [r.choices for r in fast.results] == [r.choices for r in exact.results]


class BrokenNetwork:
    @llmpar.hookimpl
    def llmpar_collective_seconds(self, collective, hardware, buffer_bytes):
        raise ZeroDivisionError("no fabric")


def test_a_collective_model_that_raises_is_named_on_the_plan_and_llmpars_is_used():
    session = session_with(BrokenNetwork())
    plan, plain = session.evaluate(SPEC), session_with().evaluate(SPEC)
    assert plan.warnings[-1] == ("plugin 'BrokenNetwork' failed in llmpar_collective_seconds "
                                 "and was set aside: ZeroDivisionError: no fabric")
    assert plan.collectives == plain.collectives
    assert plan.step_seconds == plain.step_seconds
    assert session.evaluate(SPEC).warnings == plain.warnings  # said once, then gone


class Section:
    @llmpar.hookimpl
    def llmpar_report_sections(self, plan):
        return [Table(title="Carbon", columns=(), notes=(f"{plan.num_gpus} GPUs",))]


def test_a_report_section_is_added_before_the_warnings():
    session = session_with(Section())
    plan = session.evaluate(SPEC)
    text = text_report(plan, session.report_sections(plan))
    assert "Carbon" in text and "16 GPUs" in text
    assert "Carbon" not in text_report(plan)
