"""The layout search varies what is offloaded, on its fast path, when the spec has a
`[parallel.offload]` table, and never otherwise."""

from __future__ import annotations

import llmpar

SMALL = {"num_layers": 4, "hidden_size": 256, "num_attention_heads": 8, "num_kv_heads": 4,
         "ffn_hidden_size": 1024, "ffn_activation": "swiglu", "vocab_size": 1000}


def spec(offload=None, memory="533 MB"):
    """A GPU of `memory`: about 486 MB of it go to the CUDA context and the two cuBLAS
    workspaces (PyTorch's and Transformer Engine's, 32 MiB each on Hopper), which every
    layout's device peak holds (plan schema 2)."""
    table = {"model": SMALL,
             "hardware": {"cluster": "dgx-h100", "num_gpus": 4, "gpus_per_node": 4,
                          "gpu": {"preset": "h100-sxm", "memory_bytes": memory}},
             "training": {"sequence_length": 256, "global_batch_size": 8},
             "search": {"micro_batch_sizes": [1], "recompute": ["full"]}}
    if offload is not None:
        table["parallel"] = {"offload": offload}
    return table


def test_offloading_is_searched_only_with_a_table(session):
    plain = llmpar.search(spec(), session=session)
    searched = llmpar.search(spec({}), session=session)
    assert searched.considered > plain.considered
    assert not any(r.choices.get("offload.optimizer") for r in plain.results)
    # the layout that needs the least memory offloads
    smallest = llmpar.search(spec({}), objective="memory", top=1, session=session).best
    assert smallest.choices["offload.optimizer"] and smallest.plan.host_bytes > 0


def test_the_fast_path_finds_what_one_by_one_evaluation_finds(session):
    fast = llmpar.search(spec({}), session=session, top=5)
    exact = llmpar.search(spec({}), session=session, top=5, exact=True)
    assert [r.choices for r in fast.results] == [r.choices for r in exact.results]
    assert (fast.evaluated, fast.rejected) == (exact.evaluated, exact.rejected)
    assert [p.total_bytes for p in fast.pareto] == [p.total_bytes for p in exact.pareto]


def test_weights_are_offloaded_only_where_the_search_chose_zero_3(session):
    found = llmpar.search(spec({}), session=session, top=200, objective="memory")
    offloaded = [r for r in found.results if r.choices.get("offload.weights")]
    assert offloaded and all(r.choices["data.zero"] == 3 for r in offloaded)
    assert "$.parallel.offload.weights" not in found.rejected  # never enumerated otherwise
