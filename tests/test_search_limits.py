"""A search's cost is bounded by its space: divisors without a loop up to the GPU count,
splits counted before they are listed, and `[search]` limits with a clear error."""

from __future__ import annotations

import itertools
import math
import time
from pathlib import Path

import pytest
from search_specs import MOE_MODEL, small_spec

import llmpar
from llmpar.search.arithmetic import FACTOR_LIMIT, DegreeProducts, divisors, prime_factors
from llmpar.search.prepare import prepare
from llmpar.spec.search import MAX_DEGREE_COMBINATIONS, MAX_LAYOUTS


def test_divisors_agree_with_a_plain_loop():
    for number in range(1, 1500):
        assert divisors(number) == tuple(d for d in range(1, number + 1) if number % d == 0)


@pytest.mark.parametrize(("number", "factors"), [
    (2**40, {2: 40}),
    (10**12, {2: 12, 5: 12}),
    (999_999_999_989, {999_999_999_989: 1}),  # a prime: a loop to its root takes 10**6 steps
    (2_147_483_647 * 2_147_483_659, {2_147_483_647: 1, 2_147_483_659: 1}),
    (2**61 - 1, {2**61 - 1: 1}),
])
def test_huge_counts_factor_at_once(number, factors):
    started = time.perf_counter()
    assert prime_factors(number) == factors
    found = divisors(number)
    assert time.perf_counter() - started < 2
    assert len(found) == math.prod(e + 1 for e in factors.values())
    assert all(number % d == 0 for d in found) and list(found) == sorted(found)


def test_counts_past_the_factoring_limit_are_refused():
    with pytest.raises(ValueError, match="2\\*\\*63"):
        prime_factors(FACTOR_LIMIT)


@pytest.mark.parametrize("number", [1, 7, 12, 36, 64, 360])
@pytest.mark.parametrize("narrow", [False, True])
def test_degree_products_count_and_list_what_a_nested_loop_finds(number, narrow):
    every = divisors(number)
    some = every[::2] if narrow else every
    options = {"tensor": some, "context": every, "pipeline": every[:3]}
    for fill in (None, set(every), set(some)):
        products = DegreeProducts(number, options, fill)
        expected = []
        for combo in itertools.product(*options.values()):
            product = math.prod(combo)
            rest = number // product if number % product == 0 else None
            if rest is not None and (rest == 1 if fill is None else rest in fill):
                expected.append(dict(zip(options, combo)))
        assert products.count == len(expected)
        assert list(products.choices()) == expected


def test_degree_products_of_a_highly_composite_count_are_counted_at_once():
    number = 963_761_198_400  # 6,720 divisors
    started = time.perf_counter()
    products = DegreeProducts(number, {n: divisors(number) for n in ("t", "c", "p")},
                              divisors(number))
    assert products.count == 84 * 35 * 10 * 4**6  # each prime's exponent split four ways
    assert time.perf_counter() - started < 2


def _huge(num_gpus: int, **search):
    """The small model on `num_gpus`, every default of `[search]` but `search`."""
    return small_spec(num_gpus, training={"sequence_length": 512,
                                          "global_batch_size": num_gpus}, search=search)


def test_two_to_the_forty_gpus_are_refused_in_a_second_naming_the_limit():
    started = time.perf_counter()
    with pytest.raises(llmpar.SpecError) as error:
        llmpar.search(_huge(2**40))
    assert time.perf_counter() - started < 5
    [problem] = error.value.problems
    assert problem.path == "$.search.max_layouts"
    assert f"{MAX_LAYOUTS:,}" in problem.message
    assert "max_degrees" in problem.message and "[parallel.*]" in problem.message


def test_splits_over_the_limit_are_counted_without_listing_them():
    started = time.perf_counter()
    with pytest.raises(llmpar.SpecError) as error:
        llmpar.search(_huge(10**12))
    assert time.perf_counter() - started < 5
    [problem] = error.value.problems
    assert problem.path == "$.search.max_degree_combinations"
    assert "207,025 combinations" in problem.message  # 455**2: C(15, 3) per prime
    assert f"{MAX_DEGREE_COMBINATIONS:,}" in problem.message


def test_a_large_prime_gpu_count_has_a_small_space():
    prepared = prepare(llmpar.default_session(), _huge(999_999_999_989), {}, {})
    degrees = [node.degrees for node in prepared.space.nodes]
    # One of the four strategies takes every GPU; the others are 1.
    assert sorted(max(d, key=d.__getitem__) for d in degrees) == sorted(
        ["context", "data", "pipeline", "tensor"])


def test_narrowing_brings_a_huge_count_under_the_limits():
    spec = _huge(2**40, max_degrees={"tensor": 8, "pipeline": 8, "context": 1},
                 recompute=["full"])
    prepared = prepare(llmpar.default_session(), spec, {}, {})
    assert len(prepared.space.nodes) == 16  # tensor and pipeline each 1, 2, 4 or 8


def test_the_layout_limit_is_inclusive_and_names_its_count():
    considered = llmpar.search(small_spec(), top=1).considered
    assert llmpar.search(small_spec(), top=1,
                         constraints={"max_layouts": considered}).considered == considered
    with pytest.raises(llmpar.SpecError) as error:
        llmpar.search(small_spec(), constraints={"max_layouts": considered - 1})
    assert error.value.problems[0].path == "$.search.max_layouts"
    assert f"limit of {considered - 1:,}" in error.value.problems[0].message


def test_one_node_larger_than_the_limit_is_refused_before_it_is_laid_out():
    with pytest.raises(llmpar.SpecError) as error:
        llmpar.search(small_spec(), constraints={"max_layouts": 1})
    assert error.value.problems[0].path == "$.search.max_layouts"


def test_the_split_limit_counts_the_degrees_chosen_beside_them():
    spec = small_spec(model=MOE_MODEL)
    splits = len({tuple(sorted((k, v) for k, v in n.degrees.items() if k != "expert"))
                  for n in prepare(llmpar.default_session(), spec, {}, {}).space.nodes})
    with pytest.raises(llmpar.SpecError) as error:
        llmpar.search(spec, constraints={"max_degree_combinations": splits})
    message = error.value.problems[0].message
    assert f"{splits:,} combinations of degrees" in message and "expert" in message
    with pytest.raises(llmpar.SpecError, match="over the limit of 1;"):
        llmpar.search(spec, constraints={"max_degree_combinations": 1})


@pytest.mark.parametrize("key", ["max_layouts", "max_degree_combinations"])
def test_limits_must_be_positive_integers(key):
    with pytest.raises(llmpar.SpecError) as error:
        llmpar.search(small_spec(search={key: 0}))
    assert error.value.problems[0].path == f"$.search.{key}"


ROOT = Path(__file__).resolve().parent.parent
SHIPPED = sorted(str(p.relative_to(ROOT)) for folder in ("specs/examples", "benchmarks/specs")
                 for p in (ROOT / folder).glob("*.toml"))


@pytest.mark.parametrize("path", SHIPPED)
def test_every_shipped_spec_fits_under_the_default_limits(path):
    try:
        prepared = prepare(llmpar.default_session(), str(ROOT / path), {}, {})
    except llmpar.SpecError as error:  # serving specs, specs without a fixed batch
        assert not any(p.path.startswith("$.search.max_") for p in error.problems)
        return
    assert prepared.space.considered <= MAX_LAYOUTS
    assert len(prepared.space.nodes) <= MAX_DEGREE_COMBINATIONS
