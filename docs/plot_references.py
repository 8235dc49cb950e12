"""The reference figures of docs/plots.md: each `llmpar plot` kind drawn from a shipped
example, written to docs/plots/<name>.png with the geometry of its labelled elements in
docs/plots/geometry.json (`llmpar.testing.figures`). tests/test_plot_references.py draws
each again and compares it with the geometry, so a plot that changes what a reader sees
fails until this is run again and the new figure looked at:

    python docs/plot_references.py          # needs matplotlib: pip install 'llmpar[plot]'
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PLOTS = ROOT / "docs" / "plots"
GEOMETRY = PLOTS / "geometry.json"
EXAMPLES = "specs/examples"
CASES: dict[str, tuple[str, tuple[str, ...]]] = {
    "memory": ("memory", (f"{EXAMPLES}/qwen3-4b-activations.toml",
                          f"{EXAMPLES}/adam-memory-7b.toml")),
    "sequence": ("sequence", (f"{EXAMPLES}/qwen3-4b-activations.toml",)),
    "batch-serving": ("batch", (f"{EXAMPLES}/inference-llama-2-70b-h100.toml",)),
    "pareto": ("pareto", (f"{EXAMPLES}/gpt3-175b-1024-a100.toml",)),
    "timeline": ("timeline", (f"{EXAMPLES}/llama-3-70b-tp8-pp4-cp2.toml",)),
    "waterfall": ("waterfall", (f"{EXAMPLES}/gpt3-175b-1024-a100.toml",)),
}
"""Reference name: (plot kind, the specs it is drawn from, relative to the repository)."""
DPI = 80
"""Resolution of the PNGs (the geometry is in fractions of the figure: any resolution)."""


def draw(name: str) -> Any:
    """The figure of reference `name`, as `llmpar plot` draws it."""
    import matplotlib

    matplotlib.use("Agg")
    import llmpar
    from llmpar.cli.plot import build_figure

    kind, specs = CASES[name]
    session = llmpar.Session(load_entry_points=False)
    figure = build_figure(session, kind, [str(ROOT / spec) for spec in specs], {})
    figure.set_dpi(DPI)  # laid out as the PNG is: constrained layout follows the dpi
    return figure


def main() -> int:
    from llmpar.testing.figures import figure_geometry

    PLOTS.mkdir(parents=True, exist_ok=True)
    geometry = {}
    for name in CASES:
        figure = draw(name)
        geometry[name] = figure_geometry(figure)  # as the test measures it: before saving
        figure.savefig(PLOTS / f"{name}.png", dpi=DPI)
        print(f"wrote {PLOTS / name}.png")
    GEOMETRY.write_text(json.dumps(geometry, indent=1) + "\n")
    print(f"wrote {GEOMETRY}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
