"""The plugin contract: built-ins and third parties go through the same door."""

from __future__ import annotations

import importlib.metadata

import attrs
import pytest

import llmpar
from llmpar import PluginError, Shard, Strategy, Transform
from llmpar.strategies import BUILTIN_PLUGINS, CHECKED_STRATEGY_MODULES
from llmpar.strategies.data import DataParallel

SPEC = {"model": "llama-2-7b", "hardware": {"gpu": "h100-sxm", "num_gpus": 8},
        "training": {"sequence_length": 1024}}


@attrs.frozen(kw_only=True)
class HalvesConfig:
    degree: int = 2


class HalvesWeights(Strategy):
    """A toy strategy: splits the weights over `degree` GPUs."""

    name = "halves"
    config_type = HalvesConfig
    phase = 50

    def transform(self, config, ctx):
        return Transform(strategy=self.name,
                         shards=(Shard(component="weights", divisor=config.degree,
                                       reason="toy"),))


class HalvesPlugin:
    @llmpar.hookimpl
    def llmpar_register_strategies(self, register):
        register(HalvesWeights())


class ExtraBuffer(Strategy):
    name = "buffer"
    config_type = HalvesConfig
    phase = 50

    def degree(self, config):
        return 1

    def transform(self, config, ctx):
        return Transform(strategy=self.name, buffer_bytes=1000 * config.degree)


class BufferPlugin:
    @llmpar.hookimpl
    def llmpar_register_strategies(self, register):
        register(ExtraBuffer())


def test_builtins_are_declared_in_the_entry_point_group():
    declared = {(ep.name, ep.value) for ep in importlib.metadata.entry_points(group="llmpar")}
    assert set(BUILTIN_PLUGINS) <= declared


def test_hermetic_session_has_builtins_but_no_entry_points():
    session = llmpar.Session(load_entry_points=False)
    assert "data" in session.strategies
    assert {info.name for info in session.plugins()} == {name for name, _ in BUILTIN_PLUGINS}


def test_third_party_strategy_owns_its_table_and_transforms_memory():
    session = llmpar.Session(load_entry_points=False, plugins=[HalvesPlugin()])
    base = session.evaluate(SPEC)
    split = session.evaluate({**SPEC, "parallel": {"halves": {"degree": 2}}})
    assert split.layout == {"data": 4, "halves": 2}
    assert split.weights_bytes * 2 == base.weights_bytes
    assert split.gradients_bytes == base.gradients_bytes


def test_third_party_table_errors_carry_its_path():
    session = llmpar.Session(load_entry_points=False, plugins=[HalvesPlugin()])
    with pytest.raises(llmpar.SpecError) as caught:
        session.load_spec({**SPEC, "parallel": {"halves": {"degre": 2}}})
    assert caught.value.problems[0].path == "$.parallel.halves.degre"


def test_default_session_does_not_know_a_plugin_registered_elsewhere():
    llmpar.Session(load_entry_points=False, plugins=[HalvesPlugin()])
    with pytest.raises(llmpar.SpecError, match="unknown strategy"):
        llmpar.load_spec({**SPEC, "parallel": {"halves": {"degree": 2}}})


def test_plan_does_not_depend_on_registration_order():
    spec = {**SPEC, "parallel": {"halves": {"degree": 2}, "buffer": {"degree": 3}}}
    one = llmpar.Session(load_entry_points=False, plugins=[HalvesPlugin(), BufferPlugin()])
    two = llmpar.Session(load_entry_points=False, plugins=[BufferPlugin(), HalvesPlugin()])
    assert one.evaluate(spec) == two.evaluate(spec)
    assert list(one.strategies) == list(two.strategies)


def _status(session, name):
    (info,) = [info for info in session.plugins() if info.name == name]
    return info


def test_duplicate_strategy_names_set_the_later_plugin_aside():
    class Again:
        @llmpar.hookimpl
        def llmpar_register_strategies(self, register):
            register(HalvesWeights())

    session = llmpar.Session(load_entry_points=False, plugins=[HalvesPlugin(), Again()])
    assert "halves" in session.strategies
    broken = [info for info in session.plugins() if info.status == "broken"]
    assert len(broken) == 1 and "registered by both" in broken[0].error
    with pytest.raises(PluginError, match="registered by both"):
        llmpar.Session(load_entry_points=False, plugins=[HalvesPlugin(), Again()], strict=True)


class Broken:
    @llmpar.hookimpl
    def llmpar_register_strategies(self, register):
        register(HalvesWeights())
        raise RuntimeError("boom")


def test_a_failing_plugin_is_named_and_set_aside():
    session = llmpar.Session(load_entry_points=False, plugins=[Broken(), BufferPlugin()])
    broken = [info for info in session.plugins() if info.status == "broken"]
    assert len(broken) == 1
    assert "failed to register strategies: RuntimeError: boom" in broken[0].error
    # What it registered before it broke is gone; the other plugin works.
    assert "halves" not in session.strategies and "buffer" in session.strategies
    assert session.evaluate({**SPEC, "parallel": {"buffer": {"degree": 3}}}).buffers_bytes == 3000
    with pytest.raises(PluginError, match="boom"):
        llmpar.Session(load_entry_points=False, plugins=[Broken()], strict=True)


def test_a_spec_that_needs_a_broken_plugin_says_so(monkeypatch):
    class FakeEntryPoint:
        name, value, dist = "halves", "no_such_module_anywhere", None

        def load(self):
            import no_such_module_anywhere  # noqa: F401

    real = importlib.metadata.entry_points
    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda group: [*real(group=group), FakeEntryPoint()])
    session = llmpar.Session(load_entry_points=True, environ={})
    info = _status(session, "halves")
    assert info.status == "broken" and "failed to import: ModuleNotFoundError" in info.error
    assert session.evaluate(SPEC).fits is not None  # specs without it work
    with pytest.raises(llmpar.SpecError, match="plugin 'halves' .* is broken: failed to import"):
        session.load_spec({**SPEC, "parallel": {"halves": {"degree": 2}}})


def test_unknown_hook_is_refused():
    class Typo:
        @llmpar.hookimpl
        def llmpar_register_strategy(self, register):
            pass

    session = llmpar.Session(load_entry_points=False, plugins=[Typo()])
    (info,) = [info for info in session.plugins() if info.status == "broken"]
    assert "unknown hook" in info.error and "llmpar_register_strategy" in info.error
    with pytest.raises(PluginError, match="unknown hook"):
        llmpar.Session(load_entry_points=False, plugins=[Typo()], strict=True)


def test_strategy_config_must_be_attrs():
    class Bad(Strategy):
        name = "bad"
        config_type = dict

    class BadPlugin:
        @llmpar.hookimpl
        def llmpar_register_strategies(self, register):
            register(Bad())

    with pytest.raises(PluginError, match="attrs class"):
        llmpar.Session(load_entry_points=False, plugins=[BadPlugin()], strict=True)
    assert "bad" not in llmpar.Session(load_entry_points=False, plugins=[BadPlugin()]).strategies


def test_plugins_are_blocked_by_name_and_environment():
    session = llmpar.Session(load_entry_points=False, plugins=[HalvesPlugin(), BufferPlugin()],
                             blocked=["BufferPlugin"],
                             environ={"LLMPAR_BLOCK_PLUGINS": "context, "})
    assert "buffer" not in session.strategies and "context" not in session.strategies
    assert "halves" in session.strategies
    statuses = {info.name: info.status for info in session.plugins()}
    assert statuses["context"] == "blocked"
    with pytest.raises(llmpar.SpecError, match="plugin 'context' is blocked"):
        session.load_spec({**SPEC, "parallel": {"context": {"degree": 2}}})


def test_autoload_is_switched_off_by_the_environment():
    on = llmpar.Session(environ={})
    off = llmpar.Session(environ={"LLMPAR_DISABLE_PLUGIN_AUTOLOAD": "1"})
    builtin = {name for name, _ in BUILTIN_PLUGINS}
    assert {info.name for info in off.plugins()} == builtin
    assert {info.name for info in on.plugins()} >= builtin


def test_registration_hooks_go_through_pluggy():
    """Hookwrappers run around a plugin's own registration, and pluggy's tracing
    sees the calls."""
    seen = []

    class Wraps:
        @llmpar.hookimpl(wrapper=True)
        def llmpar_register_strategies(self, register):
            seen.append("before")
            result = yield
            seen.append("after")
            return result

        @llmpar.hookimpl
        def llmpar_register_strategies(self, register):  # noqa: F811
            register(HalvesWeights())

    class WrapsOnly:
        @llmpar.hookimpl(wrapper=True)
        def llmpar_register_strategies(self, register):
            seen.append("wrapped")
            return (yield)

    session = llmpar.Session(load_entry_points=False, plugins=[WrapsOnly(), HalvesPlugin()])
    assert "halves" in session.strategies and "wrapped" in seen
    traced = []
    manager = session.plugin_manager
    undo = manager.add_hookcall_monitoring(lambda name, impls, kwargs: traced.append(name),
                                           lambda outcome, name, impls, kwargs: None)
    manager.subset_hook_caller("llmpar_register_strategies", remove_plugins=[])(
        register=lambda strategy: None)
    undo()
    assert traced == ["llmpar_register_strategies"]


def test_plugin_presets_are_found(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "tiny.toml").write_text(
        'source = "test"\nnum_layers = 2\nhidden_size = 64\nnum_attention_heads = 4\n'
        "ffn_hidden_size = 256\nvocab_size = 1000\n")

    class Presets:
        @llmpar.hookimpl
        def llmpar_register_presets(self, register):
            register(tmp_path)

    session = llmpar.Session(load_entry_points=False, plugins=[Presets()])
    assert "tiny" in session.presets.names("models")
    assert session.evaluate({**SPEC, "model": "tiny"}).parameters > 0


def test_a_strategy_that_crashes_is_named_at_evaluation():
    class Crashes(HalvesWeights):
        def transform(self, config, ctx):
            raise ZeroDivisionError("oops")

    class CrashPlugin:
        @llmpar.hookimpl
        def llmpar_register_strategies(self, register):
            register(Crashes())

    session = llmpar.Session(load_entry_points=False, plugins=[CrashPlugin()])
    with pytest.raises(PluginError, match="strategy 'halves' failed"):
        session.evaluate({**SPEC, "parallel": {"halves": {"degree": 2}}})


def test_a_subclass_of_a_built_in_strategy_is_checked_as_a_plugin_is():
    # Only llmpar's own strategy classes, which the contract suite checks, skip the check
    # of every transform; a plugin's subclass of one is checked on every evaluation.

    class Negative(DataParallel):
        def transform(self, config, ctx):
            return attrs.evolve(super().transform(config, ctx), buffer_bytes=-1.0)

    class NegativePlugin:
        @llmpar.hookimpl
        def llmpar_register_strategies(self, register):
            register(Negative())

    assert type(llmpar.Session(load_entry_points=False).strategies["data"]).__module__ \
        in CHECKED_STRATEGY_MODULES
    session = llmpar.Session(load_entry_points=False, plugins=[NegativePlugin()],
                             blocked=["data"])
    with pytest.raises(PluginError, match="buffer_bytes -1.0 is not a finite number >= 0"):
        session.evaluate({**SPEC, "parallel": {"data": {"degree": 8}}})
