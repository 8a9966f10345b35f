"""Request streams for the serving simulators: arrival times plus prompt and output lengths.

Arrivals: Poisson (exponential gaps at a rate), bursts (groups arriving together at a fixed interval), or a trace
file (CSV with a header, or JSON Lines) whose rows give `arrival_s`, `prompt_tokens`, `output_tokens`.
Lengths: fixed, uniform on [1, 2·mean − 1] (mean `mean`), or exponential (geometric on 1, 2, … with mean `mean`:
the discrete analogue of an exponential service time).
"""
from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from calculators.units import check_int, check_nonneg, check_positive, uploaded_text
from specs.model_config import SpecError

LENGTH_KINDS = ("fixed", "uniform", "exponential")
ARRIVAL_KINDS = ("poisson", "bursts")
TRACE_COLUMNS = ("arrival_s", "prompt_tokens", "output_tokens")
MAX_REQUESTS = 1_000_000
MAX_TRACE_BYTES = 50_000_000


@dataclass(frozen=True)
class Workload:
    """n requests sorted by arrival: seconds, prompt tokens, output tokens (numpy arrays)."""
    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    source: str = ""

    def __post_init__(self):
        a, p, o = (np.asarray(x) for x in (self.arrival_s, self.prompt_tokens, self.output_tokens))
        if not (a.ndim == p.ndim == o.ndim == 1 and len(a) == len(p) == len(o)):
            raise SpecError("arrival_s, prompt_tokens and output_tokens must be 1-D arrays of the same length")
        if len(a) == 0:
            raise SpecError("the workload has no requests")
        if len(a) > MAX_REQUESTS:
            raise SpecError(f"{len(a):,} requests is more than this simulator takes ({MAX_REQUESTS:,})")
        if not np.all(np.isfinite(a)) or np.any(a < 0):
            raise SpecError("arrival times must be finite and non-negative")
        for name, x in (("prompt_tokens", p), ("output_tokens", o)):
            if not np.all(np.isfinite(x)) or np.any(x != np.round(x)) or np.any(x < 1):
                raise SpecError(f"{name} must be whole numbers of at least 1")
        order = np.argsort(a, kind="stable")
        object.__setattr__(self, "arrival_s", a.astype(float)[order])
        object.__setattr__(self, "prompt_tokens", p.astype(np.int64)[order])
        object.__setattr__(self, "output_tokens", o.astype(np.int64)[order])

    def __len__(self) -> int:
        return len(self.arrival_s)

    def rows(self) -> list[dict]:
        return [dict(request=i, arrival_s=float(a), prompt_tokens=int(p), output_tokens=int(o))
                for i, (a, p, o) in enumerate(zip(self.arrival_s, self.prompt_tokens, self.output_tokens))]


def sample_lengths(kind: str, mean: float, n: int, rng: np.random.Generator, maximum: int | None = None) -> np.ndarray:
    """n lengths ≥ 1 of the given kind and mean, capped at `maximum`."""
    m = check_positive(f"mean length ({kind})", mean, limit=1e7)
    if m < 1:
        raise SpecError(f"mean length must be at least 1 token, got {mean!r}")
    if kind == "fixed":
        if m != round(m):
            raise SpecError(f"a fixed length must be a whole number, got {mean!r}")
        x = np.full(n, int(m), dtype=np.int64)
    elif kind == "uniform":
        x = rng.integers(1, int(round(2 * m - 1)) + 1, size=n)
    elif kind == "exponential":
        x = rng.geometric(1.0 / m, size=n) if m > 1 else np.ones(n, dtype=np.int64)
    else:
        raise SpecError(f"length distribution must be one of {', '.join(LENGTH_KINDS)}, got {kind!r}")
    if maximum is not None:
        x = np.minimum(x, check_int("maximum length", maximum))
    return x.astype(np.int64)


def synthetic_workload(n: int, rate_rps: float, prompt_mean: float, output_mean: float, *,
                       arrivals: str = "poisson", burst_size: int = 8, prompt_kind: str = "fixed",
                       output_kind: str = "exponential", max_tokens: int | None = None, seed: int = 0) -> Workload:
    """n requests arriving at `rate_rps` on average: Poisson, or bursts of `burst_size` every burst_size/rate s.
    `max_tokens` caps prompt + output (a model's context): the output is shortened to fit."""
    n = check_int("number of requests", n, limit=MAX_REQUESTS)
    rate = check_positive("arrival rate (requests/s)", rate_rps, limit=1e9)
    rng = np.random.default_rng(check_int("seed", seed, minimum=0))
    if arrivals == "poisson":
        t = np.cumsum(rng.exponential(1.0 / rate, size=n))
    elif arrivals == "bursts":
        k = check_int("burst size", burst_size, limit=MAX_REQUESTS)
        t = (np.arange(n) // k) * (k / rate)
    else:
        raise SpecError(f"arrivals must be one of {', '.join(ARRIVAL_KINDS)}, got {arrivals!r}")
    p = sample_lengths(prompt_kind, prompt_mean, n, rng)
    o = sample_lengths(output_kind, output_mean, n, rng)
    if max_tokens is not None:
        cap = check_int("max tokens per request", max_tokens, minimum=2)
        if np.any(p >= cap):
            raise SpecError(f"a prompt of {int(p.max()):,} tokens leaves no room to generate within "
                            f"{cap:,} tokens of context")
        o = np.minimum(o, cap - p)
    return Workload(t, p, o, source=f"{arrivals}, {rate:g} req/s, prompt {prompt_kind} {prompt_mean:g}, "
                                    f"output {output_kind} {output_mean:g}, seed {seed}")


# ============================================================================================ trace files
def parse_trace(text: str | bytes, name: str = "trace") -> Workload:
    """A workload from the text of a trace: CSV with a header naming arrival_s, prompt_tokens, output_tokens
    (other columns ignored), or JSON Lines with those keys. SpecError names the line and what is wrong."""
    text = uploaded_text(text, name, MAX_TRACE_BYTES, "a trace (CSV or JSON Lines)")
    if not text.strip():
        raise SpecError(f"{name} is empty; expected a header {','.join(TRACE_COLUMNS)} and one row per request")
    first = text.lstrip()[0]
    rows = _jsonl_rows(text, name) if first in "{[" else _csv_rows(text, name)
    if not rows:
        raise SpecError(f"{name} has a header but no requests")
    values = {c: [] for c in TRACE_COLUMNS}
    for line, row in rows:
        for c in TRACE_COLUMNS:
            v = row.get(c)
            try:
                x = float(v)
            except (TypeError, ValueError):
                raise SpecError(f"{name} line {line}: {c} = {v!r} is not a number") from None
            if c == "arrival_s":
                check_nonneg(f"{name} line {line}: arrival_s", x)
            elif x != int(x) or x < 1:
                raise SpecError(f"{name} line {line}: {c} must be a whole number of at least 1, got {v!r}")
            values[c].append(x)
    return Workload(np.array(values["arrival_s"]), np.array(values["prompt_tokens"]),
                    np.array(values["output_tokens"]), source=f"trace {name} ({len(rows):,} requests)")


def _csv_rows(text: str, name: str) -> list[tuple[int, dict]]:
    reader = csv.DictReader(io.StringIO(text))
    header = [h.strip() for h in (reader.fieldnames or [])]
    missing = [c for c in TRACE_COLUMNS if c not in header]
    if missing:
        raise SpecError(f"{name}: the CSV header must name {', '.join(TRACE_COLUMNS)}; missing "
                        f"{', '.join(missing)} (header read: {', '.join(header) or 'nothing'})")
    reader.fieldnames = header
    out = []
    for i, row in enumerate(reader, start=2):
        if None in row or any(v is None for v in row.values()):
            raise SpecError(f"{name} line {i}: expected {len(header)} comma-separated values")
        if all(not (v or "").strip() for v in row.values()):
            continue
        out.append((i, {k: v.strip() for k, v in row.items()}))
    return out


def _jsonl_rows(text: str, name: str) -> list[tuple[int, dict]]:
    out = []
    for i, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise SpecError(f"{name} line {i} is not valid JSON ({e.msg}); expected one object per line") from None
        if not isinstance(row, dict):
            raise SpecError(f"{name} line {i}: expected an object like "
                            '{"arrival_s": 0.5, "prompt_tokens": 100, "output_tokens": 200}')
        missing = [c for c in TRACE_COLUMNS if c not in row]
        if missing:
            raise SpecError(f"{name} line {i}: missing {', '.join(missing)}")
        out.append((i, row))
    return out


def load_trace(path: str | Path) -> Workload:
    """`parse_trace` of a file; SpecError if it cannot be read."""
    p = Path(path)
    try:
        if p.stat().st_size > MAX_TRACE_BYTES:
            raise SpecError(f"{p} is larger than {MAX_TRACE_BYTES:,} bytes")
        data = p.read_bytes()
    except OSError as e:
        raise SpecError(f"cannot read trace {p}: {e.strerror or e}") from None
    return parse_trace(data, p.name)


def trace_csv(workload: Workload) -> str:
    """The workload as a trace CSV (what `parse_trace` reads back)."""
    lines = [",".join(TRACE_COLUMNS)]
    lines += [f"{a!r},{p},{o}" for a, p, o in zip(workload.arrival_s.tolist(), workload.prompt_tokens.tolist(),
                                                  workload.output_tokens.tolist())]
    return "\n".join(lines) + "\n"
