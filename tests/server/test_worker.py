"""The engine worker: many sessions' requests in one batch, each streaming its own tokens; admission control (one
request per session, a bounded line with its place, refusal up front of what can never fit); and every way a
request ends (finished, stopped, session closed, abandoned) gives its KV blocks back.

Expected tokens come from `Model.generate` run alone (an independent loop with its own contiguous cache); block
counts from the pool's own size.
"""
import time

import pytest

from calculators.sizing.roofline import forward_flops
from engine import Model, ModelError, Trace
from server.worker import Busy, EngineWorker
from helpers_models import prompt, tiny

NEVER = 1e9                     # abandon_after_s for tests that step by hand (nobody reads between steps)


@pytest.fixture(scope="module")
def model():
    return Model.random(tiny(), seed=3)


def alone(model, ids, n):
    return [t.token_id for t in model.generate(ids, max_new_tokens=n, stop_at_eos=False)]


def manual(model, **kw) -> EngineWorker:
    """A worker whose steps the test drives (no thread)."""
    kw.setdefault("abandon_after_s", NEVER)
    return EngineWorker(model, start=False, block_size=4, num_blocks=kw.pop("num_blocks", 40), **kw)


def run_until_done(w: EngineWorker, limit: int = 500) -> None:
    for _ in range(limit):
        if w.step_once() is None:
            return
    raise AssertionError("requests did not finish")


def wait_for(predicate, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


# ------------------------------------------------------------------------------------------ isolation
def test_two_sessions_each_stream_only_their_own_reply(model):
    a, b = prompt(7, seed=1), prompt(12, seed=2)
    w = EngineWorker(model, block_size=4, num_blocks=40)             # the real background thread
    try:
        ha = w.submit("alice", a, max_new_tokens=6, stop_at_eos=False)
        hb = w.submit("bob", b, max_new_tokens=9, stop_at_eos=False)
        got_a = [t.token_id for t in ha]
        got_b = [t.token_id for t in hb]
    finally:
        w.close()
    assert got_a == alone(model, a, 6)
    assert got_b == alone(model, b, 9)
    assert ha.largest_batch == 2 and hb.largest_batch == 2          # they really were batched together


def test_stream_carries_engine_generated_fields(model):
    ids = prompt(5, seed=4)
    w = manual(model)
    h = w.submit("s", ids, max_new_tokens=3, stop_at_eos=False)
    run_until_done(w)
    toks = list(h)
    assert [t.step for t in toks] == [0, 1, 2]
    assert toks[-1].finish_reason == "length" and all(t.finish_reason is None for t in toks[:-1])
    c = model.config
    per_token = 2 * c.num_layers * c.num_kv_heads * c.head_dim * 4            # K and V, float32
    assert [t.kv_cache_bytes for t in toks] == [(len(ids) + i) * per_token for i in range(3)]


# ------------------------------------------------------------------------------------------ admission
def test_queue_order_and_busy_message(model):
    w = manual(model, max_batch=1)
    h1 = w.submit("s1", prompt(5, seed=1), max_new_tokens=2, stop_at_eos=False)
    h2 = w.submit("s2", prompt(5, seed=2), max_new_tokens=2, stop_at_eos=False)
    h3 = w.submit("s3", prompt(5, seed=3), max_new_tokens=2, stop_at_eos=False)
    w.step_once()
    assert (h1.position, h2.position, h3.position) == (None, 1, 2)
    assert h1.busy_message() is None
    assert h2.busy_message().startswith("busy: you are #1 in line")
    assert h3.busy_message().startswith("busy: you are #2 in line")
    while not h1.done.is_set():
        w.step_once()
    w.step_once()
    assert (h2.position, h3.position) == (None, 1)                  # first come, first served
    assert h3.busy_message().startswith("busy: you are #1 in line")
    run_until_done(w)


def test_one_request_per_session_and_a_bounded_line(model):
    w = manual(model, max_batch=1, max_waiting=1)
    w.submit("s1", prompt(5), max_new_tokens=2)
    with pytest.raises(Busy, match="already have a request running"):
        w.submit("s1", prompt(5), max_new_tokens=2)
    w.step_once()                                                   # s1 runs; the line is empty
    w.submit("s2", prompt(5), max_new_tokens=2)
    with pytest.raises(Busy, match="already waiting in line"):
        w.submit("s3", prompt(5), max_new_tokens=2)
    assert w.active_requests() == 2


def test_request_that_can_never_fit_is_refused_up_front_with_the_reason(model):
    w = manual(model, num_blocks=3)                                 # 3 blocks of 4 tokens = 12 positions
    free = w.free_blocks
    with pytest.raises(ModelError, match="blocks") as e:
        w.submit("s", prompt(6), max_new_tokens=10)                 # may hold 6 + 10 − 1 = 15 tokens: 4 blocks
    assert isinstance(e.value, ModelError) and not isinstance(e.value, Busy)
    assert "15 tokens" in str(e.value) and "only 3 blocks" in str(e.value)
    assert w.active_requests() == 0 and w.free_blocks == free
    with pytest.raises(ModelError, match="context window"):
        w.submit("s", prompt(model.config.max_position_embeddings), max_new_tokens=1)


# ------------------------------------------------------------------------------------------ blocks come back
def test_stopped_request_frees_its_blocks(model):
    w = manual(model)
    initial = w.free_blocks
    h = w.submit("s", prompt(10), max_new_tokens=20, stop_at_eos=False)
    for _ in range(4):
        w.step_once()
    assert w.free_blocks < initial                                   # it holds blocks while it runs
    h.stop()
    assert w.free_blocks == initial
    toks = list(h)
    assert len(toks) == 4 and toks[-1].finish_reason is None         # what it had (4 steps: 4 tokens), no more
    assert h.finish_reason == "stopped"
    assert w.active_requests() == 0


def test_session_that_closes_mid_generation_frees_its_blocks(model):
    connected = {"gone": True, "stays": True}
    w = EngineWorker(model, block_size=4, num_blocks=40)
    initial = w.free_blocks
    try:
        gone = w.submit("gone", prompt(9), max_new_tokens=30, stop_at_eos=False, alive=lambda: connected["gone"])
        stays = w.submit("stays", prompt(8), max_new_tokens=5, stop_at_eos=False, alive=lambda: connected["stays"])
        wait_for(lambda: len(gone.request.token_ids) >= 2)
        connected["gone"] = False                                    # the browser tab closes
        wait_for(gone.done.is_set)
        assert gone.finish_reason == "session closed"
        assert len([t.token_id for t in stays]) == 5                 # the other session is not disturbed
        wait_for(lambda: w.active_requests() == 0)
        assert w.free_blocks == initial
    finally:
        w.close()


def test_abandoned_handle_is_cancelled_after_the_timeout(model):
    w = manual(model, abandon_after_s=0.05)
    initial = w.free_blocks
    h = w.submit("s", prompt(9), max_new_tokens=30, stop_at_eos=False)
    w.step_once()
    assert w.free_blocks < initial
    time.sleep(0.1)                                                  # nobody reads the stream
    w.step_once()
    assert h.finish_reason == "session closed" and w.free_blocks == initial


def test_end_session_and_close_free_everything(model):
    w = manual(model)
    initial = w.free_blocks
    w.submit("a", prompt(9), max_new_tokens=30)
    w.submit("b", prompt(9, seed=5), max_new_tokens=30)
    w.step_once()
    w.end_session("a")
    assert w.active_requests("a") == 0 and w.active_requests("b") == 1
    w.close()
    assert w.free_blocks == initial and w.active_requests() == 0


# ------------------------------------------------------------------------------------------ the live view
def test_snapshot_block_tables_account_for_every_used_block(model):
    w = manual(model, max_batch=2)
    for i, n in enumerate((5, 9, 6)):
        w.submit(f"s{i}", prompt(n, seed=i), max_new_tokens=8, stop_at_eos=False)
    for _ in range(3):
        w.step_once()
    snap = w.snapshot()
    held = [b for r in snap.requests for b in r.block_table]
    assert len(held) == len(set(held)) == snap.num_blocks - snap.free_blocks      # counted two ways
    assert [r.label for r in snap.requests] == ["student 1", "student 2", "student 3"]
    assert [r.position for r in snap.requests] == [None, None, 1]
    owners = snap.block_owners()
    assert sum(o is not None for o in owners) == len(held)
    run_until_done(w)
    snap = w.snapshot()
    assert snap.requests == () and snap.free_blocks == snap.num_blocks
    out = sum(s.tokens_out for s in snap.steps)
    assert out == 3 * 8                                              # every token produced, counted per step
    assert snap.aggregate_tokens_per_s(window_s=1e9) == pytest.approx(out / sum(s.seconds for s in snap.steps))
    alone_steps = [s for s in snap.steps if s.decode_requests == 1 and s.prefill_tokens == 0]
    assert alone_steps and snap.single_stream_tokens_per_s() > 0


def test_decode_step_point_counts_what_a_batched_decode_pass_computes(model):
    """The roofline point's FLOPs (calculators convention) equal the engine's Trace of the same decode pass:
    B = 3 sequences, each with S − 1 cached tokens feeding 1 new one."""
    from server.worker import StepView, decode_step_point
    B, S = 3, 10
    cache = model.new_cache(B, S)
    model.forward(__import__("numpy").array([prompt(S - 1, seed=b) for b in range(B)]), cache)
    tr = Trace()
    model.forward(__import__("numpy").array([[5]] * B), cache, trace=tr)
    point = decode_step_point(model, StepView(ended_at=0.0, seconds=0.01, decode_requests=B, prefill_tokens=0,
                                              tokens_out=B, mean_context=S))
    assert point["flops"] == forward_flops(model.config, 1, S, B)
    assert point["flops"] == pytest.approx(tr.flops, rel=1e-9)      # the same integer count, two ways
    assert point["intensity_flop_per_byte"] == pytest.approx(point["flops"] / point["bytes"])


def test_progress_per_prefill_chunk_then_per_token(model):
    w = manual(model, chunk_size=4)
    h = w.submit("s", prompt(10), max_new_tokens=3, stop_at_eos=False)
    run_until_done(w)
    seen = []
    toks = list(h.tokens(on_progress=lambda done, total, phase: seen.append((phase, done, total))))
    assert len(toks) == 3
    assert seen == [("prefill", 4, 10), ("prefill", 8, 10), ("prefill", 10, 10),      # chunks of 4, 4, 2
                    ("decode", 1, 3), ("decode", 2, 3), ("decode", 3, 3)]


def test_a_failing_step_ends_every_stream_with_an_error_and_the_worker_goes_on(model, monkeypatch):
    w = manual(model)
    initial = w.free_blocks
    h = w.submit("s", prompt(6), max_new_tokens=5, stop_at_eos=False)
    real_step = w.scheduler.step
    monkeypatch.setattr(w.scheduler, "step", lambda: (_ for _ in ()).throw(MemoryError("out of memory")))
    assert w.step_once() is None
    with pytest.raises(ModelError, match="engine failed.*MemoryError: out of memory"):
        list(h)
    assert w.free_blocks == initial and w.active_requests() == 0
    monkeypatch.setattr(w.scheduler, "step", real_step)
    h2 = w.submit("s", prompt(6), max_new_tokens=2, stop_at_eos=False)   # the same session may try again
    run_until_done(w)
    assert len(list(h2)) == 2
