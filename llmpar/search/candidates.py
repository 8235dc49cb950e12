"""From a spec to its pins, and from a layout (a choice of every dimension) back to
a spec that `llmpar.evaluate` takes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from llmpar.loading.framework import profile_config
from llmpar.search.dimension import DEGREE, SearchDimension
from llmpar.search.space import MICRO_BATCH, RECOMPUTE, Choice
from llmpar.strategy import Layout

if TYPE_CHECKING:
    from llmpar.spec import Spec, Training
    from llmpar.spec.framework import Framework
    from llmpar.spec.workload import Recompute
    from llmpar.strategy import Strategy


def pins_of(spec: Spec, given: Mapping[str, Any] | None,
            strategies: Mapping[str, Strategy[Any]],
            dimensions: tuple[SearchDimension, ...]) -> dict[str, Any]:
    """The dimension values the spec's `[parallel.*]` tables fix.

    `given` is the `[parallel]` table as written (keys the user gave pin, a degree of
    -1 does not); without it (a Spec object) every field that differs from its
    default pins. A table given for a strategy with a presence dimension pins it on.
    """
    presence = {d.key for d in dimensions if d.field is None}
    pins: dict[str, Any] = {}
    for name, config in spec.parallel.items():
        if given is not None:
            keys = list(given.get(name, {}) or {}) if name in given else []
        else:
            default = strategies[name].config_type()
            keys = [f.name for f in attrs.fields(type(config))
                    if getattr(config, f.name) != getattr(default, f.name)]
        for key in keys:
            value = getattr(config, key)
            if key == DEGREE and value == -1:
                continue
            pins[f"{name}.{key}"] = value
        if name in presence and (given is None or name in given):
            pins[name] = True
    return pins


def _neutral_config(strategy: Strategy[Any], layout: Layout,
                    framework: Framework | None = None) -> Any | None:
    """The strategy's config that changes nothing (None: there is none), with the
    framework profile's defaults."""
    neutral = getattr(strategy, "neutral_config", None)
    if neutral is not None:
        return profile_config(framework, strategy.name, neutral(layout))
    default = profile_config(framework, strategy.name, strategy.config_type())
    return attrs.evolve(default, degree=1) if hasattr(default, DEGREE) else default


def default_config(spec: Spec, strategy: Strategy[Any], name: str) -> Any:
    """The config a layout gives a strategy the spec has no table for: the strategy's
    default with the framework profile's defaults."""
    return profile_config(spec.training.framework, name, strategy.config_type())


class SpecBuilder:
    """Builds the spec of a layout; caches the parts many layouts share."""

    def __init__(self, spec: Spec, strategies: Mapping[str, Strategy[Any]],
                 dimensions: tuple[SearchDimension, ...]):
        self.spec = spec
        self.strategies = strategies
        self.fields: dict[str, list[tuple[str, str]]] = {}
        """Per strategy, (dimension key, field) of its option dimensions."""
        self.presence = {d.strategy for d in dimensions if d.field is None}
        """Strategies whose table a dimension adds or leaves out."""
        for dimension in dimensions:
            if dimension.field is not None and not dimension.is_degree:
                self.fields.setdefault(dimension.strategy, []).append(
                    (dimension.key, dimension.field))
        owners = {d.strategy for d in dimensions}
        self.order = tuple(dict.fromkeys(list(spec.parallel) + sorted(owners)))
        """The strategies a layout's spec may hold: the spec's, then the dimensions'."""
        self._defaults = {name: default_config(spec, strategies[name], name)
                          for name in self.order}
        self._training: dict[tuple[int, str], Training] = {}

    def training(self, micro_batch_size: int, recompute: Recompute) -> Training:
        key = (micro_batch_size, recompute)
        if key not in self._training:
            self._training[key] = self.spec.training.with_recompute(
                recompute, micro_batch_size=micro_batch_size)
        return self._training[key]

    def parallel(self, choice: Choice) -> dict[str, Any]:
        """The `[parallel.*]` tables of a layout: a strategy's table is left out when
        the spec has none for it and the values chosen make its neutral config (the
        one that changes nothing, `Strategy.neutral_config`)."""
        tables = {}
        degrees = {key.removesuffix(f".{DEGREE}"): value for key, value in choice.items()
                   if key.endswith(f".{DEGREE}")}
        layout = Layout(degrees=degrees, num_gpus=self.spec.hardware.num_gpus,
                        order=self.spec.rank_order)
        for name in self.order:
            default = self._defaults[name]
            fields = {field: choice[key] for key, field in self.fields.get(name, ())
                      if key in choice}
            if name in degrees and hasattr(default, DEGREE):
                fields[DEGREE] = degrees[name]
            base = self.spec.parallel.get(name, default)
            config = attrs.evolve(base, **fields) if fields else base
            if self.included(name, choice, config, layout):
                tables[name] = config
        return tables

    def included(self, name: str, choice: Choice, config: Any, layout: Layout) -> bool:
        """Whether a layout's spec holds `name`'s table: its presence dimension says so,
        the searched spec has it, the strategy is always active, or `config` is not
        the strategy's neutral one."""
        if name in self.presence:
            return bool(choice.get(name, name in self.spec.parallel))
        strategy = self.strategies[name]
        if name in self.spec.parallel or strategy.always_active:
            return True
        neutral = _neutral_config(strategy, layout, self.spec.training.framework)
        return neutral is None or config != neutral

    def build(self, choice: Choice) -> Spec:
        """The spec of a layout: the searched spec with its tables and training set."""
        training = self.training(choice[MICRO_BATCH], choice[RECOMPUTE])
        return attrs.evolve(self.spec, training=training, parallel=self.parallel(choice),
                            search=None)
