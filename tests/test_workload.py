"""The workload hook (`llmpar.workload`): a plugin's `[workload.<name>]` table, its frozen
models' weights split as the trained model's are, their FLOPs in the step's, its errors
named at their keys, and the contract suite. The workload here is a distillation
teacher of the student's architecture (Hinton et al. 2015, arXiv:1503.02531: the teacher
runs forward only, to give the soft targets)."""

from __future__ import annotations

import re
from pathlib import Path

import attrs
import pytest

import llmpar
from llmpar.spec.validators import dtype
from llmpar.testing import REFERENCE_SPECS, WorkloadContract, check_workload_contract


@attrs.frozen(kw_only=True)
class TeacherConfig:
    """`[workload.teacher]`."""

    teacher_format: str = attrs.field(default="bf16", validator=dtype)
    """The teacher's number format."""
    sharded: bool = True
    """Unused by the evaluator: exercises a boolean field in the contract suite."""


class Teacher(llmpar.Workload[TeacherConfig]):
    name = "teacher"
    config_type = TeacherConfig

    def rules(self, config, spec):
        return [llmpar.Rule("$.workload.teacher.teacher_format",
                            config.teacher_format == "fp64",
                            lambda: "a teacher in fp64 is not a thing anyone runs")]

    def transform(self, config, ctx):
        size = llmpar.strategies.common.bytes_per_element(config.teacher_format)
        training = ctx.spec.training
        batch = training.global_batch_size or training.micro_batch_size * ctx.layout.degree(
            "data")
        forward = 2.0 * ctx.footprint.parameters.active * training.sequence_length * batch
        return llmpar.Transform(
            strategy=self.name, model_flops_per_step=forward,
            frozen_weights=(llmpar.FrozenWeights(name="teacher", bytes_per_parameter=size,
                                                 reason="the distillation teacher"),))


class Sharding(llmpar.Workload[TeacherConfig]):
    """Breaks the contract: a workload that divides memory."""

    name = "divider"
    config_type = TeacherConfig

    def transform(self, config, ctx):
        return llmpar.Transform(strategy=self.name, shards=(llmpar.Shard(
            component="weights", divisor=2, reason="not a workload's to state"),))


class Registers:
    """A plugin object handing over `workloads`."""

    def __init__(self, *workloads):
        self.workloads = workloads

    @llmpar.hookimpl
    def llmpar_register_workloads(self, register):
        for workload in self.workloads:
            register(workload)


plugin = Registers


@pytest.fixture(scope="module")
def session():
    return llmpar.Session(load_entry_points=False, plugins=[plugin(Teacher())])


def table(parallel=None, gpus=8, workload=None, **extra):
    found = {"model": "llama-3-8b", "hardware": {"gpu": "h100-sxm", "num_gpus": gpus},
             "training": {"sequence_length": 2048, "global_batch_size": 32},
             "parallel": {"data": {"zero": 1}} if parallel is None else parallel, **extra}
    if workload is not None:
        found["workload"] = {"teacher": workload}
    return found


@pytest.mark.parametrize(("parallel", "gpus"), [
    ({"data": {"zero": 1}}, 8),
    ({"tensor": {"degree": 4}, "data": {"zero": 1}}, 8),
    ({"pipeline": {"degree": 4}}, 8),
    ({"data": {"zero": 3}}, 8),
    ({"data": {"fsdp": True, "shard_degree": 4}}, 16),
])
def test_frozen_weights_are_split_as_the_trained_weights(session, parallel, gpus):
    alone = session.evaluate(table(parallel, gpus))
    taught = session.evaluate(table(parallel, gpus, workload={}))
    # Same architecture, same format, same shards: the weights double on every GPU, and
    # nothing else that is stored changes.
    assert taught.weights_bytes == pytest.approx(2 * alone.weights_bytes, abs=8)
    for field in ("gradients_bytes", "optimizer_bytes", "activations_bytes", "buffers_bytes"):
        assert getattr(taught, field) == getattr(alone, field), field
    for before, after in zip(alone.stages, taught.stages):
        assert after.weights_bytes == pytest.approx(2 * before.weights_bytes, abs=8)


def test_frozen_weights_take_their_own_format(session):
    alone = session.evaluate(table())
    taught = session.evaluate(table(workload={"teacher_format": "fp8"}))
    assert taught.weights_bytes - alone.weights_bytes == pytest.approx(
        alone.weights_bytes / 2, abs=8)


def test_frozen_weights_leave_the_optimizer_step_alone(session):
    # The optimizer step reads and writes the trained weights and states only.
    alone = session.evaluate(table())
    taught = session.evaluate(table(workload={}))
    assert alone.training.time_model == "modelled"
    assert taught.training.optimizer_seconds == alone.training.optimizer_seconds
    assert taught.training.compute_seconds > alone.training.compute_seconds


def test_an_assumed_mfu_times_the_workload_s_model_flops(session):
    training = {"sequence_length": 2048, "global_batch_size": 32, "mfu": 0.4}
    alone = session.evaluate(table(training=training))
    taught = session.evaluate(table(workload={}, training=training))
    ratio = taught.training.flops_per_step / alone.training.flops_per_step
    assert taught.training.step_seconds == pytest.approx(alone.training.step_seconds * ratio)


def test_model_flops_count_in_model_and_hardware_flops(session):
    size = {"model": {"parameters": 7e9}}
    alone = session.evaluate({**table(), **size})
    taught = session.evaluate({**table(workload={}), **size})
    tokens = 32 * 2048
    assert taught.training.flops_per_step == pytest.approx(8 * 7e9 * tokens)
    assert taught.training.hardware_flops_per_step == pytest.approx(
        alone.training.hardware_flops_per_step + 2 * 7e9 * tokens)
    (rule,) = [d for d in taught.derivations if d.quantity == "flops_per_step"]
    assert rule.inputs["workload_flops_per_step"] == pytest.approx(2 * 7e9 * tokens)


def test_without_a_workload_table_nothing_changes(session):
    plain = llmpar.Session(load_entry_points=False)
    assert session.evaluate(table()) == plain.evaluate(table())


@pytest.mark.parametrize(("spec", "path", "words"), [
    (table(workload={"teacher_format": "fp7"}), "$.workload.teacher.teacher_format",
     "must be one of"),
    (table(workload={"teacher_format": "fp64"}), "$.workload.teacher.teacher_format",
     "fp64"),
    (table(workload={"no_such": 1}), "$.workload.teacher", ""),
    ({**table(), "workload": {"teachr": {}}}, "$.workload.teachr", "did you mean 'teacher'"),
    ({**table(), "workload": 3}, "$.workload", "expected a table"),
])
def test_bad_tables_are_spec_errors_at_their_keys(session, spec, path, words):
    with pytest.raises(llmpar.SpecError) as error:
        session.evaluate(spec)
    assert any(p.path.startswith(path) and words in p.message
               for p in error.value.problems), error.value.problems


def test_serving_specs_take_no_workload(session):
    spec = {"model": "llama-3-8b", "hardware": {"gpu": "h100-sxm", "num_gpus": 1},
            "inference": {"prompt_tokens": 128, "generated_tokens": 16},
            "workload": {"teacher": {}}}
    with pytest.raises(llmpar.SpecError) as error:
        session.evaluate(spec)
    assert [p.path for p in error.value.problems] == ["$.workload"]


def test_a_workload_may_not_divide_what_strategies_divide():
    session = llmpar.Session(load_entry_points=False, plugins=[plugin(Sharding())])
    with pytest.raises(llmpar.PluginError, match="shards is the strategies'"):
        session.evaluate({**table(), "workload": {"divider": {}}})


def test_names_are_refused_twice_and_beside_strategies():
    class Data(Teacher):
        name = "data"

    session = llmpar.Session(load_entry_points=False, plugins=[plugin(Data())])
    assert "data" not in session.workloads
    (info,) = [i for i in session.plugins() if i.status == "broken"]
    assert "taken by 'data'" in (info.error or "")


def test_plugins_list_their_workloads(session):
    (info,) = [i for i in session.plugins() if i.workloads]
    assert info.workloads == ("teacher",) and info.strategies == ()


def test_spec_round_trips_with_its_workload(session):
    spec = session.load_spec(table(workload={"teacher_format": "fp8"}))
    text = llmpar.dump_spec(spec)
    assert "[workload.teacher]" in text and 'teacher_format = "fp8"' in text
    assert session.load_spec(text=text) == spec


def test_the_contract_suite_passes_a_workload_that_keeps_it(session):
    counts = check_workload_contract("teacher", session=session, specs=REFERENCE_SPECS[:3])
    assert all(count > 0 for count in counts.values())


def test_the_contract_suite_names_what_a_workload_breaks():
    @attrs.define(kw_only=True)
    class Mutable:
        teacher_format: str = "bf16"

    class Unfrozen(Teacher):
        config_type = Mutable

    bare = llmpar.Session(load_entry_points=False)
    with pytest.raises(AssertionError, match="provides workload 'teacher'; loaded: -$"):
        WorkloadContract("teacher", bare)
    contract = WorkloadContract(Unfrozen(), bare)
    with pytest.raises(AssertionError) as error:
        contract.check("config-schema")
    assert str(error.value) == ("workload 'teacher' breaks 'config-schema': Mutable is not "
                                "frozen (use @attrs.frozen(kw_only=True))")
    with pytest.raises(AssertionError) as error:
        contract.check("registered")
    assert str(error.value) == (
        "workload 'teacher' breaks 'registered': the session has no workload of this type "
        "under 'teacher': register it from llmpar_register_workloads and name the plugin in "
        "the `llmpar` entry-point group")
    with pytest.raises(ValueError, match="known: config-schema, registered, malformed-table, "
                                         "well-formed-transform, adds-to-training"):
        contract.check("neutral-is-identity", REFERENCE_SPECS[0])


def test_the_contract_suite_catches_a_workload_that_divides():
    session = llmpar.Session(load_entry_points=False, plugins=[plugin(Sharding())])
    with pytest.raises(AssertionError, match="divider"):
        WorkloadContract("divider", session).check("adds-to-training", REFERENCE_SPECS[1])


def test_the_page_s_example_keeps_the_contract():
    page = (Path(__file__).parents[1] / "docs" / "plugins.md").read_text()
    (source,) = [b for b in re.findall(r"```python\n(.*?)```", page, re.S)
                 if b.startswith("# teacher.py")]
    module = type(llmpar)("teacher")
    exec(compile(source, "docs/plugins.md", "exec"), module.__dict__)
    session = llmpar.Session(load_entry_points=False, plugins=[module])
    alone = session.evaluate(table())
    taught = session.evaluate(table(workload={}))
    assert taught.weights_bytes == pytest.approx(2 * alone.weights_bytes, abs=8)
    counts = check_workload_contract("teacher", session=session, specs=REFERENCE_SPECS[:2])
    assert all(counts.values())


def test_a_workloads_table_is_in_the_schema_of_its_session(session):
    """`llmpar schema` (and the page's form) describe each installed workload's table, as
    they do a plugin strategy's; without workloads `[workload]` stays any table."""
    from llmpar.loading.json_schema import spec_json_schema

    schema = spec_json_schema(session.strategies, session.workloads)
    workload = schema["properties"]["workload"]
    assert workload["additionalProperties"] is False
    assert workload["properties"]["teacher"]["$ref"] == "#/$defs/TeacherConfig"
    assert set(schema["$defs"]["TeacherConfig"]["properties"]) == {
        field.name for field in attrs.fields(TeacherConfig)}
    plain = spec_json_schema(session.strategies)["properties"]["workload"]
    assert "properties" not in plain and plain["additionalProperties"] == {}
