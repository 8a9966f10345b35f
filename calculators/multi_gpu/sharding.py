"""A sharding view of one transformer layer on a 2-D device mesh: what each device holds and computes, and the
collective after each matmul with its bytes and time (reference 001: Llama 3 70B prefill on a 4 × 8 mesh).

Mesh rows × cols (R × C devices). Every weight matrix is cut both ways:
- along C by heads (q/k/v/o) or FFN columns (gate/up/down): each device owns h_q/C query heads,
  max(h_kv/C, 1) KV heads (replicated once C > h_kv) and F/C FFN columns;
- along R by the hidden dimension D: a device multiplies its D/R slice of the input, so its product is a
  PARTIAL sum that the R devices of its column all-reduce (001's "all-reduce for QKV", reduce-scatter/all-gather
  for FF1/FF3).
After o_proj and down_proj the C devices of a row all-reduce their partial [T, D/R] results: with R = 1 this is
Megatron-LM's 1-D tensor parallelism with its two all-reduces per layer.
Times: `calculators.multi_gpu.parallel.ring_allreduce_ms` (alpha-beta over the link's per-direction bandwidth).
"""
from __future__ import annotations

from calculators import arch
from calculators.multi_gpu.parallel import ring_allreduce_ms
from calculators.units import bytes_per_element, check_int
from specs.devices import Link
from specs.model_config import ModelConfig, SpecError


def mesh_check(config: ModelConfig, rows: int, cols: int) -> None:
    """SpecError unless C divides the query heads and splits (or evenly replicates) the KV heads, R divides D."""
    R, C = check_int("rows", rows, limit=1024), check_int("cols", cols, limit=1024)
    c = config
    if arch.is_mla(c):
        raise SpecError(f"{c.name} uses MLA: this view covers q/k/v attention (GQA/MHA/MQA) only")
    if c.num_heads % C:
        raise SpecError(f"{C} mesh columns do not divide {c.num_heads} query heads")
    if c.num_kv_heads % C and C % c.num_kv_heads:
        raise SpecError(f"{C} mesh columns cannot split or evenly replicate {c.num_kv_heads} KV heads")
    if c.hidden_size % R or c.intermediate_size % C:
        raise SpecError(f"{R} mesh rows must divide D = {c.hidden_size} and {C} columns F = {c.intermediate_size}")


def layer_sharding(config: ModelConfig, rows: int, cols: int, tokens: int, link: Link,
                   act_dtype: str = "bf16") -> list[dict]:
    """One layer, step by step, as seen by ONE device of an R × C mesh processing `tokens` rows (prefill: the
    prompt; decode: the batch). Shapes are [rows, columns]; bytes are the collective's message per device.
    Llama 3 70B on 4 × 8: 8 query heads and 1 KV head per device, a [T, 1,280] partial QKV (001)."""
    mesh_check(config, rows, cols)
    c, R, C, T = config, rows, cols, check_int("tokens", tokens)
    b = bytes_per_element(act_dtype)
    d, D, F = c.head_dim, c.hidden_size, c.intermediate_size
    hq, hkv = c.num_heads // C, max(c.num_kv_heads // C, 1)
    qkv = (hq + 2 * hkv) * d

    def row(step, op, weight, inp, out, coll, group):
        msg = T * out[1] * b if coll != "none" else 0.0
        ms = ring_allreduce_ms(msg, group, link) if coll != "none" and group > 1 else 0.0
        return dict(step=step, op=op, weight_shard=weight, input_shard=inp, output_shard=out,
                    collective=coll if group > 1 else "none", group_devices=group,
                    message_bytes=msg if group > 1 else 0.0, ms=ms)

    return [
        row(1, "q/k/v projection", (D // R, qkv), (T, D // R), (T, qkv), f"all-reduce over the {R} rows", R),
        row(2, f"attention ({hq} query heads, {hkv} KV head{'s' if hkv > 1 else ''})", (0, 0), (T, qkv),
            (T, hq * d), "none", 1),
        row(3, "o_proj", (hq * d, D // R), (T, hq * d), (T, D // R), f"all-reduce over the {C} columns", C),
        row(4, "gate and up projections", (D // R, 2 * F // C), (T, D // R), (T, 2 * F // C),
            f"all-reduce over the {R} rows", R),
        row(5, "down_proj", (F // C, D // R), (T, F // C), (T, D // R), f"all-reduce over the {C} columns", C),
    ]


def layer_comm_ms(config: ModelConfig, rows: int, cols: int, tokens: int, link: Link) -> float:
    """Communication of one layer on the mesh: the sum of its collectives (not overlapped)."""
    return sum(r["ms"] for r in layer_sharding(config, rows, cols, tokens, link))
