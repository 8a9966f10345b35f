"""Multi-GPU numbers of 003 Detail 22 (tensor, pipeline and context parallelism)."""
import pytest

from calculators.multi_gpu.parallel import (all_gather_ms, allreduces_per_step, context_parallel_kv, expert_parallel,
                                  pipeline_bubble_fraction, ring_allreduce_ms, ring_attention,
                                  tp_allreduce_ms_per_step, tp_bandwidth_floor_ms)
from calculators.sizing.params import weight_bytes
from specs.devices import device_link, load_device, load_link
from specs.model_config import SpecError
from specs.presets import load_preset

TINY = load_preset("tinyllama")


def test_tinyllama_tp_1_2_4_floors_are_1_41_0_71_0_35_ms():
    assert [round(tp_bandwidth_floor_ms(2.2e9, 1555e9, tp), 2) for tp in (1, 2, 4)] == [1.41, 0.71, 0.35]
    w = weight_bytes(TINY, "fp16")
    assert [round(tp_bandwidth_floor_ms(w, 1555e9, tp), 2) for tp in (1, 2, 4)] == [1.41, 0.71, 0.35]


def test_70B_int4_is_22_5_ms_on_one_a100_and_11_3_5_6_2_8_with_tp_2_4_8():
    w = weight_bytes(70e9, "int4")
    assert round(tp_bandwidth_floor_ms(w, 1555e9, 1), 1) == 22.5
    assert [round(tp_bandwidth_floor_ms(w, 1555e9, tp), 1) for tp in (2, 4, 8)] == [11.3, 5.6, 2.8]


def test_two_allreduces_per_layer_44_per_tinyllama_step():
    assert allreduces_per_step(22) == 44


@pytest.mark.parametrize("m, bubble", [(1, 75), (4, 43), (16, 16), (64, 4)])
def test_pipeline_bubble_with_4_stages(m, bubble):
    assert round(100 * pipeline_bubble_fraction(4, m)) == bubble


def test_links_are_stated_per_direction_in_specs_nvlink4_450_ib_ndr_and_400gbe_50_100gbe_12_5_GB_s():
    # 003 Detail 22 quotes H100 NVLink as 900 GB/s: that is both directions together; a ring sends one way
    assert load_link("nvlink4").bytes_per_s == 900e9 / 2
    assert device_link(load_device("h100")).bytes_per_s == 450e9
    assert load_link("ib_ndr").bytes_per_s == load_link("roce_400gbe").bytes_per_s == 400e9 / 8     # 400 Gb/s
    assert load_link("eth_100gbe").bytes_per_s == 100e9 / 8
    for key in ("nvlink4", "pcie5", "ib_ndr", "eth_100gbe"):
        assert "tuning.cc" in load_link(key).source          # alpha cites NCCL's own cost model


def test_ring_allreduce_is_alpha_plus_2_n_minus_1_over_n_message_over_per_direction_bandwidth():
    nv = load_link("nvlink4")
    # 1,024-token prefill of a 70B (D 8,192, bf16) at TP8: the peers give ≈ 10.5 ms of bandwidth time
    # for 160 all-reduces; by hand: 160 × 2·7/8 × 16,777,216 B / 450e9 B/s = 10.44 ms, plus 160 × alpha
    msg = 1024 * 8192 * 2
    alpha_ms = (6.6 + 2 * 7 * 0.6) / 1e3                                 # NCCL ring LL: base + 14 NVLink hops
    assert ring_allreduce_ms(msg, 8, nv) == pytest.approx(alpha_ms + 2 * 7 / 8 * msg / 450e9 * 1e3, rel=1e-12)
    beta_total = 160 * 2 * 7 / 8 * msg / 450e9 * 1e3
    assert round(beta_total, 1) == 10.4
    assert tp_allreduce_ms_per_step(80, 8192, 1024, 8, nv) == pytest.approx(beta_total + 160 * alpha_ms)
    assert ring_allreduce_ms(1e9, 1, nv) == 0                             # one device: nothing to reduce
    assert all_gather_ms(msg, 8, nv) == pytest.approx((6.6 + 7 * 0.6) / 1e3 + 7 / 8 * msg / 450e9 * 1e3)


def test_decode_allreduces_are_latency_bound_and_not_negligible_at_tp8():
    """The lesson the old test taught (all-reduce negligible) was wrong: 160 calls of 16 KiB each cost alpha."""
    nv = load_link("nvlink4")
    t = tp_allreduce_ms_per_step(80, 8192, 1, 8, nv)
    beta = 160 * 2 * 7 / 8 * 8192 * 2 / 450e9 * 1e3                      # 0.0051 ms: bandwidth is nothing
    assert t > 100 * beta
    assert t == pytest.approx(160 * 15e-3 + beta)                        # 2.4 ms of per-call latency
    floor = tp_bandwidth_floor_ms(weight_bytes(70e9, "int4"), 3350e9, 8)  # 1.3 ms: comm exceeds the floor
    assert t > floor


def test_ring_attention_passes_and_causal_imbalance():
    nv = load_link("nvlink4")
    r = ring_attention(1_000_000, 8, 40_960, nv, load_balanced=False)
    assert r["passes"] == 7 and r["tokens_per_device"] == 125_000
    assert r["causal_imbalance"] == pytest.approx(2 * 8 / 9)             # busiest 8 blocks vs mean 4.5
    assert ring_attention(1_000_000, 8, 40_960, nv)["causal_imbalance"] == 1


def test_expert_parallel_deepseek_v3_32_experts_per_gpu_at_ep8():
    nv = load_link("nvlink4")
    e = expert_parallel(256, 8, 7168, 1, 8, nv)
    assert e["experts_per_device"] == 32 and e["all_to_all_bytes"] == 8 * 7168 * 2
    # the stacks' default: an all-gather of 8 devices' 64 tokens (bf16) and a reduce-scatter, each alpha + 7 hops
    # + 7/8 of the buffer at the link's one-way bandwidth
    g = expert_parallel(256, 8, 7168, 64, 8, nv)
    ring = (nv.alpha_base_s + 7 * nv.alpha_per_hop_s + 7 / 8 * 8 * 64 * 7168 * 2 / nv.bytes_per_s) * 1e3
    assert g["gathered_bytes"] == 8 * 64 * 7168 * 2 and g["gather_scatter_ms_per_layer"] == pytest.approx(2 * ring)
    with pytest.raises(SpecError):
        expert_parallel(256, 8, 7168, 1, 3, load_link("nvlink4"))


def test_context_parallel_70B_1M_tokens_is_4_1_GB_per_layer_327_GB_total_164_int8_41_per_tp8_gpu():
    fp16 = context_parallel_kv(80, 8, 128, 1_000_000, 2)
    assert round(fp16["bytes_per_layer"] / 1e9, 1) == 4.1
    assert fp16["bytes_total"] == pytest.approx(327e9, rel=0.003)        # 327.7 GB, which the text truncates
    assert round(context_parallel_kv(80, 8, 128, 1_000_000, 1)["bytes_total"] / 1e9) == 164
    assert round(context_parallel_kv(80, 8, 128, 1_000_000, 2, tp=8)["bytes_per_device"] / 1e9) == 41
    assert context_parallel_kv(80, 8, 128, 1_000_000, 2, cp=8)["tokens_per_device"] == 125_000


def test_context_parallel_kv_stops_shrinking_past_tp_equal_kv_heads():
    # 8 KV heads: TP 16 keeps two copies of each head, so per-GPU KV equals TP 8's (41 GB), not half of it
    tp8 = context_parallel_kv(80, 8, 128, 1_000_000, 2, tp=8)["bytes_per_device"]
    tp16 = context_parallel_kv(80, 8, 128, 1_000_000, 2, tp=16)["bytes_per_device"]
    assert tp16 == tp8 == 80 * 2 * 8 * 128 * 1_000_000 * 2 / 8


def test_bad_parallel_inputs():
    with pytest.raises(SpecError):
        pipeline_bubble_fraction(0, 4)
    with pytest.raises(SpecError):
        tp_bandwidth_floor_ms(1e9, 1e12, 0)


def test_every_device_interconnect_names_a_sourced_link_and_is_half_its_bidirectional_total():
    from specs.devices import all_devices, all_links, device_documents
    keys = {lk.key for lk in all_links()}
    assert {"nvlink4", "pcie5", "ib_ndr", "roce_400gbe", "eth_100gbe"} <= keys     # the four link families
    for lk in all_links():
        assert lk.source and lk.alpha_base_s > 0 and lk.alpha_per_hop_s > 0
    for doc in device_documents():
        ic = doc["interconnect"]
        if ic.get("link") is None:
            continue
        assert ic["link"] in keys
        if ic["link"] not in ("roce_gaudi",):              # Gaudi's figure is quoted per direction already
            assert ic["bandwidth_gb_s_per_direction"] * 2 == ic["bandwidth_gb_s_total"]
    assert all(d.interconnect_bytes_per_s is None or d.interconnect_link for d in all_devices())


def test_the_context_parallel_formula_text_gives_the_same_bytes():
    from calculators.explain import explain_context_parallel_kv
    for cp, tp in ((1, 8), (8, 1), (2, 16)):
        e = explain_context_parallel_kv(80, 8, 128, 1_000_000, 2, cp, tp)
        assert e.value == pytest.approx(context_parallel_kv(80, 8, 128, 1_000_000, 2, cp, tp)["bytes_per_device"])
