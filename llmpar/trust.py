"""How far to trust a plan's step time: the published runs of its validation family.

A family is a GPU and a kind of model (dense, or with experts), and for rows that check one
mechanism (hybrid sharding, ZeRO++, ...) that mechanism too. Its runs are the rows of
validation/published/, each a published, measured training run; their errors, computed
by `validation/published_throughput.py --families`, ship in the wheel as
specs/validation/step_time.toml (tests/test_published_throughput.py fails when that file
no longer matches the rows). A GPU without runs says what its time model rests on
instead: the preset's `efficiency_source` and `efficiency_uncertainty`.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import attrs

from llmpar.loading.presets import builtin_specs_dir
from llmpar.spec import Model, Spec

FAMILIES_FILE = Path("validation") / "step_time.toml"
"""The per-family errors, under llmpar's specs folder."""


@attrs.frozen(kw_only=True)
class Family:
    """The published runs of one GPU and model kind, and llmpar's error on them."""

    gpu: str
    kind: str
    """"dense" or "moe"."""
    runs: int
    median_abs_error: float
    worst_abs_error: float
    mechanism: str = ""
    """The mechanism its runs check ("zero++", "hybrid-sharding", ...; validation/
    published/ rows that name one), or "" for the GPU and model kind's general family,
    the one plans quote."""


def model_kind(model: Model) -> str:
    """The model half of a validation family: "moe" with routed experts, else "dense"."""
    return "moe" if model.moe is not None else "dense"


def load_families(path: Path | None = None) -> tuple[Family, ...]:
    """The validation families of `path` (llmpar's own file by default); a session reads
    them once (`EvaluationCache.validation_families`)."""
    path = path or builtin_specs_dir() / FAMILIES_FILE
    if not path.is_file():
        return ()
    table = tomllib.loads(path.read_text(encoding="utf-8"))
    return tuple(Family(**row) for row in table.get("family", ()))


def step_time_trust(spec: Spec, time_model: str, families: tuple[Family, ...],
                    mechanisms: tuple[str, ...] = ()) -> str:
    """In words: how far the step time of `spec` is to be trusted, and why, by the
    published runs of `families`; and, for each of the plan's `mechanisms` (its
    transforms' `Transform.mechanisms`) that rows check on their own, those rows'."""
    if time_model == "none":
        return ""
    if time_model == "assumed-mfu":
        return ("assumed MFU, not modelled: as good as the MFU given; no published run "
                "checks it")
    general = _general_trust(spec, families)
    return "; ".join([general, *(_mechanism_trust(spec, families, name)
                                 for name in dict.fromkeys(mechanisms))])


def _mechanism_trust(spec: Spec, families: tuple[Family, ...], mechanism: str) -> str:
    """The error of the rows that check `mechanism`: on this GPU and model kind, else
    where they ran."""
    gpu, kind = spec.hardware.gpu.name, model_kind(spec.model)
    rows = [f for f in families if f.mechanism == mechanism]
    same = [f for f in rows if f.gpu == gpu and f.kind == kind]
    if same:
        f = same[0]
        return (f"{mechanism}: within {f.worst_abs_error:.0%} (median "
                f"{f.median_abs_error:.0%}) of its {f.runs} published {kind} run"
                f"{'s' if f.runs != 1 else ''} on {gpu}")
    if rows:
        where = ", ".join(f"{f.runs} {f.kind} on {f.gpu} (median {f.median_abs_error:.0%})"
                          for f in rows)
        return f"{mechanism}: checked only on other runs: {where}"
    return f"{mechanism}: no published run checks it"


def _general_trust(spec: Spec, families: tuple[Family, ...]) -> str:
    """The GPU and model kind's general family."""
    gpu = spec.hardware.gpu
    kind = model_kind(spec.model)
    known = [f for f in families if f.gpu == gpu.name and not f.mechanism]
    same = [f for f in known if f.kind == kind]
    if same:
        f = same[0]
        return (f"within {f.worst_abs_error:.0%} (median {f.median_abs_error:.0%}) of "
                f"{f.runs} published {kind} training runs on {gpu.name} "
                "(docs/validation-throughput.md), for the preset as shipped")
    if known:
        other = known[0]
        return (f"no published {kind} run on {gpu.name}; its {other.runs} {other.kind} "
                f"training runs are within {other.worst_abs_error:.0%}: expect more")
    return f"no published run on {gpu.name}: {_derived(spec)}"


BASES = {"measured": "scaled from a calibrated GPU by this GPU's measured GEMM plateau",
         "derived": "taken from a sibling GPU",
         "calibrated": "fitted to measured runs by llmpar calibrate (its leave-one-out error)"}
"""How a preset without runs got its matmul_efficiency, by the first word of its
`efficiency_source` (validation/published/gemm/matmul_efficiency.toml)."""


def _derived(spec: Spec) -> str:
    """What a GPU without runs rests on, from its preset."""
    gpu = spec.hardware.gpu
    words = gpu.efficiency_source.split()
    basis = BASES.get(words[0].rstrip(":") if words else "", "as its preset states")
    if gpu.efficiency_uncertainty is None:
        return f"matmul_efficiency {basis}; no stated uncertainty"
    return f"matmul_efficiency {basis}, expect +-{gpu.efficiency_uncertainty:.0%}"


SERVING_TRUST = ("not yet checked against published serving runs: each phase is a roofline "
                 "of its operations at the GPU's efficiencies with the collectives added, "
                 "without an engine's per-step scheduling and launch costs; expect slower "
                 "decode steps at small batch")
"""What a serving plan's times rest on, until serving has validation families of its own."""
