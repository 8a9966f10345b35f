"""The Attention page's whole-model overview (issue 28): cell (layer l, head h) of the drawn grid is that head's
attention row as the engine computes it (an independent run of the same hook, `blocks.{l}.attn.hook_pattern`, on a
separately loaded copy of the model), and choosing a cell changes the single-head view."""
from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from engine import load_model, run_with_cache
from test_inside_pages import TINY, TINY_PROMPT, ok, open_page, tiny_folder  # noqa: F401  (the fixture)
from ui.attention_overview import CELL_KEY, QUERY_KEY

IDS = [int(t) for t in TINY_PROMPT.split()]           # the tiny model has no tokenizer: the prompt is its ids


def array(v) -> np.ndarray:
    """A plotly array from a chart's JSON: a plain list, or base64 with dtype and shape."""
    if isinstance(v, dict):
        a = np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"]))
        return a.reshape([int(n) for n in str(v.get("shape", a.size)).split(",")])
    return np.asarray(v, float)


def overview_z(at) -> np.ndarray:
    spec = next(json.loads(c.proto.spec) for c in at.get("plotly_chart")
                if "Every layer × head" in str(json.loads(c.proto.spec)["layout"].get("title", "")))
    assert spec["layout"]["font"]["size"] >= 14
    return array(spec["data"][0]["z"])


@pytest.mark.parametrize("query", [9, 4])
def test_each_cell_is_that_heads_attention_row_from_the_engine(tiny_folder, query):
    at = ok(open_page("13_Attention", tiny_folder, **{QUERY_KEY: str(query)}))
    z = overview_z(at)
    L, h = TINY["num_hidden_layers"], TINY["num_attention_heads"]
    width = query + 2                                   # the row's query + 1 weights and one empty column
    assert z.shape == (L, h * width)
    model = load_model(tiny_folder)
    for layer in range(L):
        for head in range(h):
            name = f"blocks.{layer}.attn.hook_pattern"
            _, acts = run_with_cache(model, IDS, names=(name,), layers=[layer], heads=[head])
            expected = np.asarray(acts[name])[0, query, :query + 1]
            cell = z[layer, head * width: head * width + query + 1]
            np.testing.assert_allclose(cell, expected, rtol=1e-5, atol=1e-7)
            assert np.isnan(z[layer, head * width + query + 1])          # the gap between two heads
            assert abs(cell.sum() - 1) < 1e-5                             # a softmax row


def test_choosing_a_cell_opens_it_in_the_single_head_view(tiny_folder):
    at = ok(open_page("13_Attention", tiny_folder))
    assert "1 · Layer 0, head 0: who looks at whom" in [s.value for s in at.subheader]
    before = [json.loads(c.proto.spec) for c in at.get("plotly_chart")][1]
    at.selectbox(key=CELL_KEY).set_value((2, 3)).run()
    ok(at)
    assert at.text_input(key="attn.layer").value == "2" and at.text_input(key="attn.head").value == "3"
    assert "1 · Layer 2, head 3: who looks at whom" in [s.value for s in at.subheader]
    after = [json.loads(c.proto.spec) for c in at.get("plotly_chart")][1]
    z = array(after["data"][0]["z"])
    model = load_model(tiny_folder)
    _, acts = run_with_cache(model, IDS, names=("blocks.2.attn.hook_pattern",), layers=[2], heads=[3])
    np.testing.assert_allclose(z, np.asarray(acts["blocks.2.attn.hook_pattern"])[0], rtol=1e-5, atol=1e-7)
    assert not np.allclose(array(before["data"][0]["z"]), z)
