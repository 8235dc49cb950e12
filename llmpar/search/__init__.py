"""Layout search: every valid parallel layout of a model on N GPUs, ranked.

    import llmpar
    result = llmpar.search("benchmarks/specs/gpt3-175b-1024-a100.toml", top=5)
    result.best.plan.step_seconds, result.considered, result.rejected

See docs/search.md.
"""

from llmpar.search.dimension import Point, SearchDimension
from llmpar.search.engine import search
from llmpar.search.hardware import HardwareEntry, HardwareSearchResult, search_hardware
from llmpar.search.result import ParetoPoint, Ranked, SearchResult
from llmpar.search.sweep import sweep

__all__ = ["HardwareEntry", "HardwareSearchResult", "ParetoPoint", "Point", "Ranked",
           "SearchDimension", "SearchResult", "search", "search_hardware", "sweep"]
