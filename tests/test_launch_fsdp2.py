"""The PyTorch FSDP2 snippet read back (`llmpar import --from pytorch-fsdp2`): the mesh,
the sharding, the formats and the batch constants, and a Problem naming the call for
what it cannot read. The round trip over the shipped examples is in test_launch.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmpar.errors import SpecError
from llmpar.launch.fsdp2_read import read_snippet
from llmpar.session import Session

ROOT = Path(__file__).resolve().parents[1]
FSDP = ROOT / "specs/examples/llama-3-8b-fsdp-8-h100.toml"
HEADER = ("import torch\nfrom torch.distributed.device_mesh import init_device_mesh\n"
          "from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard\n")


@pytest.fixture(scope="module")
def session() -> Session:
    return Session(load_entry_points=False, environ={})


def snippet(session: Session, changes: dict[str, object]) -> str:
    spec = session.load_spec(FSDP, changes)
    return session.launch(spec, "fsdp2").files[0].text


def test_hsdp_mesh_reads_as_replicas_times_shard_group(session: Session) -> None:
    """A (2, 4) mesh named replicate x shard: 8 data ranks, each state sharded over 4."""
    text = snippet(session, {"parallel.data.shard_degree": 4,
                             "parallel.data.reshard_after_forward": False,
                             "parallel.data.gradient_sync": "last-micro-batch",
                             "parallel.data.reduce_dtype": "fp32"})
    assert 'init_device_mesh("cuda", (2, 4)' in text
    read = read_snippet(text, "fsdp2_setup.py")
    assert {key: read.settings[key] for key in (
        "parallel.data.degree", "parallel.data.shard_degree",
        "parallel.data.reshard_after_forward", "parallel.data.gradient_sync",
        "parallel.data.reduce_dtype")} == {
        "parallel.data.degree": 8, "parallel.data.shard_degree": 4,
        "parallel.data.reshard_after_forward": False,
        "parallel.data.gradient_sync": "last-micro-batch", "parallel.data.reduce_dtype": "fp32"}
    # 8 micro-batches of 1 on 8 ranks: the example's 64 sequences of 8,192 tokens
    assert (read.settings["training.micro_batch_size"], read.settings["training.sequence_length"],
            read.settings["training.global_batch_size"]) == (1, 8192, 64)


def test_ddp_reads_as_zero_0_and_full_checkpointing_as_full_recompute(
        session: Session) -> None:
    text = snippet(session, {"parallel.data.zero": 0, "parallel.data.fsdp": False,
                             "training.recompute": "full"})
    assert "DistributedDataParallel(model)" in text and "apply_activation_checkpointing" in text
    read = read_snippet(text, "fsdp2_setup.py")
    assert (read.settings["parallel.data.zero"], read.settings["parallel.data.fsdp"],
            read.settings["training.recompute"]) == (0, False, "full")
    # no mesh: the data degree is the base's or the cluster's, and DDP's gradient format
    # (not written) is not claimed
    assert "parallel.data.degree" not in read.settings
    assert "parallel.data.reduce_dtype" not in read.owned


@pytest.mark.parametrize(("text", "path"), [
    ("def broken(:\n", "$"),
    ("x = 1\0\n", "$"),
    (HEADER + "shape = (8,)\nmesh = init_device_mesh('cuda', shape)\n"
     "fully_shard(model, mesh=mesh)\n", "$.init_device_mesh"),
    (HEADER + "mesh = init_device_mesh('cuda', (8, 0))\nfully_shard(model, mesh=mesh)\n",
     "$.init_device_mesh"),
    (HEADER + "mesh = init_device_mesh('cuda', (8,))\n"
     "policy = MixedPrecisionPolicy(param_dtype=torch.float8_e4m3fn)\n"
     "fully_shard(model, mesh=mesh, mp_policy=policy)\n", "$.MixedPrecisionPolicy.param_dtype"),
    (HEADER + "MICRO_BATCH_SIZE = 0\nmesh = init_device_mesh('cuda', (8,))\n"
     "fully_shard(model, mesh=mesh)\n", "$.MICRO_BATCH_SIZE"),
    (HEADER + "model = build()\n", "$"),
])
def test_what_it_cannot_read_is_a_problem_naming_the_call(text: str, path: str) -> None:
    with pytest.raises(SpecError) as error:
        read_snippet(text, "train.py")
    assert [problem.path for problem in error.value.problems] == [path]
    assert "train.py" in str(error.value)


def test_fp8_products_are_listed_not_written_as_bf16(session: Session) -> None:
    spec = session.load_spec(FSDP, {"precision.linear": "fp8-rowwise"})
    listed = {u.path for u in session.launch(spec, "fsdp2").unmapped}
    assert "$.precision.linear" in listed
