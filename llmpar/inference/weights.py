"""Weights on one GPU under the layout: each parameter group at its format, divided by
the shards the strategies state (tensor: heads, with KV heads copied past t > n_kv, see
`llmpar.strategies.tensor.attention_divisor`; expert: the routed experts), for the
layers a pipeline stage holds (`llmpar.evaluation.stages.stage_parameters`).
"""

from __future__ import annotations

from collections.abc import Mapping

from llmpar.evaluation.compose import Composition
from llmpar.inference.formats import bytes_per_parameter
from llmpar.spec import Spec
from llmpar.strategy import Transform


def weight_bytes_by_group(spec: Spec, parameters: Mapping[str, float],
                          transforms: list[Transform] | Composition) -> dict[str, float]:
    """Bytes of each group of `parameters` on one GPU, at its format, under the shards
    (of `transforms`, or of their composition, indexed once for many calls)."""
    assert spec.inference is not None
    activations = spec.precision.activations
    composition = (transforms if isinstance(transforms, Composition)
                   else Composition(transforms))
    return {group: composition.held({group: count},
                                    bytes_per_parameter(group, spec.inference, activations),
                                    "weights")
            for group, count in parameters.items()}


def weight_bytes(spec: Spec, parameters: Mapping[str, float],
                 transforms: list[Transform] | Composition) -> float:
    """All weights of `parameters` on one GPU."""
    return sum(weight_bytes_by_group(spec, parameters, transforms).values())
