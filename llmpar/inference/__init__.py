"""Inference planning: memory and time of serving a model under a parallel layout.

One module per formula, each citing its source:
- `formats`: bytes per weight under quantization, and the format matrix math runs in;
- `kv_cache`: the key/value cache (MHA, GQA, MQA, MLA; paged blocks, sliding windows);
- `weights`: weights on one GPU under the layout's shards;
- `workspace`: the activation workspace of the largest forward step;
- `overhead`: the runtime allowance (CUDA context, communication buffers, headroom);
- `memory`: everything on one GPU, per pipeline stage;
- `capacity`: the largest batch and context that fit, and what limits them;
- `roofline`: the time of one operation, max(FLOPs / compute, bytes / bandwidth);
- `operations`: the operations of one forward step, per layer;
- `communication`: tensor, expert, context and pipeline traffic of one step;
- `phases`: prefill and decode as steps of operations and collectives;
- `evaluate`: the Plan.
Conventions (NVIDIA NIM LLM benchmarking metrics, docs.nvidia.com/nim/benchmarking/llm):
time to first token is the prefill; time per output token excludes the first token;
latency = TTFT + (generated - 1) x TPOT.
"""
