"""Print `name==version` for every runtime dependency and test tool that pyproject.toml
bounds below with `>=`: the oldest versions llmpar says it works with, for
.ci/minimum-versions to install. Linters (ruff, mypy) are left out: they check the code,
they do not run it."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

LEFT_OUT = {"ruff", "mypy"}
BOUND = re.compile(r"^\s*([A-Za-z0-9_.-]+)(\[[^\]]*\])?\s*>=\s*([0-9][0-9A-Za-z.]*)\s*$")


def lower_bounds(pyproject: Path) -> list[str]:
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    wanted = project["dependencies"] + project["optional-dependencies"]["test"]
    pins = []
    for requirement in wanted:
        match = BOUND.match(requirement.split(";")[0])
        if match is None:
            raise SystemExit(f"no lower bound to test in {requirement!r}")
        name, _extras, version = match.groups()
        if name not in LEFT_OUT:
            pins.append(f"{name}=={version}")
    return pins


if __name__ == "__main__":
    root = Path(__file__).resolve().parent.parent
    print("\n".join(lower_bounds(root / "pyproject.toml")))
    sys.exit(0)
