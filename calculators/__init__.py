"""The theory: closed-form, pure functions that size LLM inference from a `ModelConfig` and a `Device`.

Modules (each function's docstring gives its formula and source):
- params          parameter counts by component, active params (MoE), weight bytes per precision
- kv_cache        KV bytes per token and per sequence: MHA/GQA/MQA, sliding window, MLA, linear-attention state
- memory          what fits (weights + KV + activations), max batch / context, 004's prefill scratch
- roofline        op-by-op FLOPs/bytes/intensity; forward_flops, weight_bytes_read, kv_bytes_step (the convention
                  the engine's counters are checked against)
- latency         bandwidth floor, prefill/TTFT, ITL, total latency, batching table, $ per 1M tokens
- engine_floor    the NumPy engine's own decode floor on a measured machine (the Trace's bytes / matvec bandwidth)
- flash_attention unfused vs tiled attention HBM traffic
- quantization    size and floor per precision; NumPy symmetric INT8/INT4 quantize/dequantize
- paging, speculative, prefix_cache, queueing   the serving-curriculum numbers
- parallel        collectives (alpha-beta ring), pipeline bubble, context and expert parallelism
- tensor_parallel per-GPU memory, decode and prefill on a TP/PP/EP mesh, fit verdict and advice
- pipeline, sharding, cost, planner, calibration   stages; one layer on a mesh; $/request; capacity planner;
                  fitting MBU/MFU/alpha to measurements
- explain         the formula behind every number (value, unit, formula with numbers, source)
- cli             `python -m calculators memory|floor|roofline|latency|plan ...`
Units: bytes, seconds (or ms where the name says so), FLOPs; MB/GB are decimal (see `units`).
"""
