"""Linear attention (Qwen3-Next's gated delta rule) priced from a profile's linear-attention table (issue 36): the
layer's projections as GEMMs holding its own weights, its conv + delta rule interpolated in the measured table.
The tables come from a made-up efficiency law, so each expected value is the law's; the real package's test skips
cleanly without it."""
from types import SimpleNamespace

import numpy as np
import pytest

from calculators import arch
from calculators.multi_gpu.tensor_parallel import Mesh
from calculators.planning.measured_step import (layer_gemms, linear_layers, profile_support, resolve_profile,
                                                step_ops_table)
from calculators.sizing.measured_ops import gdn_roofline_ms, linear_decode_ms, linear_prefill_ms
from calculators.sizing.params import attention_parts_per_layer
from specs.devices import load_device
from specs.model_config import SpecError
from specs.presets import load_preset

H200 = load_device("h200")
NEXT = load_preset("qwen3-next-80b-a3b")


def eff(x):
    """A made-up efficiency rising with the batch or the tokens: 5% at 1, 65% at 1,024."""
    return np.clip(0.05 + 0.6 * np.log2(np.asarray(x, dtype=float)) / 10, 0.05, 0.65)


def linear_profile():
    rows = []
    for kh, vh in ((8, 16), (16, 32)):
        for b in 2 ** np.arange(0, 11):
            ideal = float(gdn_roofline_ms(H200, b, 1, kh, vh, 128, 128))
            rows.append(dict(phase="generation", batch=int(b), tokens=1, k_heads=kh, v_heads=vh, head_k_dim=128,
                             head_v_dim=128, ms=ideal / eff(b)))
        for b in (1, 4):
            for t in 2 ** np.arange(0, 15):
                ideal = float(gdn_roofline_ms(H200, b, t, kh, vh, 128, 128))
                rows.append(dict(phase="context", batch=b, tokens=int(t), k_heads=kh, v_heads=vh, head_k_dim=128,
                                 head_v_dim=128, ms=ideal / eff(t)))
    table = {k: np.asarray([r[k] for r in rows]) for k in rows[0]}
    return SimpleNamespace(name="gdn-law", device=H200.name, tables=dict(linear_attention=table))


def test_a_measured_decode_and_prefill_come_back_exactly():
    p = linear_profile()
    got = linear_decode_ms(p, H200, 64, 8, 16, 128, 128)
    assert got.ms == pytest.approx(float(gdn_roofline_ms(H200, 64, 1, 8, 16, 128, 128) / eff(64)), rel=1e-9)
    pre = linear_prefill_ms(p, H200, 2048, 8, 16, 128, 128, batch=4.0)
    assert pre.ms == pytest.approx(float(gdn_roofline_ms(H200, 4, 2048, 8, 16, 128, 128) / eff(2048)), rel=1e-9)
    arr = linear_decode_ms(p, H200, np.array([1.0, 64.0]), 8, 16, 128, 128)[1]      # arrays: one at a time
    assert arr[1] == pytest.approx(got.ms, rel=1e-12)


def test_qwen3_next_projections_hold_the_layers_own_weights():
    """At TP 1 the GEMMs of the linear layers multiply exactly their projection weights (params.py from the
    config: in_proj_qkvz, in_proj_ba, out_proj; the conv, the gates' biases and the norm are not GEMMs), and the
    full-attention layers keep their q/k/v/o."""
    gemms = {name: (n * k, count) for name, n, k, count in layer_gemms(NEXT, Mesh())}
    lin = arch.kind_counts(NEXT)[arch.LINEAR]
    assert linear_layers(NEXT, Mesh()) == lin == 36
    parts = attention_parts_per_layer(NEXT, arch.LINEAR)
    linear_weights = sum(w for name, (w, c) in gemms.items() if "linear attention" in name)
    assert linear_weights == parts["in_proj_qkvz"] + parts["in_proj_ba"] + parts["out_proj"]
    assert all(c == lin for name, (w, c) in gemms.items() if "linear attention" in name)
    full = attention_parts_per_layer(NEXT, arch.FULL)
    assert gemms["qkv projection"][0] + gemms["o projection"][0] == \
        sum(v for k, v in full.items() if k.endswith("_proj"))
    assert gemms["qkv projection"][1] == NEXT.num_layers - lin


def test_a_profile_without_the_table_leaves_qwen3_next_to_the_closed_form_and_says_why():
    bare = SimpleNamespace(name="no-gdn", device=H200.name, tables={"gemm": {}})
    assert "measured none" in profile_support(NEXT, bare)
    prof, words = resolve_profile(bare, H200, "vllm", NEXT)
    assert prof is None and "linear-attention layers" in words
    with pytest.raises(SpecError, match="measured none"):
        step_ops_table(bare, NEXT, H200, Mesh(tp=2), "bf16", "bf16", 8, 1024)


def test_qwen3_next_on_a_real_profile_prices_linear_attention_and_the_commands_agree(capsys):
    pytest.importorskip("aiconfigurator_core")
    import json
    from calculators.cli import main as cli
    from calculators.planning.serve_at import serve_at
    from specs.profiles import profile_for
    prof = profile_for("H200", "vllm")
    if prof is None or "linear_attention" not in prof.tables:
        pytest.skip("no H200 vLLM profile with a linear-attention table installed")
    ops = {o["op"]: o for o in step_ops_table(prof, NEXT, H200, Mesh(tp=2), "bf16", "bf16", 64, 4096)}
    assert 0.05 < ops["linear attention (gated delta rule)"]["efficiency"] < 1.0
    code = cli(["latency", "--model", "qwen3-next-80b-a3b", "--gpu", "h200", "--gpus", "2", "--tp", "2",
                "--tokens", "1000", "--output-tokens", "200", "--profile", "auto", "--json"])
    lat = json.loads(capsys.readouterr().out)
    assert code == 0 and lat["pricing"].startswith("measured kernels")
    quiet = serve_at(NEXT, H200, Mesh(tp=2, gpus=2), 1e-4, 1000, 200, "bf16", profile=prof)
    assert quiet["tpot_ms"] == pytest.approx(lat["itl_ms"], rel=0.02)
    assert quiet["ttft_p50_ms"] == pytest.approx(lat["ttft_ms"], rel=0.02)
