"""What fits: weights + KV cache + activations against a device's memory; prefill scratch buffers (004).

003 "The Systems Picture": TinyLlama serving one sequence needs weights 2.2 GB + KV ~45 MB (2,048 tokens) +
decode activations ~50-100 MB. Activations here are reference 004's scratch-buffer formula for the largest
chunk a step processes (a prefill chunk, or the decode batch), plus the fp32 logits of every sequence.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from calculators import arch
from calculators.sizing.kv_cache import kv_cache_bytes
from calculators.sizing.params import bytes_per_param, param_breakdown
from calculators.units import GiB, bytes_per_element, check_fraction, check_int, check_nonneg, default_kv_dtype
from specs.devices import Device
from specs.model_config import ModelConfig

DEFAULT_PREFILL_CHUNK = 4096     # 004: max_prefill_chunk default
# vLLM's `gpu_memory_utilization` (default 0.9, vllm/engine/arg_utils.py): the fraction of the WHOLE device memory
# this server may use for everything (weights, activations, CUDA context, NCCL buffers, CUDA graphs, and the KV
# cache, which gets what is left). The CLI and every page use this one default.
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9


@dataclass(frozen=True)
class RuntimeOverheads:
    """Memory a real server holds besides weights, KV cache and activations, per GPU (stated, editable):
    - cuda_context_bytes 0.5 GiB: the CUDA context, cuBLAS/cuDNN workspaces and the framework's allocator slack;
      vLLM's start-up profile reports this "non-torch memory" at roughly 0.3-0.7 GiB on A100/H100.
    - comm_buffer_bytes 0.25 GiB, only with 2+ GPUs: NCCL's channel buffers (NCCL_BUFFSIZE 4 MiB × channels ×
      peers) and custom all-reduce buffers; NVLink SHARP (NVLS) on H100 can take more.
    - cuda_graph_bytes 0.5 GiB: vLLM captures decode CUDA graphs for batch sizes up to 512 and logs about
      0.3-1 GiB for them.
    The activation workspace is computed, not assumed (`activation_bytes`)."""
    cuda_context_bytes: float = 0.5 * GiB
    comm_buffer_bytes: float = 0.25 * GiB
    cuda_graph_bytes: float = 0.5 * GiB

    def __post_init__(self):
        for k, v in asdict(self).items():
            check_nonneg(k, v)

    def total_bytes(self, gpus: int = 1) -> float:
        """Context + graphs, plus the communication buffers when more than one GPU serves the model."""
        return self.cuda_context_bytes + self.cuda_graph_bytes + \
            (self.comm_buffer_bytes if check_int("gpus", gpus) > 1 else 0.0)


NO_OVERHEADS = RuntimeOverheads(0.0, 0.0, 0.0)


def resident_weight_bytes(config: ModelConfig, weight_dtype: str = "bf16", group_size: int | None = None,
                          embeddings_16bit: bool = True) -> float:
    """Bytes of every weight as a checkpoint stores them. Quantized checkpoints (FP8 from llm-compressor/ModelOpt,
    GPTQ/AWQ INT4) keep the token embedding and the LM head in 16-bit: with `embeddings_16bit` those two tables
    count 2 bytes per parameter whenever the weight format is narrower; everything else at `weight_dtype`.
    Llama-3-8B FP8: 7.50e9 × 1 B + 1.05e9 × 2 B = 9.6 GB instead of 8.0 GB."""
    b = param_breakdown(config)
    bpp = bytes_per_param(weight_dtype, group_size)
    tables = b.embedding + b.lm_head
    wide = 2.0 if embeddings_16bit and bpp < 2.0 else bpp
    return (b.total - tables) * bpp + tables * wide


def prefill_scratch_bytes(seq_len: int, dim: int, q_dim: int, kv_dim: int, ffn_dim: int,
                          bytes_per_elem: float = 2) -> float:
    """004 "Scratch Buffer Layout": S × (5·dim + 2·q_dim + 2·kv_dim + 3·ffn_dim) × bytes, the [S, ·] buffers
    allocated once for the largest prefill chunk S (residual streams and norm outputs of width dim; q and
    attention output; k and v; gate, up and their product of width ffn_dim).
    For dim 4,096, q_dim 4,096, kv_dim 1,024, ffn 14,336, S = 4,096 the formula gives 603,979,776 B ≈ 604 MB;
    the text rounds this to "about 700 MB" (which the formula does not give)."""
    S = check_int("seq_len", seq_len, minimum=0, limit=1 << 40)
    dims = [check_int(n, v) for n, v in (("dim", dim), ("q_dim", q_dim), ("kv_dim", kv_dim), ("ffn_dim", ffn_dim))]
    d, q, kv, f = dims
    return float(S) * (5 * d + 2 * q + 2 * kv + 3 * f) * bytes_per_element(bytes_per_elem)


def ffn_width(config: ModelConfig) -> int:
    """Widest FFN activation a token produces: F for dense layers; top-k × expert width + shared for MoE ones."""
    c = config
    widths = []
    for i in range(c.num_layers):
        if arch.is_moe_layer(c, i):
            fm = c.moe_intermediate_size or c.intermediate_size
            fs = c.shared_expert_intermediate_size or (c.num_shared_experts or 0) * fm
            widths.append(c.num_experts_per_tok * fm + fs)
        else:
            widths.append(c.intermediate_size)
    return max(widths)


def prefill_scratch_bytes_for(config: ModelConfig, seq_len: int, act_dtype: str | float = "bf16") -> float:
    """004's scratch formula with this model's dim, q_dim, kv_dim and FFN width."""
    return prefill_scratch_bytes(seq_len, config.hidden_size, config.q_dim, config.kv_dim, ffn_width(config),
                                 bytes_per_element(act_dtype))


def activation_buffer_bytes(rows: int, dim: int, bytes_per_elem: float = 2) -> float:
    """One [rows, dim] activation buffer. 004: [128K, 4,096] FP16 = 131,072 × 4,096 × 2 B ≈ 1.07 GB."""
    return float(check_int("rows", rows, minimum=0, limit=1 << 40)) * check_int("dim", dim) * \
        bytes_per_element(bytes_per_elem)


def gemm_tile_memory_bytes(tm: int = 32, tn: int = 64, tk: int = 32) -> int:
    """004: threadgroup memory of one GEMM tile, the input tiles (FP16) and the output tile (FP32) sharing it:
    max((TN·TK + TM·TK) × 2, TN·TM × 4). TM 32, TN 64, TK 32 -> max(6,144, 8,192) = 8,192 B."""
    tm, tn, tk = check_int("tm", tm), check_int("tn", tn), check_int("tk", tk)
    return max((tn * tk + tm * tk) * 2, tn * tm * 4)


def activation_bytes(config: ModelConfig, context_tokens: int, batch: int = 1, act_dtype: str = "bf16",
                     prefill_chunk: int = DEFAULT_PREFILL_CHUNK) -> float:
    """Working activations of a serving step: 004 scratch for max(min(context, chunk), batch) rows plus the fp32
    logits of `batch` sequences (V × 4 B each)."""
    rows = max(min(check_int("context_tokens", context_tokens, minimum=0, limit=1 << 40),
                   check_int("prefill_chunk", prefill_chunk)), check_int("batch", batch, limit=1 << 30))
    return prefill_scratch_bytes_for(config, rows, act_dtype) + batch * config.vocab_size * 4.0


def memory_budget(config: ModelConfig, device: Device, context_tokens: int, batch: int = 1,
                  weight_dtype: str = "bf16", kv_dtype: str | None = None, act_dtype: str = "bf16",
                  prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
                  usable_fraction: float = DEFAULT_GPU_MEMORY_UTILIZATION, group_size: int | None = None,
                  overheads: RuntimeOverheads = RuntimeOverheads(), embeddings_16bit: bool = True) -> dict:
    """Weights + KV cache (batch × context) + activations + runtime overheads vs `usable_fraction` of the device
    memory (vLLM's gpu_memory_utilization). All experts of an MoE model are resident, so weights count every
    parameter (`resident_weight_bytes`). `total_bytes` is the model's own need (weights + KV + activations, 003's
    "Systems Picture"); `needed_bytes` adds the overheads, and `fits` compares that with the usable memory."""
    w = resident_weight_bytes(config, weight_dtype, group_size, embeddings_16bit)
    kv = kv_cache_bytes(config, context_tokens, batch, kv_dtype or default_kv_dtype(weight_dtype))
    act = activation_bytes(config, context_tokens, batch, act_dtype, prefill_chunk)
    usable = device.memory_bytes * check_fraction("usable_fraction", usable_fraction)
    total = w + kv + act
    over = overheads.total_bytes(1)
    needed = total + over
    return dict(weights_bytes=w, kv_bytes=kv, activation_bytes=act, total_bytes=total, overhead_bytes=over,
                needed_bytes=needed, device_bytes=device.memory_bytes, usable_bytes=usable, fits=needed <= usable,
                headroom_bytes=usable - needed)


def _largest(ok, hi: int) -> int:
    """Largest n in [0, hi] with ok(n) true, for ok monotone non-increasing in n (ok(0) assumed true)."""
    lo = 0
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def max_batch(config: ModelConfig, device: Device, context_tokens: int, weight_dtype: str = "bf16",
              kv_dtype: str | None = None, usable_fraction: float = DEFAULT_GPU_MEMORY_UTILIZATION,
              limit: int = 1 << 20, **kw) -> int:
    """Most sequences of `context_tokens` that fit with the weights (0 if even one does not)."""
    def ok(b):
        return b == 0 or memory_budget(config, device, context_tokens, b, weight_dtype, kv_dtype,
                                       usable_fraction=usable_fraction, **kw)["fits"]
    return _largest(ok, limit)


def max_context(config: ModelConfig, device: Device, batch: int = 1, weight_dtype: str = "bf16",
                kv_dtype: str | None = None, usable_fraction: float = DEFAULT_GPU_MEMORY_UTILIZATION,
                limit: int | None = None, **kw) -> int:
    """Longest context (tokens per sequence, capped at the model's max_position_embeddings or `limit`) for which
    `batch` sequences fit; 0 if the weights alone do not fit."""
    cap = limit or config.max_position_embeddings

    def ok(t):
        return memory_budget(config, device, t, batch, weight_dtype, kv_dtype, usable_fraction=usable_fraction,
                             **kw)["fits"]
    if not ok(0):
        return 0
    return _largest(lambda t: t == 0 or ok(t), cap)


def fit_grid(config: ModelConfig, device: Device, contexts: list[int], batches: list[int],
             weight_dtype: str = "bf16", kv_dtype: str | None = None,
             usable_fraction: float = DEFAULT_GPU_MEMORY_UTILIZATION) -> list[dict]:
    """Rows (context, batch, total bytes, fits) for a batch × context heat map."""
    rows = []
    for t in contexts:
        for b in batches:
            m = memory_budget(config, device, t, b, weight_dtype, kv_dtype, usable_fraction=usable_fraction)
            rows.append(dict(context_tokens=t, batch=b, total_bytes=m["total_bytes"], kv_bytes=m["kv_bytes"],
                             fits=m["fits"]))
    return rows
