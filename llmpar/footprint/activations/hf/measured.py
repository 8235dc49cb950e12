"""Measured ground truth (validation/data/<arch>.json, written by
validation/measure_hf.py) next to what `hf-eager`/`hf-sdpa` predict for the same runs.

Pure reading and arithmetic: neither torch nor transformers is needed. A run is one
(variant, attention, experts, b, s) of one architecture; the measurement took the
bytes autograd keeps (live storages after the forward, each once) for 1 and 2 layers,
so per layer = 2 layers - 1 layer and fixed = 1 layer - per layer. The input ids,
which the measurement counts apart (kind "input"), are added to the totals, since the
inventory lists them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs

from llmpar.footprint.activations.hf.model import hf_inventory
from llmpar.footprint.activations.hf.run import HfRun, dropout_from_hf_config
from llmpar.footprint.inventory import ActivationInventory

LAYER_KEYS = ("num_hidden_layers", "n_layer")
MEASURED_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


@attrs.frozen(kw_only=True)
class MeasuredRun:
    """One measured configuration and its bytes."""

    arch: str
    variant: str
    attention: str
    experts: str | None
    batch: int
    sequence: int
    per_layer_bytes: int | None
    """None when only one layer count was measured."""
    fixed_bytes: int | None
    """Outside the layers, input ids included."""
    total_bytes: Mapping[int, int]
    """By number of layers, input ids included."""

    @property
    def label(self) -> str:
        experts = f"/{self.experts}" if self.experts else ""
        return (f"{self.arch}[{self.variant}] {self.attention}{experts} "
                f"b={self.batch} s={self.sequence}")


@attrs.frozen(kw_only=True)
class Comparison:
    run: MeasuredRun
    per_layer_bytes: float | None
    fixed_bytes: float | None
    total_bytes: Mapping[int, float]

    @property
    def per_layer_error(self) -> float | None:
        """(predicted - measured) / measured; None without both layer counts."""
        if self.per_layer_bytes is None or not self.run.per_layer_bytes:
            return None
        return self.per_layer_bytes / self.run.per_layer_bytes - 1

    @property
    def total_errors(self) -> dict[int, float]:
        return {n: self.total_bytes[n] / measured - 1
                for n, measured in self.run.total_bytes.items()}


def load(path: str | Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(Path(path).read_text(encoding="utf-8"))
    return data


def data_files(folder: str | Path) -> list[Path]:
    """The measurement files of `folder` with measured variants, by name."""
    found = []
    for path in sorted(Path(folder).glob("*.json")):
        try:
            data = load(path)
        except (OSError, ValueError):
            continue
        if data.get("variants"):
            found.append(path)
    return found


def _variant(data: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    return next(v for v in data["variants"] if v["variant"] == name)


def measured_runs(data: Mapping[str, Any]) -> Iterator[MeasuredRun]:
    """Every measured run of every variant (a run measured at one layer count only has
    no per-layer bytes)."""
    for variant in data.get("variants", ()):
        totals: dict[tuple[Any, ...], dict[int, int]] = {}
        for run in variant.get("saved_runs", ()):
            key = (run["attn_implementation"], run["experts_implementation"], run["batch"],
                   run["seq"])
            totals.setdefault(key, {})[run["num_layers"]] = (
                run["saved_activation_bytes"] + run.get("saved_input_ids_bytes", 0))
        for key, total in totals.items():
            both = len(total) == 2
            per_layer = total[2] - total[1] if both else None
            yield MeasuredRun(arch=data["name"], variant=variant["variant"],
                              attention=key[0], experts=key[1], batch=key[2], sequence=key[3],
                              per_layer_bytes=per_layer,
                              fixed_bytes=total[1] - per_layer if per_layer is not None
                              else None,
                              total_bytes=total)


REMOVED = "<removed>"


def config_used(data: Mapping[str, Any], variant: str, layers: int,
                root: Path | None = None) -> dict[str, Any]:
    """The config.json values the measurement built `layers` layers from: the published
    config.json (data["published_config_file"], relative to `root`, the repository; its
    data["published_config_part"] where the measurement took the language model of a
    multimodal config) with
    the variant's changes (a change given by layer count, a pattern of one letter per
    layer repeating a unit `layers` times, takes the value for `layers` and says the
    number of layers), else the config transformers reports (whose key names can
    differ from config.json's)."""
    found = _variant(data, variant)
    published = data.get("published_config_file")
    path = (root or Path.cwd()) / published if published else None
    if path is None or not path.is_file():
        return dict(found["configs_used"][str(layers)])
    config = dict(load(path))
    part = data.get("published_config_part")
    if part is not None:  # the language model of a multimodal config.json (text_config)
        config = dict(config[part])
    changes = found.get("changes_from_published", {})
    for key, change in changes.items():
        used = change.get("used")
        if used == REMOVED:
            config.pop(key, None)
        elif key in LAYER_KEYS:
            config[key] = layers
        elif isinstance(used, Mapping):  # by layer count (a layer pattern's letters)
            config[key] = used[str(layers)]
        else:
            config[key] = used
    patterns = [change["used"][str(layers)] for change in changes.values()
                if isinstance(change.get("used"), Mapping)]
    for key in LAYER_KEYS:  # a pattern of one letter per layer says their number
        if patterns and key in config:
            config[key] = len(patterns[0])
    return config


def spec_table(data: Mapping[str, Any], run: MeasuredRun, layers: int,
               root: Path | None = None) -> dict[str, Any]:
    """A spec (as a mapping) for `run` with `layers` layers."""
    from llmpar.hf import model_table_from_hf

    config = config_used(data, run.variant, layers, root)
    config.setdefault("_source", data.get("source_repo"))
    dtype = data.get("measurement_setup", {}).get("dtype", "bfloat16")
    model = model_table_from_hf(config)
    moe = model.get("moe")
    if isinstance(moe, Mapping) and (moe.get("dense_layers", 0) >= model["num_layers"]
                                     or moe.get("layer_frequency", 1) > model["num_layers"]):
        # The run kept fewer layers than the leading dense ones (DeepSeek's
        # first_k_dense_replace) or than the period of the MoE layers (Llama 4's
        # interleave_moe_layer_step): transformers built a dense model, and a spec says so
        # without a [model.moe] table.
        model = {key: value for key, value in model.items() if key != "moe"}
    return {
        "model": model,
        "hardware": {"gpu": "h100-sxm"},
        "precision": {"activations": MEASURED_DTYPES[dtype], "weights": MEASURED_DTYPES[dtype]},
        "training": {"sequence_length": run.sequence, "micro_batch_size": run.batch},
    }


def hf_run(data: Mapping[str, Any], run: MeasuredRun, root: Path | None = None) -> HfRun:
    """How the measured run ran: its attention and experts, its config's dropout."""
    config = config_used(data, run.variant, 1, root)
    return HfRun(attention=run.attention, experts=run.experts or "grouped_mm",
                 dropout=dropout_from_hf_config(config))


def predicted(data: Mapping[str, Any], run: MeasuredRun, layers: int,
              root: Path | None = None) -> ActivationInventory:
    import llmpar

    spec = llmpar.load_spec(spec_table(data, run, layers, root))
    return hf_inventory(spec, hf_run(data, run, root), f"hf-{run.attention}")


def compare(data: Mapping[str, Any], run: MeasuredRun, root: Path | None = None) -> Comparison:
    """What hf-eager/hf-sdpa predict for `run`, measured the same way (2 - 1 layers);
    `root` is the repository holding the published config.json files (default: the
    working directory)."""
    totals = {n: predicted(data, run, n, root).total_bytes for n in run.total_bytes}
    if len(totals) < 2:
        return Comparison(run=run, per_layer_bytes=None, fixed_bytes=None, total_bytes=totals)
    per_layer = totals[2] - totals[1]
    return Comparison(run=run, per_layer_bytes=per_layer, fixed_bytes=totals[1] - per_layer,
                      total_bytes=totals)
