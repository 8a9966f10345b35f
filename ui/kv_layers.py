"""The KV cache per layer kind (full attention vs sliding window), measured next to the calculators' hybrid formula.
Shared by the KV-cache pages; the formula is `calculators.sizing.kv_cache.kv_cache_layers`, the measurement the engine's
own per-layer count (`KVCache.bytes_per_layer`, as `record_generation` keeps it per step)."""
from __future__ import annotations

from typing import Sequence

import pandas as pd
import streamlit as st

from calculators.sizing.kv_cache import kv_cache_layers, kv_elements_per_token_layer
from specs.model_config import ModelConfig

ENGINE_KV_DTYPE = "fp32"          # the engine keeps K and V in float32
KIND_LABEL = {"full_attention": "full attention (global)", "sliding_attention": "sliding window (local)"}


def layer_kind(config: ModelConfig, layer: int) -> str:
    return config.layer_types[layer] if config.layer_types else "full_attention"


def kv_by_layer_kind(config: ModelConfig, bytes_per_layer: Sequence[int], tokens: int) -> pd.DataFrame:
    """One row per layer kind: layers, positions each layer holds and bytes, measured and by the formula."""
    rows = []
    for r in kv_cache_layers(config, tokens, kv_dtype=ENGINE_KV_DTYPE):
        kind = r["kind"]
        measured = [b for li, b in enumerate(bytes_per_layer) if layer_kind(config, li) == kind]
        row_bytes = kv_elements_per_token_layer(config, kind) * 4          # K and V of one position, float32
        rows.append({"layer kind": KIND_LABEL.get(kind, kind), "layers": r["layers"],
                     "positions held per layer (measured)": max(measured) // row_bytes if measured else 0,
                     "positions held per layer (formula)": r["tokens_kept"],
                     "bytes, all such layers (measured)": int(sum(measured)),
                     "bytes, all such layers (formula)": int(r["bytes"])})
    return pd.DataFrame(rows)


def show_kv_by_layer_kind(config: ModelConfig, bytes_per_layer: Sequence[int], tokens: int, key: str) -> None:
    """The table, a line saying whether every row agrees to the byte, and its CSV download."""
    from ui import df_with_download
    df = kv_by_layer_kind(config, bytes_per_layer, tokens)
    same = (df["bytes, all such layers (measured)"] == df["bytes, all such layers (formula)"]).all()
    window = config.sliding_window
    st.markdown(f"**Per layer kind at {tokens:,} tokens** (float32 K and V; a sliding-window layer keeps the last "
                f"min(tokens, {window}) positions, a full layer every position):" if window else
                f"**Per layer kind at {tokens:,} tokens** (float32 K and V):")
    df_with_download(df, key)
    (st.success if same else st.error)("Measured = formula, to the byte, for every layer kind." if same else
                                       "Measured and formula differ!")
