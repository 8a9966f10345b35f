"""The Galaxy section of the Parallelism page (pages/41_Parallelism.py): the 8 × 4 mesh, one layer's collectives per
mesh axis with bytes and time, the step estimate and 001's shapes, every table downloadable; bad input -> a message."""
from __future__ import annotations

from pathlib import Path

from helpers_apptest import REFERENCE, in_datacentre, run_script

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 90


def page(**state):
    return run_script(str(next((ROOT / "pages").glob("41_*.py"))), TIMEOUT, **state)


def frame_with(at, column):
    return next(d.value for d in at.dataframe if column in d.value.columns)


def test_galaxy_section_shows_the_mesh_collectives_per_axis_and_the_step():
    at = page(**in_datacentre(REFERENCE))
    assert not at.exception and not [e.value for e in at.error]
    # TinyLlama (chosen: the class's machine has no links) cannot be laid out on 8 × 4: the section says so and shows 001's model
    assert any("Llama-3-70B, the model of 001" in c.value for c in at.caption)
    labels = {m.label for m in at.metric}
    assert {"Weights per chip", "KV per chip", "TTFT, one prompt (ms)", "ITL (ms)", "Output tokens/s"} <= labels
    coll = frame_with(at, "named in 001")
    # prefill of 2,048 tokens (the default): 001's QKV all-reduce along axis 1 over 4 chips, FF2 along axis 0 over 8
    qkv = coll[coll["collective"] == "QKV"].iloc[0]
    assert qkv["mesh axis"] == 1 and qkv["chips"] == 4 and qkv["per-chip in"] == "(2048, 1280)"
    ff2 = coll[coll["collective"] == "FF2"].iloc[0]
    assert ff2["mesh axis"] == 0 and ff2["chips"] == 8
    axes = frame_with(at, "sent per chip per layer (MB)")
    assert sorted(axes["mesh axis"]) == [0, 1]
    step = frame_with(at, "collectives (ms)")
    assert list(step["phase"]) == ["prefill (one prompt)", "decode step"]
    check = frame_with(at, "agrees")
    assert check["agrees"].any() and not check["agrees"].all()          # 001's 12,288 agrees, its 14,336 does not
    names = {b.proto.label for b in at.get("download_button")}
    assert "Download CSV" in names
    plots = at.get("plotly_chart")
    assert plots


def test_galaxy_section_bad_batch_is_a_message():
    at = page(**in_datacentre(REFERENCE))
    at.text_input(key="par.gx.batch").set_value("64").run()
    assert not at.exception and any("32" in e.value for e in at.error)
