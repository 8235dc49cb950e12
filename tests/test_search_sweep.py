"""llmpar.sweep: many specs, here or on any concurrent.futures executor (Dask too)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from search_specs import small_spec

import llmpar

SPECS = [small_spec(num_gpus=2), small_spec(num_gpus=4)]


def summary(result: llmpar.SearchResult) -> tuple:
    return result.considered, [r.choices for r in result.results]


def test_sweep_searches_each_spec_in_order():
    results = llmpar.sweep(SPECS, top=2)
    assert [r.best.plan.num_gpus for r in results] == [2, 4]
    assert summary(results[1]) == summary(llmpar.search(SPECS[1], top=2))


def test_sweep_can_evaluate_instead():
    specs = [{**small_spec(num_gpus=n), "training": {"sequence_length": 512,
                                                     "global_batch_size": 8}}
             for n in (1, 2)]
    plans = llmpar.sweep(specs, mode="evaluate")
    assert plans == [llmpar.evaluate(spec) for spec in specs]


def test_sweep_runs_on_an_executor():
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = llmpar.sweep(SPECS, pool, top=2)
    assert [summary(r) for r in results] == [summary(r) for r in llmpar.sweep(SPECS, top=2)]


def test_sweep_rejects_an_unknown_mode():
    with pytest.raises(ValueError, match="mode"):
        llmpar.sweep(SPECS, mode="plan")


def test_sweep_on_a_dask_cluster():
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        results = llmpar.sweep(SPECS, client.get_executor(), top=2)
    assert [summary(r) for r in results] == [summary(r) for r in llmpar.sweep(SPECS, top=2)]
