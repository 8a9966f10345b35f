"""Quantization applied to a loaded model, to MEASURE what the calculators predict: weight error, logit error,
top-1 agreement and perplexity change on a fixed text.

The round trip itself (symmetric INT8/INT4, per tensor / channel / group) is `calculators.sizing.quantization`; here it
is applied to every projection matrix of a real model ("fake quantization": weights are quantized then dequantized
back to float32, so the engine runs unchanged and only the rounding error remains).
"""
from __future__ import annotations

import dataclasses

from dataclasses import dataclass

import numpy as np

from calculators.sizing.quantization import dequantize, quantize
from engine.errors import ModelError
from engine.model.model import Model, Weights
from specs.model_config import SpecError

# A fixed text to score perplexity on (our own words; plain English a small model should predict reasonably).
REFERENCE_TEXT = (
    "The library opens at nine in the morning and closes at six in the evening. Children come after school to "
    "read books, and their parents often wait in the small garden outside. On Saturdays there is a story hour, "
    "when a volunteer reads aloud to anyone who wants to listen. The building is old, but it is warm and quiet, "
    "and people say it is the best place in town to spend a rainy afternoon."
)


@dataclass(frozen=True)
class Scheme:
    bits: int = 8                     # 8 or 4
    granularity: str = "per_channel"  # per_tensor | per_channel | per_group
    group_size: int = 64

    @property
    def label(self) -> str:
        g = {"per_tensor": "per tensor", "per_channel": "per channel"}.get(self.granularity,
                                                                           f"group {self.group_size}")
        return f"INT{self.bits} {g}"


def stored_precision(model: Model) -> str | None:
    """How the loaded model's weights were stored in their file, when the file says: the llama.cpp file type of a
    GGUF ('Q4_1', 'Q8_0', 'F16', 'BF16', ...; gguf-py's LlamaFileType names), else None. A model stored below 16
    bits is measured here against its de-quantized weights, not against the original 16-bit ones."""
    code = (model.config.extra or {}).get("gguf_file_type")
    if code is None:
        return None
    try:
        import gguf
        name = gguf.LlamaFileType(int(code)).name
    except (ImportError, ValueError, TypeError):
        return f"GGUF file type {code}"
    return name.removeprefix("MOSTLY_").removeprefix("ALL_")


def below_16_bits(stored: str | None) -> bool:
    """Whether a stored precision name is a quantized one (anything but F32, F16, BF16)."""
    return stored is not None and stored not in ("F32", "F16", "BF16")


def _round_trip(w: np.ndarray, s: Scheme) -> np.ndarray:
    return dequantize(quantize(w, bits=s.bits, granularity=s.granularity, group_size=s.group_size)).astype(np.float32)


def quantized_model(model: Model, scheme: Scheme, include_lm_head: bool = False) -> Model:
    """A copy of `model` whose projection matrices went through quantize -> dequantize (norms stay fp32; the
    embedding/LM head too unless `include_lm_head`, as most INT4/INT8 schemes keep them at higher precision)."""
    try:
        layers = [dataclasses.replace(lw, **{name: _round_trip(m, scheme) for name, m in lw.matrices().items()})
                  for lw in model.weights.layers]          # norms (Gemma's q/k/post norms too) stay as they are
        w = model.weights
        lm_head = _round_trip(w.lm_head, scheme) if include_lm_head else w.lm_head
    except SpecError as e:
        raise ModelError(f"cannot apply {scheme.label} to {model.name}: {e}") from None
    embed = lm_head if (include_lm_head and w.lm_head is w.embed) else w.embed
    q = Weights(embed=embed, layers=layers, final_norm=w.final_norm, lm_head=lm_head)
    return Model(model.config, q, tokenizer=model.tokenizer, source=f"{model.source} [{scheme.label}]",
                 rope_layout=model.rope_layout, random_weights=model.random_weights)


def quantization_memory_bytes(model: Model, include_lm_head: bool = False) -> float:
    """Memory one scheme's measurement adds while it runs: the quantized copy of every projection matrix (and
    the LM head when included), float32 like the originals, plus the integer codes and scales the round trip
    holds for one matrix at a time (at most that matrix again). Upper bound: 2 × the copied bytes."""
    copied = sum(a.nbytes for lw in model.weights.layers for a in lw.matrices().values())
    if include_lm_head:
        copied += model.weights.lm_head.nbytes
    return 2.0 * copied


def perplexity(logits: np.ndarray, ids: list[int]) -> float:
    """exp(mean negative log-likelihood of each next token).   logits [T, V] for ids [T] -> scalar"""
    z = logits[:-1].astype(np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    nll = -logp[np.arange(len(ids) - 1), ids[1:]]
    return float(np.exp(nll.mean()))


def measure_quantization(model: Model, schemes: list[Scheme], text: str = REFERENCE_TEXT,
                         include_lm_head: bool = False, progress=None) -> list[dict]:
    """For each scheme: weight relative RMSE, logit max/mean abs error, top-1 agreement and perplexity vs fp32.

    One row for the fp32 baseline first. `progress(fraction, message)` is called as schemes finish.
    """
    ids = model.encode_prompt(text) if model.tokenizer is not None else \
        [int(t) for t in np.random.default_rng(0).integers(0, model.config.vocab_size, 64)]
    ids = ids[: min(len(ids), model.config.max_position_embeddings)]
    if len(ids) < 2:
        raise ModelError("the text must be at least 2 tokens long to measure perplexity")
    base = model.logits(ids)
    base_top1 = base.argmax(-1)
    rows = [dict(scheme="fp32 (baseline)", bits=32, weight_relative_rmse=0.0, logit_max_abs_error=0.0,
                 logit_mean_abs_error=0.0, top1_agreement=1.0, perplexity=perplexity(base, ids),
                 perplexity_change_pct=0.0, tokens=len(ids))]
    for i, s in enumerate(schemes):
        qm = quantized_model(model, s, include_lm_head)
        err_sq = ref_sq = 0.0
        for lw, qw in zip(model.weights.layers, qm.weights.layers):
            for name, a in lw.matrices().items():
                b = qw.matrices()[name]
                err_sq += float(np.sum((b.astype(np.float64) - a) ** 2))
                ref_sq += float(np.sum(a.astype(np.float64) ** 2))
        lg = qm.logits(ids)
        ppl = perplexity(lg, ids)
        rows.append(dict(scheme=s.label, bits=s.bits, weight_relative_rmse=float(np.sqrt(err_sq / ref_sq)),
                         logit_max_abs_error=float(np.abs(lg - base).max()),
                         logit_mean_abs_error=float(np.abs(lg - base).mean()),
                         top1_agreement=float((lg.argmax(-1) == base_top1).mean()), perplexity=ppl,
                         perplexity_change_pct=100.0 * (ppl / rows[0]["perplexity"] - 1.0), tokens=len(ids)))
        if progress:
            progress((i + 1) / len(schemes), f"measured {s.label}")
    return rows
