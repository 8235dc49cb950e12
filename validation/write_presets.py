#!/usr/bin/env python3
"""Write the model presets that come from a published config.json.

Every `validation/configs/<name>.json` with a `_cite` key (the paper or model card the preset
also cites) becomes `specs/models/<name>.toml`: the table `llmpar import-hf` prints for that
config, its `source` followed by the citation. The tests check that each such preset is what
this script writes, so a preset and its config cannot drift apart.

Usage:
  python validation/write_presets.py           # write every preset
  python validation/write_presets.py --check   # exit 1 when a preset differs
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from llmpar.hf import model_table_from_hf, model_toml  # noqa: E402

CONFIGS = ROOT / "validation" / "configs"
MODELS = ROOT / "specs" / "models"


def cited_configs() -> list[Path]:
    """The configs that are the source of a preset (those with `_cite`)."""
    return [path for path in sorted(CONFIGS.glob("*.json"))
            if "_cite" in json.loads(path.read_text(encoding="utf-8"))]


def preset_text(config: Path) -> str:
    """The preset TOML of one config: import-hf's table, the citation after its source."""
    cite = json.loads(config.read_text(encoding="utf-8"))["_cite"]
    table = model_table_from_hf(config)
    table["source"] = f"{table['source']}; {cite}"
    return model_toml(table)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare, write nothing")
    args = parser.parse_args()
    stale = []
    for config in cited_configs():
        target = MODELS / f"{config.stem}.toml"
        text = preset_text(config)
        if target.is_file() and target.read_text(encoding="utf-8") == text:
            continue
        stale.append(target.name)
        if not args.check:
            target.write_text(text, encoding="utf-8")
    verb = "differ" if args.check else "written"
    print(f"{len(stale)} preset(s) {verb}: {', '.join(stale) or '-'}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
