"""Units, number formats and input checks shared by every calculator.

Convention (the reference text's, stated once here and in the UI): MB and GB are DECIMAL (1 MB = 10^6 bytes,
1 GB = 10^9 bytes), like GPU vendors' bandwidth and capacity figures (003, Detail 2a). KiB/MiB/GiB are binary and
only used where the text's number is binary (e.g. "22 KB" of KV per token is 22,528 bytes = 22 KiB).
Every function returns plain SI numbers (bytes, seconds, FLOPs); names carry the unit (`_bytes`, `_ms`, `_s`).
"""
from __future__ import annotations

import math

from specs.devices import precision_name
from specs.model_config import SpecError

KB, MB, GB, TB = 1e3, 1e6, 1e9, 1e12
KiB, MiB, GiB = 2 ** 10, 2 ** 20, 2 ** 30

# Storage width of one element. "tf32" is stored as 32 bits; integer formats hold no scale here (see
# `params.bytes_per_param` for per-group scale overhead).
DTYPE_BITS = {"fp32": 32, "tf32": 32, "bf16": 16, "fp16": 16, "fp8": 8, "int8": 8, "int4": 4, "fp4": 4}
WEIGHT_DTYPES = ("fp32", "bf16", "fp16", "fp8", "int8", "int4", "fp4")
KV_DTYPES = ("fp32", "bf16", "fp16", "fp8", "int8", "int4")


def dtype_name(dtype: str) -> str:
    """Canonical dtype name ('bfloat16' -> 'bf16', 'float16' -> 'fp16'); SpecError if unknown."""
    return precision_name(dtype)


def default_kv_dtype(weight_dtype: str | float) -> str:
    """KV precision when none is given: the weights' float format, or bf16 for quantized weights (weight-only
    quantization leaves the KV cache in 16-bit; 003 Detail 18)."""
    if isinstance(weight_dtype, (int, float)) and not isinstance(weight_dtype, bool):
        return "bf16"
    d = dtype_name(weight_dtype)
    return d if d in ("fp32", "bf16", "fp16") else "bf16"


def bytes_per_element(dtype: str | float) -> float:
    """Bytes one element occupies: 'fp16' -> 2, 'int4' -> 0.5; a number is taken as bytes (0.75 = 6 bits)."""
    if isinstance(dtype, (int, float)) and not isinstance(dtype, bool):
        return check_positive("bytes per element", dtype, limit=64)
    return DTYPE_BITS[dtype_name(dtype)] / 8


def check_positive(what: str, v, limit: float = 1e30) -> float:
    """A positive finite number (bool refused), else SpecError naming `what`."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise SpecError(f"{what} must be a positive number, got {v!r}")
    if v > limit:
        raise SpecError(f"{what} = {v!r} is implausibly large (limit {limit:g})")
    return float(v)


def check_nonneg(what: str, v, limit: float = 1e30) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise SpecError(f"{what} must be a non-negative number, got {v!r}")
    if v > limit:
        raise SpecError(f"{what} = {v!r} is implausibly large (limit {limit:g})")
    return float(v)


def check_int(what: str, v, minimum: int = 1, limit: int = 10 ** 12) -> int:
    """An integer >= `minimum` (floats equal to an integer accepted; bool refused), else SpecError."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or int(v) != v:
        raise SpecError(f"{what} must be an integer, got {v!r}")
    if v < minimum:
        raise SpecError(f"{what} must be at least {minimum}, got {v!r}")
    if v > limit:
        raise SpecError(f"{what} = {v!r} is implausibly large (limit {limit:,})")
    return int(v)


def check_fraction(what: str, v, allow_one: bool = True) -> float:
    """A number in (0, 1] (or (0, 1) if not allow_one)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0 or v > 1 or \
            (v == 1 and not allow_one):
        upper = "1]" if allow_one else "1)"
        raise SpecError(f"{what} must be in (0, {upper}, got {v!r}")
    return float(v)


def uploaded_text(data: str | bytes, name: str, max_bytes: int, expected: str) -> str:
    """The text of an uploaded or pasted file: at most `max_bytes`, UTF-8 (a byte-order mark dropped); otherwise a
    SpecError naming the file and what was `expected` (e.g. "a Hugging Face config.json")."""
    if len(data) > max_bytes:
        raise SpecError(f"{name} is {len(data):,} {'bytes' if isinstance(data, bytes) else 'characters'}: "
                        f"too large for {expected} (at most {max_bytes:,})")
    if isinstance(data, str):
        return data
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise SpecError(f"{name} is not UTF-8 text; expected {expected}") from None


def fmt_bytes(n: float, binary: bool = False, digits: int = 3) -> str:
    """'2.20 GB' (decimal) or '22.0 KiB' (binary), with `digits` significant digits."""
    if binary:
        units, base = ("B", "KiB", "MiB", "GiB", "TiB", "PiB"), 1024.0
    else:
        units, base = ("B", "KB", "MB", "GB", "TB", "PB"), 1000.0
    v, i = float(n), 0
    while abs(v) >= base and i < len(units) - 1:
        v, i = v / base, i + 1
    return f"{fmt_num(v, digits)} {units[i]}"


def fmt_num(x: float, digits: int = 3) -> str:
    """A number with `digits` significant digits and thousands separators ('1,555', '0.657', '2.2e+12')."""
    x = float(x)
    if x == 0 or not math.isfinite(x):
        return str(x if not x.is_integer() else int(x))
    mag = math.floor(math.log10(abs(x)))
    if mag >= 15 or mag < -6:
        return f"{x:.{max(digits - 1, 0)}e}"
    decimals = max(digits - 1 - mag, 0)
    s = f"{round(x, decimals):,.{decimals}f}"
    return s


def fmt_count(n: float, digits: int = 3) -> str:
    """'1.10 B' (billions), '34.6 M', '22.5 K' for parameter and FLOP counts."""
    for div, suffix in ((1e12, " T"), (1e9, " B"), (1e6, " M"), (1e3, " K")):
        if abs(n) >= div:
            return fmt_num(n / div, digits) + suffix
    return fmt_num(n, digits)
