"""DeepEP's low-latency decode kernels (`llmpar.communication.deepep`), checked against
the kernel measurements they come from."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

import llmpar
from llmpar.communication.deepep import (
    COMBINE_BYTES_PER_ELEMENT,
    DISPATCH_BYTES_PER_ELEMENT,
    MEAN_BYTES_PER_ELEMENT,
    low_latency_call_seconds,
    low_latency_shares,
)

TABLE = tomllib.loads((Path(__file__).resolve().parent.parent / "validation" / "published"
                       / "kernels" / "deepep_low_latency_h800.toml").read_text())


@pytest.mark.parametrize("row", TABLE["rows"], ids=lambda r: f"EP{r['expert_ranks']}")
def test_shares_are_the_measured_bandwidths_over_the_nic(row):
    dispatch, combine = low_latency_shares(row["expert_ranks"])
    nic = TABLE["nic_bytes_per_s"]
    assert dispatch * nic == pytest.approx(row["dispatch_gb_per_s"] * 1e9)
    assert combine * nic == pytest.approx(row["combine_gb_per_s"] * 1e9)


@pytest.mark.parametrize("row", TABLE["rows"], ids=lambda r: f"EP{r['expert_ranks']}")
def test_the_measured_setting_gives_back_the_measured_latencies(row):
    # 128 tokens a rank, top-8, hidden 7168: one dispatch and one combine, no latency added.
    elements = TABLE["tokens"] * TABLE["experts_per_token"] * TABLE["hidden"]
    nic = TABLE["nic_bytes_per_s"]
    both = 2 * low_latency_call_seconds(elements * MEAN_BYTES_PER_ELEMENT,
                                        row["expert_ranks"], nic, 0.0)
    measured = (row["dispatch_microseconds"] + row["combine_microseconds"]) * 1e-6
    assert both == pytest.approx(measured, rel=0.025)
    dispatch, _ = low_latency_shares(row["expert_ranks"])
    assert elements * DISPATCH_BYTES_PER_ELEMENT / (dispatch * nic) == pytest.approx(
        row["dispatch_microseconds"] * 1e-6, rel=0.025)
    assert COMBINE_BYTES_PER_ELEMENT == 2.0


def test_shares_fall_with_the_ranks_and_hold_beyond_the_table():
    ranks = [4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256, 512]
    dispatch = [low_latency_shares(r)[0] for r in ranks]
    assert dispatch == sorted(dispatch, reverse=True)
    assert low_latency_shares(4) == low_latency_shares(8)
    assert low_latency_shares(512) == low_latency_shares(256)
    low, high = low_latency_shares(32)[0], low_latency_shares(64)[0]
    assert low > low_latency_shares(48)[0] > high


def _decode_collectives(dispatcher: str, num_gpus: int) -> list[dict]:
    spec = {"model": "deepseek-v3", "hardware": {"cluster": "dgx-h100", "num_gpus": num_gpus},
            "inference": {"batch_size": 128, "prompt_tokens": 2000, "generated_tokens": 64,
                          "weights": "fp8", "weights_group_size": 16384},
            "parallel": {"data": {"degree": num_gpus},
                         "expert": {"degree": num_gpus, "dispatcher": dispatcher}}}
    collectives = llmpar.evaluate(spec).to_dict()["serving"][0]["collectives"]
    return [c for c in collectives if c["reason"].startswith("decode")]


def test_deepep_decode_across_nodes_runs_the_low_latency_kernels():
    [decode] = _decode_collectives("deepep", 64)
    assert decode["name"] == "expert.serving-low-latency-all-to-all"
    assert decode["algorithm"] == "deepep-low-latency"
    hardware = llmpar.load_spec({"model": "deepseek-v3",
                                 "hardware": {"cluster": "dgx-h100", "num_gpus": 64}}).hardware
    per_call = low_latency_call_seconds(decode["buffer_bytes"], 64,
                                        hardware.inter_node_bandwidth_bytes_per_s,
                                        hardware.inter_node_latency_seconds)
    assert decode["seconds"] == pytest.approx(per_call * decode["calls_per_step"], rel=1e-6)
    # Every routed copy of the 128 tokens, FP8 out and bf16 back.
    assert decode["buffer_bytes"] == pytest.approx(128 * 8 * 7168 * MEAN_BYTES_PER_ELEMENT,
                                                   abs=1)


def test_nccl_and_one_node_keep_the_all_to_all():
    [nccl] = _decode_collectives("all-to-all", 64)
    [inside] = _decode_collectives("deepep", 8)
    assert nccl["name"] == inside["name"] == "expert.serving-all-to-all"


def _prefill_all_to_all(dispatcher: str, weights: str) -> dict:
    spec = {"model": "deepseek-v3", "hardware": {"cluster": "dgx-h100", "num_gpus": 32},
            "inference": {"batch_size": 4, "prompt_tokens": 4096, "generated_tokens": 2,
                          "weights": weights},
            "parallel": {"data": {"degree": 32},
                         "expert": {"degree": 32, "dispatcher": dispatcher}}}
    collectives = llmpar.evaluate(spec).to_dict()["serving"][0]["collectives"]
    [prefill] = [c for c in collectives if c["reason"].startswith("prefill")]
    return prefill


def test_deepep_prefill_dispatches_fp8_where_the_experts_compute_in_fp8():
    # 16,384 prompt tokens over 4 nodes of 8 expert ranks: each token crosses to
    # 3 (1 - (3/4)^8) remote nodes, and the buffer's network share is 24 / 32 of it.
    copies = 3 * (1 - 0.75**8) * 32 / 24
    elements = 16384 * copies * 7168
    fp8 = _prefill_all_to_all("deepep", "fp8")
    # FP8 out with one fp32 scale per 128 channels, bf16 back: the mean of the two.
    assert fp8["buffer_bytes"] == pytest.approx(elements * (1 + 4 / 128 + 2) / 2, abs=2)
    assert fp8["buffer_bytes"] == pytest.approx(elements * MEAN_BYTES_PER_ELEMENT, abs=2)
    # bf16 experts, or NCCL's all-to-all (k copies), move bf16 both ways.
    assert _prefill_all_to_all("deepep", "bf16")["buffer_bytes"] == pytest.approx(
        elements * 2, abs=2)
    assert _prefill_all_to_all("all-to-all", "fp8")["buffer_bytes"] == pytest.approx(
        16384 * 8 * 7168 * 2, abs=2)


NORMAL = tomllib.loads((Path(__file__).resolve().parent.parent / "validation" / "published"
                        / "kernels" / "deepep_normal_h800.toml").read_text())


def _nic_level(row: dict) -> tuple[float, float]:
    """A normal-kernel row's bandwidths over the NIC: DeepEP counts a token once per node
    hosting one of its experts, its own node included; the NIC carries (N - 1) / N."""
    nodes = row["expert_ranks"] / NORMAL["gpus_per_node"]
    remote = (nodes - 1) / nodes
    return row["dispatch_gb_per_s"] * 1e9 * remote, row["combine_gb_per_s"] * 1e9 * remote


def test_deepeps_count_of_nodes_less_its_own_is_llmpars_network_copies():
    # Uniform routing over N nodes (no group limit binds at N <= 4): DeepEP counts
    # N (1 - (1 - 1/N)^k) nodes a token, llmpar sends (N - 1)(1 - (1 - 1/N)^k) copies over
    # the network: the counted bytes times (N - 1) / N.
    from llmpar.strategies.expert import network_copies

    k = NORMAL["experts_per_token"]
    for nodes in (2, 4):
        e = nodes * NORMAL["gpus_per_node"]
        counted = nodes * (1 - (1 - 1 / nodes) ** k)
        network = network_copies("deepep", k, e, NORMAL["gpus_per_node"]) * (e - 8) / e
        assert network == pytest.approx(counted * (nodes - 1) / nodes)


def test_prefill_all_to_all_bandwidth_lies_within_the_normal_kernels_measurements():
    # llmpar costs a prefill's DeepEP all-to-all on the NIC at inter-node bandwidth x
    # collective_efficiency (400 Gb/s x 0.8 = 40 GB/s on the dgx-h100 cluster); the normal
    # kernels' NIC-level bandwidths at 4 and 8 nodes span 33 to 45 GB/s over the two
    # versions of the table (a check, not a fit).
    hardware = llmpar.load_spec({"model": "gpt2", "hardware": {"cluster": "dgx-h100"},
                                 "inference": {"prompt_tokens": 1, "generated_tokens": 1}}
                                ).hardware
    costed = hardware.inter_node_bandwidth_bytes_per_s * hardware.collective_efficiency
    assert costed == pytest.approx(40e9)
    measured = [bandwidth for version in NORMAL["version"] for row in version["rows"]
                if row["expert_ranks"] in (32, 64) for bandwidth in _nic_level(row)]
    assert min(measured) < costed < max(measured)
    assert min(measured) == pytest.approx(33e9) and max(measured) == pytest.approx(44.625e9)
    # Every inter-node row stays under the NIC's 50 GB/s once its own node's copies are out.
    rows = [row for version in NORMAL["version"] for row in version["rows"]
            if row["link"] == "rdma"]
    assert all(max(_nic_level(row)) < NORMAL["nic_bytes_per_s"] for row in rows)
