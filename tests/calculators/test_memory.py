"""What fits, and reference 004's scratch-buffer numbers."""
import pytest

from calculators.sizing.memory import (NO_OVERHEADS, RuntimeOverheads, activation_buffer_bytes, fit_grid,
                                gemm_tile_memory_bytes, max_batch, max_context, memory_budget, prefill_scratch_bytes,
                                prefill_scratch_bytes_for, resident_weight_bytes)
from specs.devices import custom_device, load_device
from specs.model_config import SpecError
from specs.presets import load_preset

TINY = load_preset("tinyllama")


def test_004_prefill_scratch_formula_gives_604_MB_where_the_text_says_700():
    b = prefill_scratch_bytes(4096, dim=4096, q_dim=4096, kv_dim=1024, ffn_dim=14336, bytes_per_elem=2)
    assert b == 4096 * (5 * 4096 + 2 * 4096 + 2 * 1024 + 3 * 14336) * 2 == 603_979_776
    assert round(b / 1e6) == 604                  # the text's "about 700 MB" is not what its formula gives


def test_scratch_for_a_7B_config_uses_its_dims():
    m = load_preset("mistral-7b")                 # dim 4,096, q 4,096, kv 1,024, ffn 14,336
    assert prefill_scratch_bytes_for(m, 4096) == 603_979_776


def test_one_128K_x_4096_fp16_buffer_is_1_07_GB():
    assert round(activation_buffer_bytes(128 * 1024, 4096, 2) / 1e9, 2) == 1.07


def test_gemm_tile_memory_is_the_larger_of_input_and_output_tiles():
    assert gemm_tile_memory_bytes(32, 64, 32) == max((64 * 32 + 32 * 32) * 2, 64 * 32 * 4) == 8192
    assert gemm_tile_memory_bytes(8, 64, 32) == (64 * 32 + 8 * 32) * 2


def test_tinyllama_one_sequence_is_about_2_4_GB():
    # 003 "The Systems Picture": weights 2.2 GB + KV ~45 MB + activations ~50-100 MB ≈ 2.4 GB. Our activations
    # are 004's scratch layout for the whole 2,048-token prompt in one chunk plus fp32 logits: 130 MB, above the
    # text's rough range; the total still rounds to the text's 2.4 GB.
    m = memory_budget(TINY, load_device("a100"), 2048, 1, "fp16")
    assert m["weights_bytes"] == 2 * 1_100_048_384                                  # published parameter count
    assert m["kv_bytes"] == 2048 * 22 * 2 * 256 * 2 == 46_137_344                     # "~45 MB" (44 MiB)
    assert m["activation_bytes"] == 2048 * (5 * 2048 + 2 * 2048 + 2 * 256 + 3 * 5632) * 2 + 32000 * 4
    assert round(m["total_bytes"] / 1e9, 1) == 2.4 and m["fits"]


def test_70B_fp16_does_not_fit_one_80GB_a100_but_int4_does():
    c, a100 = load_preset("llama-2-70b"), load_device("a100-80gb")
    assert not memory_budget(c, a100, 2048, 1, "fp16")["fits"]
    assert memory_budget(c, a100, 2048, 1, "int4")["fits"]
    assert max_batch(c, a100, 2048, "fp16") == 0 and max_batch(c, a100, 2048, "int4") > 10


def test_max_batch_and_context_are_the_largest_that_fit():
    dev = custom_device("8 GB card", memory_gb=8, bandwidth_gb_s=300, peak_tflops=30)
    b = max_batch(TINY, dev, 2048, "fp16")
    assert memory_budget(TINY, dev, 2048, b, "fp16")["fits"]
    assert not memory_budget(TINY, dev, 2048, b + 1, "fp16")["fits"]
    # 3.8 GiB × 0.9 usable − 1 GiB overheads leaves ≈ 0.4 GB past the 2.2 GB of weights: 8 × 2,048 tokens do not fit
    small = custom_device("3.8 GB", memory_gb=3.8, bandwidth_gb_s=100, peak_tflops=10)
    t = max_context(TINY, small, batch=8, weight_dtype="fp16")
    assert 0 < t < 2048
    assert memory_budget(TINY, small, t, 8, "fp16")["fits"] and not memory_budget(TINY, small, t + 1, 8, "fp16")["fits"]
    assert max_context(TINY, load_device("a100"), 1, "fp16") == 2048          # capped at the model's context


def test_fit_grid_rows():
    # T4: 16 GiB = 17.18 GB. Weights 2.2 GB; KV 22,528 bytes per token per sequence: 512 x 512 -> 5.9 GB fits,
    # 2,048 x 512 -> 23.6 GB does not (activations, < 0.2 GB here, cannot change either verdict)
    rows = fit_grid(TINY, load_device("T4"), [512, 2048], [1, 512])
    assert [(r["context_tokens"], r["batch"], r["fits"]) for r in rows] == [
        (512, 1, True), (512, 512, True), (2048, 1, True), (2048, 512, False)]
    assert rows[3]["kv_bytes"] == 22_528 * 2048 * 512


def test_bad_memory_inputs():
    with pytest.raises(SpecError):
        memory_budget(TINY, load_device("a100"), 2048, 0)
    with pytest.raises(SpecError):
        memory_budget(TINY, load_device("a100"), 2048, 1, usable_fraction=1.5)
    with pytest.raises(SpecError):
        prefill_scratch_bytes(4096, 0, 1, 1, 1)


def test_overheads_are_stated_terms_inside_the_gpu_memory_utilization_budget():
    a100 = load_device("a100")
    bare = memory_budget(TINY, a100, 2048, 1, "fp16", usable_fraction=1.0, overheads=NO_OVERHEADS)
    real = memory_budget(TINY, a100, 2048, 1, "fp16")
    # vLLM's meaning: usable = 0.9 × the whole device (40 GiB), and context + graphs (0.5 + 0.5 GiB) come out of it
    assert real["usable_bytes"] == 0.9 * 40 * 2 ** 30 and bare["usable_bytes"] == 40 * 2 ** 30
    assert real["overhead_bytes"] == 2 ** 30 and bare["overhead_bytes"] == 0
    assert real["needed_bytes"] - real["total_bytes"] == 2 ** 30
    assert real["headroom_bytes"] == pytest.approx(bare["headroom_bytes"] - 0.1 * 40 * 2 ** 30 - 2 ** 30)
    assert RuntimeOverheads().total_bytes(2) - RuntimeOverheads().total_bytes(1) == 0.25 * 2 ** 30


def test_fp8_checkpoints_keep_embedding_and_lm_head_in_16_bit_as_an_option():
    c = load_preset("llama-3-8b")                    # V 128,256 × D 4,096, untied: two tables of 525,336,576
    tables = 2 * 128_256 * 4096
    with16 = resident_weight_bytes(c, "fp8", embeddings_16bit=True)
    all8 = resident_weight_bytes(c, "fp8", embeddings_16bit=False)
    assert with16 - all8 == tables                   # one more byte for each table entry
    assert resident_weight_bytes(c, "bf16", embeddings_16bit=True) == resident_weight_bytes(c, "bf16", None, False)
