"""MLA (DeepSeek) priced from a profile's MLA tables (issue 36): the projections as GEMMs whose weights are the
model's own, the attention interpolated in the measured tables. The tables here come from a made-up efficiency law,
so every expected value is the law's; the real package's test skips cleanly without it."""
from types import SimpleNamespace

import numpy as np
import pytest

from calculators.multi_gpu.tensor_parallel import Mesh
from calculators.planning.measured_step import layer_gemms, profile_support, resolve_profile, step_ops_table
from calculators.sizing.measured_ops import (MLA_TABLE_RANK, MLA_TABLE_ROPE, mla_decode_ms, mla_decode_roofline_ms,
                                             mla_prefill_ms, mla_prefill_roofline_ms)
from calculators.sizing.params import attention_parts_per_layer
from specs.devices import load_device
from specs.model_config import SpecError
from specs.presets import load_preset

H200 = load_device("h200")
DSV3 = load_preset("deepseek-v3")


def eff(batch):
    """A made-up efficiency rising with the batch: 10% at one row, 80% at 512."""
    return np.clip(0.1 + 0.7 * np.log2(np.asarray(batch, dtype=float)) / 9, 0.1, 0.8)


def mla_profile():
    gen, ctx_rows = [], []
    for b in 2 ** np.arange(0, 10):
        for c in (512, 2048, 8192):
            for h in (16, 128):
                ideal = float(mla_decode_roofline_ms(H200, b, c, h, MLA_TABLE_RANK, MLA_TABLE_ROPE, "fp8"))
                gen.append(dict(dtype="bf16", kv_dtype="fp8", batch=int(b), context=c, heads=h, ms=ideal / eff(b)))
        for t in (256, 1024, 4096):
            for h in (16, 128):
                ideal = float(mla_prefill_roofline_ms(H200, b, t, 0, h, 192, 128))
                ctx_rows.append(dict(dtype="bf16", kv_dtype="fp8", batch=int(b), tokens=t, prefix=0, heads=h,
                                     ms=ideal / 0.5))
    table = (lambda rows: {k: np.asarray([r[k] for r in rows]) for k in rows[0]})
    return SimpleNamespace(name="mla-law", device=H200.name, tables=dict(mla_generation=table(gen),
                                                                         mla_context=table(ctx_rows)))


def test_a_measured_mla_decode_comes_back_exactly_and_between_rows_geometrically():
    p = mla_profile()
    got = mla_decode_ms(p, H200, 64, 2048, 16, 512, 64, "fp8")
    want = mla_decode_roofline_ms(H200, 64, 2048, 16, 512, 64, "fp8") / eff(64)
    assert got.ms == pytest.approx(float(want), rel=1e-9) and not got.extrapolated and got.note == ""
    mid = mla_decode_ms(p, H200, 90, 2048, 16, 512, 64, "fp8")      # between 64 and 128 rows: log-linear
    w = np.log(90 / 64) / np.log(2)
    e = np.exp((1 - w) * np.log(eff(64)) + w * np.log(eff(128)))
    assert mid.ms == pytest.approx(float(mla_decode_roofline_ms(H200, 90, 2048, 16, 512, 64, "fp8") / e), rel=1e-9)


def test_another_latent_is_priced_at_its_own_roofline_and_says_where_it_was_measured():
    got = mla_decode_ms(mla_profile(), H200, 64, 2048, 16, 256, 64, "fp8")
    assert got.ms == pytest.approx(float(mla_decode_roofline_ms(H200, 64, 2048, 16, 256, 64, "fp8") / eff(64)),
                                   rel=1e-9)
    assert "DeepSeek-V3's shapes" in got.note


def test_a_kv_format_not_measured_is_priced_as_bf16_and_a_missing_table_is_one_message():
    p = mla_profile()
    p.tables["mla_generation"]["kv_dtype"] = np.full(len(p.tables["mla_generation"]["ms"]), "bf16")
    assert "priced as bf16" in mla_decode_ms(p, H200, 8, 2048, 16, 512, 64, "fp8").note
    with pytest.raises(SpecError, match="no MLA decode table"):
        mla_decode_ms(SimpleNamespace(name="empty", device=H200.name, tables={}), H200, 8, 2048, 16, 512, 64)


def test_prefill_reads_the_context_table():
    got = mla_prefill_ms(mla_profile(), H200, 1024, 16, 192, 128, "fp8", batch=4.0)
    assert got.ms == pytest.approx(float(mla_prefill_roofline_ms(H200, 4.0, 1024, 0, 16, 192, 128)) / 0.5, rel=1e-9)


def test_mla_projections_hold_the_models_own_attention_weights():
    """At TP 1 the GEMMs of an MLA layer multiply exactly the layer's projection weights (params.py counts them
    from the config: q_a, q_b, kv_a, kv_b as W_UK + W_UV, o; the norms are vectors, not GEMMs)."""
    weights = sum(n * k for _, n, k, _ in layer_gemms(DSV3, Mesh())[:6])
    parts = attention_parts_per_layer(DSV3)
    assert weights == sum(v for name, v in parts.items() if "norm" not in name)
    # at TP 8 the heads split and the latent down-projections (q_a, kv_a) stay whole on every GPU
    tp8 = {name: n * k for name, n, k, _ in layer_gemms(DSV3, Mesh(tp=8))[:6]}
    assert tp8["q_a projection"] == parts["q_a_proj"] and tp8["kv_a projection"] == parts["kv_a_proj"]
    assert tp8["o projection"] * 8 == parts["o_proj"]


def test_a_profile_without_mla_tables_leaves_deepseek_to_the_closed_form_and_says_why():
    bare = SimpleNamespace(name="no-mla", device=H200.name, tables={"gemm": {}})
    assert "measured no MLA kernels" in profile_support(DSV3, bare)
    assert profile_support(DSV3, mla_profile()) is None
    prof, words = resolve_profile(bare, H200, "vllm", DSV3)
    assert prof is None and "measured no MLA kernels" in words
    with pytest.raises(SpecError, match="measured no MLA kernels"):
        step_ops_table(bare, DSV3, H200, Mesh(tp=8), "fp8", "fp8", 8, 1024)


def test_deepseek_on_a_real_profile_prices_mla_from_measured_kernels_and_the_commands_agree(capsys):
    """aiconfigurator-core's H200 TensorRT-LLM tables: DeepSeek-R1's step is priced op by op (its MLA attention
    below the datasheet), and `latency` and `serve-at` at a rate where requests never meet agree within 2%."""
    pytest.importorskip("aiconfigurator_core")
    import json
    from calculators.cli import main as cli
    from calculators.planning.serve_at import serve_at
    from specs.profiles import profile_for
    prof = profile_for("H200", "trtllm")
    if prof is None or "mla_generation" not in prof.tables:
        pytest.skip("no H200 TensorRT-LLM profile with MLA tables installed")
    ops = step_ops_table(prof, DSV3, H200, Mesh(tp=8, ep=8), "fp8", "fp8", 64, 4096)
    mla = next(o for o in ops if o["op"] == "decode attention")
    assert "MLA latent 512 + 64" in [o["shape"] for o in ops if o["op"] == "decode attention"][0]
    assert 0.05 < mla["efficiency"] < 1.0
    code = cli(["latency", "--model", "deepseek-r1", "--gpu", "h200", "--gpus", "8", "--tp", "8", "--ep", "8",
                "--weight-dtype", "fp8", "--tokens", "1000", "--output-tokens", "200", "--stack", "trtllm",
                "--profile", "auto", "--json"])
    lat = json.loads(capsys.readouterr().out)
    assert code == 0 and lat["pricing"].startswith("measured kernels")
    quiet = serve_at(DSV3, H200, Mesh(tp=8, ep=8, gpus=8), 1e-4, 1000, 200, "fp8", stack="trtllm", profile=prof)
    assert quiet["tpot_ms"] == pytest.approx(lat["itl_ms"], rel=0.02)
    assert quiet["ttft_p50_ms"] == pytest.approx(lat["ttft_ms"], rel=0.02)


def test_the_measured_kernels_pages_attention_curves_of_deepseek_are_its_mla():
    from calculators.planning.measured_curves import decode_attention_curves
    curves = decode_attention_curves(mla_profile(), H200, DSV3, tp=8, kv_dtype="fp8", batches=(64,),
                                     contexts=(2048.0,))
    assert "MLA latent 512 + 64" in curves[0].shape
    want = mla_decode_roofline_ms(H200, 64, 2048, 16, 512, 64, "fp8") / eff(64)
    assert float(curves[0].ms[0]) == pytest.approx(float(want), rel=1e-9)
