"""What FlopCounterMode sees differently from llmpar's FLOPs in validation/measure_flops.py's
runs (torch 2.13, transformers 5.24 on the CPU): the terms tests/test_model_catalogue.py and
validation/report_activations.py add to llmpar's forward before comparing it with the
counter's. Plain Python on llmpar's Model; neither torch nor transformers is needed."""

from __future__ import annotations

from typing import Any


def every_expert_extra(model: Any, run: dict[str, Any]) -> float:
    """Llama 4: transformers runs every routed expert on every token, zero-weighted
    (Llama4TextMoe.forward repeats the tokens for each expert, then one bmm per
    projection); llmpar counts the top-k experts a token is routed to, as an MoE kernel
    runs them: the difference is the other experts' three matrices. 0 for other models."""
    moe = model.moe
    if run["model_class"] != "Llama4ForCausalLM" or moe is None:
        return 0.0
    tokens = run["seq"] * run["batch"]
    return float(model.num_moe_layers * (moe.num_experts - moe.experts_per_token) * tokens
                 * 2 * 3 * model.hidden_size * moe.expert_ffn_hidden_size)


def recurrent_unseen(model: Any, run: dict[str, Any]) -> tuple[float, float]:
    """What FlopCounterMode does not see of llmpar's forward FLOPs of the recurrent layers
    (torch 2.13, transformers 5.24's reference kernels), and the backward it counts without
    its depthwise-convolution artefact.

    - Gated DeltaNet (torch_chunk_gated_delta_rule): the UT transform is two
      torch.linalg.solve_triangular calls, which the counter has no formula for: 2 C (d_k +
      d_v) per token and value head, as the matrix products the kernels run in its place.
    - Mamba-2 (torch_forward of GraniteMoeHybridMambaLayer and FalconH1Mixer): C.B^T per
      head, not per group (B and C repeated to the heads), and the states passed across
      chunks as one dense (chunks + 1)^2 contraction, both einsums the counter sees; llmpar
      counts C.B^T per group and the scan across chunks as elementwise.
    - The convolution's causal_conv1d fallback pads kernel - 1 positions on both sides and
      cuts them off after: the counter sees s + kernel - 1 outputs per channel.
    - Backward: the counter's convolution_backward formula ignores groups and counts the
      depthwise convolution's input gradient as a dense one (conv_width times too much), so
      it is left out, and the rest of the backward is twice the forward it saw."""
    s, b = run["seq"], run["batch"]
    unseen = 0.0
    for kind, count in model.mixers_in(0, model.num_layers).items():
        if kind == "linear_attention":
            la = model.linear_attention
            unseen += count * s * la.num_value_heads * 2 * la.chunk_size * (
                la.key_head_dim + la.value_head_dim)
            conv, taps = la.conv_width, la.conv_kernel_size
        elif kind == "mamba":
            m = model.mamba
            chunks = -(-s // m.chunk_size)
            unseen -= count * s * 2 * (m.num_heads - m.num_groups) * m.chunk_size * m.state_size
            unseen -= count * 2 * (chunks + 1) ** 2 * m.num_heads * m.head_dim * m.state_size
            conv, taps = m.conv_width, m.conv_kernel_size
        else:
            continue
        unseen -= count * 2 * conv * taps * (taps - 1)
    forward_conv = run["forward_flops_by_op"].get("aten.convolution", 0)
    backward = (sum(run["backward_flops_by_op"].values())
                - run["backward_flops_by_op"].get("aten.convolution_backward", 0)
                + run["backward_uncounted_kernel_flops_computed_here"] + 2 * forward_conv)
    return unseen * b, backward
