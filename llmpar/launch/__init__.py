"""From a plan to what a framework runs, and back: launch targets (`llmpar launch`,
`llmpar import`). See `llmpar.launch.target` for the contract."""

from llmpar.launch.target import (
    Launch,
    LaunchFile,
    LaunchTarget,
    PlannedLaunchTarget,
    ReadingTarget,
    ReadSettings,
    Unmapped,
)

__all__ = ["Launch", "LaunchFile", "LaunchTarget", "PlannedLaunchTarget", "ReadSettings",
           "ReadingTarget", "Unmapped"]
