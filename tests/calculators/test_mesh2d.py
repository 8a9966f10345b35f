"""Llama 3 70B on the Tenstorrent Galaxy (reference 001, /work/shared/reference/001_5bee09bf957672c2.txt): the
Wormhole device and the 8 × 4 mesh from datasheets, the per-chip shapes 001 states, the collectives along each mesh
axis (bytes by a simulated ring over the chips, times by hand), memory per chip by a loop over chips, the step times,
the plan, the CLI and the published Galaxy figures.

Expected values are typed from 001 (its line numbers in comments), from the datasheets the specs cite, or counted
by brute force here; never read back from the code under test."""
from __future__ import annotations

import json

import numpy as np
import pytest

from calculators.cli import main
from calculators.multi_gpu import mesh2d as m
from calculators.planning.published_galaxy import compare_all, load_rows, speed_error, table_text
from specs.devices import load_device, load_link
from specs.model_config import SpecError
from specs.presets import load_preset
from specs.topologies import block_format_bytes, load_topology

L70 = load_preset("llama-3-70b")
GALAXY = load_topology("galaxy")
BFP8 = 1 + 1 / 16            # BFP8-B: 8-bit elements, one 8-bit exponent per 16 (Tenstorrent data formats page)
BFP4 = 0.5 + 1 / 16


# --- specs: device, link, topology, formats ---------------------------------------------------------------------
def test_wormhole_datasheet_numbers():
    d = load_device("wormhole")
    assert d.name == load_device("n150").name
    assert d.memory_bytes == 12 * 2 ** 30                          # 12 GB GDDR6 (12 GiB: 6 chips × 2 × 1 GiB)
    assert d.memory_bandwidth_bytes_per_s == 288e9                 # datasheet "Memory Bandwidth 288 GB/sec"
    assert d.peak("fp8") == 148e12 and d.peak("bf16") == 74e12     # BLOCKFP8 148, FP16 74 TFLOP/s
    with pytest.raises(SpecError, match="no FP4"):
        d.flops_for("fp4")                                         # bfloat4_b at LoFi is not the project's fp4
    assert d.source.startswith("https://docs.tenstorrent.com")


def test_ethernet_link_and_the_galaxy_mesh():
    lk = load_link("wh_eth")
    assert lk.bytes_per_s == 12.5e9                                 # 100 Gb/s per direction per link
    assert lk.alpha_per_hop_s == pytest.approx(0.65e-6)             # ~650 ns per hop (ring ping microbenchmark)
    assert GALAXY.mesh_shape == (8, 4) and GALAXY.chips == 32 and GALAXY.wraparound == (False, False)
    for axis in (0, 1):                                            # 001 lines 98, 420, 571: num_links 3
        assert GALAXY.axis_link(axis).bytes_per_s == 3 * 12.5e9
    torus = load_topology("galaxy-wormhole-6u")
    assert torus.wraparound == (True, True) and torus.axis_link(1).bytes_per_s == 4 * 12.5e9
    with pytest.raises(SpecError, match="choose one of"):
        load_topology("dgx")
    with pytest.raises(SpecError):
        GALAXY.axis_link(2)


def test_block_formats_spread_the_shared_exponent_over_16_elements():
    assert block_format_bytes("bfp8_b") == BFP8 and block_format_bytes("bfp4_b") == BFP4
    assert block_format_bytes("bf16") == 2
    with pytest.raises(SpecError):
        block_format_bytes("bfp3")


# --- 001's shapes -------------------------------------------------------------------------------------------------
def test_001_heads_per_chip_and_the_attention_shapes():
    S = 4096
    shapes = {r["step"]: r["shape"] for r in m.prefill_op_shapes(L70, S)}
    assert shapes["q heads"] == [1, 8, S, 128]                      # 001 lines 147, 152: 8 per device
    assert shapes["k heads"] == [1, 1, S, 128] == shapes["v heads"]  # 001 lines 148, 154, 156: 1 per device
    assert shapes["attention scores"] == [1, 8, S, S]               # 001 line 329
    assert shapes["attention output"] == [1, 8, S, 128]             # 001 line 336


def test_001_chunking_and_matmul_choice_by_sequence_length():
    def shape(S, step):
        return next(r for r in m.prefill_op_shapes(L70, S) if r["step"] == step)
    assert shape(8192, "QKV input")["shape"][:3] == [1, 8192 // 2048, 2048]   # 001 line 35: chunks of 2048
    assert shape(2048, "QKV input")["shape"][:3] == [1, 1, 2048]               # only past 2048 (line 34)
    assert shape(2048, "MLP input")["shape"][:3] == [1, 2, 1024]               # 001 line 398: 1024 ≤ S < 4096
    assert shape(512, "MLP input")["shape"][:3] == [1, 1, 512]
    assert shape(4096, "w1_out / w3_out (partial)")["op"] == "minimal_matmul"  # 001 line 13: S >= 4096
    assert shape(2048, "w1_out / w3_out (partial)")["op"] == "linear"


def test_001_qkv_width_12288_is_the_ring_padded_qkv_of_the_8_rows():
    # 001 lines 52, 107: xqkv [1, 1, seq_len, 12288]. A chip's QKV is (8 + 1 + 1) heads × 128 = 1,280 columns
    # (line 29's "1280"); the decode ring pads it to whole tiles on 24 cores (2 tiles each = 1,536); 8 rows.
    qkv = next(w for w in m.weight_shards(L70) if w["weight"] == "wqkv")
    assert qkv["per_chip_shape"][1] == (8 + 1 + 1) * 128 == 1280
    assert 8 * qkv["ring_padded_shape"][1] == 12288
    # tt-metal: "[1, 1, 8192, 10240] -> [2304, 1536]" (llama_attention.py); pad_to_next_multiple 9216 = 4 × 2304,
    # 3840 × 8 (llama_mlp.py)
    assert qkv["ring_padded_shape"] == (2304, 1536)
    assert [m.ring_padded(w) for w in (1280, 2048, 3584)] == [1536, 2304, 3840]
    assert m.ring_padded(768) == 768 and m.ring_padded(769) == 1536


def test_where_001_disagrees_with_the_llama_3_70b_config():
    """001 prints a 1,280-wide input (lines 29, 393), a 14,336-wide w1 output (line 415) and 14,336/8 = 1,792 after a
    reduce-scatter over axis 1 (lines 422, 494). With D = 8,192 and F = 28,672 (the HF config) on 8 × 4, a chip holds
    D/4 = 2,048 of the hidden, F/8 = 3,584 of w1's output, and the reduce-scatter over the 4 chips of axis 1 leaves
    896. The model follows the config; the check says so row by row."""
    w = {x["weight"]: x["per_chip_shape"] for x in m.weight_shards(L70)}
    assert w["w1"] == (8192 // 4, 28672 // 8) == w["w3"] and w["w2"] == (28672 // 8, 8192 // 4)
    assert w["wo"] == (64 * 128 // 8, 8192 // 4)
    rs = next(r for r in m.layer_collectives(L70, 256) if r["key"] == "FF1")
    assert rs["shape_out"] == (256, 896) != (256, 14336 // 8)
    check = {r["what"].split(" (")[0]: r for r in m.reference_001_check(L70)}
    assert check["local query heads"]["agrees"] and check["local KV heads"]["agrees"]
    assert check["QKV width after the all-reduce"]["agrees"]
    assert not check["input width per chip"]["agrees"] and check["input width per chip"]["layout"] == 2048
    assert not check["after the FF1/FF3 reduce-scatter"]["agrees"]


def test_001_collectives_and_their_mesh_axes():
    rows = m.layer_collectives(L70, 2048)
    in_001 = [(r["key"], r["op"], r["axis"]) for r in rows if r["in_001"]]
    assert in_001 == [("QKV", "all_reduce", 1),                    # 001 lines 97, 121: cluster axis 1
                      ("FF1", "reduce_scatter", 1), ("FF3", "reduce_scatter", 1),   # lines 419, 430
                      ("FF3 all-gather", "all_gather", 1),          # line 508
                      ("FF2", "all_reduce", 0)]                     # line 570: cluster axis 0
    assert all(r["devices"] == (8 if r["axis"] == 0 else 4) for r in rows)
    # the code's output projection all-reduce (001 skips it) and, past 1,024 tokens at batch 1, the ring SDPA's
    # two all-gathers
    assert [r["key"] for r in rows if not r["in_001"]] == ["SDPA", "SDPA_REVERSE", "WO"]
    assert [r["key"] for r in m.layer_collectives(L70, 1024) if not r["in_001"]] == ["WO"]


# --- bytes by a simulated ring over the chips ---------------------------------------------------------------------
def ring_reduce_scatter(chunks: list[np.ndarray]) -> tuple[list[np.ndarray], list[int]]:
    """Chip i holds a full vector split in n chunks; after n−1 steps chip i owns the sum of chunk (i+1) % n.
    Returns (owned sums, bytes each chip sent)."""
    n = len(chunks)
    data = [np.array_split(c.copy(), n) for c in chunks]
    sent = [0] * n
    for step in range(n - 1):
        msgs = []
        for i in range(n):
            k = (i - step) % n
            msgs.append((i, k, data[i][k].copy()))
            sent[i] += data[i][k].nbytes
        for i, k, payload in msgs:
            data[(i + 1) % n][k] += payload
    return [data[i][(i + 1) % n] for i in range(n)], sent


def ring_all_gather(pieces: list[np.ndarray]) -> tuple[list[list[np.ndarray]], list[int]]:
    n = len(pieces)
    have = [{i: pieces[i]} for i in range(n)]
    sent = [0] * n
    for step in range(n - 1):
        msgs = [(i, (i - step) % n) for i in range(n)]
        for i, k in msgs:
            sent[i] += have[i][k].nbytes
        for i, k in msgs:
            have[(i + 1) % n][k] = have[i][k]
    return have, sent


@pytest.mark.parametrize("key", ["FF1", "FF3 all-gather", "FF2", "QKV"])
def test_bytes_each_chip_sends_match_a_ring_run_over_the_chips(key):
    T = 64
    row = next(r for r in m.layer_collectives(L70, T) if r["key"] == key)
    n = row["devices"]
    elems = row["shape_in"][0] * row["shape_in"][1] if row["op"] != "all_gather" else \
        row["shape_out"][0] * row["shape_out"][1]
    rng = np.random.default_rng(0)
    # one byte an element stands for one bfp8 element; the spec's 1/16 exponent overhead rides on top
    full = [rng.integers(0, 3, elems).astype(np.int8) for _ in range(n)]
    if row["op"] == "reduce_scatter":
        owned, sent = ring_reduce_scatter(full)
        total = np.array_split(sum(f.astype(np.int64) for f in full), n)
        assert all(np.array_equal(owned[i], total[(i + 1) % n]) for i in range(n))
    elif row["op"] == "all_gather":
        _, sent = ring_all_gather(np.array_split(full[0], n))
    else:                                                       # all-reduce = reduce-scatter + all-gather
        owned, s1 = ring_reduce_scatter(full)
        _, s2 = ring_all_gather(owned)
        sent = [a + b for a, b in zip(s1, s2)]
    assert len(set(sent)) == 1                                  # a ring is balanced: every chip sends the same
    assert row["bytes_sent_per_chip"] == pytest.approx(sent[0] * BFP8)
    assert row["message_bytes"] == pytest.approx(elems * BFP8)


def test_a_collective_time_by_hand():
    # FF2 all-reduce of a 2,048-token prefill: [2048, 2048] bfp8 over the 8 chips of axis 0, 3 links × 12.5 GB/s,
    # alpha 6.6 µs + 2·7 hops × 0.65 µs (ring all-reduce = 2(n−1) steps)
    M = 2048 * 2048 * BFP8
    want = (6.6e-6 + 14 * 0.65e-6 + 2 * 7 / 8 * M / 37.5e9) * 1e3
    row = next(r for r in m.layer_collectives(L70, 2048) if r["key"] == "FF2")
    assert row["ms"] == pytest.approx(want, rel=1e-9)
    # a reduce-scatter over the 4 chips of axis 1: 3 steps, (n−1)/n of the message
    M = 2048 * 3584 * BFP8
    row = next(r for r in m.layer_collectives(L70, 2048) if r["key"] == "FF1")
    assert row["ms"] == pytest.approx((6.6e-6 + 3 * 0.65e-6 + 3 / 4 * M / 37.5e9) * 1e3, rel=1e-9)


def test_per_axis_summary_adds_up_its_rows():
    rows = m.layer_collectives(L70, 4096)
    summary = m.per_axis_summary(rows)
    assert [s["axis"] for s in summary] == [0, 1]
    assert sum(s["collectives"] for s in summary) == len(rows)
    assert sum(s["ms"] for s in summary) == pytest.approx(sum(r["ms"] for r in rows))


def test_decode_moves_whole_32_row_tiles_on_the_ring_padded_widths():
    one, full = m.layer_collectives(L70, 1, "decode"), m.layer_collectives(L70, 32, "decode")
    assert [r["message_bytes"] for r in one] == [r["message_bytes"] for r in full]
    wo = next(r for r in one if r["key"] == "WO")
    assert wo["shape_in"] == (32, 2304) and wo["axis"] == 0        # tt-metal: "# [1, 1, 32, 2304]"
    assert next(r for r in one if r["key"] == "SDPA concat")["shape_out"] == (32, 1024)   # "[1, 1, 32, 1024]"


# --- memory by a loop over chips -------------------------------------------------------------------------------------
def test_prefill_weight_shards_tile_the_whole_model_exactly_once():
    """Summed over the 32 chips, the interleaved shards are the model: every matrix of every layer (HF shapes
    typed here) in its format, plus the vocabulary matrices."""
    D, F, V, L = 8192, 28672, 128256, 80
    layer = (D * (64 + 2 * 8) * 128 + 64 * 128 * D + D * F * 1) * BFP8 + 2 * D * F * BFP4
    model = L * layer + 2 * V * D * BFP8
    chips = sum(m.weight_bytes_per_chip(L70, GALAXY, copy="prefill") for _r in range(8) for _c in range(4))
    assert chips == pytest.approx(model, rel=1e-12)
    both = m.weight_bytes_per_chip(L70, GALAXY)
    assert both == pytest.approx(m.weight_bytes_per_chip(L70, GALAXY, copy="prefill")
                                 + m.weight_bytes_per_chip(L70, GALAXY, copy="decode") - 2 * V * D * BFP8 / 32)
    with pytest.raises(SpecError):
        m.weight_bytes_per_chip(L70, GALAXY, copy="all")


def test_kv_per_chip_by_dealing_users_and_heads_over_the_mesh():
    B, S = 32, 1000
    per_chip = np.zeros((8, 4))
    for user in range(B):                      # tt-metal: 8 users per column group (batch_size_per_device_group)
        for head in range(8):                  # one KV head per row (001 line 148)
            per_chip[head, user // 8] += 80 * S * 128 * 2 * BFP8      # bfloat8_b K and V (001 line 266)
    assert m.kv_bytes_per_chip(L70, GALAXY, B, S) == pytest.approx(per_chip.max())
    assert per_chip.min() == per_chip.max()
    assert m.kv_bytes_per_chip(L70, GALAXY, 1, S) == pytest.approx(80 * S * 256 * BFP8)


# --- step times and the plan -------------------------------------------------------------------------------------
def test_decode_step_memory_part_is_ring_weights_and_kv_over_288_gb_s():
    d = m.decode_step(L70, 1, 128)
    W = m.weight_bytes_per_chip(L70, GALAXY, copy="decode")
    assert d["memory_ms"] == pytest.approx((W + 80 * 128 * 256 * BFP8) / 288e9 * 1e3)
    assert d["binds"] == "memory"
    assert d["step_ms"] == pytest.approx(d["memory_ms"] + d["comm_ms"])
    assert d["comm_ms"] == pytest.approx(80 * sum(r["ms"] for r in m.layer_collectives(L70, 1, "decode")))


def test_prefill_compute_counts_two_flops_per_weight_per_token_over_32_chips():
    p = m.prefill(L70, 8192)
    D, F = 8192, 28672
    layer_elems = D * 10240 + 8192 * D + 3 * D * F
    assert p["matmul_flops"] == pytest.approx(2 * 80 * layer_elems * 8192 / 32)
    # causal attention, 8 heads a row, the sequence split over the row's 4 chips (ring SDPA past 1,024 tokens)
    assert p["ring_sdpa"] and p["attention_flops"] == pytest.approx(2 * 8192 ** 2 * 8 * 128 * 80 / 4)
    assert not m.prefill(L70, 1024)["ring_sdpa"]
    assert p["binds"] == "compute"
    assert p["ms"] == pytest.approx(p["compute_ms"] + p["comm_ms"])


def test_plan_numbers_and_formulas():
    plan = m.galaxy_plan(L70, 128, 128, 32)
    assert plan["fits"] and plan["max_users_by_kv"] == 32 and plan["chips"] == 32
    assert plan["itl_ms"] == plan["decode"]["step_ms"] and plan["ttft_ms"] == plan["prefill"]["ms"]
    assert plan["output_tok_s"] == pytest.approx(32e3 / plan["itl_ms"])
    assert plan["request_ms"] == pytest.approx(plan["ttft_ms"] + 127 * plan["itl_ms"])
    assert set(plan["formulas"]) >= {"weight_bytes_per_chip", "kv_bytes_per_chip", "itl_ms", "ttft_ms",
                                     "max_users_by_kv"}
    # most users by KV: (usable − weights) / KV per user per chip, × 4 columns, capped at 32
    free = 0.9 * 12 * 2 ** 30 - plan["weight_bytes_per_chip"]
    per_user = 80 * 8192 * 256 * BFP8
    assert m.max_users_by_kv(L70, 8192) == min(32, int(free // per_user) * 4)


def test_bad_inputs_are_one_clear_message():
    with pytest.raises(SpecError, match="does not fit the 8 × 4 Galaxy layout"):
        m.galaxy_plan(load_preset("tinyllama"), 128, 128)
    with pytest.raises(SpecError, match="32 users"):               # 001 line 10: up to 32 users
        m.galaxy_plan(L70, 128, 128, batch=33)
    with pytest.raises(SpecError, match="window"):
        m.galaxy_plan(L70, 8000, 500)
    with pytest.raises(SpecError, match="phase"):
        m.layer_collectives(L70, 10, "train")
    with pytest.raises(SpecError):
        m.decode_step(L70, 0, 10)


# --- CLI ------------------------------------------------------------------------------------------------------------
def test_cli_mesh_json_and_table(capsys):
    code = main(["mesh", "--prompt-tokens", "2048", "--output-tokens", "64", "--batch", "8", "--json"])
    out, err = capsys.readouterr()
    d = json.loads(out)
    assert code == 0 and err == ""
    assert d["mesh_shape"] == [8, 4] and d["context_tokens"] == 2112
    assert d["kv_bytes_per_chip"] == pytest.approx(80 * 2 * 2112 * 256 * BFP8)      # 8 users over 4 columns
    assert [a["axis"] for a in d["prefill_per_axis"]] == [0, 1]
    assert {r["key"] for r in d["decode_collectives_per_layer"]} >= {"WO", "FF2", "FF1"}
    assert d["formulas"]["itl_ms"]
    assert main(["mesh"]) == 0 and "ITL" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["mesh", "--model", "tinyllama"], ["mesh", "--batch", "40"],
                                  ["mesh", "--topology", "nvl72"], ["mesh", "--mlp", "fp2"]])
def test_cli_mesh_bad_input_is_one_line_exit_2(capsys, argv):
    try:
        code = main(argv)
    except SystemExit as e:                     # argparse refuses --mlp fp2 itself
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error:") and err.count("\n") == 1


# --- published Galaxy figures ---------------------------------------------------------------------------------------
def test_published_rows_are_sourced_at_a_commit():
    rows = load_rows()
    assert len(rows) >= 20
    for r in rows:
        assert r["url"].startswith("https://github.com/tenstorrent/tt-metal/blob/")
        commit = r["url"].split("/blob/")[1].split("/")[0]
        assert len(commit) == 40 and int(commit, 16) >= 0
        assert float(r["published"]) > 0 and r["settings"]


def test_error_sign_is_speed():
    assert speed_error({"metric": "itl_ms", "published": "20"}, 10.0) == pytest.approx(1.0)
    assert speed_error({"metric": "tok_s_u", "published": "50"}, 25.0) == pytest.approx(-0.5)


def test_predictions_against_published_galaxy_figures():
    """Printed for the record; asserted only inside sanity bands (nothing is fitted to these rows). Decode steps
    are memory- and latency-bound and land within ±35% up to 4K of context; prefill at datasheet peak is a lower
    bound on time, 2-5× faster than measured."""
    res = compare_all()
    print("\n" + table_text(res))
    short_itl = [x for x in res["rows"] if x["row"]["metric"] in ("itl_ms", "tok_s_u")
                 and int(x["row"]["prompt_tokens"]) <= 4096]
    assert len(short_itl) >= 6
    assert all(abs(x["error"]) <= 0.35 for x in short_itl)
    ttft = [x for x in res["rows"] if x["row"]["metric"] == "ttft_ms"]
    assert len(ttft) >= 6
    assert all(0 < x["error"] <= 6 for x in ttft)              # optimistic (a lower bound), by at most 7×
