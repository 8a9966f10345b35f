"""Quantization: weight size and bandwidth floor per precision, and symmetric INT8/INT4 quantize/dequantize in NumPy.

003 Detail 18:
    scale = max|W| / q_max        (q_max = 127 for INT8, 7 for INT4)
    q     = round(W / scale)      clipped to [−2^(bits−1), 2^(bits−1) − 1]  (INT8 [−128, 127], INT4 [−8, 7])
    Ŵ     = q × scale
Walk-through: max|W| = 1.0 -> scale = 1/127 ≈ 0.00787; 0.0217 / 0.00787 = 2.76 -> q = 3 -> Ŵ = 0.0236 (error 0.0019).
Granularity: one scale per tensor, per output channel, or per group of `group_size` consecutive weights along the
input (reduction) dimension, as GPTQ/AWQ do. Storage adds the scales (`calculators.sizing.params.bytes_per_param`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from calculators.sizing.latency import bandwidth_floor_ms
from calculators.sizing.params import bytes_per_param, weight_bytes
from calculators.units import bytes_per_element, check_int, check_positive
from specs.model_config import ModelConfig, SpecError

GRANULARITIES = ("per_tensor", "per_channel", "per_group")


def q_range(bits: int) -> tuple[int, int]:
    """Signed two's-complement range: INT8 (-128, 127), INT4 (-8, 7)."""
    if bits not in (2, 3, 4, 8):
        raise SpecError(f"bits must be 8 or 4 (or 3, 2), got {bits!r}")
    return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1


@dataclass(frozen=True)
class QuantizedTensor:
    q: np.ndarray              # int8 codes, same shape as the input
    scale: np.ndarray          # float32 scales, broadcastable against the codes (see `granularity`)
    bits: int
    granularity: str
    group_size: int | None
    axis: int

    @property
    def num_scales(self) -> int:
        return int(self.scale.size)

    def storage_bytes(self, scale_bytes: float = 2) -> float:
        """Packed size: bits/8 per code + one scale (fp16 by default) per tensor/channel/group."""
        return self.q.size * self.bits / 8 + self.num_scales * scale_bytes


def _as_float_array(w) -> np.ndarray:
    a = np.asarray(w, dtype=np.float64)
    if a.size == 0:
        raise SpecError("cannot quantize an empty array")
    if not np.all(np.isfinite(a)):
        raise SpecError("cannot quantize an array holding NaN or infinity")
    return a


def quantize(w, bits: int = 8, granularity: str = "per_tensor", group_size: int = 128,
             axis: int = 0) -> QuantizedTensor:
    """Symmetric quantization of `w`. per_channel: one scale per index along `axis` (the output channel; rows of
    a Hugging Face [out, in] weight). per_group: groups of `group_size` consecutive values along the LAST axis
    (the input dimension), which must divide evenly."""
    a = _as_float_array(w)
    lo, hi = q_range(bits)
    if granularity not in GRANULARITIES:
        raise SpecError(f"granularity must be one of {', '.join(GRANULARITIES)}, got {granularity!r}")
    gs = None
    if granularity == "per_tensor":
        amax = np.max(np.abs(a)).reshape(())
    elif granularity == "per_channel":
        if a.ndim < 1:
            raise SpecError("per_channel needs at least a 1-D array")
        ax = axis % a.ndim
        amax = np.max(np.abs(a), axis=tuple(i for i in range(a.ndim) if i != ax), keepdims=True)
    else:
        gs = check_int("group_size", group_size, limit=1 << 30)
        if a.shape[-1] % gs:
            raise SpecError(f"last dimension ({a.shape[-1]}) is not a multiple of group_size ({gs})")
        g = a.reshape(*a.shape[:-1], a.shape[-1] // gs, gs)
        amax = np.max(np.abs(g), axis=-1, keepdims=True)                 # [..., n_groups, 1]
    scale = np.where(amax > 0, amax / hi, 1.0)
    if granularity == "per_group":
        codes = np.clip(np.rint(a.reshape(*a.shape[:-1], -1, gs) / scale), lo, hi).reshape(a.shape)
    else:
        codes = np.clip(np.rint(a / scale), lo, hi)
    return QuantizedTensor(q=codes.astype(np.int8), scale=scale.astype(np.float32), bits=bits,
                           granularity=granularity, group_size=gs, axis=axis)


def dequantize(qt: QuantizedTensor) -> np.ndarray:
    """Ŵ = q × scale, float32, in the original shape."""
    q = qt.q.astype(np.float32)
    if qt.granularity == "per_group":
        gs = qt.group_size
        return (q.reshape(*q.shape[:-1], -1, gs) * qt.scale).reshape(q.shape)
    return q * qt.scale


def quantize_value(x: float, max_abs: float, bits: int = 8) -> dict:
    """One weight through the round trip, for the walk-through: scale = max_abs / q_max, q = round(x / scale),
    Ŵ = q × scale, error = |Ŵ − x|. (0.0217 with max 1.0 at INT8 -> q 3, Ŵ 0.0236, error 0.0019.)"""
    lo, hi = q_range(bits)
    scale = check_positive("max_abs", max_abs) / hi
    q = int(np.clip(np.rint(x / scale), lo, hi))
    return dict(scale=scale, ratio=x / scale, q=q, dequantized=q * scale, error=abs(q * scale - x))


def quantization_error(w, w_hat) -> dict:
    """How far Ŵ is from W: max and mean absolute error, RMSE, RMSE relative to RMS(W), SQNR in dB."""
    a, b = _as_float_array(w), _as_float_array(w_hat)
    if a.shape != b.shape:
        raise SpecError(f"shapes differ: {a.shape} vs {b.shape}")
    e = b - a
    rmse = float(np.sqrt(np.mean(e ** 2)))
    rms = float(np.sqrt(np.mean(a ** 2)))
    return dict(max_abs_error=float(np.max(np.abs(e))), mean_abs_error=float(np.mean(np.abs(e))), rmse=rmse,
                relative_rmse=rmse / rms if rms else 0.0,
                sqnr_db=float(10 * np.log10(rms ** 2 / rmse ** 2)) if rmse > 0 else float("inf"))


def precision_table(model: ModelConfig | float, bandwidth_bytes_per_s: float,
                    dtypes: tuple[str, ...] = ("fp16", "int8", "int4"), group_size: int | None = None,
                    scale_dtype: str = "fp16") -> list[dict]:
    """Weight bytes and decode bandwidth floor per precision (003 Detail 18's table): TinyLlama on an A100 (1,555
    GB/s): FP16 2.2 GB -> 1.41 ms, INT8 1.1 GB -> 0.71 ms, INT4 0.55 GB -> 0.35 ms. With `group_size`, integer
    formats carry one `scale_dtype` scale per group (float formats none)."""
    rows = []
    for d in dtypes:
        g = group_size if d.startswith("int") else None
        wb = weight_bytes(model, d, g, scale_dtype)
        rows.append(dict(dtype=d, bytes_per_param=bytes_per_param(d, g, scale_dtype), group_size=g,
                         weight_bytes=wb, bandwidth_floor_ms=bandwidth_floor_ms(wb, bandwidth_bytes_per_s),
                         bits_per_weight=8 * bytes_per_param(d, g, scale_dtype)))
    return rows


def kv_bytes_ratio(kv_dtype: str, baseline: str = "fp16") -> float:
    """How much a quantized KV cache shrinks per token vs `baseline` (fp8/int8: 0.5, int4: 0.25)."""
    return bytes_per_element(kv_dtype) / bytes_per_element(baseline)


# What a lower weight precision costs in answer quality, in words a planner can show next to a cheaper plan.
# Source: Kurtic et al., "Give Me BF16 or Give Me Death? Accuracy-Performance Trade-Offs in LLM Quantization"
# (2024, arXiv:2411.02355), over 500,000 evaluations of Llama 3.1 8B/70B/405B.
QUALITY_CAVEATS = {
    "fp8": "FP8 weights (and activations) were found essentially lossless against BF16 on academic and real-world "
           "benchmarks at every Llama 3.1 size (Kurtic et al. 2024, arXiv:2411.02355).",
    "int8": "INT8 weights and activations, well tuned, lost about 1-3% accuracy against BF16 in the same study "
            "(Kurtic et al. 2024, arXiv:2411.02355).",
    "int4": "INT4 weights (GPTQ/AWQ-style, 16-bit activations) stayed competitive with 8-bit in that study, but "
            "losses grow on small models, long contexts and hard reasoning; check your own task before buying on "
            "it (Kurtic et al. 2024, arXiv:2411.02355).",
}


def quality_caveat(weight_dtype: str) -> str | None:
    """The quality note for a weight precision below 16 bits (None for bf16/fp16/fp32)."""
    return QUALITY_CAVEATS.get(weight_dtype)
