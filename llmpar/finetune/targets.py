"""The linear layers LoRA can target, by PEFT's module names, with their shapes.

Shapes are those of the `nn.Linear` modules Hugging Face transformers builds for a
Llama-style block (LlamaAttention, LlamaMLP; Mixtral's and Qwen-MoE's experts are the
same MLP per expert): q_proj h -> heads x head_dim, k_proj and v_proj h -> kv_heads x
head_dim (grouped-query attention: Ainslie et al. 2023, arXiv:2305.13245), o_proj back
to h; gate_proj and up_proj h -> ffn, down_proj ffn -> h (an ungated MLP has no
gate_proj). MLA (DeepSeek-V2, arXiv:2405.04434, Eqs. 9-13) has its own projections:
"all-linear" takes them (q_a_proj / q_b_proj or q_proj, kv_a_proj_with_mqa, kv_b_proj,
o_proj).
"""

from __future__ import annotations

import attrs

from llmpar.spec import Model

ATTENTION_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_TARGETS = ("gate_proj", "up_proj", "down_proj")


@attrs.frozen(kw_only=True)
class Linear:
    """One kind of linear layer: `copies` of it in each of `layers` blocks, of which a
    token passes through `active` (routed experts: experts_per_token)."""

    name: str
    """PEFT's module name."""
    group: str
    """The parameter group of its weight (llmpar.footprint.parameters)."""
    in_features: int
    out_features: int
    layers: int
    copies: int = 1
    active: float = 1.0

    @property
    def weights(self) -> int:
        """Weight elements of all its copies in all its blocks."""
        return self.in_features * self.out_features * self.copies * self.layers


def attention_linears(model: Model) -> tuple[Linear, ...]:
    """The attention projections of every block that attends (a hybrid model's recurrent
    layers have none of them; Qwen3-Next's gated q_proj is twice as wide)."""
    assert model.hidden_size is not None and model.num_layers is not None
    h, layers, mla = model.hidden_size, model.num_attention_layers, model.mla
    shapes: tuple[tuple[str, int, int], ...]
    if mla is None:
        q, kv = model.query_width, model.kv_width
        gated = 2 * q if model.attention_output_gate else q
        shapes = (("q_proj", h, gated), ("k_proj", h, kv), ("v_proj", h, kv),
                  ("o_proj", q, h))
    else:
        assert model.num_attention_heads is not None
        a, rank = model.num_attention_heads, mla.q_lora_rank
        query = ((("q_proj", h, a * mla.qk_head_dim),) if rank is None else
                 (("q_a_proj", h, rank), ("q_b_proj", rank, a * mla.qk_head_dim)))
        shapes = query + (
            ("kv_a_proj_with_mqa", h, mla.kv_lora_rank + mla.qk_rope_head_dim),
            ("kv_b_proj", mla.kv_lora_rank, a * (mla.qk_nope_head_dim + mla.v_head_dim)),
            ("o_proj", a * mla.v_head_dim, h))
    return tuple(Linear(name=n, group="attention", in_features=i, out_features=o,
                        layers=layers) for n, i, o in shapes)


def mlp_linears(model: Model, width: int, group: str, layers: int, copies: int = 1,
                active: float = 1.0) -> tuple[Linear, ...]:
    """One MLP of inner width `width` (gated: gate/up/down; else up/down), `copies` per
    block in `layers` blocks."""
    assert model.hidden_size is not None
    h = model.hidden_size
    shapes = ((("gate_proj", h, width),) if model.gated else ()) + (
        ("up_proj", h, width), ("down_proj", width, h))
    return tuple(Linear(name=n, group=group, in_features=i, out_features=o, layers=layers,
                        copies=copies, active=active) for n, i, o in shapes)


def block_linears(model: Model) -> tuple[Linear, ...]:
    """Every linear layer of the blocks (not the output layer, which PEFT's "all-linear"
    leaves out too), with its group."""
    found = attention_linears(model)
    if model.num_dense_layers:
        assert model.ffn_hidden_size is not None
        found += mlp_linears(model, model.ffn_hidden_size, "mlp", model.num_dense_layers)
    moe = model.moe
    if moe is not None and model.num_moe_layers:
        found += mlp_linears(model, moe.expert_ffn_hidden_size, "experts", model.num_moe_layers,
                             copies=moe.num_experts, active=moe.experts_per_token)
        if moe.num_shared_experts:
            width = moe.shared_expert_ffn_hidden_size or moe.expert_ffn_hidden_size
            found += mlp_linears(model, width, "shared_experts", model.num_moe_layers,
                                 copies=moe.num_shared_experts)
    return found


def targeted(model: Model, targets: tuple[str, ...], all_linear: bool) -> tuple[Linear, ...]:
    """The linear layers that get adapters: every one under "all-linear", else those
    whose PEFT name is in `targets`."""
    return tuple(linear for linear in block_linears(model)
                 if all_linear or linear.name in targets)


def known_targets(model: Model) -> frozenset[str]:
    """The module names `model`'s blocks have."""
    return frozenset(linear.name for linear in block_linears(model))

