"""`llmpar search` on serving specs, as properties (Hypothesis; deterministic under the `ci`
profile): whatever the limits and the percentile they bound, every layout returned fits,
meets `[search] ttft_seconds_max` and `tpot_seconds_max` on its own evaluated plan at that
percentile, and every layout tried is either returned or counted under the reason it was
set aside; a tighter limit never returns more layouts."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

import llmpar
from llmpar.search.serving import search_serving

PERCENTILE_FIELD = {"mean": "ttft_seconds", "p90": "ttft_p90_seconds",
                    "p99": "ttft_p99_seconds"}


def _spec(ttft: float, tpot: float, percentile: str, rate: float) -> dict[str, Any]:
    return {"model": "llama-3-8b", "hardware": {"cluster": "dgx-h100", "num_gpus": 4},
            "inference": {"engine": "vllm", "request_rate_per_s": rate,
                          "prompt_tokens": 1024, "generated_tokens": 128},
            "search": {"ttft_seconds_max": ttft, "tpot_seconds_max": tpot,
                       "percentile": percentile}}


@settings(max_examples=8)  # each example evaluates every layout of 4 GPUs
@given(st.floats(0.05, 5.0), st.floats(0.005, 0.1), st.sampled_from(sorted(PERCENTILE_FIELD)),
       st.floats(0.5, 20.0), st.floats(0.3, 0.9))
def test_every_result_meets_its_limits_at_its_percentile(ttft, tpot, percentile, rate,
                                                          tighter):
    session = llmpar.Session()
    result = search_serving(session, session.load_spec(_spec(ttft, tpot, percentile, rate)),
                            objective="step_time", top=50)
    assert sum(result.rejected.values()) + len(result.results) == result.tried
    for candidate in result.results:
        plan = session.evaluate(candidate.table)
        state = plan.serving[0].continuous
        assert plan.fits and state is not None and state.stable
        assert getattr(state, PERCENTILE_FIELD[percentile]) == candidate.ttft_seconds <= ttft
        assert state.tpot_seconds == candidate.tpot_seconds <= tpot
    tight = search_serving(session, session.load_spec(
        _spec(ttft * tighter, tpot * tighter, percentile, rate)), objective="step_time",
        top=50)
    kept = {tuple(sorted(c.layout.items())) for c in result.results}
    assert {tuple(sorted(c.layout.items())) for c in tight.results} <= kept
