"""Op-level selective activation checkpointing as torchtitan runs it (`[training]
recompute_policy`).

torchtitan wraps every transformer block in a checkpoint whose policy decides op by op
what the forward keeps (torchtitan v0.2.2, torchtitan/distributed/activation_checkpoint.py,
`_apply_op_sac`, with the save list `_op_sac_save_list` of
torchtitan/models/llama3/infra/parallelize.py; the same rule is `SelectiveAC` in later
versions):

- the block's input is kept by the checkpoint;
- an op in the save list (aten.mm, scaled-dot-product attention's flash, efficient,
  cuDNN and math kernels, the functional reduce-scatter, aten.max) keeps its outputs
  (CheckpointPolicy.MUST_SAVE), except every second aten.mm: a counter per block and
  pass counts the products and an even count is recomputed ("Saves output of all
  compute ops, except every second mm");
- every other op is recomputed in the backward (PREFER_RECOMPUTE): the recomputation
  reruns the block's whole forward (early_stop is off), the saved ops returning their
  outputs from the cache, so every product that is not saved runs again and every
  elementwise op (norms, RoPE, the activation, residual adds) writes its output again.

The products of a block in forward order follow torchtitan's models (llama3 and
deepseek_v3 model.py, v0.2.2): wq, wk, wv (or MLA's wq / wq_a, wq_b, wkv_a, wkv_b), the
attention kernel, wo, then the MLP's w1, w3 (gated) and w2. A Llama block so saves wq,
wv, w1 and w2 and recomputes wk, wo and w3. A projection with a bias runs as aten.addmm,
which the save list does not hold: recomputed, not counted. Under sequence parallelism
the reduce-scatter of wo's and w2's outputs is saved too (b x s/t x h each): that tensor
exists only under sequence parallelism, so the sequence strategy adds it
(`llmpar.strategies.sequence`, its `added_activation_bytes`) with the all-gathers the
recomputation issues again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from llmpar.dtypes import bytes_per_element
from llmpar.footprint.activations.common import FP32_BYTES, INSIDE_TP, OUTSIDE_TP, TOKENS_ONLY
from llmpar.footprint.inventory import ActivationInventory, SavedTensor

if TYPE_CHECKING:
    from llmpar.spec import Spec
    from llmpar.spec.model import Model

SOURCE = ("torchtitan v0.2.2 op-level selective activation checkpointing "
          "(torchtitan/distributed/activation_checkpoint.py _apply_op_sac; "
          "torchtitan/models/llama3/infra/parallelize.py _op_sac_save_list)")


@attrs.frozen(kw_only=True)
class BlockOp:
    """One op of a block's forward that the checkpoint policy decides on."""

    name: str
    kind: str
    """"mm" (aten.mm: counted, every second one recomputed), "addmm" (a projection with
    a bias: not in the save list) or "attention" (scaled-dot-product attention: saved)."""
    width: int
    """Output features per token (its outputs' width)."""
    weights: int = 0
    """Matrix weights: in x out of a product (2 FLOPs per weight and token)."""
    splits: frozenset[str] = INSIDE_TP
    """How tensor and context parallelism split its output: column-parallel products'
    INSIDE_TP, row-parallel products' (wo, w2: partial sums of the whole hidden width on
    every tensor rank) and replicated ones' TOKENS_ONLY."""
    product: str = ""
    """The product (`llmpar.evaluation.matmuls.Product.name`) it is part of."""
    symbol: str = ""
    """Its output width's symbol in a shape ("ffn", "kv*d_head"...)."""


def _projection(name: str, fan_in: int, width: int, bias: bool, splits: frozenset[str],
                product: str, symbol: str) -> BlockOp:
    return BlockOp(name=name, kind="addmm" if bias else "mm", width=width,
                   weights=fan_in * width, splits=splits, product=product, symbol=symbol)


def _attention(model: Model) -> list[BlockOp]:
    assert model.hidden_size is not None and model.num_attention_heads is not None
    h, bias = model.hidden_size, model.qkv_bias or model.linear_bias
    out_bias = model.attention_output_bias or model.linear_bias
    mla = model.mla
    if mla is None:
        query = model.query_width * (2 if model.attention_output_gate else 1)
        ops = [_projection("wq", h, query, bias, INSIDE_TP, "Q/K/V",
                           "a*d_head"),
               _projection("wk", h, model.kv_width, bias, INSIDE_TP, "Q/K/V",
                           "kv*d_head"),
               _projection("wv", h, model.kv_width, bias, INSIDE_TP, "Q/K/V",
                           "kv*d_head")]
    else:
        a = model.num_attention_heads
        if mla.q_lora_rank is None:
            ops = [_projection("wq", h, a * mla.qk_head_dim, bias, INSIDE_TP, "Q",
                               "a*d_qk")]
        else:
            ops = [_projection("wq_a", h, mla.q_lora_rank, bias, TOKENS_ONLY,
                               "Q down", "r_q"),
                   _projection("wq_b", mla.q_lora_rank, a * mla.qk_head_dim, False,
                               INSIDE_TP, "Q up", "a*d_qk")]
        ops += [_projection("wkv_a", h, mla.kv_lora_rank + mla.qk_rope_head_dim, bias,
                            TOKENS_ONLY, "KV down", "r_kv+d_rope"),
                _projection("wkv_b", mla.kv_lora_rank,
                            a * (mla.qk_nope_head_dim + mla.v_head_dim), False, INSIDE_TP,
                            "KV up", "a*(d_nope+d_v)")]
    ops.append(BlockOp(name="attention", kind="attention",
                       width=model.attention_output_width, symbol="a*d_v"))
    ops.append(_projection("wo", model.attention_output_width, h, out_bias,
                           TOKENS_ONLY, "attention output", "h"))
    return ops


def _mlp(model: Model) -> list[BlockOp]:
    assert model.hidden_size is not None and model.ffn_hidden_size is not None
    h, f = model.hidden_size, model.ffn_hidden_size
    bias = model.mlp_bias or model.linear_bias
    ops = [_projection("w1", h, f, bias, INSIDE_TP, "mlp up", "ffn")]
    if model.gated:  # w2(silu(w1(x)) * w3(x)): w1 runs first (llama3 model.py FeedForward)
        ops.append(_projection("w3", h, f, bias, INSIDE_TP, "mlp up", "ffn"))
    ops.append(_projection("w2", f, h, bias, TOKENS_ONLY, "mlp down", "h"))
    return ops


def block_ops(model: Model) -> tuple[BlockOp, ...]:
    """The ops of one dense attention block's forward that the policy decides on, in the
    order they run."""
    return tuple(_attention(model) + _mlp(model))


def saved_ops(ops: tuple[BlockOp, ...], policy: str) -> tuple[bool, ...]:
    """Whether the policy saves each op's outputs: attention always, an aten.mm unless it
    is an even one of the block's products under "op" (torchtitan's counter: the 1st, 3rd,
    5th... are saved), an aten.addmm never."""
    found, count = [], 0
    for op in ops:
        if op.kind == "mm":
            count += 1
            found.append(policy == "op-all-matmuls" or count % 2 == 1)
        else:
            found.append(op.kind == "attention")
    return tuple(found)


def _outputs(spec: Spec, op: BlockOp) -> list[SavedTensor]:
    """What a saved op keeps: a product its output; flash attention its output and the
    fp32 log-sum-exp per head and query (aten._scaled_dot_product_flash_attention's
    outputs; the seeds and offsets are scalars)."""
    training, model = spec.training, spec.model
    d = _activation_bytes(spec)
    tokens = (("b", training.micro_batch_size), ("s", training.sequence_length))
    output = SavedTensor(name=f"{op.name} output", reason=f"saved by the checkpoint policy "
                         f"({op.kind})", shape=(*tokens, (op.symbol, op.width)),
                         bytes_per_element=d, splits=op.splits)
    if op.kind != "attention":
        return [output]
    assert model.num_attention_heads is not None
    lse = SavedTensor(name="attention log-sum-exp (fp32)", reason="saved by the checkpoint "
                      "policy (attention)", shape=(tokens[0], ("a", model.num_attention_heads),
                                                   tokens[1]),
                      bytes_per_element=FP32_BYTES, splits=INSIDE_TP)
    return [output, lse]


def _activation_bytes(spec: Spec) -> float:
    return bytes_per_element(spec.precision.activations)


def kept_tensors(spec: Spec) -> tuple[SavedTensor, ...]:
    """What one block keeps between its forward and its backward: its input (the
    checkpoint's) and the outputs of the ops the policy saves."""
    policy = spec.training.recompute_policy
    assert policy is not None and spec.model.hidden_size is not None
    training = spec.training
    checkpoint = SavedTensor(
        name="layer input", reason="kept by the checkpoint wrapper; the block reruns from it",
        shape=(("b", training.micro_batch_size), ("s", training.sequence_length),
               ("h", spec.model.hidden_size)),
        bytes_per_element=_activation_bytes(spec), splits=OUTSIDE_TP)
    ops = block_ops(spec.model)
    found = [checkpoint]
    for op, kept in zip(ops, saved_ops(ops, policy)):
        if kept:
            found += _outputs(spec, op)
    return tuple(found)


def op_checkpointed(inventory: ActivationInventory, spec: Spec) -> ActivationInventory:
    """The inventory under the op-level policy: every layer keeps `kept_tensors`."""
    kept = kept_tensors(spec)
    return inventory.map_layers(lambda group: group.replace(kept))


def rerun_weights(model: Model, policy: str) -> int:
    """Matrix weights one token multiplies through again in one block's recomputation:
    the products the policy does not save."""
    ops = block_ops(model)
    return sum(op.weights for op, kept in zip(ops, saved_ops(ops, policy)) if not kept)


def rerun_products(model: Model, policy: str) -> tuple[str, ...]:
    """The names of one block's products the policy recomputes (for derivations)."""
    ops = block_ops(model)
    return tuple(op.name for op, kept in zip(ops, saved_ops(ops, policy))
                 if not kept and op.weights)


def rerun_flops_per_sequence(model: Model, sequence_length: int, policy: str) -> float:
    """Forward FLOPs the recomputation adds to one sequence, all layers: 2 FLOPs per
    weight and token of the products not saved (attention is saved: not rerun)."""
    return 2.0 * sequence_length * (model.num_layers or 0) * rerun_weights(model, policy)


def rerun_shares(model: Model, policy: str) -> dict[str, float]:
    """Share of each product (`llmpar.evaluation.matmuls.Product.name`) the
    recomputation reruns, by its weights (Q/K/V is one product there, three here)."""
    ops = block_ops(model)
    total: dict[str, int] = {}
    rerun: dict[str, int] = {}
    for op, kept in zip(ops, saved_ops(ops, policy)):
        if op.product:
            total[op.product] = total.get(op.product, 0) + op.weights
            if not kept:
                rerun[op.product] = rerun.get(op.product, 0) + op.weights
    return {name: rerun.get(name, 0) / weights for name, weights in total.items() if weights}


CACHED_INVENTORY_TENSORS = ("input norm input", "attention output", "log-sum-exp (fp32)")
"""Tensors of the fused inventory that the recomputation does not write again: the
block's input (the checkpoint) and attention's outputs (saved by the policy); every other
tensor a block keeps for its backward is written again."""


def rebuilt(tensors: tuple[SavedTensor, ...]) -> tuple[SavedTensor, ...]:
    """The tensors of one block (of the fused inventory) its recomputation writes again."""
    return tuple(t for t in tensors if t.name not in CACHED_INVENTORY_TENSORS)
