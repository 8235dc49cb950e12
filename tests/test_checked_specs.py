"""A session checks a spec object once (specs are frozen): the same object evaluates
without being checked again, and any other object, an evolved one included, is checked."""

from __future__ import annotations

import attrs
import pytest

import llmpar
from llmpar import session as session_module
from llmpar.evaluation.cache import EvaluationCache

SPEC = {"model": "llama-3-8b", "hardware": {"gpu": "h100-sxm", "num_gpus": 8},
        "parallel": {"tensor": {"degree": 8}}}


def counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    checked = session_module.checked_layout

    def counted(*args, **kwargs):
        calls.append(1)
        return checked(*args, **kwargs)

    monkeypatch.setattr(session_module, "checked_layout", counted)
    return calls


def test_the_same_spec_object_is_checked_once(monkeypatch):
    calls = counting(monkeypatch)
    session = llmpar.Session(load_entry_points=False)
    spec = session.load_spec(SPEC)
    first = session.evaluate(spec)
    assert session.evaluate(spec).to_dict() == first.to_dict()
    assert len(calls) == 1


def test_another_object_is_checked_again(monkeypatch):
    calls = counting(monkeypatch)
    session = llmpar.Session(load_entry_points=False)
    spec = session.load_spec(SPEC)
    wrong = attrs.evolve(spec, hardware=attrs.evolve(spec.hardware, num_gpus=12))
    with pytest.raises(llmpar.SpecError) as error:
        session.evaluate(wrong)
    assert [p.path for p in error.value.problems] == ["$.parallel.data.degree"]
    session.evaluate(session.load_spec(SPEC))
    assert len(calls) == 3


def test_a_session_keeping_nothing_checks_every_time(monkeypatch):
    calls = counting(monkeypatch)
    session = llmpar.Session(load_entry_points=False)
    session.cache = EvaluationCache(size=0)
    spec = session.load_spec(SPEC)
    session.evaluate(spec)
    session.evaluate(spec)
    assert len(calls) == 3
