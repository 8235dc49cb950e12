"""llmpar's own launch targets, registered through `llmpar_launch_targets` exactly as a
third-party plugin's are (entry point `launch` in llmpar's package metadata)."""

from __future__ import annotations

from collections.abc import Callable

from llmpar.hookspecs import hookimpl
from llmpar.launch.deepspeed import DeepSpeedTarget
from llmpar.launch.fsdp2 import Fsdp2Target
from llmpar.launch.hf_trainer import HfTrainerTarget
from llmpar.launch.megatron import MegatronTarget
from llmpar.launch.nemo import BRIDGE_TARGET, NemoTarget
from llmpar.launch.sglang import SglangTarget
from llmpar.launch.target import LaunchTarget
from llmpar.launch.torchtitan import TorchtitanTarget
from llmpar.launch.trtllm import TrtLlmTarget
from llmpar.launch.vllm import VllmTarget


@hookimpl
def llmpar_launch_targets(register: Callable[[LaunchTarget], None]) -> None:
    register(MegatronTarget())
    register(NemoTarget())
    register(BRIDGE_TARGET)
    register(TorchtitanTarget())
    register(DeepSpeedTarget())
    register(Fsdp2Target())
    register(HfTrainerTarget())
    register(VllmTarget())
    register(SglangTarget())
    register(TrtLlmTarget())
