"""The aiconfigurator-core adapter (specs/aiconfigurator_source.py) on small tables written here in the package's
layout, with every expected value worked out by hand from those tables; then one check on the real package (skipped
without it): the H200 vLLM profile exists and its numbers sit under the H200's datasheet."""
import numpy as np
import pytest

from specs import aiconfigurator_source as aic
from specs.model_config import SpecError

COMMON = {"framework": "VLLM", "device": "NVIDIA H200"}


def write(root, rel, rows):
    """One parquet table at systems/data/<rel>, the columns aiconfigurator writes."""
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    path = root / "systems" / "data" / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame([{**COMMON, **r} for r in rows]).to_parquet(path)


@pytest.fixture
def fake_package(tmp_path):
    """h200_sxm with vLLM 0.24.0 (GEMM, attention, custom all-reduce), MoE only in 0.20.0, attention also in a newer
    0.25.0 that must not be used, and NCCL 2.26.2 (the version its yaml names) next to a newer 2.29.2."""
    pytest.importorskip("yaml")
    g = "h200_sxm"
    write(tmp_path, f"{g}/gemm/vllm/0.24.0/gemm_perf.parquet", [
        {"kernel_source": "torch.nn.functional.linear", "gemm_dtype": "bfloat16", "m": 8, "n": 4096, "k": 4096,
         "latency": 0.0130},
        {"kernel_source": "CutlassFp8BlockScaledMMKernel", "gemm_dtype": "fp8_block", "m": 8, "n": 4096,
         "k": 4096, "latency": 0.0110},
        {"kernel_source": "DeepGemmFp8BlockScaledMMKernel", "gemm_dtype": "fp8_block", "m": 8, "n": 4096,
         "k": 4096, "latency": 0.0090}])
    attn = {"kernel_source": "vllm_flash_attn_fa3", "num_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
            "beam_width": 1, "attn_dtype": "bfloat16", "kv_cache_dtype": "fp8", "window_size": 0}
    write(tmp_path, f"{g}/attention/vllm/0.24.0/generation_attention_perf.parquet", [
        {**attn, "batch_size": 32, "isl": 1, "step": 4095, "latency": 0.100},
        {**attn, "batch_size": 32, "isl": 1, "step": 1023, "latency": 0.030}])
    write(tmp_path, f"{g}/attention/vllm/0.24.0/context_attention_perf.parquet", [
        {**attn, "batch_size": 2, "isl": 2048, "step": 0, "latency": 0.500},
        {**attn, "batch_size": 2, "isl": 2048, "step": 0, "kernel_source": "vllm_flash_attn_fa4", "latency": 0.450},
        {**attn, "batch_size": 2, "isl": 2048, "step": 0, "beam_width": 4, "latency": 0.100}])
    write(tmp_path, f"{g}/attention/vllm/0.25.0/generation_attention_perf.parquet", [
        {**attn, "batch_size": 32, "isl": 1, "step": 4095, "latency": 9.0}])
    moe = {"kernel_source": "vllm_fp8moe_triton_tritonexperts", "moe_dtype": "fp8_block", "num_tokens": 64,
           "hidden_size": 7168, "inter_size": 2048, "topk": 8, "num_experts": 256, "moe_tp_size": 1,
           "moe_ep_size": 8}
    write(tmp_path, f"{g}/moe/vllm/0.20.0/moe_perf.parquet", [
        {**moe, "distribution": "balanced", "latency": 0.20}, {**moe, "distribution": "power_law_1.2",
                                                                "latency": 0.26}])
    write(tmp_path, f"{g}/comm/vllm/0.24.0/custom_allreduce_perf.parquet", [
        {"kernel_source": "vLLM_custom_graph", "allreduce_dtype": "bfloat16", "num_gpus": 8, "message_size": 8192,
         "latency": 0.0052, "backend": "vllm_graph"},
        {"kernel_source": "vLLM_custom_eager", "allreduce_dtype": "bfloat16", "num_gpus": 8, "message_size": 8192,
         "latency": 0.0200, "backend": "vllm_eager"}])
    nccl = {"kernel_source": "NCCL", "num_gpus": 4, "message_size": 524288}
    write(tmp_path, f"{g}/comm/nccl/2.26.2/nccl_perf.parquet", [
        {**nccl, "op_name": "all_reduce", "nccl_dtype": "half", "latency": 0.018},
        {**nccl, "op_name": "all_reduce", "nccl_dtype": "int8", "latency": 0.012},
        {**nccl, "op_name": "all_gather", "nccl_dtype": "half", "latency": 0.009}])
    write(tmp_path, f"{g}/comm/nccl/2.29.2/nccl_perf.parquet", [
        {**nccl, "op_name": "all_reduce", "nccl_dtype": "half", "latency": 5.0}])
    (tmp_path / "systems" / f"{g}.yaml").write_text(
        "gpu:\n  mem_bw: 4800000000000\n  bfloat16_tc_flops: 989000000000000\nmisc:\n  nccl_version: '2.26.2'\n")
    return tmp_path


def rows(table, order):
    """The table's rows as tuples of the named columns."""
    return list(zip(*(table[c].tolist() for c in order)))


def test_the_package_layout_lists_one_profile_per_gemm_table(fake_package):
    assert aic.shipped(fake_package) == [("h200_sxm", "vllm", "0.24.0")]
    assert aic.profile_name("h200_sxm", "vllm", "0.24.0", "0.12.0") == "h200-vllm-0.24.0@aiconfigurator-core-0.12.0"
    assert aic.profile_name("a100_sxm", "trtllm", "1.0.0", "0.12.0").startswith("a100-sxm-80gb-trtllm-1.0.0@")
    assert sorted(["1.3.0", "1.3.0rc20", "1.2.9", "1.3.0rc3"], key=aic.version_key) == \
           ["1.2.9", "1.3.0rc3", "1.3.0rc20", "1.3.0"]


def test_gemm_keeps_the_fastest_kernel_per_shape(fake_package):
    p = aic.convert("h200_sxm", "vllm", "0.24.0", root=fake_package)
    assert p.device == "H200" and p.stack == "vllm" and p.source["kind"] == "aiconfigurator-core"
    assert rows(p.table("gemm"), ["dtype", "m", "n", "k", "kernel", "ms"]) == [
        ("bf16", 8, 4096, 4096, "torch.nn.functional.linear", 0.0130),
        ("fp8_block", 8, 4096, 4096, "DeepGemmFp8BlockScaledMMKernel", 0.0090)]


def test_attention_lengths_decode_reads_isl_plus_step(fake_package):
    p = aic.convert("h200_sxm", "vllm", "0.24.0", root=fake_package)
    assert rows(p.table("generation_attention"), ["batch", "context", "heads", "kv_heads", "kv_dtype", "ms"]) == [
        (32, 1024, 32, 8, "fp8", 0.030), (32, 4096, 32, 8, "fp8", 0.100)]      # 0.25.0's 9.0 ms is never used
    assert rows(p.table("context_attention"), ["batch", "tokens", "prefix", "kernel", "ms"]) == [
        (2, 2048, 0, "vllm_flash_attn_fa4", 0.450)]                            # beam-width-4 row dropped


def test_moe_falls_back_to_an_older_version_and_keeps_every_distribution(fake_package):
    p = aic.convert("h200_sxm", "vllm", "0.24.0", root=fake_package)
    assert rows(p.table("moe"), ["tokens", "experts", "topk", "ep", "distribution", "ms"]) == [
        (64, 256, 8, 8, "balanced", 0.20), (64, 256, 8, 8, "power_law_1.2", 0.26)]
    assert "systems/data/h200_sxm/moe/vllm/0.20.0/moe_perf.parquet" in p.source["detail"]
    assert "0.25.0" not in p.source["detail"]


def test_allreduce_message_sizes_are_elements_times_the_dtype_size(fake_package):
    p = aic.convert("h200_sxm", "vllm", "0.24.0", root=fake_package)
    assert rows(p.table("allreduce"), ["dtype", "bytes", "gpus", "kind", "ms"]) == [
        ("bf16", 16384, 8, "custom_eager", 0.0200), ("bf16", 16384, 8, "custom_graph", 0.0052),
        ("fp16", 1048576, 4, "nccl", 0.018), ("int8", 524288, 4, "nccl", 0.012)]    # NCCL 2.26.2, as the yaml says
    assert p.provenance["nccl"] == "2.26.2" and p.provenance["device"] == "NVIDIA H200"


def test_nccls_all_gather_is_its_own_table_in_bytes_of_the_whole_buffer_and_a_missing_op_is_no_table(fake_package):
    """The fake NCCL 2.26.2 table measured one all-gather (524,288 half elements on 4 GPUs, 0.009 ms) and no
    reduce-scatter; the all-gather rows do not leak into the all-reduce table (checked above)."""
    p = aic.convert("h200_sxm", "vllm", "0.24.0", root=fake_package)
    assert rows(p.table("allgather"), ["dtype", "bytes", "gpus", "kind", "ms"]) == [("fp16", 1048576, 4, "nccl", 0.009)]
    assert "reduce_scatter" not in p.tables


def test_a_missing_gemm_table_or_reader_is_a_spec_error(fake_package, monkeypatch):
    with pytest.raises(SpecError, match="no GEMM table for h200_sxm/vllm/0.20.0"):
        aic.convert("h200_sxm", "vllm", "0.20.0", root=fake_package)
    monkeypatch.setattr(aic, "readers_installed", lambda: False)
    assert aic.shipped(fake_package) == []
    with pytest.raises(SpecError, match="pip install -r requirements-profiles.txt"):
        aic.convert("h200_sxm", "vllm", "0.24.0", root=fake_package)


def test_the_real_h200_vllm_profile_sits_under_the_datasheet():
    """aiconfigurator-core 0.12.0 as installed: a big bf16 GEMM reaches 40-100% of 989 TFLOP/s, and a decode
    attention row reads its KV cache below 4.8 TB/s."""
    if aic.package_dir() is None:
        pytest.skip(f"{aic.PACKAGE} is not installed (pip install -r requirements-profiles.txt)")
    pytest.importorskip("pyarrow")
    from specs.profiles import available_profiles, profile_for
    assert f"h200-vllm-0.24.0@{aic.PACKAGE}-{aic.package_version()}" in available_profiles()
    p = profile_for("H200", "vllm", "0.24.0")
    dev = p.device_spec()
    g = p.table("gemm")
    big = (g["dtype"] == "bf16") & (g["m"] == 8192) & (g["n"] == 8192) & (g["k"] == 8192)
    mfu = 2 * 8192 ** 3 / (g["ms"][big][0] * 1e-3) / dev.peak("bf16")
    assert 0.4 < mfu < 1.0
    a = p.table("generation_attention")
    row = np.flatnonzero((a["batch"] == 64) & (a["context"] == 4096) & (a["kv_heads"] == 8) & (a["head_dim"] == 128)
                         & (a["kv_dtype"] == "bf16") & (a["window"] == 0))[0]
    kv_bytes = 64 * 4096 * 2 * 8 * 128 * 2            # batch x context x (K and V) x kv heads x head dim x 2 bytes
    bandwidth = kv_bytes / (a["ms"][row] * 1e-3)
    assert 0.5 * dev.memory_bandwidth_bytes_per_s < bandwidth < dev.memory_bandwidth_bytes_per_s == 4.8e12


def test_older_tables_without_a_window_are_full_attention_and_a_missing_column_is_named(tmp_path):
    pytest.importorskip("yaml")
    gemm = {"kernel_source": "torch_flow", "gemm_dtype": "bfloat16", "m": 1, "n": 128, "latency": 0.01}
    write(tmp_path, "a100_sxm/gemm/trtllm/1.0.0/gemm_perf.parquet", [{**gemm, "k": 128}])
    write(tmp_path, "a100_sxm/attention/trtllm/1.0.0/generation_attention_perf.parquet", [
        {"kernel_source": "torch_flow", "batch_size": 4, "isl": 1, "step": 511, "num_heads": 8,
         "num_key_value_heads": 8, "head_dim": 64, "beam_width": 1, "attn_dtype": "bfloat16",
         "kv_cache_dtype": "bfloat16", "latency": 0.02}])
    p = aic.convert("a100_sxm", "trtllm", "1.0.0", root=tmp_path)
    assert p.device == "A100 SXM 80GB"
    assert rows(p.table("generation_attention"), ["batch", "context", "window", "ms"]) == [(4, 512, 0, 0.02)]
    write(tmp_path, "a100_sxm/gemm/trtllm/1.1.0/gemm_perf.parquet", [gemm])
    with pytest.raises(SpecError, match=r"1.1.0/gemm_perf.parquet: not the columns this adapter reads"):
        aic.convert("a100_sxm", "trtllm", "1.1.0", root=tmp_path)


def test_attention_keeps_the_framework_default_kernel_where_the_package_names_one(tmp_path):
    """SGLang 0.5.14 runs triton attention on SM100 (systems/attention_lane_defaults.yaml), so a faster
    trtllm_mha row of the same shape is not what it serves with; a shape only trtllm_mha measured keeps that."""
    pytest.importorskip("yaml")
    write(tmp_path, "b200_sxm/gemm/sglang/0.5.14/gemm_perf.parquet", [
        {"kernel_source": "sglang_torch_linear", "gemm_dtype": "bfloat16", "m": 1, "n": 128, "k": 128,
         "latency": 0.01}])
    attn = {"isl": 1, "num_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "beam_width": 1,
            "attn_dtype": "bfloat16", "kv_cache_dtype": "bfloat16", "window_size": 0}
    write(tmp_path, "b200_sxm/attention/sglang/0.5.14/generation_attention_perf.parquet", [
        {**attn, "batch_size": 8, "step": 1023, "kernel_source": "triton", "latency": 0.040},
        {**attn, "batch_size": 8, "step": 1023, "kernel_source": "trtllm_mha", "latency": 0.030},
        {**attn, "batch_size": 16, "step": 1023, "kernel_source": "trtllm_mha", "latency": 0.050}])
    (tmp_path / "systems" / "b200_sxm.yaml").write_text("gpu:\n  sm_version: 100\n")
    (tmp_path / "systems" / "attention_lane_defaults.yaml").write_text(
        "sglang:\n  \"0.5.14\":\n    90: fa3\n    100: triton\nvllm:\n  \"0.24.0\":\n    100: default\n")
    p = aic.convert("b200_sxm", "sglang", "0.5.14", root=tmp_path)
    assert rows(p.table("generation_attention"), ["batch", "context", "kernel", "ms"]) == [
        (8, 1024, "triton", 0.040), (16, 1024, "trtllm_mha", 0.050)]


def test_a_gated_delta_rule_layer_is_its_conv_plus_its_delta_rule_each_the_fastest_measured(fake_package):
    """gdn_perf: two kernels per phase and shape, measured on several models that share the shape; a layer is the
    fastest of each kernel summed, and a shape with only one of its kernels measured is left out."""
    shape = {"op_name": "gdn", "d_conv": 4, "num_k_heads": 16, "head_k_dim": 128, "num_v_heads": 32,
             "head_v_dim": 128}
    write(fake_package, "h200_sxm/linear_attention/vllm/0.24.0/gdn_perf.parquet", [
        {**shape, "kernel_source": "causal_conv1d_update", "phase": "generation", "batch_size": 8, "seq_len": 1,
         "num_tokens": 8, "d_model": 2048, "model_name": "a", "latency": 0.0020},
        {**shape, "kernel_source": "causal_conv1d_update", "phase": "generation", "batch_size": 8, "seq_len": 1,
         "num_tokens": 8, "d_model": 4096, "model_name": "b", "latency": 0.0018},
        {**shape, "kernel_source": "fused_recurrent_gated_delta_rule_packed_decode", "phase": "generation",
         "batch_size": 8, "seq_len": 1, "num_tokens": 8, "d_model": 2048, "model_name": "a", "latency": 0.0060},
        {**shape, "kernel_source": "causal_conv1d_fn", "phase": "context", "batch_size": 1, "seq_len": 1024,
         "num_tokens": 1024, "d_model": 2048, "model_name": "a", "latency": 0.0160}])
    p = aic.convert("h200_sxm", "vllm", "0.24.0", root=fake_package)
    assert rows(p.table("linear_attention"), ["phase", "batch", "tokens", "k_heads", "v_heads", "ms"]) == [
        ("generation", 8, 1, 16, 32, pytest.approx(0.0018 + 0.0060))]


def test_the_all_to_all_table_is_read_in_microseconds(fake_package):
    """moe_a2a_perf keeps DeepEP's latency in microseconds (its `transmit_us` + `notify_us`), unlike the other
    tables' milliseconds: 307.3 µs is 0.3073 ms in the profile, and of two backends at one shape both stay (the
    reader keeps the faster)."""
    a2a = {"op_name": "moe_a2a", "kernel_source": "deepep", "phase": "dispatch", "comm_dtype": "nvfp4", "ep_size": 8,
           "node_num": 1, "hidden_size": 7168, "topk": 8, "num_experts": 256, "num_tokens": 1024, "sms": 0,
           "notify_us": 0.0}
    write(fake_package, "h200_sxm/comm/vllm/0.24.0/moe_a2a_perf.parquet", [
        {**a2a, "comm_backend": "deepep_ht", "transmit_us": 307.3, "latency": 307.3},
        {**a2a, "comm_backend": "deepep_ll", "transmit_us": 512.0, "latency": 512.0}])
    p = aic.convert("h200_sxm", "vllm", "0.24.0", root=fake_package)
    assert sorted(rows(p.table("moe_a2a"), ["backend", "tokens", "ms"])) == [
        ("deepep_ht", 1024, pytest.approx(0.3073)), ("deepep_ll", 1024, pytest.approx(0.512))]


def test_an_opt_in_min_latency_moe_kernel_prices_only_the_shapes_no_default_kernel_measured(tmp_path):
    """TensorRT-LLM's min-latency fused MoE (off unless `enable_min_latency` is set) is faster than its CUTLASS
    kernel under skewed routing (B200 NVFP4, DeepSeek-R1's experts, 8,192 tokens: 0.577 against 0.865 ms in
    aiconfigurator-core 0.12). A throughput run does not use it, so where CUTLASS measured a shape the table keeps
    CUTLASS's row even though it is the slower; where only the min-latency kernel measured a shape, its row stays."""
    pytest.importorskip("yaml")
    g = "b200_sxm"
    write(tmp_path, f"{g}/gemm/trtllm/1.3.0rc20/gemm_perf.parquet", [
        {"framework": "TRTLLM", "kernel_source": "torch_flow", "gemm_dtype": "bfloat16", "m": 8, "n": 4096,
         "k": 4096, "latency": 0.01}])
    moe = {"framework": "TRTLLM", "moe_dtype": "nvfp4", "hidden_size": 7168, "inter_size": 2048, "topk": 8,
           "num_experts": 256, "moe_tp_size": 1, "moe_ep_size": 8, "distribution": "power_law_1.01"}
    write(tmp_path, f"{g}/moe/trtllm/1.3.0rc20/moe_perf.parquet", [
        {**moe, "kernel_source": "moe_torch_flow_cutlass", "num_tokens": 8192, "latency": 0.865},
        {**moe, "kernel_source": "moe_torch_flow_min_latency", "num_tokens": 8192, "latency": 0.577},
        {**moe, "kernel_source": "moe_torch_flow_min_latency", "num_tokens": 4, "latency": 0.040}])
    (tmp_path / "systems" / f"{g}.yaml").write_text("gpu:\n  mem_bw: 8000000000000\n")
    p = aic.convert(g, "trtllm", "1.3.0rc20", root=tmp_path)
    assert rows(p.table("moe"), ["dtype", "tokens", "kernel", "ms"]) == [
        ("fp4", 4, "moe_torch_flow_min_latency", 0.040), ("fp4", 8192, "moe_torch_flow_cutlass", 0.865)]
