"""Load a script of validation/ as a module, for the tests that check its rows; skip the
calling test module where validation/ is not part of the tree (an sdist ships none)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

VALIDATION = Path(__file__).resolve().parents[1] / "validation"


def load_script(name: str) -> ModuleType:
    """validation/<name>.py as a module."""
    path = VALIDATION / f"{name}.py"
    if not path.is_file():
        pytest.skip("validation/ is not part of this tree", allow_module_level=True)
    spec = importlib.util.spec_from_file_location(f"llmpar_validation_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
