"""What the hybrid-model inventory tests share: a model's fused activation groups."""

from __future__ import annotations

import llmpar
from llmpar.footprint.baseline import baseline_footprint
from llmpar.footprint.inventory import LayerGroup

SESSION = llmpar.Session(load_entry_points=False)


def fused_groups(name: str, **parallel: object) -> dict[str, LayerGroup]:
    """Model preset `name`'s fused inventory by layer kind, at 4,096 tokens on 4 H100s
    under the layout `parallel`."""
    spec = SESSION.load_spec({"model": name, "hardware": {"gpu": "h100-sxm", "num_gpus": 4},
                              "training": {"sequence_length": 4096,
                                           "activation_model": "fused"},
                              "parallel": parallel})
    inventory = baseline_footprint(spec).activations
    assert inventory is not None
    return {group.kind: group for group in inventory.groups}
