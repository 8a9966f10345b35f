"""A profile's curves for the Measured kernels page (calculators/planning/measured_curves.py): the sentences under
each chart come from the plotted numbers, on both sides of what they decide (a GEMM that turns compute-bound or
stays bandwidth-bound, a small attention step far under the best or not, an all-reduce that reaches half its
ring bound or never does); and the curves of a hand-made profile read back what it measured."""
import numpy as np
import pytest

from calculators.planning.measured_curves import (Curve, allreduce_caption, allreduce_curves, attention_caption,
                                                  decode_attention_curves, gemm_caption, gemm_curves)
from helpers_profiles import H200, hand_made_h200_profile, qwen3_moe_fp8_slow_profile
from specs.presets import load_preset

LLAMA = load_preset("Llama-3.1-8B")


def curve(eff, compute_bound, x=None, extrapolated=None, label="qkv projection"):
    eff = np.asarray(eff, dtype=float)
    x = np.asarray(x if x is not None else 2.0 ** np.arange(len(eff)))
    return Curve(label, x, eff.copy(), np.ones_like(eff),
                 np.asarray(extrapolated if extrapolated is not None else [False] * len(eff)),
                 np.asarray(compute_bound, dtype=bool))


# ------------------------------------------------------------------------------------------- sentences
def test_gemm_caption_names_the_bandwidth_at_one_token_and_the_peak_past_the_ridge():
    c = curve([0.56, 0.55, 0.60, 0.70, 0.79, 0.78], [0, 0, 0, 1, 1, 1], x=[1, 16, 256, 512, 1024, 4096])
    assert gemm_caption(c) == ("At 1 token the qkv projection GEMM streams its weights at 56% of the datasheet "
                               "bandwidth; from 512 tokens it is compute-bound, and from 1,024 tokens it reaches "
                               "79% of peak FLOP/s.")
    c = curve([0.56, 0.79, 0.78], [0, 1, 1], x=[1, 512, 4096])
    assert gemm_caption(c).endswith("; from 512 tokens it is compute-bound and reaches 79% of peak FLOP/s.")


def test_gemm_caption_of_a_gemm_that_never_leaves_the_bandwidth_side():
    c = curve([0.38, 0.40, 0.52], [0, 0, 0], x=[1, 2, 4])
    assert gemm_caption(c) == ("At 1 token the qkv projection GEMM streams its weights at 38% of the datasheet "
                               "bandwidth; up to 4 tokens it stays bandwidth-bound, at best 52% (at 4 tokens).")


def test_gemm_caption_reads_the_peak_from_measured_points_and_says_when_none_was_measured():
    c = curve([0.5, 0.7, 0.9], [0, 1, 1], extrapolated=[False, False, True])
    assert "reaches 70% of peak FLOP/s" in gemm_caption(c)              # 90% lies past the table
    c = curve([0.5, 0.7], [0, 1], extrapolated=[True, True])
    assert gemm_caption(c).endswith("(every point lies past the measured table: the edge's efficiency, held).")


def test_attention_caption_contrasts_a_small_step_only_when_it_is_under_half_the_best():
    small = curve([0.06, 0.4], [0, 0], x=[1024, 8192], label="batch 1")
    big = curve([0.8, 0.91], [0, 0], x=[1024, 8192], label="batch 256")
    text = attention_caption([small, big])
    assert text.startswith("At batch 256 and 8,192 cached positions decode attention streams the KV cache at 91%")
    assert "at batch 1 and 1,024 positions only 6%" in text
    close = curve([0.6, 0.7], [0, 0], x=[1024, 8192], label="batch 1")
    assert "even batch 1 at 1,024 positions reaches 60%" in attention_caption([close, big])
    assert "Above 100%" not in text
    alone = curve([0.33, 0.3], [0, 0], x=[1024, 8192], label="batch 1")          # the smallest step is the best
    assert attention_caption([alone]) == ("At batch 1 and 1,024 cached positions decode attention streams the KV "
                                          "cache at 33% of the datasheet bandwidth.")
    tiny = curve([0.004, 0.4], [0, 0], x=[1024, 8192], label="batch 1")
    cached = curve([0.9, 2.06], [0, 0], x=[1024, 16384], label="batch 256")
    text = attention_caption([tiny, cached])
    assert "at 206% of the datasheet bandwidth" in text and "only 0.4%" in text
    assert text.endswith("Above 100% is faster than the datasheet's memory bandwidth allows: the KV cache was read "
                         "from on-chip cache (L2), or the table was measured on terms the roofline does not assume.")


def test_allreduce_caption_says_latency_then_the_share_of_the_ring_bound():
    c = Curve("8 GPUs", np.array([1024.0, 1 << 20, 1 << 26]), np.array([0.00002, 0.004, 0.26]),
              np.array([0.005, 0.008, 0.3]), np.zeros(3, bool), np.zeros(3, bool))
    text = allreduce_caption([c], "NVLink 4", 450e9)
    assert text.startswith("On 8 GPUs a 1.00 KiB all-reduce takes 5.00 µs, under 1% of what the NVLink 4 (450 GB/s")
    assert text.endswith("from 64.0 MiB it reaches 87% of the link's ring bound.")
    slow = Curve("2 GPUs", c.x, c.ideal_ms * 0.4, c.ms, c.extrapolated, c.compute_bound)
    assert "no message measured gets past 35% of the link's ring bound (best at 64.0 MiB)" in \
        allreduce_caption([slow], "PCIe", 32e9)


# ------------------------------------------------------------------------------------------- curves
@pytest.fixture(scope="module")
def profile():
    return hand_made_h200_profile()


def test_gemm_curves_read_back_the_measured_efficiency_and_mark_the_lm_head_past_the_table(profile):
    curves = {c.label: c for c in gemm_curves(profile, H200, LLAMA, tokens=[1, 16, 256, 4096, 16384])}
    assert list(curves) == ["qkv projection", "o projection", "gate + up", "down", "LM head"]
    qkv = curves["qkv projection"]
    assert qkv.efficiency[:4] == pytest.approx([0.6, 0.6, 0.8, 0.8])
    assert qkv.extrapolated.tolist() == [False, False, False, False, True]         # 16k tokens: past m = 4,096
    assert qkv.compute_bound.tolist() == [False, False, True, True, True]
    assert curves["LM head"].extrapolated.all()                                    # 128,256 columns > 65,536


def test_attention_and_allreduce_curves_per_batch_and_per_gpu_count(profile):
    attn = decode_attention_curves(profile, H200, LLAMA, contexts=[1024, 32768, 131072])
    assert [c.label for c in attn] == ["batch 1", "batch 32", "batch 256"]
    assert attn[0].efficiency[:2] == pytest.approx([0.5, 0.5]) and attn[1].efficiency[:2] == pytest.approx([0.9, 0.9])
    assert [c.extrapolated.tolist() for c in attn] == [[False, False, True]] * 3   # 128k: past 32k
    assert not any(c.compute_bound.any() for c in attn)                            # GQA decode streams its KV
    ar = allreduce_curves(profile, H200, gpus=(2, 4, 8), sizes=[1024, 1 << 20])
    assert [c.label for c in ar] == ["2 GPUs", "8 GPUs"]                           # 4 GPUs: not measured
    assert ar[1].efficiency == pytest.approx([0.7, 0.7])


def test_on_the_h200_vllm_profile_attention_streams_near_the_datasheet_and_a_gemv_does_not():
    """aiconfigurator-core's measured H200 (vLLM 0.24.0), when installed: what the page's sentences say of it."""
    from specs import aiconfigurator_source as aic
    from specs.profiles import available_profiles, load_profile
    name = next((n for n in available_profiles() if n.startswith("h200-vllm-0.24.0@")), None)
    if aic.package_dir() is None or name is None:
        pytest.skip("aiconfigurator-core is not installed (pip install -r requirements-profiles.txt)")
    p = load_profile(name)
    gemms = gemm_curves(p, H200, LLAMA)
    qkv = gemms[0]
    assert 0.4 < qkv.efficiency[0] < 0.95 and not qkv.compute_bound[0]          # a GEMV: bandwidth-bound
    assert qkv.compute_bound[-1] and 0.6 < qkv.efficiency[qkv.compute_bound].max() < 1.0
    attn = decode_attention_curves(p, H200, LLAMA)
    assert 0.8 < max(c.efficiency.max() for c in attn) < 1.0                       # streams the KV near 90%
    assert attn[0].efficiency[0] < 0.5 * attn[-1].efficiency[0]                   # batch 1 at 1k: fixed cost
    assert "only" in attention_caption(attn) and "compute-bound" in gemm_caption(qkv)


def test_the_moe_router_is_priced_in_16_bits_when_the_layers_are_fp8():
    """Quantized checkpoints leave the router (`mlp.gate`) in bf16: its curve and the step's GEMMs read the bf16
    table (made here at 50% of the roofline) while the qkv projection reads the fp8 one (10%)."""
    import numpy as np
    from calculators.multi_gpu.tensor_parallel import Mesh
    from calculators.planning.measured_step import gemm_dtype, step_grid_tables
    from calculators.sizing.measured_ops import gemm_roofline_ms, moe_roofline_ms
    p, qwen = qwen3_moe_fp8_slow_profile()
    assert [gemm_dtype(n, "fp8") for n in ("router", "qkv projection")] == ["bf16", "fp8"]
    assert gemm_dtype("router", "fp16") == "fp16"
    curves = {c.label: c for c in gemm_curves(p, H200, qwen, weight_dtype="fp8", tokens=[64])}
    assert curves["router"].efficiency == pytest.approx([0.5]) and "(bf16)" in curves["router"].shape
    assert curves["qkv projection"].efficiency == pytest.approx([0.1])
    g = step_grid_tables(p, qwen, H200, Mesh(), "fp8", "fp8", 1024.0, 1000.0, np.array([64.0]))
    layers = qwen.num_layers
    want = layers * sum(float(gemm_roofline_ms(H200, 64, n, k, dt)) / eff for (n, k), dt, eff in
                        (((5120, 2048), "fp8", 0.1), ((2048, 4096), "fp8", 0.1), ((128, 2048), "bf16", 0.5))) \
        + layers * float(moe_roofline_ms(H200, 64, 2048, 768, 128, 8, 1, 1, "fp8")) / 0.3
    assert float(g["gemm"][0]) == pytest.approx(want, rel=1e-9)


def test_an_op_whose_quantized_kernel_measures_slower_than_bf16_says_so():
    """The fp8 GEMMs of this hand-made profile run at 10% of their roofline, the bf16 ones at 50%: at half the
    bytes an fp8 GEMV then takes 2.5x the bf16 one, and the ops table says so with both times; a bf16 op (the
    router) and an op the bf16 table cannot price (the fused MoE, measured in fp8 only) say nothing."""
    import numpy as np
    from calculators.multi_gpu.tensor_parallel import Mesh
    from calculators.planning.measured_step import step_ops_table
    from calculators.sizing.measured_ops import gemm_roofline_ms
    p, qwen = qwen3_moe_fp8_slow_profile()
    rows = {r["op"]: r for r in step_ops_table(p, qwen, H200, Mesh(), "fp8", "fp8", 64, 1024)}
    layers = qwen.num_layers
    bf16 = layers * float(gemm_roofline_ms(H200, 64, 5120, 2048, "bf16")) / 0.5
    fp8 = layers * float(gemm_roofline_ms(H200, 64, 5120, 2048, "fp8")) / 0.1
    assert fp8 > 1.1 * bf16 and rows["qkv projection"]["measured_ms"] == pytest.approx(fp8, rel=1e-9)
    note = rows["qkv projection"]["note"]
    assert note.startswith("this profile's bf16 kernel is faster at this shape") and "in fp8" in note
    assert f"{bf16:.3g}" in note or f"{bf16:.3f}" in note
    assert rows["router"]["note"] == "" and "bf16 kernel" not in rows["routed experts (fused MoE)"]["note"]
    assert np.isfinite(sum(r["measured_ms"] for r in rows.values()))


def test_the_slower_than_bf16_note_needs_ten_percent_and_a_bf16_measurement():
    """Both sides of the note's condition: 1.10x the bf16 kernel's time says so (with both times over the layers),
    1.09x and a faster quantized kernel say nothing, nor does an op with no bf16 measurement."""
    from calculators.planning.measured_step import _slower_than_16_bits
    from calculators.sizing.measured_ops import Priced
    wide = Priced("gemm", 0.5, 1.0, False)
    note = _slower_than_16_bits(Priced("gemm", 0.25, 1.10, False), wide, 10, "fp8")
    assert note == "this profile's bf16 kernel is faster at this shape: 10.0 ms in these layers against 11.0 ms in fp8"
    assert _slower_than_16_bits(Priced("gemm", 0.25, 1.09, False), wide, 10, "fp8") == ""
    assert _slower_than_16_bits(Priced("gemm", 0.25, 0.6, False), wide, 10, "fp8") == ""
    assert _slower_than_16_bits(Priced("gemm", 0.25, 5.0, False), None, 10, "fp8") == ""


def test_a_curve_past_its_roofline_gets_a_sentence_that_says_why_and_one_under_it_none():
    """The fused MoE measured at 122% of its uniform-routing roofline at 32 tokens is explained (a skewed router
    touches fewer experts); a GEMM under 100% everywhere adds nothing."""
    from calculators.planning.measured_curves import over_roofline_caption
    x = np.array([1.0, 32.0, 1024.0])
    moe = Curve("routed experts (fused MoE)", x, np.array([0.5, 1.22, 0.6]), np.ones(3), np.zeros(3, bool),
                np.zeros(3, bool))
    dense = Curve("down", x, np.array([0.1, 0.5, 0.9]), np.ones(3), np.zeros(3, bool), np.zeros(3, bool))
    text = over_roofline_caption([dense, moe])
    assert text.startswith("The routed experts (fused MoE) reaches 122% of its roofline at 32 tokens:")
    assert "power law of exponent 1.01" in text and "down" not in text
    assert over_roofline_caption([dense]) == ""
    fast = Curve("down", x, np.array([0.1, 1.05, 0.9]), np.ones(3), np.zeros(3, bool), np.zeros(3, bool))
    assert over_roofline_caption([fast]) == ("The down reaches 105% of its roofline at 32 tokens: the measured "
                                             "kernel moves less than the roofline counts.")


def test_fp8_weights_of_a_block_scaled_checkpoint_run_the_block_fp8_kernels():
    """A checkpoint published in block-scaled FP8 (quantization_config.weight_block_size, as DeepSeek-V3/R1's 128 x
    128) runs its "fp8" weights through block-FP8 GEMMs and fused MoE: in a profile that measured both, its step
    reads the fp8_block rows (here 20% and 15% of the roofline) where a per-tensor FP8 checkpoint of the same shapes
    reads the fp8 ones (10% and 30%). The op table names the format it priced."""
    from calculators.multi_gpu.tensor_parallel import Mesh
    from calculators.planning.measured_step import kernel_format, step_ops_table
    from calculators.sizing.measured_ops import gemm_roofline_ms, moe_roofline_ms
    p, qwen = qwen3_moe_fp8_slow_profile(block=True)
    blocked = qwen.replace(fp8_weight_block=(128, 128))
    assert (kernel_format(qwen, "fp8"), kernel_format(blocked, "fp8"), kernel_format(blocked, "fp4"),
            kernel_format(blocked, "bf16")) == ("fp8", "fp8_block", "fp4", "bf16")
    layers = qwen.num_layers
    for config, dt, gemm_eff, moe_eff in ((qwen, "fp8", 0.1, 0.3), (blocked, "fp8_block", 0.2, 0.15)):
        ops = {r["op"]: r for r in step_ops_table(p, config, H200, Mesh(), "fp8", "fp8", 64, 1024)}
        qkv = ops["qkv projection"]
        assert qkv["shape"].endswith(f"({dt})")
        assert qkv["measured_ms"] == pytest.approx(layers * float(gemm_roofline_ms(H200, 64, 5120, 2048, dt))
                                                   / gemm_eff, rel=1e-9)
        moe = ops["routed experts (fused MoE)"]["measured_ms"]
        assert moe == pytest.approx(layers * float(moe_roofline_ms(H200, 64, 2048, 768, 128, 8, 1, 1, dt)) / moe_eff,
                                    rel=1e-9)
