"""A published-table group's value read as words on the page (the JSON and CSV keep the identifiers)."""
from calculators.planning.accuracy import REGIME_WORDS, group_value_words


def test_regimes_read_as_words_and_other_groups_stay():
    assert group_value_words("max_throughput") == REGIME_WORDS["max_throughput"] == "maximum throughput"
    assert group_value_words("under_rate, MoE") == "under a rate, MoE"
    assert group_value_words("NVIDIA") == "NVIDIA" and group_value_words("fp8") == "fp8"


def test_a_device_priced_from_another_gpus_kernels_carries_its_vendors_held_out_error():
    """MI300X priced from H200's kernels: the band adds what AMD's held-out rows priced that way measured (read
    from bench/published_accuracy.json, the table the bench wrote), and only then."""
    import json
    from pathlib import Path
    from calculators.planning.accuracy import band
    doc = json.loads((Path(__file__).resolve().parents[2] / "bench" / "published_accuracy.json").read_text())
    rows = doc["rows"]
    amd = next(r for r in rows if r["split"] == "test" and r["group"] == "vendor (measured kernels)"
               and r["value"] == "AMD")
    got = band("batch1", "AMD", "fp8", False, measured=True, borrowed=True)
    assert got["borrowed_vendor"]["n"] == amd["n"]
    assert f"worst {100 * amd['worst_abs_error']:.0f}% over {amd['n']}" in got["text"]
    assert "another GPU's kernels" not in band("batch1", "AMD", "fp8", False, measured=True)["text"]
    assert "another GPU's kernels" not in band("batch1", "AMD", "fp8", False, borrowed=True)["text"]


def test_a_layout_with_attention_dp_carries_the_wide_ep_rows_held_out_error(monkeypatch):
    """A wide-EP plan (attention DP, experts across the group) is priced under a rate, where its regime's rows are
    dense or EP-inside-TP: the band adds the held-out error of the rows that ran attention DP with wide EP (read from
    bench/published_accuracy.json), for the pricing that made the figure; a layout without attention DP adds
    nothing; a table with no such row says so."""
    import json
    from pathlib import Path
    import calculators.planning.accuracy as acc
    doc = json.loads((Path(__file__).resolve().parents[2] / "bench" / "published_accuracy.json").read_text())
    wide = next(r for r in doc["rows"] if r["split"] == "test" and r["group"] == "experts (measured kernels)"
                and r["value"] == "wide EP (attention DP)")
    got = acc.band("under_rate", "NVIDIA", "fp4", True, measured=True, wide_ep=True)
    assert got["wide_ep"]["n"] == wide["n"]
    assert got["text"].endswith(f"attention DP with wide EP, as {wide['n']} held-out rows ran: median "
                                f"{100 * wide['median_abs_error']:.0f}%, worst {100 * wide['worst_abs_error']:.0f}%")
    assert "wide EP" not in acc.band("under_rate", "NVIDIA", "fp4", True, measured=True)["text"]
    monkeypatch.setattr(acc, "table", lambda: tuple(r for r in doc["rows"] if not r["group"].startswith("experts")))
    assert acc.band("under_rate", "NVIDIA", "fp4", True, wide_ep=True)["text"].endswith(
        "; no held-out row ran attention DP with wide EP")
