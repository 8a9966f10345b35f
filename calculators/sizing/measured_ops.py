"""Operations priced from a device profile: each op's measured latency, interpolated in log space, with its
datasheet roofline beside it and a mark where the shape lies past what was measured.

A profile (`specs.profiles.Profile`) holds tables of measured milliseconds: weight GEMMs by (m, n, k, dtype),
decode attention by (batch, context, heads, KV heads, head dim, KV dtype), prefill attention by (batch, tokens,
prefix, ...), fused MoE by (tokens, hidden, inter, experts, top-k, TP, EP), all-reduce by (bytes, GPUs).
For a shape between the measured ones this module interpolates the op's EFFICIENCY

    efficiency = roofline ms / measured ms,    roofline ms = max(bytes / bandwidth, FLOPs / peak)  (datasheet)

linearly in the logs of the sizes (one primary size, e.g. the GEMM's m, and the corners of the cell the other
sizes fall in), then prices the op at roofline / efficiency. Efficiency moves slowly where latency moves fast
(a GEMM's latency grows a thousandfold from m = 1 to m = 16,384, its efficiency a few times), so the
interpolation is gentle, and past the table's edge the efficiency is held at the edge's value: the op is then
extrapolated by the roofline, and `Priced.extrapolated` says so. A profile read for another device (the nearest
profiled one, borrowed) keeps its efficiencies but not its library's kernel-size cliffs (`padding_envelope`), nor
its library's quantized kernels that reach less of their roofline than its 16-bit ones at the same shape
(`no_slower_than_16_bits`).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from calculators.units import bytes_per_element
from specs.devices import Device, custom_device, load_device
from specs.model_config import SpecError
from specs.small_kernels import small_kernel_constants

ACT_BYTES = 2.0          # activations enter and leave the GEMMs in 16 bits (bf16/fp16) on every stack profiled

# the weight formats a table may hold, from narrowest to widest: a format not measured is priced by the next
# wider one that was (block-scaled FP8 by per-tensor FP8, FP4 by FP8), and marked
_WIDER = {"fp4": ("fp8_block", "fp8"), "fp8_block": ("fp8", "bf16"), "fp8": ("fp8_block", "bf16"),
          "int8": ("fp8",), "fp16": ("bf16",), "bf16": ("fp16",), "fp32": ("bf16",)}
# INT4 weights run weight-only kernels (Marlin, W4A16) that no profile measures as GEMMs: they stay with the closed
# form rather than borrow an FP8 table whose kernels work otherwise
_PEAK_OF = {"fp8_block": "fp8", "int4": "int8"}


@dataclass(frozen=True)
class Priced:
    """One op at one shape: its datasheet roofline and its measured (interpolated) time, in ms."""
    op: str
    ideal_ms: float
    ms: float
    extrapolated: bool      # some size lies past the measured table: its efficiency is the edge's
    note: str = ""          # e.g. "fp4 priced as fp8 (not measured)"

    @property
    def efficiency(self) -> float:
        """Roofline ÷ measured: the fraction of the datasheet this op reaches."""
        return self.ideal_ms / self.ms if self.ms > 0 else 0.0


def dtype_bytes(dtype: str) -> float:
    """Bytes per element of a profile's dtype name (fp8_block counts as fp8; fp4 with its block scales)."""
    d = str(dtype)
    if d == "fp8_block":
        return 1.0
    if d == "fp4":
        return 0.5 + 1 / 16           # NVFP4: one FP8 scale per 16 values
    return bytes_per_element(d)


def peak_flops(device: Device, dtype: str) -> float:
    return device.peak(_PEAK_OF.get(dtype, dtype if dtype != "fp4" or "fp4" in device.peak_flops else "fp8"))


# ------------------------------------------------------------------------------------------- rooflines
def gemm_roofline_ms(device: Device, m, n: float, k: float, dtype: str):
    """max(2mnk / peak, (m·k + m·n activations in 16 bits + k·n weights) / bandwidth), ms. Arrays in m."""
    m = np.asarray(m, dtype=float)
    flops = 2.0 * m * n * k
    bytes_ = (m * k + m * n) * ACT_BYTES + k * n * dtype_bytes(dtype)
    return np.maximum(flops / peak_flops(device, dtype), bytes_ / device.memory_bandwidth_bytes_per_s) * 1e3


def decode_attention_roofline_ms(device: Device, batch, context: float, heads: float, kv_heads: float,
                                 head_dim: float, kv_dtype: str, dtype: str = "bf16"):
    """One layer's decode attention: every row reads its K and V (context × 2 × kv_heads × head_dim) and does
    4 · heads · head_dim FLOPs per cached position (QKᵀ and P·V). Arrays in batch."""
    b = np.asarray(batch, dtype=float)
    bytes_ = b * context * 2 * kv_heads * head_dim * dtype_bytes(kv_dtype)
    flops = 4.0 * b * heads * head_dim * context
    return np.maximum(flops / peak_flops(device, dtype), bytes_ / device.memory_bandwidth_bytes_per_s) * 1e3


def prefill_attention_roofline_ms(device: Device, batch, tokens: float, prefix: float, heads: float,
                                  kv_heads: float, head_dim: float, kv_dtype: str, dtype: str = "bf16"):
    """One layer's causal prefill attention of `tokens` new tokens after `prefix` cached ones, per sequence:
    4 · heads · head_dim · tokens · (prefix + (tokens + 1)/2) FLOPs; Q, O and the K/V read once. Arrays in batch."""
    b = np.asarray(batch, dtype=float)
    flops = 4.0 * b * heads * head_dim * tokens * (prefix + (tokens + 1) / 2)
    bytes_ = b * (tokens * 2 * heads * head_dim * ACT_BYTES
                  + (tokens + prefix) * 2 * kv_heads * head_dim * dtype_bytes(kv_dtype))
    return np.maximum(flops / peak_flops(device, dtype), bytes_ / device.memory_bandwidth_bytes_per_s) * 1e3


# aiconfigurator-core measures MLA at DeepSeek-V3's shapes: a latent of 512 + a 64-wide RoPE key cached per token,
# and prefill's up-projected heads of 128 + 64 (query/key) and 128 (value); its rows are read against these
MLA_TABLE_RANK, MLA_TABLE_ROPE, MLA_TABLE_QK, MLA_TABLE_V = 512, 64, 192, 128


def mla_decode_roofline_ms(device: Device, batch, context: float, heads: float, rank: float, rope: float,
                           kv_dtype: str, dtype: str = "bf16"):
    """One layer's MLA decode attention in its absorbed form: every row reads its latent cache (context × (rank +
    rope)) once, and each head scores it (2 · (rank + rope) FLOPs per position) and sums the latent values
    (2 · rank). Arrays in batch."""
    b = np.asarray(batch, dtype=float)
    bytes_ = b * context * (rank + rope) * dtype_bytes(kv_dtype)
    flops = 2.0 * b * heads * context * (2 * rank + rope)
    return np.maximum(flops / peak_flops(device, dtype), bytes_ / device.memory_bandwidth_bytes_per_s) * 1e3


def mla_prefill_roofline_ms(device: Device, batch, tokens: float, prefix: float, heads: float, qk_dim: float,
                            v_dim: float, dtype: str = "bf16"):
    """One layer's causal MLA prefill, keys and values up-projected per head (qk_dim wide keys, v_dim wide
    values): 2 · heads · (qk_dim + v_dim) · tokens · (prefix + (tokens + 1)/2) FLOPs; Q and O of the new tokens
    and K and V of every key read once in 16 bits. Arrays in batch."""
    b = np.asarray(batch, dtype=float)
    flops = 2.0 * b * heads * (qk_dim + v_dim) * tokens * (prefix + (tokens + 1) / 2)
    bytes_ = b * (2 * tokens + prefix) * heads * (qk_dim + v_dim) * ACT_BYTES
    return np.maximum(flops / peak_flops(device, dtype), bytes_ / device.memory_bandwidth_bytes_per_s) * 1e3


def gdn_roofline_ms(device: Device, batch, tokens: float, k_heads: float, v_heads: float, head_k: float,
                    head_v: float, dtype: str = "bf16"):
    """One gated-delta-rule layer (linear attention) on one GPU for `batch` sequences of `tokens` new tokens each:
    6 · h · d_k · d_v FLOPs per token (h = max(k_heads, v_heads): state read-out, delta, rank-1 update; the
    roofline convention of `roofline.py`), each sequence's float32 state read and written once, and every token's
    q, k, v and output in 16 bits. Arrays in batch or tokens."""
    b, t = np.asarray(batch, dtype=float), np.asarray(tokens, dtype=float)
    h = max(k_heads, v_heads)
    flops = 6.0 * b * t * h * head_k * head_v
    bytes_ = b * h * head_k * head_v * 4.0 * 2 + b * t * (2 * k_heads * head_k + 2 * v_heads * head_v) * ACT_BYTES
    return np.maximum(flops / peak_flops(device, dtype), bytes_ / device.memory_bandwidth_bytes_per_s) * 1e3


def experts_hit(experts: float, topk: float, tokens):
    """Expected distinct experts `tokens` tokens route to (top-k of E each, uniform): E·(1 − (1 − k/E)^t)."""
    t = np.asarray(tokens, dtype=float)
    return experts * (1.0 - (1.0 - topk / experts) ** t)


def moe_roofline_ms(device: Device, tokens, hidden: float, inter: float, experts: float, topk: float,
                    tp: float, ep: float, dtype: str):
    """One MoE layer's experts on one GPU: the experts its share of tokens touches are read once (3 matrices of
    hidden × inter/tp each) and 2 · 3 · hidden · inter/tp FLOPs per (token, expert) pair. Arrays in tokens."""
    t = np.asarray(tokens, dtype=float)
    per_expert = 3.0 * hidden * inter / tp
    local = experts / ep
    touched = np.minimum(local, experts_hit(experts, topk, t) / ep)
    bytes_ = touched * per_expert * dtype_bytes(dtype) + t * hidden * ACT_BYTES * 2
    flops = 2.0 * per_expert * t * topk / ep
    return np.maximum(flops / peak_flops(device, dtype), bytes_ / device.memory_bandwidth_bytes_per_s) * 1e3


# the format names an all-to-all table uses, as `dtype_bytes` knows them
A2A_FORMATS = {"bfloat16": "bf16", "nvfp4": "fp4"}


def a2a_roofline_ms(link_bytes_per_s: float, tokens, hidden: float, topk: int, experts: int, ep: int,
                    dtype: str):
    """One dispatch (or combine) of `tokens` tokens per GPU among `ep` GPUs: each token goes once to each distinct
    remote GPU holding one of its top-k experts (`moe.dispatch_copies_per_token`, uniform routing) as `hidden`
    values of `dtype`, over one direction of the link (every GPU sends at once), ms. Arrays in tokens."""
    from calculators.multi_gpu.moe import dispatch_copies_per_token
    copies = dispatch_copies_per_token(int(experts), int(topk), int(ep))
    return np.asarray(tokens, dtype=float) * copies * hidden * dtype_bytes(A2A_FORMATS.get(dtype, dtype)) / \
        link_bytes_per_s * 1e3


def ring_pass_roofline_ms(link_bytes_per_s: float, bytes_, gpus: float):
    """A ring all-gather's (or reduce-scatter's) wire time: (n − 1)/n × the whole buffer over one direction of
    the link, ms."""
    b = np.asarray(bytes_, dtype=float)
    return b * (gpus - 1) / gpus / link_bytes_per_s * 1e3


def allreduce_roofline_ms(link_bytes_per_s: float, bytes_, gpus: float):
    """A ring all-reduce's wire time: 2(n − 1)/n × the message over one direction of the link, ms."""
    b = np.asarray(bytes_, dtype=float)
    return b * 2 * (gpus - 1) / gpus / link_bytes_per_s * 1e3


# ------------------------------------------------------------------------------------- interpolation
@dataclass(frozen=True)
class _Lines:
    """A table cut into lines along its primary size: for each tuple of the other sizes, the sorted log primary
    sizes and log efficiencies measured there."""
    others: tuple[str, ...]
    keys: np.ndarray             # [L, d] the other sizes of each line (log)
    lines: tuple                 # L × (log primary [n], log efficiency [n])
    axes: tuple                  # d × sorted unique log values of each other size
    primary_range: tuple         # (min, max) log primary over the table


def _build_lines(primary: np.ndarray, others: dict, log_eff: np.ndarray) -> _Lines:
    names = tuple(others)
    cols = np.stack([np.log(np.asarray(others[n], dtype=float)) for n in names], axis=1) if names else \
        np.zeros((len(primary), 0))
    lp = np.log(np.asarray(primary, dtype=float))
    groups: dict[tuple, list[int]] = {}
    for i, key in enumerate(map(tuple, np.round(cols, 9))):
        groups.setdefault(key, []).append(i)
    keys, lines = [], []
    for key, idx in groups.items():
        idx = np.asarray(idx)
        order = np.argsort(lp[idx], kind="stable")
        x, y = lp[idx][order], log_eff[idx][order]
        ux, inv = np.unique(x, return_inverse=True)              # repeats of one size: their mean
        uy = np.bincount(inv, weights=y) / np.bincount(inv)
        keys.append(key)
        lines.append((ux, uy))
    keys_arr = np.asarray(keys, dtype=float).reshape(len(keys), len(names))
    axes = tuple(np.unique(keys_arr[:, j]) for j in range(len(names)))
    return _Lines(names, keys_arr, tuple(lines), axes, (float(lp.min()), float(lp.max())))


def _bracket(axis: np.ndarray, v: float) -> tuple[list[tuple[float, float]], bool]:
    """The one or two axis values around v with their linear weights, and whether v lies outside the axis."""
    if v <= axis[0] or len(axis) == 1:
        return [(axis[0], 1.0)], v < axis[0] - 1e-9 or (len(axis) == 1 and abs(v - axis[0]) > 1e-9)
    if v >= axis[-1]:
        return [(axis[-1], 1.0)], v > axis[-1] + 1e-9
    j = int(np.searchsorted(axis, v))
    lo, hi = axis[j - 1], axis[j]
    f = (v - lo) / (hi - lo)
    return [(lo, 1 - f), (hi, f)], False


def interpolate(lines: _Lines, primary, others: dict) -> tuple[np.ndarray, np.ndarray]:
    """Log efficiency at `primary` (array) and the other sizes (scalars), and whether each point is past the
    table (an extrapolation). Multilinear in the logs over the corners of the cell the other sizes fall in that
    were measured (their weights renormalised); the nearest measured line when none of them was."""
    lp = np.log(np.maximum(np.asarray(primary, dtype=float), 1e-30))
    outside = False
    brackets = []
    for j, name in enumerate(lines.others):
        br, out = _bracket(lines.axes[j], math.log(max(float(others[name]), 1e-30)))
        brackets.append(br)
        outside |= out
    index = {tuple(k): i for i, k in enumerate(np.round(lines.keys, 9))}
    acc, wsum = np.zeros_like(lp), 0.0
    for corner in itertools.product(*brackets) if brackets else [()]:
        key = tuple(round(v, 9) for v, _ in corner)
        w = float(np.prod([wt for _, wt in corner])) if corner else 1.0
        i = index.get(key)
        if i is None or w == 0.0:
            continue
        x, y = lines.lines[i]
        acc += w * np.interp(lp, x, y)
        wsum += w
    if wsum == 0.0:                                      # no measured corner: the nearest line
        target = np.array([math.log(max(float(others[n]), 1e-30)) for n in lines.others])
        i = int(np.argmin(((lines.keys - target) ** 2).sum(axis=1)))
        x, y = lines.lines[i]
        acc, wsum, outside = np.interp(lp, x, y), 1.0, True
    past = (lp < lines.primary_range[0] - 1e-9) | (lp > lines.primary_range[1] + 1e-9) | outside
    return acc / wsum, past


# ----------------------------------------------------------------------------------- profile readers
_MEMO: dict = {}


def _memo(fn):
    """Cache a table's lines per profile object and the remaining arguments: a profile holds dicts (unhashable)
    and is loaded once per process, so its identity is the key (the object is kept alive beside the value so an
    id is never reused)."""
    def wrapped(profile, *args):
        key = (fn.__name__, id(profile), args)
        hit = _MEMO.get(key)
        if hit is None:
            hit = _MEMO[key] = (profile, fn(profile, profile_device(profile), *args))
        return hit[1]
    wrapped.__name__ = fn.__name__
    return wrapped


def profile_device(profile) -> Device:
    """The device a profile was measured on: the project's datasheet of that name, else the datasheet the profile
    carries (a CPU, a device the project does not list). Efficiencies are taken against THIS device's roofline,
    so a profile prices another device of its class at that device's roofline and the same efficiency."""
    own = getattr(profile, "datasheet", None)
    if isinstance(own, Device):
        return own
    try:
        return load_device(profile.device)
    except SpecError:
        if not own:
            raise
    peaks = {k: float(v) / 1e12 for k, v in own["peak_flops"].items()}
    return custom_device(profile.device, memory_gb=float(own.get("memory_bytes", 2 ** 30)) / 2 ** 30,
                         bandwidth_gb_s=float(own["memory_bandwidth_bytes_per_s"]) / 1e9, peak_tflops=peaks,
                         source=f"profile {profile.name}")


def _table(profile, name: str) -> dict | None:
    t = getattr(profile, "tables", {}).get(name)
    return t if t and len(t.get("ms", ())) else None


def _select(table: dict, **equal) -> np.ndarray:
    keep = np.ones(len(table["ms"]), dtype=bool)
    for col, v in equal.items():
        if col in table:
            keep &= np.asarray(table[col]).astype(str) == str(v)
    return keep


def _rows_of(profile, name: str, **equal):
    """(table, rows whose columns equal `equal`), or (None, None) when the table or every such row is missing."""
    t = _table(profile, name)
    if t is None:
        return None, None
    keep = _select(t, **equal)
    return (t, keep) if keep.any() else (None, None)


def padding_envelope(primary, others, ms):
    """Each line's latencies made non-decreasing in its primary size: at every size, the fastest latency measured
    at that size or a larger one on the same line (a kernel can always be run padded to a larger measured size).
    `others`: [rows, d] the other sizes that name a line. What a BORROWED profile's GEMMs are read through: the
    profiled library's kernel-size cliffs (vLLM's FP8 GEMM of a 16,384 × 16,384 weight on an H200 measures 0.32 ms
    at m = 257 and 0.18 ms at m = 512) belong to that library's dispatch on that chip, not to
    another vendor's, so another device keeps the curve's level and loses its cliffs."""
    envelope = ms.copy()
    for key in np.unique(others, axis=0):
        idx = np.flatnonzero((others == key).all(axis=1))
        idx = idx[np.argsort(primary[idx], kind="stable")]
        envelope[idx] = np.minimum.accumulate(ms[idx][::-1])[::-1]
    return envelope


@_memo
def _gemm_lines(profile, device: Device, dtype: str, envelope: bool = False) -> _Lines | None:
    t, keep = _rows_of(profile, "gemm", dtype=dtype)
    if t is None:
        return None
    m, n, k, ms = (np.asarray(t[c], dtype=float)[keep] for c in ("m", "n", "k", "ms"))
    if envelope:
        ms = padding_envelope(m, np.stack([n, k], axis=1), ms)
    ideal = gemm_roofline_ms(device, m, n, k, dtype)                 # elementwise over the rows
    return _build_lines(m, dict(n=n, k=k), np.log(ideal / ms))


def _fallback(builder, profile, dtype: str):
    """The lines of `dtype`, or of the next wider format measured (with a note), or (None, note)."""
    for d in (dtype, *_WIDER.get(dtype, ())):
        lines = builder(profile, d)
        if lines is not None:
            return lines, d, "" if d == dtype else f"{dtype} priced as {d} (not measured)"
    return None, None, f"no {dtype} measured"


def gemm_format(profile, dtype: str) -> str | None:
    """The format whose GEMM table prices `dtype` weights in `profile` (itself, or the next wider one measured),
    None where none does (INT4's weight-only kernels: no wider table stands in for them)."""
    return _fallback(_gemm_lines, profile, dtype)[1]


WIDE_FORMATS = ("bf16", "fp16", "fp32")


def no_slower_than_16_bits(ms, past, wide):
    """A BORROWED profile's quantized kernel read at no lower efficiency than the same profile's 16-bit kernel at
    the same shape, each against its own format's roofline: (ms, extrapolated). vLLM's FP8 fused MoE of Mixtral
    8x7B on an H200 (aiconfigurator-core 0.12) measures 4.0 ms for 1,024 tokens where its bf16 kernel takes 1.4 ms;
    TensorRT-LLM's FP8 kernel takes 0.75 ms against its bf16 1.41 ms, the same share of a doubled peak. A slow
    quantized path is that library's untuned kernel on that chip, which another vendor's stack does not run (on its
    own device a profile keeps it, and the step's op table says the quantized kernel is the slower). `wide`: the
    quantized format's roofline over the bf16 kernel's efficiency, with its extrapolation flags, or None where the
    profile measured no bf16."""
    if wide is None:
        return ms, past
    wide_ms, wide_past = wide
    slower = np.asarray(ms) > np.asarray(wide_ms)
    return np.where(slower, wide_ms, ms), np.where(slower, wide_past, past)


def _floored_at_16_bits(ms, past, wide_lines, size, shape: dict, ideal_used):
    """`no_slower_than_16_bits` with the profile's bf16 lines (`wide_lines`, None where it measured none) read at
    the same primary `size` and `shape`, against the quantized format's roofline `ideal_used`."""
    if wide_lines is None:
        return ms, past
    le16, past16 = interpolate(wide_lines, size, shape)
    return no_slower_than_16_bits(ms, past, (ideal_used / np.exp(le16), past16))


def _borrowed(profile, device: Device) -> bool:
    return device.name != profile_device(profile).name


def gemm_ms(profile, device: Device, m, n: int, k: int, dtype: str = "bf16") -> Priced | list:
    """A weight GEMM [m × k] · [k × n] at `dtype` weights: measured, interpolated (see the module docstring).
    `m` may be an array: then the return value is (ideal ms, ms, extrapolated) arrays. On another device than the
    profile's (a borrowed profile) the table is read through its `padding_envelope`, and a quantized GEMM at no
    lower efficiency than the profile's bf16 one (`no_slower_than_16_bits`)."""
    borrowed = _borrowed(profile, device)
    lines, used, note = _fallback(lambda p, d: _gemm_lines(p, d, borrowed), profile, dtype)
    ideal = gemm_roofline_ms(device, m, n, k, dtype)
    if lines is None:
        raise SpecError(f"profile {profile.name} has no GEMM table for {dtype}")
    ideal_used = gemm_roofline_ms(device, m, n, k, used)
    le, past = interpolate(lines, m, dict(n=n, k=k))
    ms = ideal_used / np.exp(le)
    if borrowed and used not in WIDE_FORMATS:
        ms, past = _floored_at_16_bits(ms, past, _gemm_lines(profile, "bf16", True), m, dict(n=n, k=k), ideal_used)
    return _priced("gemm", ideal, ms, past | bool(note), note, np.ndim(m))


def _priced(op, ideal, ms, past, note, ndim):
    if ndim == 0:
        return Priced(op, float(ideal), float(ms), bool(np.asarray(past).any()), note)
    return np.asarray(ideal, dtype=float), np.asarray(ms, dtype=float), np.asarray(past, dtype=bool)


def _kv_dtype_name(kv_dtype: str) -> str:
    return "fp8" if str(kv_dtype).startswith("fp8") else str(kv_dtype)


@_memo
def _decode_lines(profile, device: Device, kv_dtype: str, head_dim: int) -> _Lines | None:
    t = _table(profile, "generation_attention")
    if t is None:
        return None
    keep = _select(t, kv_dtype=kv_dtype, head_dim=head_dim, window=0)
    if not keep.any():
        keep = _select(t, kv_dtype=kv_dtype, window=0)          # another head size: the nearest is scaled
    if not keep.any():
        return None
    b, ctx, h, kvh, hd, ms = (np.asarray(t[c], dtype=float)[keep]
                              for c in ("batch", "context", "heads", "kv_heads", "head_dim", "ms"))
    ideal = decode_attention_roofline_ms(device, b, ctx, h, kvh, hd, kv_dtype)
    return _build_lines(b, dict(context=ctx, heads=h, kv_heads=kvh), np.log(ideal / ms))


def decode_attention_ms(profile, device: Device, batch, context: float, heads: int, kv_heads: int,
                        head_dim: int, kv_dtype: str = "bf16"):
    """One layer's decode attention of `batch` rows at `context` cached positions each (per GPU: heads after TP).
    `batch` may be an array (then arrays come back, as `gemm_ms`)."""
    kd = _kv_dtype_name(kv_dtype)
    lines = _decode_lines(profile, kd, int(head_dim))
    note = ""
    if lines is None and kd != "bf16":
        lines, note = _decode_lines(profile, "bf16", int(head_dim)), f"KV {kd} priced as bf16"
    if lines is None:
        raise SpecError(f"profile {profile.name} has no decode attention table")
    ideal = decode_attention_roofline_ms(device, batch, context, heads, kv_heads, head_dim, kd)
    le, past = interpolate(lines, batch, dict(context=max(context, 1.0), heads=heads, kv_heads=kv_heads))
    return _priced("decode attention", ideal, ideal / np.exp(le), past, note, np.ndim(batch))


@_memo
def _prefill_lines(profile, device: Device, kv_dtype: str, head_dim: int, primary: str = "tokens") -> _Lines | None:
    t = _table(profile, "context_attention")
    if t is None:
        return None
    keep = _select(t, kv_dtype=kv_dtype, head_dim=head_dim, window=0)
    if not keep.any():
        keep = _select(t, kv_dtype=kv_dtype, window=0)
    if not keep.any():
        return None
    cols = ("batch", "tokens", "prefix", "heads", "kv_heads", "head_dim", "ms")
    b, tok, pre, h, kvh, hd, ms = (np.asarray(t[c], dtype=float)[keep] if c in t else
                                   np.zeros(int(keep.sum())) for c in cols)
    ideal = prefill_attention_roofline_ms(device, b, tok, pre, h, kvh, hd, kv_dtype)
    # the primary size is the tokens a sequence prefills (batch another size), or the batch (tokens another)
    if primary == "batch":
        return _build_lines(b, dict(tokens=tok, heads=h, kv_heads=kvh), np.log(ideal / ms))
    return _build_lines(tok, dict(batch=b, heads=h, kv_heads=kvh), np.log(ideal / ms))


def prefill_attention_ms(profile, device: Device, tokens, heads: int, kv_heads: int, head_dim: int,
                         kv_dtype: str = "bf16", batch=1.0, prefix: float = 0.0):
    """One layer's causal prefill attention of `batch` prompts of `tokens` each (per GPU: heads after TP).
    Measured tables have no prefix: a prompt after `prefix` cached tokens is priced at the efficiency of its
    own length. Either `tokens` or `batch` may be an array (then arrays come back, as `gemm_ms`)."""
    kd = _kv_dtype_name(kv_dtype)
    primary = "batch" if np.ndim(batch) else "tokens"
    lines = _prefill_lines(profile, kd, int(head_dim), primary)
    note = ""
    if lines is None and kd != "bf16":
        lines, note = _prefill_lines(profile, "bf16", int(head_dim), primary), f"KV {kd} priced as bf16"
    if lines is None:
        raise SpecError(f"profile {profile.name} has no prefill attention table")
    ideal = prefill_attention_roofline_ms(device, batch, tokens, prefix, heads, kv_heads, head_dim, kd)
    if primary == "batch":
        le, past = interpolate(lines, np.maximum(batch, 1.0), dict(tokens=float(tokens), heads=heads,
                                                                   kv_heads=kv_heads))
    else:
        le, past = interpolate(lines, tokens, dict(batch=max(float(batch), 1.0), heads=heads, kv_heads=kv_heads))
    return _priced("prefill attention", ideal, ideal / np.exp(le), past, note, np.ndim(tokens) or np.ndim(batch))


@_memo
def _mla_lines(profile, device: Device, table: str, kv_dtype: str, primary: str) -> _Lines | None:
    t, keep = _rows_of(profile, table, kv_dtype=kv_dtype)
    if t is None:
        return None
    col = (lambda c: np.asarray(t[c], dtype=float)[keep] if c in t else np.zeros(int(keep.sum())))
    b, h, ms = col("batch"), col("heads"), col("ms")
    if table == "mla_generation":
        ctx = col("context")
        ideal = mla_decode_roofline_ms(device, b, ctx, h, MLA_TABLE_RANK, MLA_TABLE_ROPE, kv_dtype)
        return _build_lines(b, dict(context=ctx, heads=h), np.log(ideal / ms))
    tok, pre = col("tokens"), col("prefix")
    ideal = mla_prefill_roofline_ms(device, b, tok, pre, h, MLA_TABLE_QK, MLA_TABLE_V)
    if primary == "batch":
        return _build_lines(b, dict(tokens=tok, heads=h), np.log(ideal / ms))
    return _build_lines(tok, dict(batch=b, heads=h), np.log(ideal / ms))


def _mla_table_lines(profile, table: str, kv_dtype: str, primary: str, what: str):
    """The MLA table's lines for this KV format, else bf16's (and a note), else one SpecError."""
    kd = _kv_dtype_name(kv_dtype)
    lines, note = _mla_lines(profile, table, kd, primary), ""
    if lines is None and kd != "bf16":
        lines, note = _mla_lines(profile, table, "bf16", primary), f"KV {kd} priced as bf16"
    if lines is None:
        raise SpecError(f"profile {profile.name} has no MLA {what} table")
    return lines, note, kd


def _mla_shape_note(note: str, **dims) -> str:
    measured = dict(rank=MLA_TABLE_RANK, rope=MLA_TABLE_ROPE, qk_dim=MLA_TABLE_QK, v_dim=MLA_TABLE_V)
    if all(measured[k] == v for k, v in dims.items()):
        return note
    return "; ".join(x for x in (note, "MLA measured at DeepSeek-V3's shapes, read at this model's roofline") if x)


def mla_decode_ms(profile, device: Device, batch, context: float, heads: int, rank: int, rope: int,
                  kv_dtype: str = "bf16"):
    """One layer's MLA decode attention (absorbed) of `batch` rows at `context` cached positions (heads per GPU),
    from the profile's `mla_generation` table. `batch` may be an array (then arrays come back, as `gemm_ms`)."""
    lines, note, kd = _mla_table_lines(profile, "mla_generation", kv_dtype, "batch", "decode")
    ideal = mla_decode_roofline_ms(device, batch, context, heads, rank, rope, kd)
    le, past = interpolate(lines, batch, dict(context=max(context, 1.0), heads=heads))
    return _priced("MLA decode attention", ideal, ideal / np.exp(le), past,
                   _mla_shape_note(note, rank=rank, rope=rope), np.ndim(batch))


def mla_prefill_ms(profile, device: Device, tokens, heads: int, qk_dim: int, v_dim: int, kv_dtype: str = "bf16",
                   batch=1.0, prefix: float = 0.0):
    """One layer's causal MLA prefill of `batch` prompts of `tokens` each (heads per GPU), from the profile's
    `mla_context` table. Either `tokens` or `batch` may be an array (then arrays come back)."""
    primary = "batch" if np.ndim(batch) else "tokens"
    lines, note, _ = _mla_table_lines(profile, "mla_context", kv_dtype, primary, "prefill")
    ideal = mla_prefill_roofline_ms(device, batch, tokens, prefix, heads, qk_dim, v_dim)
    if primary == "batch":
        le, past = interpolate(lines, np.maximum(batch, 1.0), dict(tokens=float(tokens), heads=heads))
    else:
        le, past = interpolate(lines, tokens, dict(batch=max(float(batch), 1.0), heads=heads))
    return _priced("MLA prefill attention", ideal, ideal / np.exp(le), past,
                   _mla_shape_note(note, qk_dim=qk_dim, v_dim=v_dim), np.ndim(tokens) or np.ndim(batch))


@_memo
def _gdn_lines(profile, device: Device, phase: str, primary: str) -> _Lines | None:
    t, keep = _rows_of(profile, "linear_attention", phase=phase)
    if t is None:
        return None
    b, tok, kh, vh, dk, dv, ms = (np.asarray(t[c], dtype=float)[keep] for c in
                                  ("batch", "tokens", "k_heads", "v_heads", "head_k_dim", "head_v_dim", "ms"))
    ideal = np.array([gdn_roofline_ms(device, *x) for x in zip(b, tok, kh, vh, dk, dv)], dtype=float)
    if primary == "batch":
        return _build_lines(b, dict(tokens=tok, k_heads=kh, v_heads=vh), np.log(ideal / ms))
    return _build_lines(tok, dict(batch=b, k_heads=kh, v_heads=vh), np.log(ideal / ms))


def _gdn_priced(profile, device, phase, primary, batch, tokens, k_heads, v_heads, head_k, head_v, what):
    lines = _gdn_lines(profile, phase, primary)
    if lines is None:
        raise SpecError(f"profile {profile.name} has no linear-attention ({phase}) table")
    ideal = gdn_roofline_ms(device, batch, tokens, k_heads, v_heads, head_k, head_v)
    if primary == "batch":
        le, past = interpolate(lines, np.maximum(batch, 1.0), dict(tokens=float(tokens), k_heads=k_heads,
                                                                   v_heads=v_heads))
    else:
        le, past = interpolate(lines, np.maximum(tokens, 1.0), dict(batch=max(float(batch), 1.0), k_heads=k_heads,
                                                                    v_heads=v_heads))
    return _priced(what, ideal, ideal / np.exp(le), past, "", np.ndim(batch) or np.ndim(tokens))


def linear_decode_ms(profile, device: Device, batch, k_heads: int, v_heads: int, head_k: int, head_v: int):
    """One gated-delta-rule layer's decode step of `batch` sequences (heads per GPU), from the profile's
    `linear_attention` generation rows; its cost does not grow with the context. `batch` may be an array."""
    return _gdn_priced(profile, device, "generation", "batch", batch, 1.0, k_heads, v_heads, head_k, head_v,
                       "linear attention decode")


def linear_prefill_ms(profile, device: Device, tokens, k_heads: int, v_heads: int, head_k: int, head_v: int,
                      batch=1.0):
    """One gated-delta-rule layer's prefill of `batch` prompts of `tokens` each (heads per GPU), from the
    profile's `linear_attention` context rows. Either `tokens` or `batch` may be an array."""
    primary = "batch" if np.ndim(batch) else "tokens"
    return _gdn_priced(profile, device, "context", primary, batch, tokens, k_heads, v_heads, head_k, head_v,
                       "linear attention prefill")


MOE_ROUTING = ("power_law_1.01", "uniform", "balanced")   # the routing a MoE table is read at, first measured


@_memo
def _moe_lines(profile, device: Device, dtype: str) -> _Lines | None:
    t, keep = _rows_of(profile, "moe", dtype=dtype)
    if t is None:
        return None
    if "distribution" in t:
        # aiconfigurator prices MoE at its default routing, a power law of exponent 1.01 (`workload_distribution`
        # "power_law", alpha 1.01): real routers skew. Its "balanced" rows also run faster than reading the experts
        # the tokens must touch allows (B200 NVFP4, 512 tokens on one GPU: 0.63 ms, 126% of the roofline).
        dist = np.asarray(t["distribution"]).astype(str)
        for pref in MOE_ROUTING:
            if (keep & (dist == pref)).any():
                keep &= dist == pref
                break
    if not keep.any():
        return None
    cols = ("tokens", "hidden", "inter", "experts", "topk", "tp", "ep", "ms")
    tok, hid, inter, e, k, tp, ep, ms = (np.asarray(t[c], dtype=float)[keep] for c in cols)
    ideal = moe_roofline_ms(device, tok, hid, inter, e, k, tp, ep, dtype)    # elementwise over the rows
    return _build_lines(tok, dict(hidden=hid, inter=inter, experts=e, topk=k, tp=tp, ep=ep), np.log(ideal / ms))


def moe_ms(profile, device: Device, tokens, hidden: int, inter: int, experts: int, topk: int, tp: int = 1,
           ep: int = 1, dtype: str = "bf16"):
    """One MoE layer's routed experts (fused kernel) for `tokens` tokens, on one GPU of TP `tp` × EP `ep`.
    `tokens` may be an array. On another device than the profile's (borrowed), a quantized kernel is read at no
    lower efficiency than the profile's bf16 one (`no_slower_than_16_bits`)."""
    lines, used, note = _fallback(_moe_lines, profile, dtype)
    if lines is None:
        raise SpecError(f"profile {profile.name} has no MoE table for {dtype}")
    ideal = moe_roofline_ms(device, tokens, hidden, inter, experts, topk, tp, ep, dtype)
    ideal_used = moe_roofline_ms(device, tokens, hidden, inter, experts, topk, tp, ep, used)
    shape = dict(hidden=hidden, inter=inter, experts=experts, topk=topk, tp=tp, ep=ep)
    le, past = interpolate(lines, np.maximum(tokens, 1.0), shape)
    ms = ideal_used / np.exp(le)
    if _borrowed(profile, device) and used not in WIDE_FORMATS:
        ms, past = _floored_at_16_bits(ms, past, _moe_lines(profile, "bf16"), np.maximum(tokens, 1.0), shape,
                                       ideal_used)
    return _priced("moe experts", ideal, ms, past | bool(note), note, np.ndim(tokens))


def _fastest_per_size(columns: tuple, ms: np.ndarray) -> tuple:
    """The distinct sizes among `columns` (equal-length arrays) and, at each, the least of `ms`: several kernels
    measured at one size, of which the stack runs the fastest."""
    sizes, at = np.unique(np.stack(columns, axis=1), axis=0, return_inverse=True)
    fastest = np.full(len(sizes), np.inf)
    np.minimum.at(fastest, at.ravel(), ms)
    return tuple(sizes.T), fastest


@_memo
def _allreduce_lines(profile, _device, gpus: int, link_bytes_per_s: float) -> _Lines | None:
    t = _table(profile, "allreduce")
    if t is None:
        return None
    keep = np.ones(len(t["ms"]), dtype=bool)
    if "kind" in t:
        kinds = np.asarray(t["kind"]).astype(str)
        graph = np.char.find(kinds, "graph") >= 0
        if graph.any():
            keep &= graph
    b, g, ms = (np.asarray(t[c], dtype=float)[keep] for c in ("bytes", "gpus", "ms"))
    # several kernels measured at one size (custom, NCCL): the stack runs the fastest, as its AUTO strategy picks
    (b, g), ms = _fastest_per_size((b, g), ms)
    ideal = allreduce_roofline_ms(link_bytes_per_s, b, g)                   # elementwise over the rows
    return _build_lines(b, dict(gpus=g), np.log(ideal / ms))


def allreduce_ms(profile, link_bytes_per_s: float, bytes_, gpus: int):
    """An all-reduce of `bytes_` (array allowed) over `gpus` GPUs, or None where the profile has no table."""
    lines = _allreduce_lines(profile, int(gpus), float(link_bytes_per_s))
    if lines is None or gpus < 2:
        return None
    ideal = allreduce_roofline_ms(link_bytes_per_s, bytes_, gpus)
    le, past = interpolate(lines, np.maximum(bytes_, 1.0), dict(gpus=gpus))
    return _priced("all-reduce", ideal, ideal / np.exp(le), past, "", np.ndim(bytes_))


@_memo
def _ring_lines(profile, _device, table: str, link_bytes_per_s: float) -> _Lines | None:
    t = _table(profile, table)
    if t is None:
        return None
    b, g, ms = (np.asarray(t[c], dtype=float) for c in ("bytes", "gpus", "ms"))
    (b, g), ms = _fastest_per_size((b, g), ms)          # the 16-bit and 8-bit rows of one size: bytes are bytes
    ideal = ring_pass_roofline_ms(link_bytes_per_s, b, g)                   # elementwise over the rows
    return _build_lines(b, dict(gpus=g), np.log(ideal / ms))


def ring_collective_ms(profile, table: str, link_bytes_per_s: float, bytes_, gpus: int):
    """One all-gather (`table` "allgather") or reduce-scatter ("reduce_scatter") whose whole buffer is `bytes_`
    (array allowed) over `gpus` GPUs, from the profile's measured table (its efficiency against
    `ring_pass_roofline_ms`, interpolated in log bytes), or None where the profile measured none."""
    lines = _ring_lines(profile, str(table), float(link_bytes_per_s))
    if lines is None or gpus < 2:
        return None
    ideal = ring_pass_roofline_ms(link_bytes_per_s, bytes_, gpus)
    le, past = interpolate(lines, np.maximum(bytes_, 1.0), dict(gpus=gpus))
    return _priced(table, ideal, ideal / np.exp(le), past, "", np.ndim(bytes_))


@_memo
def _a2a_lines(profile, _device, phase: str, dtype: str, link_bytes_per_s: float) -> _Lines | None:
    t, keep = _rows_of(profile, "moe_a2a", phase=phase, dtype=dtype)
    if t is None:
        return None
    if "nodes" in t:                                     # one node: the NVLink domain the link stands for
        keep &= np.asarray(t["nodes"], dtype=float) == 1
    cols = ("tokens", "hidden", "topk", "experts", "ep", "ms")
    tok, hid, k, e, ep, ms = (np.asarray(t[c], dtype=float)[keep] for c in cols)
    if not len(ms):
        return None
    # several backends measured at one shape (DeepEP low-latency below a few hundred tokens, high-throughput at
    # every size): the stack switches to the faster, so the fastest is kept, as for the all-reduces
    (tok, hid, k, e, ep), ms = _fastest_per_size((tok, hid, k, e, ep), ms)
    ideal = np.array([a2a_roofline_ms(link_bytes_per_s, *row, dtype) for row in zip(tok, hid, k, e, ep)],
                     dtype=float)
    return _build_lines(tok, dict(hidden=hid, topk=k, experts=e, ep=ep), np.log(ideal / ms))


def moe_a2a_ms(profile, link_bytes_per_s: float, tokens, hidden: int, topk: int, experts: int, ep: int,
               phase: str, dtype: str):
    """One MoE layer's dispatch or combine (`phase`) of `tokens` tokens per GPU (array allowed) among `ep` GPUs,
    sending `dtype` (bfloat16, fp8, nvfp4), from the profile's measured all-to-all table (DeepEP); None where the
    profile measured none in that format. Its efficiency against `a2a_roofline_ms` is interpolated in log tokens
    (an EP size between those measured: between their lines; past them, held at the edge and marked)."""
    lines = _a2a_lines(profile, str(phase), str(dtype), float(link_bytes_per_s))
    if lines is None:
        return None
    ideal = a2a_roofline_ms(link_bytes_per_s, tokens, hidden, topk, experts, ep, dtype)
    le, past = interpolate(lines, np.maximum(tokens, 1.0), dict(hidden=hidden, topk=topk, experts=experts, ep=ep))
    return _priced(f"all-to-all {phase}", ideal, ideal / np.exp(le), past, "", np.ndim(tokens))


def elementwise_ms(profile, device: Device, bytes_, kernels: float):
    """The step's memory-bound small kernels (norms, residual adds, RoPE, the gate's activation, sampling's
    softmax): their bytes over the bandwidth these kernels reach, plus each kernel's fixed latency, from the
    profile's source (`specs.small_kernels`: aiconfigurator-core's own per-GPU figures, or the profiler's launch
    table). (ideal ms, ms); None where the profile says neither."""
    key = ("small kernels", id(profile))
    if key not in _MEMO:
        _MEMO[key] = (profile, small_kernel_constants(profile))
    k = _MEMO[key][1]
    if not k:
        return None
    frac, lat = k["elementwise_bandwidth_fraction"], k["kernel_latency_ms"]
    ideal = np.asarray(bytes_, dtype=float) / device.memory_bandwidth_bytes_per_s * 1e3
    return ideal, ideal / float(frac) + kernels * float(lat)
