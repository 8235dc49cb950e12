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

An MoE block (torchtitan b5bcd76c, torchtitan/models/common/moe.py `MoE.forward`,
`TokenChoiceTopKRouter`, `GroupedExperts` and torchtitan/models/common/token_dispatcher.py;
the policy of torchtitan/distributed/activation_checkpoint.py `SelectiveAC` and
`_get_default_save_ops` at that commit) runs the same attention, then:

- the router gate (an aten.mm of h x E in fp32): `force_recompute_mm_shapes_by_fqns`
  defaults to ["moe.router.gate"], so any aten.mm of that weight shape is recomputed and
  left out of the every-second-mm count;
- aten.topk of the scores (in the save list: "save to keep MoE expert assignments
  stable"): its fp32 values and int64 expert ids, b x s x k each, are saved;
- under expert parallelism the dispatch and the combine all-to-alls
  (_c10d_functional.all_to_all_single, in the save list): their outputs, the routed
  token copies (b x s x k x h each), are saved; that tensor exists only under expert
  parallelism, so the expert strategy adds it (`llmpar.strategies.expert`). Without it
  the dispatch is a local permutation, recomputed;
- the routed experts' grouped products (torch._grouped_mm, aten._grouped_mm): neither
  torchtitan's list nor the compute-intensive ops of PyTorch's partitioner it starts from
  (torch/_functorch/partitioners.py `get_default_op_list`: mm, bmm, addmm, the SDPA
  kernels, _scaled_mm) hold aten._grouped_mm or aten._scaled_grouped_mm, so they are
  recomputed and not counted: the experts' whole forward reruns;
- the shared experts (one FeedForward of n_s x ffn_s: w1, w3, w2 as aten.mm) join the
  count after attention's products: in a Llama-attention block w1 (5th) and w2 (7th) are
  saved, w3 (6th) recomputed. A shared-expert gate (h x 1, Qwen2-MoE's, applied after
  the shared expert) is one more aten.mm in the count.

The token-count all-to-all and the device-to-host copies of the splits, also saved, hold
E and e integers per layer: left out. A gate with a bias runs as aten.addmm: recomputed,
like every addmm here.
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
MOE_SOURCE = ("torchtitan b5bcd76c MoE blocks (torchtitan/distributed/activation_checkpoint.py "
              "SelectiveAC, _get_default_save_ops; torchtitan/models/common/moe.py)")


@attrs.frozen(kw_only=True)
class BlockOp:
    """One op of a block's forward that the checkpoint policy decides on."""

    name: str
    kind: str
    """"mm" (aten.mm: counted, every second one recomputed), "addmm" (a projection with
    a bias: not in the save list), "attention" (scaled-dot-product attention: saved),
    "router" (the MoE gate's aten.mm: always recomputed, not counted), "topk" (the
    routing's aten.topk: saved) or "grouped" (the routed experts' aten._grouped_mm: not
    in the save list, not counted)."""
    width: int
    """Output features per token (its outputs' width)."""
    weights: int = 0
    """Matrix weights one token multiplies through: in x out of a product (2 FLOPs per
    weight and token); k x in x out of a grouped product over a token's k experts."""
    fan_in: int = 0
    """Input features of a product: with `width` the weight shape torchtitan's
    forced-recompute rule matches."""
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
                   weights=fan_in * width, fan_in=fan_in, splits=splits, product=product,
                   symbol=symbol)


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


def _moe(model: Model) -> list[BlockOp]:
    """The MoE block's ops in torchtitan's order (moe.py `MoE.forward`): router gate,
    top-k, the routed experts' grouped w1, w3 (gated) and w2, then the shared experts."""
    moe = model.moe
    assert moe is not None and model.hidden_size is not None
    h, k, e = model.hidden_size, moe.experts_per_token, moe.num_experts
    ops = [BlockOp(name="router gate", kind="addmm" if moe.router_bias else "router",
                   width=e, weights=h * e, fan_in=h, splits=OUTSIDE_TP, product="router",
                   symbol="E"),
           BlockOp(name="router top-k", kind="topk", width=k, splits=OUTSIDE_TP, symbol="k")]
    f = moe.expert_ffn_hidden_size
    ups = ("w1", "w3") if model.gated else ("w1",)
    ops += [BlockOp(name=f"expert {name}", kind="grouped", width=f, weights=k * h * f,
                    fan_in=h, product="expert up", symbol="ffn_e") for name in ups]
    ops.append(BlockOp(name="expert w2", kind="grouped", width=h, weights=k * f * h,
                       fan_in=f, splits=TOKENS_ONLY, product="expert down", symbol="h"))
    if moe.num_shared_experts:
        width = moe.num_shared_experts * (moe.shared_expert_ffn_hidden_size or f)
        ops += [attrs.evolve(op, name=f"shared {op.name}",
                             product=op.product.replace("mlp", "shared expert"),
                             symbol=op.symbol.replace("ffn", "n_s*ffn_s"))
                for op in _mlp(attrs.evolve(model, ffn_hidden_size=width))]
        if moe.shared_expert_gate:
            ops.append(_projection("shared gate", h, 1, False, TOKENS_ONLY,
                                   "shared expert gate", "1"))
    return ops


def block_ops(model: Model, moe: bool = False) -> tuple[BlockOp, ...]:
    """The ops of one attention block's forward that the policy decides on, in the
    order they run: its MLP's, or (`moe`) its MoE block's."""
    return tuple(_attention(model) + (_moe(model) if moe else _mlp(model)))


def saved_ops(ops: tuple[BlockOp, ...], policy: str) -> tuple[bool, ...]:
    """Whether the policy saves each op's outputs: attention and top-k always; an aten.mm
    unless it is an even one of the block's products under "op" (torchtitan's counter:
    the 1st, 3rd, 5th... are saved) or has the router gate's weight shape (always
    recomputed, not counted); an aten.addmm, the gate and a grouped product never."""
    forced = {(op.fan_in, op.width) for op in ops if op.kind == "router"}
    found, count = [], 0
    for op in ops:
        if op.kind == "mm" and (op.fan_in, op.width) not in forced:
            count += 1
            found.append(policy == "op-all-matmuls" or count % 2 == 1)
        else:
            found.append(op.kind in ("attention", "topk"))
    return tuple(found)


def _outputs(spec: Spec, op: BlockOp) -> list[SavedTensor]:
    """What a saved op keeps: a product its output; flash attention its output and the
    fp32 log-sum-exp per head and query (aten._scaled_dot_product_flash_attention's
    outputs; the seeds and offsets are scalars)."""
    training, model = spec.training, spec.model
    d = _activation_bytes(spec)
    tokens = (("b", training.micro_batch_size), ("s", training.sequence_length))
    if op.kind == "topk":  # aten.topk's two outputs (moe.py TokenChoiceTopKRouter)
        routed = (*tokens, (op.symbol, op.width))
        reason = "saved by the checkpoint policy (topk)"
        return [SavedTensor(name="router top-k scores (fp32)", reason=reason, shape=routed,
                            bytes_per_element=FP32_BYTES, splits=op.splits),
                SavedTensor(name="router top-k expert ids (int64)", reason=reason,
                            shape=routed, bytes_per_element=EXPERT_ID_BYTES,
                            splits=op.splits)]
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


EXPERT_ID_BYTES = 8.0
"""torch.topk's indices are int64."""


def kept_tensors(spec: Spec, moe: bool = False) -> tuple[SavedTensor, ...]:
    """What one (`moe`: MoE) block keeps between its forward and its backward: its input
    (the checkpoint's) and the outputs of the ops the policy saves; the all-to-alls'
    outputs under expert parallelism are the expert strategy's."""
    policy = spec.training.recompute_policy
    assert policy is not None and spec.model.hidden_size is not None
    training = spec.training
    checkpoint = SavedTensor(
        name="layer input", reason="kept by the checkpoint wrapper; the block reruns from it",
        shape=(("b", training.micro_batch_size), ("s", training.sequence_length),
               ("h", spec.model.hidden_size)),
        bytes_per_element=_activation_bytes(spec), splits=OUTSIDE_TP)
    ops = block_ops(spec.model, moe)
    found = [checkpoint]
    for op, kept in zip(ops, saved_ops(ops, policy)):
        if kept:
            found += _outputs(spec, op)
    return tuple(found)


def op_checkpointed(inventory: ActivationInventory, spec: Spec) -> ActivationInventory:
    """The inventory under the op-level policy: every dense layer keeps `kept_tensors`,
    every MoE layer those of an MoE block."""
    dense = kept_tensors(spec)
    moe = kept_tensors(spec, moe=True) if spec.model.num_moe_layers else dense
    return inventory.map_layers(
        lambda group: group.replace(moe if group.kind == "moe" else dense))


def _kinds(model: Model) -> tuple[bool, ...]:
    """The kinds of block the model has (False: dense, True: MoE)."""
    return tuple(moe for moe, count in ((False, model.num_dense_layers),
                                        (True, model.num_moe_layers)) if count)


def rerun_weights(model: Model, policy: str, moe: bool = False) -> int:
    """Matrix weights one token multiplies through again in one dense (`moe`: MoE)
    block's recomputation: the products the policy does not save."""
    ops = block_ops(model, moe)
    return sum(op.weights for op, kept in zip(ops, saved_ops(ops, policy)) if not kept)


def rerun_products(model: Model, policy: str) -> tuple[str, ...]:
    """The names of the products the policy recomputes, of each kind of block (for
    derivations)."""
    found: list[str] = []
    for moe in _kinds(model):
        ops = block_ops(model, moe)
        found += [op.name for op, kept in zip(ops, saved_ops(ops, policy))
                  if not kept and op.weights and op.name not in found]
    return tuple(found)


def rerun_flops_per_sequence(model: Model, sequence_length: int, policy: str) -> float:
    """Forward FLOPs the recomputation adds to one sequence, all layers: 2 FLOPs per
    weight and token of the products not saved (attention is saved: not rerun)."""
    weights = sum((model.num_moe_layers if moe else model.num_dense_layers)
                  * rerun_weights(model, policy, moe) for moe in _kinds(model))
    return 2.0 * sequence_length * weights


def rerun_shares(model: Model, policy: str) -> dict[str, float]:
    """Share of each product (`llmpar.evaluation.matmuls.Product.name`) the
    recomputation reruns, by its weights (Q/K/V is one product there, three here).
    Attention's products come first in both kinds of block, so their shares agree."""
    total: dict[str, int] = {}
    rerun: dict[str, int] = {}
    for moe in _kinds(model):
        ops = block_ops(model, moe)
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
