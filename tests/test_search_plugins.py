"""Search dimensions come through the plugin hook: built-ins declare theirs, and a
third-party strategy's own dimension is searched like any other."""

from __future__ import annotations

from collections.abc import Callable

import attrs
import pytest
from search_specs import small_spec

import llmpar
from llmpar.search.dimension import Point, SearchDimension, divisors
from llmpar.search.dimensions import collect_dimensions

BUILTIN_KEYS = {"data.zero", "data.shard_degree", "tensor.degree", "sequence",
                "context.degree", "context.kind", "expert.degree", "pipeline.degree",
                "pipeline.schedule", "pipeline.virtual_stages", "pipeline.layers_per_stage"}


@attrs.frozen(kw_only=True)
class ChunkedLossConfig:
    """`[parallel.chunked_loss]`: activations kept in chunks and recomputed, trading
    memory for time; one chunk (the default) changes nothing."""

    chunks: int = 1


class ChunkedLoss(llmpar.Strategy):
    name = "chunked_loss"
    config_type = ChunkedLossConfig
    phase = 90

    def degree(self, config: ChunkedLossConfig) -> int:
        return 1

    def transform(self, config: ChunkedLossConfig, ctx: llmpar.StrategyContext):
        if config.chunks == 1:
            return llmpar.Transform(strategy=self.name)
        split = llmpar.ActivationSplit(tag="tensor", divisor=config.chunks, reason="chunks")
        return llmpar.Transform(strategy=self.name, activation_splits=(split,),
                                extra_flops_per_step=1e14 * config.chunks)


class ChunkedLossPlugin:
    @llmpar.hookimpl
    def llmpar_register_strategies(self, register: Callable) -> None:
        register(ChunkedLoss())

    @llmpar.hookimpl
    def llmpar_search_dimensions(self, register: Callable) -> None:
        register(SearchDimension(strategy="chunked_loss", field="chunks", values=(1, 2, 4)))


def session_with(*plugins: object) -> llmpar.Session:
    return llmpar.Session(load_entry_points=False, plugins=plugins)


def test_builtin_strategies_declare_their_dimensions_through_the_hook():
    keys = {d.key for d in collect_dimensions(session_with())}
    assert keys == BUILTIN_KEYS


def test_a_plugin_dimension_is_searched_and_emitted():
    session = session_with(ChunkedLossPlugin())
    base = llmpar.search(small_spec(num_gpus=2), top=3, session=session_with())
    found = llmpar.search(small_spec(num_gpus=2), top=3, session=session)
    assert found.considered == 3 * base.considered
    chunked = llmpar.search(small_spec(num_gpus=2), top=1, objective="memory",
                            session=session).best
    assert chunked.spec.parallel["chunked_loss"].chunks == chunked.choices[
        "chunked_loss.chunks"] == 4
    assert session.evaluate(session.load_spec(chunked.to_toml())) == chunked.plan


def test_a_plugin_without_a_fast_form_is_evaluated_one_by_one_only_where_it_applies(
        monkeypatch):
    """The built-ins stay on the fast path: the layouts with one chunk (the neutral config,
    so no table) are evaluated there, only the chunked ones one by one."""
    from llmpar.search import exhaustive

    calls: list[int] = []
    examine = exhaustive.Judge.examine
    monkeypatch.setattr(exhaustive.Judge, "examine",
                        lambda self, index: calls.append(index) or examine(self, index))
    session = session_with(ChunkedLossPlugin())
    found = llmpar.search(small_spec(num_gpus=2), top=3, session=session)
    chunked = 2 * found.considered // 3  # chunks 2 and 4
    assert chunked <= len(calls) <= chunked + len(found.rejected)  # + one example a reason
    exact = llmpar.search(small_spec(num_gpus=2), top=3, session=session, exact=True)
    assert [r.choices for r in found.results] == [r.choices for r in exact.results]
    assert (found.evaluated, found.rejected) == (exact.evaluated, exact.rejected)


def test_a_plugin_dimension_trades_memory_for_time():
    session = session_with(ChunkedLossPlugin())
    fastest = llmpar.search(small_spec(num_gpus=2), top=1, session=session).best
    smallest = llmpar.search(small_spec(num_gpus=2), top=1, objective="memory",
                             session=session).best
    assert fastest.choices["chunked_loss.chunks"] == 1
    assert smallest.choices["chunked_loss.chunks"] == 4


def test_dimension_values_may_depend_on_the_degrees():
    def values(point: Point) -> tuple[int, ...]:
        return divisors(point.degree("tensor"))

    dimension = SearchDimension(strategy="chunked_loss", field="chunks", values=values)
    assert dimension.values_at(Point(spec=None, degrees={"tensor": 4})) == (1, 2, 4)
    assert dimension.key == "chunked_loss.chunks"


@pytest.mark.parametrize(("dimension", "message"), [
    (SearchDimension(strategy="nope", field="degree"), "names no loaded strategy"),
    (SearchDimension(strategy="chunked_loss", field="size", values=(1,)), "has no field"),
    (SearchDimension(strategy="tensor", field="degree"), "declared by both"),
])
def test_bad_dimensions_are_plugin_errors(dimension, message):
    class Bad:
        @llmpar.hookimpl
        def llmpar_register_strategies(self, register: Callable) -> None:
            register(ChunkedLoss())

        @llmpar.hookimpl
        def llmpar_search_dimensions(self, register: Callable) -> None:
            register(dimension)

    session = session_with(Bad())
    (broken,) = [info for info in session.plugins() if info.status == "broken"]
    assert message in broken.error
    # Set aside whole: its strategy and dimensions go, the built-ins' stay.
    assert "chunked_loss" not in session.strategies
    assert {d.strategy for d in collect_dimensions(session)} <= set(session.strategies)
    assert any(d.key == "tensor.degree" for d in collect_dimensions(session))


class StickyLoss(ChunkedLoss):
    """Says no config of it is neutral, so its table stays in every layout's spec."""

    name = "sticky_loss"

    def neutral_config(self, layout: llmpar.Layout) -> None:
        return None


class StickyLossPlugin:
    @llmpar.hookimpl
    def llmpar_register_strategies(self, register: Callable) -> None:
        register(StickyLoss())

    @llmpar.hookimpl
    def llmpar_search_dimensions(self, register: Callable) -> None:
        register(SearchDimension(strategy="sticky_loss", field="chunks", values=(1, 2)))


def test_a_table_stays_unless_its_values_make_the_neutral_config():
    session = session_with(StickyLossPlugin())
    found = llmpar.search(small_spec(num_gpus=2), top=3, session=session)
    assert all("sticky_loss" in r.spec.parallel for r in found.results)
    plain = llmpar.search(small_spec(num_gpus=2), top=3, session=session_with())
    assert all("tensor" not in r.spec.parallel for r in plain.results
               if r.choices["tensor.degree"] == 1)


def test_a_dimension_sees_another_strategy_s_choice():
    """Chunks only where the search chose ZeRO-3: the two groups are enumerated as one."""

    def chunks(point: Point) -> tuple[int, ...]:
        return (1, 2) if point.choices.get("data.zero") == 3 else (1,)

    class Seeing:
        @llmpar.hookimpl
        def llmpar_register_strategies(self, register: Callable) -> None:
            register(ChunkedLoss())

        @llmpar.hookimpl
        def llmpar_search_dimensions(self, register: Callable) -> None:
            register(SearchDimension(strategy="chunked_loss", field="chunks", values=chunks,
                                     sees=("data.zero",)))

    session = session_with(Seeing())
    found = llmpar.search(small_spec(num_gpus=2), top=500, session=session)
    chosen = {(r.choices["data.zero"], r.choices["chunked_loss.chunks"]) for r in found.results}
    assert (3, 2) in chosen and not any(z != 3 and c == 2 for z, c in chosen)
