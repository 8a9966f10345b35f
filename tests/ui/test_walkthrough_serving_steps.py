"""The Walkthrough's serving steps (9 batching, 10 paging, 11 the planner), headless on the default run: each is
drawn and links on, and its numbers agree with a second way of getting them (the engine's own arrays counted, a
block-filling loop, the planner's table)."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from helpers_apptest import chart_specs, errors, in_order, run_script

ROOT = Path(__file__).resolve().parents[2]
PAGE = str(ROOT / "pages" / "01_Walkthrough.py")
TIMEOUT = 180


def step(n: int):
    at = run_script(PAGE, TIMEOUT, **{"walk.step": str(n)})
    assert not at.exception and not errors(at), (at.exception, errors(at))
    return at


def words(at) -> str:
    return "\n".join(str(e.value) for k in ("markdown", "caption", "warning") for e in at.get(k))


def engine_model():
    from engine import load_model
    from helpers_apptest import SMALL_RANDOM
    from ui.model_picker import source_for
    return load_model(source_for(SMALL_RANDOM))


def array_elements(obj, seen: dict) -> None:
    """Every distinct NumPy array in the weights, counted once (a tied LM head is the embedding array)."""
    import dataclasses
    if isinstance(obj, np.ndarray):
        seen[id(obj)] = obj.size
    elif dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            array_elements(getattr(obj, f.name), seen)
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            array_elements(x, seen)
    elif isinstance(obj, dict):
        for x in obj.values():
            array_elements(x, seen)


def test_batching_step_one_reply_is_bandwidth_over_weights_plus_kv():
    """At batch 1 a decode step reads every weight once (bf16: 2 bytes each, counted from the engine's own arrays)
    and the reply's KV cache (2 × layers × KV heads × head dim × 2 bytes per token: the cached tokens read, the new
    token's row written), at the GPU's datasheet
    bandwidth; the total at batch b is b × one reply's rate. Catches: the step counting the KV of the whole batch
    for one reply, the weights read per reply, the wrong device or context."""
    from specs.devices import load_device
    from ui.model_source import REFERENCE_DEVICE
    at = step(9)
    assert at.header[0].value.startswith("9.")
    total, one = [t for t in chart_specs(at)[0]["data"]]
    batches = total["x"]
    model = engine_model()
    c = model.config
    seen: dict = {}
    array_elements(model.weights, seen)
    context = int(re.search(r"([\d,]+) tokens of context each", words(at)).group(1).replace(",", ""))
    kv = 2 * c.num_layers * c.num_kv_heads * c.head_dim * 2
    bw = load_device(REFERENCE_DEVICE).memory_bandwidth_bytes_per_s
    assert one["y"][0] == pytest.approx(bw / (2 * sum(seen.values()) + (context + 1) * kv), rel=1e-9)
    for b, tot, per in zip(batches, total["y"], one["y"]):
        assert tot == pytest.approx(b * per, rel=1e-9)
    assert total["y"][batches.index(64)] > 30 * total["y"][0]         # batching pays while the weights dominate
    assert "Go deeper: Batching" in words(at)


def test_paging_step_blocks_match_a_slot_filling_loop():
    """Catches: blocks = n // 16 (a partial last block dropped), the grid not showing the reply's tokens."""
    at = step(10)
    text = words(at)
    n = int(re.search(r"this reply's ([\d,]+) tokens take", text).group(1).replace(",", ""))
    blocks, used = 0, 16                                              # give a new block whenever the last is full
    for _ in range(n):
        if used == 16:
            blocks, used = blocks + 1, 0
        used += 1
    assert f"**{blocks:,} blocks**, with {16 - used if blocks else 0:,} empty slots" in text
    grid = chart_specs(at)[0]["data"][0]
    assert len(grid["z"]) == blocks and sum(map(sum, grid["z"])) == n
    assert "Go deeper: Paged KV cache" in text


def test_planner_step_names_the_cheapest_bar_and_sorts_them():
    """Catches: the headline naming a plan that is not the cheapest one drawn, bars in no order."""
    at = step(11)
    bars = chart_specs(at)[0]["data"][0]
    cost, names = bars["x"], bars["y"]
    assert cost == sorted(cost) and len(names) >= 2
    assert f"× {names[0]}** " in words(at) and f"**${cost[0]:,.3f} per million output tokens**" in words(at)
    assert "Go deeper: Capacity planner" in words(at)


def test_the_walkthrough_has_eleven_steps_and_says_so():
    at = step(11)
    assert "in 11 steps" in words(at)
    at.button(key="walk.step.next").click().run()                       # past the last: a note, same step
    assert at.header[0].value.startswith("11.")
    assert any("last one" in w.value for w in at.warning)


def test_two_speeds_step_calls_the_beat_steady_only_when_its_bars_are():
    """Step 8's sentence is a function of the bars drawn beside it (ui.walk_claims): "a steady beat" only when
    every decode bar is within ±25% of the median one, else the spread. Catches the fixed "at a steady beat" next
    to a first decode step of 90 ms among 36 ms ones."""
    from ui.walk_claims import STEADY_SPREAD, decode_spread
    at = step(8)
    import base64
    x = [t for t in chart_specs(at)[0]["data"] if t.get("name") == "decode"][0]["x"]
    if isinstance(x, dict):                                             # plotly's base64-packed array
        x = np.frombuffer(base64.b64decode(x["bdata"]), dtype=np.dtype(x["dtype"]))
    decode = {"x": list(x)}
    spread = decode_spread(decode["x"])[3]
    text = words(at)
    if len(decode["x"]) >= 3:
        assert ("at a steady beat: all" in text) == (spread <= STEADY_SPREAD)
        assert ("not at a steady beat" in text) == (spread > STEADY_SPREAD)


def test_planner_step_says_what_binds_only_when_it_nearly_does():
    """Step 11 names a binding limit only when the plan nearly uses it up; "binding: memory (5% of its limit)"
    said the opposite of what it showed."""
    text = words(step(11))
    assert "binding:" not in text and "of its limit" not in text
    assert "nothing binds" in text or "what limits it" in text


def test_each_steps_heading_chart_and_next_come_before_the_prompt():
    """A projector's first screen (1366×768) shows Next, the step's heading and its chart: the prompt box and the
    run settings are under the step (today they came first, and the chart started at 822 px or lower). Step 1 holds
    the prompt box, after its heading."""
    for n in (1, 5, 8):
        at = step(n)
        kinds = in_order(at.main)
        first = {k: kinds.index(k) for k in ("button", "header", "text_area") if k in kinds}
        assert first["button"] < first["header"] < first["text_area"], kinds
        if n > 1:
            assert kinds.index("plotly_chart") < first["text_area"], kinds
