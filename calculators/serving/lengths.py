"""Prompt and output lengths as distributions, not means: fixed, geometric (the memoryless discrete length),
lognormal fitted to a mean and a p99, or an empirical histogram (a trace's lengths).

A lognormal X = exp(μ + σZ) has mean exp(μ + σ²/2) and p99 exp(μ + z·σ) with z = Φ⁻¹(0.99) = 2.3263, so
    ln(p99 / mean) = z·σ − σ²/2   ->   σ = z − √(z² − 2·ln(p99 / mean))        (the smaller root)
which exists only while p99 / mean ≤ exp(z²/2) ≈ 14.97; a p99 below the mean fits no length distribution.
Reasoning workloads have long output tails (DeepSeek-R1 in MLPerf Inference v5.1: mean ≈ 3,900 output tokens,
up to 20,000; `PRESETS["reasoning"]`); chat has short, moderately spread outputs.

What the serving models need from a distribution: E[X], E[X²] (variability: a queue's wait grows with
(1 + c²)), E[X·(X+1)/2] (causal attention pairs of a prompt), and samples for the simulator.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from calculators.units import check_positive
from specs.model_config import SpecError
from specs.workloads import mlperf_dataset, mlperf_length_datasets

Z99 = 2.3263478740408408          # Φ⁻¹(0.99)
KINDS = ("fixed", "geometric", "lognormal", "histogram")
MAX_TOKENS = 1 << 24


def lognormal_sigma(mean: float, p99: float) -> float:
    """σ of the lognormal whose mean and 99th percentile are given (see the module docstring)."""
    r = math.log(p99 / mean)
    disc = Z99 * Z99 - 2 * r
    if disc < 0:
        raise SpecError(f"no lognormal has p99 / mean = {p99 / mean:.1f}: at most {math.exp(Z99 * Z99 / 2):.2f} "
                        "(give a histogram or a trace for tails that long)")
    return Z99 - math.sqrt(disc)


@dataclass(frozen=True)
class Lengths:
    """A token-length distribution. `kind`: fixed (every request `mean`), geometric (mean `mean`), lognormal
    (mean and p99), histogram (`values` with `weights`)."""
    kind: str
    mean: float
    p99: float | None = None
    maximum: int | None = None                 # lengths are capped here (a context window); None = no cap
    values: tuple = ()
    weights: tuple = ()

    # ---------------------------------------------------------------------------------------- constructors
    @classmethod
    def fixed(cls, n: int) -> "Lengths":
        return cls("fixed", float(_whole("length", n))).check()

    @classmethod
    def geometric(cls, mean: float) -> "Lengths":
        return cls("geometric", float(mean)).check()

    @classmethod
    def from_mean_p99(cls, mean: float, p99: float | None = None, maximum: int | None = None) -> "Lengths":
        """Fixed when p99 is None or equals the mean; else the lognormal through both."""
        if p99 is None or p99 == mean:
            return cls.fixed(mean) if float(mean).is_integer() else cls("lognormal", float(mean), float(mean)).check()
        return cls("lognormal", float(mean), float(p99), maximum).check()

    @classmethod
    def histogram(cls, lengths, weights=None) -> "Lengths":
        v = np.asarray(lengths, dtype=float).ravel()
        w = np.ones_like(v) if weights is None else np.asarray(weights, dtype=float).ravel()
        if len(v) == 0 or len(v) != len(w):
            raise SpecError("a length histogram needs as many weights as lengths, and at least one length")
        if np.any(v < 1) or np.any(v != np.round(v)) or np.any(w < 0) or w.sum() <= 0:
            raise SpecError("histogram lengths must be whole numbers ≥ 1 with non-negative weights")
        m = float((v * w).sum() / w.sum())
        return cls("histogram", m, None, None, tuple(v.tolist()), tuple(w.tolist()))

    def check(self) -> "Lengths":
        if self.kind not in KINDS:
            raise SpecError(f"length distribution must be one of {', '.join(KINDS)}, got {self.kind!r}")
        check_positive("mean length", self.mean, limit=MAX_TOKENS)
        if self.mean < 1:
            raise SpecError(f"a mean length must be at least 1 token, got {self.mean!r}")
        if self.kind == "lognormal":
            check_positive("p99 length", self.p99, limit=MAX_TOKENS)
            if self.p99 < self.mean:
                raise SpecError(f"the p99 length ({self.p99:,.0f}) cannot be below the mean ({self.mean:,.0f}): "
                                "the p99 is the length 99% of requests stay under; give p99 ≥ mean")
            lognormal_sigma(self.mean, self.p99)
        return self

    # ---------------------------------------------------------------------------------------- moments
    def _grid(self) -> tuple[np.ndarray, np.ndarray]:
        """Support points and probabilities, sorted (cached: a distribution is immutable)."""
        return _support(self)

    def _make_grid(self) -> tuple[np.ndarray, np.ndarray]:
        """Support points and probabilities (lognormal: 4,000 quantiles; geometric: the exact pmf to the tail)."""
        if self.kind == "fixed":
            return np.array([self.mean]), np.array([1.0])
        if self.kind == "histogram":
            v, w = np.array(self.values), np.array(self.weights)
            return v, w / w.sum()
        if self.kind == "geometric":
            q = 1.0 / self.mean
            top = int(min(MAX_TOKENS, math.ceil(self.mean * 40) + 10))
            k = np.arange(1, top + 1, dtype=float)
            p = q * (1 - q) ** (k - 1) if q < 1 else (k == 1).astype(float)
            return self._capped(k, p / p.sum())
        s = lognormal_sigma(self.mean, self.p99)
        mu = math.log(self.mean) - s * s / 2
        u = (np.arange(4000) + 0.5) / 4000
        x = np.maximum(1.0, np.exp(mu + s * _norm_ppf(u)))
        return self._capped(x, np.full(len(x), 1 / len(x)))

    def _capped(self, x, p):
        return (np.minimum(x, self.maximum), p) if self.maximum else (x, p)

    def moment(self, f) -> float:
        """E[f(X)] for a vectorised f."""
        x, p = self._grid()
        return float(np.sum(f(x) * p))

    @property
    def mean_tokens(self) -> float:
        return self.moment(lambda x: x)

    @property
    def second_moment(self) -> float:
        return self.moment(lambda x: x * x)

    @property
    def scv(self) -> float:
        """Squared coefficient of variation Var/mean²: 0 fixed, ≈ 1 geometric."""
        m = self.mean_tokens
        return max(0.0, self.second_moment / (m * m) - 1)

    def quantile(self, q):
        """The q-quantile (q a number or an array of them)."""
        x, p = self._grid()
        c = np.cumsum(p)
        i = np.minimum(np.searchsorted(c, np.asarray(q, dtype=float) - 1e-12), len(x) - 1)
        out = x[i]
        return float(out) if np.ndim(out) == 0 else out

    # ---------------------------------------------------------------------------------------- samples
    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """n whole lengths ≥ 1 drawn from the distribution (for the simulator)."""
        if self.kind == "fixed":
            x = np.full(n, int(self.mean))
        elif self.kind == "geometric":
            x = rng.geometric(1.0 / self.mean, size=n) if self.mean > 1 else np.ones(n, dtype=np.int64)
        elif self.kind == "histogram":
            v, w = np.array(self.values), np.array(self.weights)
            x = rng.choice(v, size=n, p=w / w.sum())
        else:
            s = lognormal_sigma(self.mean, self.p99)
            x = np.exp(math.log(self.mean) - s * s / 2 + s * rng.standard_normal(n))
        x = np.maximum(1, np.round(x)).astype(np.int64)
        return np.minimum(x, self.maximum) if self.maximum else x

    def rescaled(self, mean: float) -> "Lengths":
        """This histogram with every length scaled by `mean` / its mean (rounded, at least one token): the same
        shape at another mean (a dataset's reference answers at the tokens a system generated per sample)."""
        if self.kind != "histogram":
            raise SpecError(f"only a histogram is rescaled, not a {self.kind} length distribution")
        k = check_positive("mean length", mean, limit=MAX_TOKENS) / self.mean_tokens
        return Lengths.histogram([max(1, round(v * k)) for v in self.values], self.weights)

    def describe(self) -> str:
        if self.kind == "fixed":
            return f"{self.mean:,.0f} (fixed)"
        if self.kind == "lognormal":
            return f"mean {self.mean:,.0f}, p99 {self.p99:,.0f} (lognormal)"
        return f"mean {self.mean:,.0f} ({self.kind})"


@functools.lru_cache(maxsize=256)
def _support(d: "Lengths") -> tuple[np.ndarray, np.ndarray]:
    x, p = d._make_grid()
    o = np.argsort(x, kind="stable")
    x, p = x[o], p[o]
    x.setflags(write=False)
    p.setflags(write=False)
    return x, p


def _whole(what: str, n) -> int:
    if isinstance(n, bool) or not float(n).is_integer() or n < 1:
        raise SpecError(f"{what} must be a whole number of at least 1, got {n!r}")
    return int(n)


def _norm_ppf(u: np.ndarray) -> np.ndarray:
    """Φ⁻¹(u) by Acklam's rational approximation (relative error < 1.2e-9), vectorised."""
    a = (-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02, 1.383577518672690e+02,
         -3.066479806614716e+01, 2.506628277459239e+00)
    b = (-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02, 6.680131188771972e+01,
         -1.328068155288572e+01)
    c = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00, -2.549732539343734e+00,
         4.374664141464968e+00, 2.938163982698783e+00)
    d = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00, 3.754408661907416e+00)
    u = np.asarray(u, dtype=float)
    out = np.empty_like(u)
    lo, hi = u < 0.02425, u > 1 - 0.02425
    mid = ~(lo | hi)
    q = u[mid] - 0.5
    r = q * q
    out[mid] = (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q / \
        (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1)
    for mask, sign, uu in ((lo, 1, u[lo]), (hi, -1, 1 - u[hi])):
        q = np.sqrt(-2 * np.log(uu))
        out[mask] = sign * (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) / \
            ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1)
    return out


def from_kind(kind: str, mean: float, maximum: int | None = None) -> "Lengths":
    """The distribution the simulator's workload kinds draw (`serving.workload.sample_lengths`): fixed; uniform on
    [1, 2·mean − 1]; exponential = geometric with that mean."""
    if kind == "fixed":
        return Lengths.fixed(mean)
    if kind == "exponential":
        return Lengths("geometric", float(mean), maximum=maximum).check()
    if kind == "uniform":
        top = int(round(2 * mean - 1))
        return Lengths.histogram(np.arange(1, top + 1), None)
    raise SpecError(f"length distribution must be fixed, uniform or exponential, got {kind!r}")


# Workload presets: (prompt, output) distributions with their sources.
PRESETS = {
    "chat": dict(prompt=Lengths("lognormal", 1000.0, 4000.0), output=Lengths("lognormal", 250.0, 1000.0),
                 source="chat-style traffic: ShareGPT-like prompts and replies (vLLM's default benchmark dataset); "
                        "means and p99 rounded, an assumption to edit"),
    "reasoning": dict(prompt=Lengths("lognormal", 804.0, 1432.0), output=Lengths("lognormal", 3900.0, 20000.0),
                      source="MLPerf Inference v5.1 DeepSeek-R1 (mlperf_deepseek_r1 dataset: mean output ≈ 3.9k "
                             "tokens, generation capped at 20k; prompts 804 tokens on average, p99 1,432, from its "
                             "per-sample counts: the mlperf-deepseek-r1 preset is that histogram itself)"),
}


MLPERF_PREFIX = "mlperf-"


def dataset_lengths(dataset: dict) -> tuple[Lengths, Lengths]:
    """A measured dataset's (prompt, answer) length histograms (`specs.workloads`: values and counts)."""
    p, o = dataset["prompt"], dataset["output"]
    return Lengths.histogram(p["values"], p["counts"]), Lengths.histogram(o["values"], o["counts"])


def workload_names() -> tuple[str, ...]:
    """Every workload preset: the assumed ones above, then each MLPerf dataset's measured lengths."""
    return tuple(PRESETS) + tuple(MLPERF_PREFIX + k for k in mlperf_length_datasets())


def preset(name: str) -> dict:
    """A workload preset's prompt and output distributions and their source: one of PRESETS, or "mlperf-<dataset>"
    (the dataset's prompt lengths and its reference answers' lengths, as histograms)."""
    if name in PRESETS:
        return PRESETS[name]
    key = name[len(MLPERF_PREFIX):] if name.startswith(MLPERF_PREFIX) else None
    if key not in mlperf_length_datasets():
        raise SpecError(f"unknown workload preset {name!r}: {', '.join(workload_names())}")
    d = mlperf_dataset(key)
    prompt, output = dataset_lengths(d)
    return dict(prompt=prompt, output=output,
                source=(f"MLPerf Inference's {key} dataset, {d['samples']:,} samples: their prompt lengths and "
                        f"their reference answers' lengths (a model generates its own: MLPerf's systems generated "
                        f"0.9 to 1.6 times these answers' mean), per-sample token counts from {d['source']}"))
