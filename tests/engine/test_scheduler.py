"""Continuous batching: per request the scheduler's output equals the request run alone, and no block leaks."""
import time
from types import SimpleNamespace

import numpy as np
import pytest

from engine import Model, ModelError, Scheduler, Trace
from engine.serve.scheduler import split_rows, step_timeline
from helpers_models import prompt, tiny

# float32 logits of the same computation; only the batch composition and the gathered K/V differ, ~1e-7
# relative on O(1) logits. 1e-5 is the bound test_engine_forward uses for the same forward pass.
TOL = 1e-5


@pytest.fixture(scope="module")
def model():
    return Model.random(tiny(), seed=3)


@pytest.fixture(scope="module")
def sharp_model():
    """Larger weights -> peaked distributions, so a seeded sample is far from a tie."""
    return Model.random(tiny(), seed=1, std=0.5)


def alone(model, ids, **kw):
    return [t.token_id for t in model.generate(ids, **kw)]


def check_step_invariants(s: Scheduler) -> None:
    """KV memory never over-committed; paged waste at most block_size - 1 per decoding sequence."""
    s.blocks.check_invariants()
    held = {b for r in s.running for b in r.block_table}
    assert s.blocks.num_used == len(held) <= s.num_blocks          # blocks counted two ways
    for r in s.running:
        known = r.num_cached if r.status == "running" else len(r.all_ids)   # prefill reserves the whole prompt
        assert len(r.block_table) == -(-known // s.block_size)
        if r.status == "running":
            assert len(r.block_table) * s.block_size - r.num_cached <= s.block_size - 1
    for r in s.waiting:
        assert r.block_table == []


def run_checked(s: Scheduler):
    reports = []
    while s.has_work:
        reports.append(s.step())
        check_step_invariants(s)
        assert len(reports) < 10_000
    return reports


LENGTHS = (5, 13, 9, 20, 3, 11)


@pytest.mark.parametrize("block_size,max_batch,chunk_size", [(4, 8, None), (1, 3, None), (16, 2, None),
                                                            (4, 8, 3), (3, 4, 5)])
def test_greedy_output_per_request_equals_the_request_alone(model, block_size, max_batch, chunk_size):
    prompts = [prompt(n, seed=n) for n in LENGTHS]
    s = Scheduler(model, block_size=block_size, num_blocks=200, max_batch=max_batch, chunk_size=chunk_size)
    reqs = [s.submit(p, max_new_tokens=4 + i, stop_at_eos=False) for i, p in enumerate(prompts)]
    reports = run_checked(s)
    for i, (p, r) in enumerate(zip(prompts, reqs)):
        assert r.token_ids == alone(model, p, max_new_tokens=4 + i, stop_at_eos=False)
        assert r.status == "finished" and r.finish_reason == "length"
    assert s.free_blocks == s.num_blocks
    assert max(rep.batch_size for rep in reports) == min(max_batch, len(prompts))
    if chunk_size:
        assert max(n for rep in reports for n in rep.prefilled.values()) == chunk_size


def test_seeded_sampling_per_request_equals_the_request_alone(sharp_model):
    prompts = [prompt(n, seed=20 + n) for n in (4, 12, 7)]
    settings = [dict(temperature=0.8, seed=1), dict(temperature=1.0, top_k=20, seed=2),
                dict(temperature=0.7, top_p=0.9, seed=3)]
    s = Scheduler(sharp_model, block_size=4, num_blocks=64)
    reqs = [s.submit(p, max_new_tokens=10, stop_at_eos=False, **kw) for p, kw in zip(prompts, settings)]
    run_checked(s)
    for p, kw, r in zip(prompts, settings, reqs):
        assert r.token_ids == alone(sharp_model, p, max_new_tokens=10, stop_at_eos=False, **kw)
    # the seed matters: another seed gives another continuation (else the test above could not fail on seeds)
    other = alone(sharp_model, prompts[0], max_new_tokens=10, stop_at_eos=False, temperature=0.8, seed=99)
    assert other != reqs[0].token_ids


def test_stop_rules_match_generate_eos_and_context(model):
    ctx = model.config.max_position_embeddings
    ids = prompt(ctx - 3, seed=7)
    s = Scheduler(model, block_size=4, num_blocks=64)
    r = s.submit(ids, max_new_tokens=10, stop_at_eos=False)
    eos_model_out = alone(model, prompt(6, seed=8), max_new_tokens=12)
    s.run()
    single = [t for t in model.generate(ids, max_new_tokens=10, stop_at_eos=False)]
    assert r.token_ids == [t.token_id for t in single] and r.finish_reason == single[-1].finish_reason == "context"
    eos = eos_model_out[0]                           # make the first token an end-of-sequence token
    m2 = Model(tiny(eos_token_id=eos), model.weights)
    s2 = Scheduler(m2, block_size=4, num_blocks=64)
    r2 = s2.submit(prompt(6, seed=8), max_new_tokens=12)
    s2.run()
    assert r2.token_ids == [eos] and r2.finish_reason == "eos"


def test_no_request_lost_or_duplicated_under_preemption(model):
    """A pool of 14 blocks of 4 cannot hold six growing sequences at once: requests get preempted, recompute,
    and still produce exactly the tokens they would alone; every request finishes exactly once."""
    prompts = [prompt(n, seed=30 + n) for n in LENGTHS]
    s = Scheduler(model, block_size=4, num_blocks=14, max_batch=6)
    reqs = [s.submit(p, max_new_tokens=12, stop_at_eos=False, request_id=f"r{i}") for i, p in enumerate(prompts)]
    reports = run_checked(s)
    assert sum(len(rep.preempted) for rep in reports) > 0                 # the scenario really preempts
    finished = [rid for rep in reports for rid in rep.finished]
    assert sorted(finished) == sorted(r.request_id for r in reqs)         # each once, none missing
    assert sum(rep.tokens_produced for rep in reports) == sum(len(r.token_ids) for r in reqs) == 6 * 12
    for rep in reports:
        ids = list(rep.prefilled) + rep.decoded
        assert len(ids) == len(set(ids))                                  # one row per request per step
        assert rep.blocks_used <= s.num_blocks
    for p, r in zip(prompts, reqs):
        assert r.token_ids == alone(model, p, max_new_tokens=12, stop_at_eos=False)
    assert s.free_blocks == s.num_blocks


def test_step_timeline_has_one_row_per_request_per_step(model):
    s = Scheduler(model, block_size=4, num_blocks=64, chunk_size=4)
    reqs = [s.submit(prompt(n, seed=n), max_new_tokens=3, stop_at_eos=False) for n in (9, 2)]
    reports = s.run()
    rows = step_timeline(reports)
    assert len(rows) == sum(r.batch_size for r in reports)
    for req in reqs:
        mine = [r for r in rows if r["request_id"] == req.request_id]
        assert sum(r["tokens"] for r in mine if r["phase"] == "prefill") == len(req.prompt_ids)
        assert sum(1 for r in mine if r["phase"] == "decode") == len(req.token_ids) - 1   # the last is never fed
        assert all(0 <= r["start_s"] < r["end_s"] for r in mine)
    assert step_timeline([]) == []


def test_one_forward_pass_per_step_with_ragged_rows(model, monkeypatch):
    calls = []
    s = Scheduler(model, block_size=4, num_blocks=64, chunk_size=4)
    real = s.runner.forward

    def counting(tokens, cache, n_valid=None, **kw):
        calls.append((tokens.shape, list(n_valid)))
        return real(tokens, cache, n_valid=n_valid, **kw)

    s.runner = SimpleNamespace(forward=counting)           # the shared model itself is never patched
    s.submit(prompt(3), max_new_tokens=5, stop_at_eos=False)
    s.step()
    s.submit(prompt(10, seed=1), max_new_tokens=2, stop_at_eos=False)
    reports = [s.step(), s.step(), s.step()]
    assert len(calls) == 4
    assert calls[1] == ((2, 4), [1, 4])               # a decode row and a 4-token prefill chunk, one pass
    assert calls[2][1] == [1, 4] and calls[3][1] == [1, 2]
    assert reports[0].decoded == ["0"] and reports[0].prefilled == {"1": 4}
    assert reports[0].padded_tokens == 8 and reports[0].forward_tokens == 5


def test_a_decode_step_reads_the_weights_once_for_the_whole_batch(model):
    """Trace of one decode step: weight bytes do not grow with the batch, except the gathered embedding rows."""
    per_batch = {}
    for B in (1, 4):
        s = Scheduler(model, block_size=4, num_blocks=64)
        for i in range(B):
            s.submit(prompt(5, seed=i), max_new_tokens=3, stop_at_eos=False)
        s.step()                                             # prefill
        tr = Trace()
        rep = s.step(trace=tr)                               # one decode step for all B
        assert rep.decoded and len(rep.decoded) == B
        per_batch[B] = tr.weight_bytes
    D = model.config.hidden_size
    assert per_batch[4] - per_batch[1] == 3 * D * 4          # 3 more embedding rows of D float32, nothing else


def test_split_rows_cuts_a_long_chunk_only_when_it_saves_padding():
    assert split_rows([1, 1, 40]) == [(0, 0, 1), (1, 0, 1), (2, 0, 16), (2, 16, 16), (2, 32, 8)]   # 80 < 120 rows
    assert split_rows([30, 32]) == [(0, 0, 30), (1, 0, 32)]          # cutting would not save a quarter
    assert split_rows([100]) == [(0, 0, 100)]                        # one request: one row, no padding
    assert len(split_rows([1, 64 * 40])) == 1 + 64                   # never more than 64 rows per request


def test_a_long_prompt_next_to_decodes_runs_in_several_rows_with_identical_results(model):
    calls = []
    s = Scheduler(model, block_size=4, num_blocks=64)
    real = s.runner.forward

    def recording(tokens, cache, n_valid=None, **kw):
        out = real(tokens, cache, n_valid=n_valid, **kw)
        calls.append((tokens.shape, list(n_valid), out.copy()))
        return out

    s.runner = SimpleNamespace(forward=recording)          # the shared model itself is never patched
    short = [s.submit(prompt(3, seed=i), max_new_tokens=6, stop_at_eos=False) for i in range(2)]
    s.step()
    long_ids = prompt(40, seed=9)
    long_req = s.submit(long_ids, max_new_tokens=3, stop_at_eos=False)
    rep = s.step()
    assert calls[-1][:2] == ((5, 16), [1, 1, 16, 16, 8])                 # 2 decodes + the prompt in 3 rows
    assert rep.forward_rows == 5 and rep.padded_tokens == 80 and rep.forward_tokens == 42
    assert np.abs(calls[-1][2][4] - model.logits(long_ids)[-1]).max() < TOL   # its last row: the prompt's end
    run_checked(s)
    assert long_req.token_ids == alone(model, long_ids, max_new_tokens=3, stop_at_eos=False)
    for i, r in enumerate(short):
        assert r.token_ids == alone(model, prompt(3, seed=i), max_new_tokens=6, stop_at_eos=False)


def test_blocks_return_after_run_cancel_and_errors(model, monkeypatch):
    s = Scheduler(model, block_size=4, num_blocks=40, max_batch=4)
    initial = s.free_blocks
    reqs = [s.submit(prompt(n, seed=n), max_new_tokens=20, stop_at_eos=False) for n in LENGTHS]
    s.step(), s.step()
    running, waiting = s.running[0], s.waiting[0]
    assert s.block_table(running) and not s.block_table(waiting)
    s.cancel(running)
    s.cancel(waiting)
    assert running.finish_reason == waiting.finish_reason == "cancelled"
    assert running.block_table == [] and running not in s.running and waiting not in s.waiting
    check_step_invariants(s)
    s.step()

    def broken(*a, **kw):
        raise MemoryError("simulated failure inside the forward pass")

    s.runner = SimpleNamespace(forward=broken)             # the shared model itself is never patched
    with pytest.raises(MemoryError):
        s.step()
    monkeypatch.undo()
    failed = [r for r in reqs if r.finish_reason == "error"]
    assert failed and all(r.block_table == [] for r in failed)
    s.run()
    assert s.free_blocks == initial and not s.running and not s.waiting
    assert all(r.done for r in reqs)
    s.cancel(reqs[0])                                    # cancelling a finished request changes nothing
    other = Scheduler(model, block_size=4, num_blocks=40)
    foreign = other.submit(prompt(5), max_new_tokens=2)
    with pytest.raises(ModelError, match="not submitted to this scheduler"):
        s.cancel(foreign)                                # never releases blocks of another pool
    assert reqs[0].finish_reason in ("error", "cancelled", "length")


@pytest.mark.parametrize("kwargs,words", [
    (dict(block_size=0), "block_size"), (dict(block_size=-4), "block_size"),
    (dict(num_blocks=0), "num_blocks"), (dict(max_batch=0), "max_batch"), (dict(chunk_size=0), "chunk_size"),
    (dict(prefix_cache_blocks=-1), "prefix_cache_blocks"),
])
def test_bad_scheduler_options_raise_clear_errors(model, kwargs, words):
    with pytest.raises(ModelError, match=words):
        Scheduler(model, **kwargs)


def test_bad_requests_are_refused_at_submit_and_take_no_block(model):
    s = Scheduler(model, block_size=4, num_blocks=3)
    ctx = model.config.max_position_embeddings
    with pytest.raises(ModelError, match="pool has only 3 blocks"):
        s.submit(prompt(10), max_new_tokens=5)                  # 14 tokens of K/V = 4 blocks of 4
    s.submit(prompt(10), max_new_tokens=3)                        # 12 tokens = 3 blocks: fits exactly
    big = Scheduler(model, block_size=4, num_blocks=64)
    with pytest.raises(ModelError, match="context window"):
        big.submit(prompt(ctx), max_new_tokens=1)
    for bad, words in [(dict(prompt_ids=[]), "empty"), (dict(prompt_ids=[1, 10**6]), "token ids"),
                       (dict(prompt_ids=[1, 2], max_new_tokens=0), "max_new_tokens"),
                       (dict(prompt_ids=[1, 2], temperature=-1), "temperature"),
                       (dict(prompt_ids=[1, 2], top_p=0), "top_p")]:
        with pytest.raises(ModelError, match=words):
            big.submit(**bad)
    assert big.free_blocks == 64 and not big.waiting
    big.submit([1, 2], request_id="a")
    with pytest.raises(ModelError, match="already"):
        big.submit([1, 2], request_id="a")
    big.run()
    assert big.free_blocks == 64


# ------------------------------------------------------------------------------------------------ prefix caching
class RecordingModel:
    """The model with every forward's logits kept (the scheduler only uses these few attributes)."""

    def __init__(self, model):
        self._m, self.logits = model, []
        self.config, self.tokenizer = model.config, model.tokenizer
        self.encode_prompt, self.check_prompt = model.encode_prompt, model.check_prompt

    def forward(self, tokens, cache, n_valid=None, **kw):
        out = self._m.forward(tokens, cache, n_valid=n_valid, **kw)
        self.logits.append(out.copy())
        return out


def test_prefix_cached_prompt_gives_identical_logits_and_saves_prefill(model):
    system = prompt(18, seed=40)                           # a "system prompt": 4 full blocks of 4 + 2 tokens
    q1, q2 = system + prompt(5, seed=41), system + prompt(7, seed=42)
    rec = RecordingModel(model)
    s = Scheduler(rec, block_size=4, num_blocks=32, prefix_caching=True)
    r1 = s.submit(q1, max_new_tokens=3, stop_at_eos=False)
    s.run()
    computed_before = s.prefill_tokens_computed
    r2 = s.submit(q2, max_new_tokens=3, stop_at_eos=False)
    s.step()                                               # r2's prefill, from the cached blocks on
    assert r2.prefix_cached_tokens == 16                   # ⌊18 / 4⌋ full blocks of the shared prefix
    assert s.prefill_tokens_computed - computed_before == len(q2) - 16
    assert np.abs(rec.logits[-1][0] - model.logits(q2)[-1]).max() < TOL   # cached == recomputed
    s.run()
    assert r1.prefix_cached_tokens == 0
    assert r2.token_ids == alone(model, q2, max_new_tokens=3, stop_at_eos=False)
    assert s.free_blocks == s.num_blocks
    s.blocks.check_invariants()


def test_whole_prompt_cached_recomputes_the_last_token_in_a_copied_block(model):
    ids = prompt(12, seed=43)                              # exactly 3 full blocks of 4
    s = Scheduler(model, block_size=4, num_blocks=16, prefix_caching=True)
    first = s.submit(ids, max_new_tokens=4, stop_at_eos=False)
    s.run()
    cached_blocks = s.blocks.lookup(ids, len(ids))
    assert len(cached_blocks) == 3
    second = s.submit(ids, max_new_tokens=4, stop_at_eos=False)
    s.step()
    assert second.prefix_cached_tokens == 11               # all but the last token
    assert second.block_table[:2] == cached_blocks[:2]     # full blocks shared
    assert second.block_table[2] != cached_blocks[2]       # the block it writes was copied, the cached one kept
    s.run()
    assert second.token_ids == first.token_ids == alone(model, ids, max_new_tokens=4, stop_at_eos=False)
    assert s.free_blocks == s.num_blocks
    s.blocks.check_invariants()


def test_whole_prompt_hit_in_a_pool_with_no_room_for_a_copy_recomputes_the_last_block(model):
    ids = prompt(12, seed=45)                              # 3 blocks of 4 = the whole pool
    s = Scheduler(model, block_size=4, num_blocks=3, prefix_caching=True)
    first = s.submit(ids, max_new_tokens=1, stop_at_eos=False)
    s.run()
    second = s.submit(ids, max_new_tokens=1, stop_at_eos=False)
    s.run(max_steps=5)
    assert second.done and second.token_ids == first.token_ids
    assert second.prefix_cached_tokens == 8                # 2 blocks shared, the last one recomputed
    assert s.free_blocks == 3
    s.blocks.check_invariants()


def test_concurrent_requests_share_prefix_blocks_and_respect_the_lru_budget(model):
    system = prompt(16, seed=44)
    s = Scheduler(model, block_size=4, num_blocks=40, prefix_caching=True, prefix_cache_blocks=6)
    first = s.submit(system + [7], max_new_tokens=2, stop_at_eos=False)
    s.run()
    tails = [prompt(3, seed=50 + i) for i in range(3)]
    reqs = [s.submit(system + t, max_new_tokens=6, stop_at_eos=False) for t in tails]
    s.step()
    tables = [s.block_table(r) for r in reqs]
    assert tables[0][:4] == tables[1][:4] == tables[2][:4]            # one copy of the system prompt's K/V
    assert all(s.blocks.ref_count[b] == 3 for b in tables[0][:4])
    run_checked(s)
    for t, r in zip(tails, reqs):
        assert r.token_ids == alone(model, system + t, max_new_tokens=6, stop_at_eos=False)
    assert len(s.blocks._unreferenced) <= 6 and s.blocks.evictions > 0    # budget held, oldest evicted
    assert first.finish_reason == "length" and s.free_blocks == s.num_blocks


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_arrivals_with_every_feature_on_equal_each_request_alone(model, seed):
    """Arrivals at random steps, shared prefixes, prefix caching, chunking, cut rows and preemption together."""
    rng = np.random.default_rng(seed)
    system = prompt(9, seed=100 + seed)
    s = Scheduler(model, block_size=4, num_blocks=16, max_batch=5, chunk_size=[None, 20, 6][seed],
                  prefix_caching=True, prefix_cache_blocks=4)
    s.row_tokens = 4                                   # this tiny context (48) needs short rows to cut any
    jobs = []
    for i in range(9):
        ids = (system if rng.random() < 0.6 else []) + prompt(int(rng.integers(2, 31)), seed=200 + 10 * seed + i)
        jobs.append((int(rng.integers(0, 12)), ids, int(rng.integers(1, 9))))
    reqs, reports = [], []
    for step in range(400):
        reqs += [(ids, new, s.submit(ids, max_new_tokens=new, stop_at_eos=False)) for at, ids, new in jobs
                 if at == step]
        if step > 12 and not s.has_work:
            break
        reports.append(s.step())
        check_step_invariants(s)
    assert len(reqs) == 9 and all(r.done for _, _, r in reqs)
    for ids, new, r in reqs:
        assert r.token_ids == alone(model, ids, max_new_tokens=new, stop_at_eos=False)
    assert s.free_blocks == s.num_blocks
    assert sorted(x for rep in reports for x in rep.finished) == sorted(r.request_id for _, _, r in reqs)
    # the scenario really exercises what it claims (found by running it: these seeds do)
    assert sum(len(rep.preempted) for rep in reports) >= 1 and s.prefix_hit_tokens > 0 and s.blocks.evictions > 0
    assert any(rep.forward_rows > rep.batch_size for rep in reports) == (s.chunk_size != 6)


# ------------------------------------------------------------------------------------------------ default model
def test_default_model_scheduler_equals_each_request_alone(default_model):
    tok = default_model.tokenizer
    texts = ["Write a story about a cat", "What is the capital of France?", "1, 2, 3,"]
    prompts = [tok.encode(t) for t in texts]
    s = Scheduler(default_model, block_size=16, max_batch=4)
    reqs = [s.submit(p, max_new_tokens=5, stop_at_eos=False) for p in prompts]
    s.run()
    for p, r in zip(prompts, reqs):
        assert r.token_ids == alone(default_model, p, max_new_tokens=5, stop_at_eos=False)
    assert s.free_blocks == s.num_blocks


def test_equal_block_tokens_after_a_different_prefix_are_not_reused(model):
    """The chain hash covers every token before a block, not only its own: request A = X + Y caches Y as its second
    block; request B starts with Y. B's first block must not reuse A's Y block, whose K/V were computed at positions
    4-7 after X (a hash of the block's tokens alone would hand them over)."""
    x, y, tail = prompt(4, seed=11), prompt(4, seed=12), prompt(3, seed=13)
    s = Scheduler(model, block_size=4, num_blocks=32, prefix_caching=True)
    a = s.submit(x + y + tail, max_new_tokens=2, stop_at_eos=False)
    s.run()
    b = s.submit(y + tail, max_new_tokens=4, stop_at_eos=False)
    s.run()
    assert a.prefix_cached_tokens == 0 and b.prefix_cached_tokens == 0
    assert b.token_ids == alone(model, y + tail, max_new_tokens=4, stop_at_eos=False)
    c = s.submit(x + y + prompt(2, seed=14), max_new_tokens=1, stop_at_eos=False)   # the same prefix IS reused
    s.run()
    assert c.prefix_cached_tokens == 8


def test_preemption_takes_the_newest_request(model):
    """When a decode finds no free block, the most recently admitted request gives its blocks back (it has done the
    least work, so recomputing it costs least), never the oldest. Pool: 6 blocks of 4; three 7-token prompts hold 2
    blocks each; the first decode step of the oldest needs a 7th block."""
    s = Scheduler(model, block_size=4, num_blocks=6)
    reqs = [s.submit(prompt(7, seed=20 + i), max_new_tokens=6, stop_at_eos=False) for i in range(3)]
    first_preemption = None
    while s.has_work and first_preemption is None:
        rep = s.step()
        if rep.preempted:
            first_preemption = rep.preempted
    assert first_preemption == [reqs[2].request_id]
    s.run()
    for r, p in zip(reqs, [prompt(7, seed=20 + i) for i in range(3)]):
        assert r.token_ids == alone(model, p, max_new_tokens=6, stop_at_eos=False)


def test_submit_and_cancel_from_other_threads_while_steps_run(model):
    """A server submits and cancels from request threads while one thread steps: nothing is lost, nothing leaks.
    Every request ends (finished or cancelled), a finished one equals its run alone, and every block is free."""
    import threading
    s = Scheduler(model, block_size=4, num_blocks=64)
    prompts = [prompt(5 + i % 4, seed=40 + i) for i in range(12)]
    reqs, go = [None] * len(prompts), threading.Event()

    def client(i):
        go.wait()
        reqs[i] = s.submit(prompts[i], max_new_tokens=5, stop_at_eos=False)
        if i % 3 == 0:
            s.cancel(reqs[i])

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    go.set()
    deadline = time.monotonic() + 60
    while (any(t.is_alive() for t in threads) or s.has_work) and time.monotonic() < deadline:
        s.step()
    for t in threads:
        t.join(5)
    assert all(r is not None and r.done for r in reqs)
    for i, r in enumerate(reqs):
        if r.finish_reason == "length":
            assert r.token_ids == alone(model, prompts[i], max_new_tokens=5, stop_at_eos=False)
        else:
            assert i % 3 == 0 and r.finish_reason == "cancelled"
    assert s.free_blocks == s.num_blocks


def _brute_log_softmax(z):
    z = np.asarray(z, np.float64) - np.max(z)
    return z - np.log(np.exp(z).sum())


def test_logprobs_one_per_token_and_exact_under_preemption(model):
    """Preempted requests recompute their tokens without sampling them again: still exactly one log-probability
    per generated token, each the log-softmax of the model's logits at that point (brute force, full forward)."""
    prompts = [prompt(n, seed=60 + n) for n in LENGTHS]
    s = Scheduler(model, block_size=4, num_blocks=14, max_batch=6)
    reqs = [s.submit(p, max_new_tokens=8, stop_at_eos=False, request_id=f"r{i}", logprobs=3)
            for i, p in enumerate(prompts)]
    reports = run_checked(s)
    assert sum(len(rep.preempted) for rep in reports) > 0
    for p, r in zip(prompts, reqs):
        assert len(r.token_logprobs) == len(r.top_logprobs) == len(r.token_ids) == 8
        for k, tok in enumerate(r.token_ids):
            ref = _brute_log_softmax(model.logits(list(p) + r.token_ids[:k])[-1])
            assert r.token_logprobs[k] == pytest.approx(ref[tok], abs=1e-4)
            assert [i for i, _ in r.top_logprobs[k]] == [int(i) for i in np.argsort(-ref, kind="stable")[:3]]


def test_penalties_follow_openais_formula(model):
    """Greedy with presence and frequency penalties equals a loop written from OpenAI's formula; a request with
    no penalties in the same batch is unaffected. (Negative penalties: a random model seldom repeats a token, so
    encouraging repeats is what makes the penalties change its reply.)"""
    p = prompt(5, seed=71)
    s = Scheduler(model, block_size=4, num_blocks=64, max_batch=4)
    pen = s.submit(p, max_new_tokens=10, stop_at_eos=False, presence_penalty=-2.0, frequency_penalty=-0.5)
    plain = s.submit(p, max_new_tokens=10, stop_at_eos=False)
    run_checked(s)
    gen = []
    for _ in range(10):
        z = np.asarray(model.logits(list(p) + gen)[-1], np.float64)
        for t in set(gen):
            z[t] -= -0.5 * gen.count(t) - 2.0
        gen.append(int(np.argmax(z)))
    assert pen.token_ids == gen
    assert plain.token_ids == alone(model, p, max_new_tokens=10, stop_at_eos=False) != gen
    with pytest.raises(ModelError, match="presence_penalty"):
        s.submit(p, max_new_tokens=2, presence_penalty=3.0)
