#!/usr/bin/env python3
"""The numbers every shipped training example had under the `megatron-core` and `nemo`
profiles before their switch to fused attention timed by its kernel: the reference the
`megatron-core-legacy` and `nemo-legacy` profiles must reproduce exactly
(tests/test_legacy_profiles.py).

Run once, on the commit before the switch (2f159f5, where `megatron-core` and `nemo`
kept Korthikanti et al. 2022's activation model, timed attention at matmul_efficiency and
the GPU presets held their efficiencies calibrated so):
  python validation/legacy_reference.py   # writes validation/data/legacy_profiles.json
Rerun later, it describes the code it runs under, not the reference: keep the file.
"""

from __future__ import annotations

import json
import subprocess
import tomllib
from pathlib import Path

import llmpar

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "validation" / "data" / "legacy_profiles.json"
PROFILES = ("megatron-core", "nemo")


def training_examples() -> list[Path]:
    """The shipped examples with a `[training]` table that names no framework (those
    that name one, torchtitan's, run under their own profile)."""
    found = []
    for path in sorted((ROOT / "specs" / "examples").glob("*.toml")):
        training = tomllib.loads(path.read_text()).get("training")
        if training is not None and "framework" not in training:
            found.append(path)
    return found


def numbers(path: Path, profile: str) -> dict[str, float | int | None]:
    """Step time and memory of one example under `profile`."""
    plan = llmpar.evaluate(path, {"training.framework": profile})
    peak = plan.training.memory_peak
    return {"step_seconds": plan.training.step_seconds, "total_bytes": plan.total_bytes,
            "allocated_bytes": None if peak is None else peak.allocated_bytes,
            "device_bytes": None if peak is None else peak.device_bytes}


def main() -> None:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.strip()
    found = {"what": "step_seconds and memory (plan total_bytes, training.memory_peak "
                     "allocated_bytes and device_bytes) of each shipped training example "
                     "that names no framework, with training.framework set to the profile, "
                     "before the switch to fused attention",
             "commit": commit,
             "profiles": {profile: {path.name: numbers(path, profile)
                                    for path in training_examples()}
                          for profile in PROFILES}}
    OUT.write_text(json.dumps(found, indent=1) + "\n")


if __name__ == "__main__":
    main()
