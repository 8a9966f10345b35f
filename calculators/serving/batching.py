"""Batching: the step-time model every serving simulator runs on, throughput and per-stream ITL versus batch, and
the two critical batches (003 Details 13 and 21).

One forward step of a serving loop reads the weights once, reads every running sequence's KV cache, writes the
new tokens' K/V, and does 2·(linear params) FLOPs per new token plus attention over each token's context:

    bytes(step) = W + kv·(context read + new tokens)
    flops(step) = f_lin·new tokens + f_attn·(query × key pairs)
    step time   = max(bytes / bandwidth, flops / peak) + overhead

With every sequence decoding one token at context S, a batch of b costs (W + b·S·kv)/BW (Detail 21's table).
Two batches mark the regimes:
- the KV batch b_kv = W / (S·kv): from here on the KV read is larger than the weight read;
- the compute batch b_c = (W/BW) / (f_tok/peak − S·kv/BW): from here on the FLOPs take longer than the bytes
  (none if a sequence's FLOPs never outrun its KV bytes).
f_lin and f_attn come from `roofline.forward_flops` (its convention: 2·M·N·K per matmul, the LM head counted per
new token here, which slightly overstates a long prefill's FLOPs). The model is linear in context, so a sliding
window or a fixed linear-attention state is not modelled (use `latency.batch_table_for` for those).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from calculators.explain import Explained, explain
from calculators.sizing.kv_cache import kv_bytes_per_token
from calculators.sizing.latency import IDEAL, Efficiency, step_weight_bytes
from calculators.sizing.roofline import compute_precision_for, forward_flops
from calculators.units import check_int, check_nonneg, check_positive, default_kv_dtype
from specs.devices import Device
from specs.model_config import ModelConfig, SpecError

SOURCE = "003 Details 13 and 21 (one weight read per step, plus every sequence's KV cache)"


@dataclass(frozen=True)
class StepModel:
    """What one serving step costs. Bandwidth and peak are the EFFECTIVE rates (datasheet × MBU/MFU)."""
    weight_bytes: float                 # W: read once per step
    kv_bytes_per_token: float           # kv: per cached token position, all layers
    bandwidth_bytes_per_s: float        # BW
    flops_per_token: float              # f_lin: matmul FLOPs per new token (projections, FFN, LM head)
    attn_flops_per_pair: float          # f_attn: QKᵀ + P·V FLOPs for one (query, key) pair, all layers and heads
    peak_flop_s: float                  # peak
    overhead_ms: float = 0.0            # fixed cost per step (kernel launches, scheduling); 0 = the ideal model
    name: str = ""
    context_tokens: int | None = None   # the model's context window: no request may need more (None = unchecked)

    def __post_init__(self):
        for k in ("weight_bytes", "kv_bytes_per_token", "flops_per_token", "attn_flops_per_pair", "overhead_ms"):
            check_nonneg(k, getattr(self, k))
        check_positive("bandwidth_bytes_per_s", self.bandwidth_bytes_per_s)
        check_positive("peak_flop_s", self.peak_flop_s)

    # ------------------------------------------------------------------------------------------ one step
    def step_parts_ms(self, new_tokens: float, context_read: float, pairs: float) -> tuple[float, float]:
        """(memory ms, compute ms) of a step that adds `new_tokens`, reads `context_read` cached positions and
        scores `pairs` (query, key) pairs."""
        mem = (self.weight_bytes + self.kv_bytes_per_token * (context_read + new_tokens)) / \
            self.bandwidth_bytes_per_s * 1e3
        comp = (self.flops_per_token * new_tokens + self.attn_flops_per_pair * pairs) / self.peak_flop_s * 1e3
        return mem, comp

    def step_ms(self, new_tokens: float, context_read: float, pairs: float) -> float:
        mem, comp = self.step_parts_ms(new_tokens, context_read, pairs)
        return max(mem, comp) + self.overhead_ms

    def decode_step_ms(self, batch: int, context_total: float) -> float:
        """`batch` sequences decode one token each; `context_total` = their cached positions summed. Each new
        token scores as many keys as its sequence has cached (roofline.py's convention: context × new)."""
        return self.step_ms(batch, context_total, context_total)

    def prefill_ms(self, prompt_tokens: int, start_position: int = 0) -> float:
        """One prompt (or chunk) alone: T new tokens after `start_position` cached ones; T·(start + (T+1)/2)
        causal pairs."""
        T, s = prompt_tokens, start_position
        return self.step_ms(T, s, T * s + T * (T + 1) / 2)


def step_model_for(config: ModelConfig, device: Device, weight_dtype: str = "bf16", kv_dtype: str | None = None,
                   efficiency: Efficiency = IDEAL, overhead_ms: float = 0.0) -> StepModel:
    """The step model of `config` on `device`: W = every parameter once (`latency.step_weight_bytes`, batch 1
    for an MoE), kv from `kv_cache.kv_bytes_per_token`, FLOPs split out of `roofline.forward_flops`, bandwidth
    × decode MBU and peak × prefill MFU."""
    kd = kv_dtype or default_kv_dtype(weight_dtype)
    f11, f12 = forward_flops(config, 1, 1, 1), forward_flops(config, 1, 2, 1)
    attn = f12 - f11                                   # one more key for one query
    peak, _ = device.flops_for(compute_precision_for(weight_dtype))
    return StepModel(weight_bytes=step_weight_bytes(config, weight_dtype, rows=1),
                     kv_bytes_per_token=kv_bytes_per_token(config, kd),
                     bandwidth_bytes_per_s=device.memory_bandwidth_bytes_per_s * efficiency.decode_mbu,
                     flops_per_token=f11 - attn, attn_flops_per_pair=attn,
                     peak_flop_s=peak * efficiency.prefill_mfu, overhead_ms=overhead_ms,
                     name=f"{config.name} on {device.name} ({weight_dtype})",
                     context_tokens=config.max_position_embeddings)


# ============================================================================================ batch curve
def batch_row(model: StepModel, batch: int, context_tokens: int) -> dict:
    """Every sequence of the batch decodes one token at `context_tokens` of context: the step's bytes, time,
    bound, total tokens/s and one stream's ITL and tokens/s."""
    b = check_int("batch", batch, limit=10 ** 7)
    S = check_int("context_tokens", context_tokens, minimum=0, limit=10 ** 9)
    kv = b * S * model.kv_bytes_per_token
    mem, comp = model.step_parts_ms(b, b * S, b * S)
    step = max(mem, comp) + model.overhead_ms
    return dict(batch=b, weight_bytes=model.weight_bytes, kv_read_bytes=kv, total_bytes=model.weight_bytes + kv,
                memory_ms=mem, compute_ms=comp, step_ms=step, itl_ms=step, bound="memory" if mem >= comp else
                "compute", total_tok_s=b / step * 1e3, per_stream_tok_s=1e3 / step)


def batch_curve(model: StepModel, context_tokens: int, batches) -> list[dict]:
    """`batch_row` for each batch, plus `gain_vs_first`: its total tokens/s over the first row's. Throughput
    climbs almost linearly while the weight read dominates."""
    bs = list(batches)
    if not bs:
        raise SpecError("give at least one batch size")
    rows = [batch_row(model, b, context_tokens) for b in bs]
    for r in rows:
        r["gain_vs_first"] = r["total_tok_s"] / rows[0]["total_tok_s"]
    return rows


def kv_critical_batch(model: StepModel, context_tokens: int) -> float:
    """b_kv = W / (S·kv): the batch whose KV read equals the weight read (inf without KV).
    TinyLlama at 300 tokens: 2.2 GB / 6.6 MB ≈ 333 (003: "push to 256 and it approaches the weight read")."""
    S = check_int("context_tokens", context_tokens, minimum=0)
    per_seq = S * model.kv_bytes_per_token
    return math.inf if per_seq == 0 else model.weight_bytes / per_seq


def compute_critical_batch(model: StepModel, context_tokens: int) -> float:
    """b_c where a decode step's FLOPs take as long as its bytes: (W/BW) / (f_seq/peak − bytes_seq/BW), with
    f_seq = f_lin + f_attn·S and bytes_seq = kv·(S+1) (S read, one written) per sequence; inf if never."""
    S = check_int("context_tokens", context_tokens, minimum=0)
    t_flops = (model.flops_per_token + model.attn_flops_per_pair * S) / model.peak_flop_s
    t_bytes = model.kv_bytes_per_token * (S + 1) / model.bandwidth_bytes_per_s
    if t_flops <= t_bytes:
        return math.inf
    return (model.weight_bytes / model.bandwidth_bytes_per_s) / (t_flops - t_bytes)


def explain_kv_critical_batch(model: StepModel, context_tokens: int) -> Explained:
    return explain("kv_critical_batch", "W / (S * kv)", "sequences", SOURCE,
                   "the batch whose KV read equals the weight read", W=model.weight_bytes, S=context_tokens,
                   kv=model.kv_bytes_per_token)


def explain_compute_critical_batch(model: StepModel, context_tokens: int) -> Explained:
    return explain("compute_critical_batch", "(W / BW) / ((f + a * S) / peak - kv * (S + 1) / BW)",
                   "sequences", SOURCE + "; roofline: compute time = memory time",
                   W=model.weight_bytes, BW=model.bandwidth_bytes_per_s, f=model.flops_per_token,
                   a=model.attn_flops_per_pair, S=context_tokens, peak=model.peak_flop_s,
                   kv=model.kv_bytes_per_token)


def explain_batch_step(model: StepModel, batch: int, context_tokens: int) -> Explained:
    return explain("step_ms", "(W + b * S * kv + b * kv) / BW * 1000", "ms", SOURCE,
                   "memory-bound decode step (the FLOPs side is in the table)", W=model.weight_bytes, b=batch,
                   S=context_tokens, kv=model.kv_bytes_per_token, BW=model.bandwidth_bytes_per_s)


# 003 Detail 21's own inputs, as the text rounds them: 2.2 GB of weights, 22 KB (22,000 B) per token, A100
# 1,555 GB/s, 312 TFLOP/s, ≈ 2 FLOPs per parameter per token. (The TinyLlama preset has 22,528 B per token, so
# its batch-128 step is 1.97 ms where the text prints 1.96.)
REFERENCE_003 = StepModel(weight_bytes=2.2e9, kv_bytes_per_token=22e3, bandwidth_bytes_per_s=1555e9,
                          flops_per_token=2.2e9, attn_flops_per_pair=0.0, peak_flop_s=312e12,
                          name="003 Detail 21 (TinyLlama on an A100, the text's rounding)")


def reference_batch_table() -> list[dict]:
    """The text's table: batch 1/8/32/128 at 300 tokens -> 1.42/1.45/1.55/1.96 ms, 704/5,517/20,645/65,306 tok/s."""
    return batch_curve(REFERENCE_003, 300, (1, 8, 32, 128))
