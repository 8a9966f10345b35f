"""The serving simulator (calculators/serving/serving_sim.py): its timing against brute-force sums of the step model, the
invariants (no request lost or duplicated, slots and KV never over-committed, Little's law), the M/D/1 queue,
003 Details 13-14's static vs continuous scenario, trace files and bad input, and the CLI."""
import json
import math

import numpy as np
import pytest

from calculators.serving.batching import StepModel, step_model_for
from calculators.cli import main as cli_main
from calculators.serving.prefix_cache import prefix_cache_numbers
from calculators.serving.queueing import md1_mean_wait_s, mg1_mean_wait_s
from calculators.serving.serving_sim import (_decode_lines, littles_law, prefill_stall_runs, simulate, simulate_continuous,
                                     simulate_static, weighted_percentiles)
from calculators.serving.workload import Workload, parse_trace, synthetic_workload, trace_csv
from specs.devices import load_device
from specs.model_config import SpecError
from specs.presets import load_preset

TINY = step_model_for(load_preset("tinyllama"), load_device("A100 SXM 40GB"), "fp16")


def workload(arrivals, prompts, outputs) -> Workload:
    return Workload(np.array(arrivals, float), np.array(prompts), np.array(outputs))


def brute_service_s(m: StepModel, prompt: int, output: int) -> float:
    """One request alone: its prefill, then output − 1 decode steps at contexts P, P+1, ... (a plain loop)."""
    return (m.prefill_ms(prompt) + sum(m.decode_step_ms(1, prompt + k) for k in range(output - 1))) / 1e3


# ------------------------------------------------------------------------------------------ timing
@pytest.mark.parametrize("batch, context", [(1, 100), (64, 20_000), (600, 100)])   # memory-, both-, compute-bound
def test_closed_form_stretch_equals_the_sum_of_step_times(batch, context):
    lines = _decode_lines(TINY, batch, context)
    steps = [TINY.decode_step_ms(batch, context + batch * k) for k in range(400)]
    for n in (1, 2, 57, 400):
        assert lines.total(n) == pytest.approx(sum(steps[:n]), rel=1e-12)
    target = sum(steps[:123]) - 1e-9
    assert lines.steps_to_reach(target, 400) == 123


def test_one_request_alone_takes_its_prefill_then_one_decode_step_per_token():
    r = simulate_continuous(TINY, workload([0.5], [100], [50]), max_batch=4)
    assert r.ttft[0] == pytest.approx(TINY.prefill_ms(100) / 1e3, rel=1e-12)
    assert r.latency[0] == pytest.approx(brute_service_s(TINY, 100, 50), rel=1e-12)
    s = simulate_static(TINY, workload([0.5], [100], [50]), max_batch=4)
    assert s.latency[0] == pytest.approx(r.latency[0], rel=1e-12)


# ------------------------------------------------------------------------------------------ invariants
@pytest.fixture(scope="module")
def busy_runs():
    w = synthetic_workload(3000, 150, 150, 100, prompt_kind="uniform", output_kind="exponential", seed=7)
    return w, {"continuous": simulate(TINY, w, "continuous", 16, kv_capacity_tokens=6000),
               "static": simulate(TINY, w, "static", 16, kv_capacity_tokens=6000, batch_timeout_s=0.01),
               "chunked": simulate(TINY, w, "continuous", 16, kv_capacity_tokens=6000, chunk_tokens=64)}


def max_overlap(start, end, weight) -> float:
    """Largest total weight of intervals [start, end) alive at once (a sweep over the sorted events)."""
    ev = sorted([(s, 1, w) for s, w in zip(start, weight)] + [(e, 0, -w) for e, w in zip(end, weight)])
    level, peak = 0.0, 0.0
    for _, _, w in ev:                                       # ends (0) sort before starts (1) at equal times
        level += w
        peak = max(peak, level)
    return peak


@pytest.mark.parametrize("policy", ["continuous", "static", "chunked"])
def test_no_request_lost_or_duplicated_and_every_timestamp_in_order(busy_runs, policy):
    w, runs = busy_runs
    r = runs[policy]
    assert len(r.finish) == len(w) and np.all(np.isfinite(r.finish))
    assert np.array_equal(r.arrival, w.arrival_s) and np.array_equal(r.output_tokens, w.output_tokens)
    assert np.all(r.arrival <= r.admitted) and np.all(r.admitted < r.first_token)
    assert np.all(r.first_token <= r.finish) and np.all(r.finish <= r.batch_end)
    # every output token is produced exactly once: token-producing slot-steps = tokens asked for
    if policy != "static":
        assert r.slot_steps == int(w.output_tokens.sum())


@pytest.mark.parametrize("policy", ["continuous", "static", "chunked"])
def test_slots_and_kv_pool_are_never_over_committed(busy_runs, policy):
    w, runs = busy_runs
    r = runs[policy]
    n = len(w)
    assert max_overlap(r.admitted, r.batch_end, np.ones(n)) <= 16
    reserved = w.prompt_tokens + w.output_tokens
    if policy == "static":                                      # a static slot reserves the batch's padded size
        reserved = np.array([(w.prompt_tokens[r.admitted == a].max() + w.output_tokens[r.admitted == a].max())
                             for a in r.admitted])
    assert max_overlap(r.admitted, r.batch_end, reserved) <= 6000
    for s in range(16):                                          # one request per slot at a time
        mine = np.flatnonzero(r.slot == s)
        order = mine[np.argsort(r.admitted[mine], kind="stable")]
        assert np.all(r.admitted[order][1:] >= r.batch_end[order][:-1])


def test_littles_law_holds_within_5_percent_on_a_long_stationary_run():
    w = synthetic_workload(20_000, 100, 150, 100, prompt_kind="uniform", output_kind="exponential", seed=11)
    r = simulate(TINY, w, "continuous", 16)
    lw = littles_law(r)
    # L is sampled on a 20,000-point grid over the middle 80% of the run, independently of the per-request
    # latencies behind λ·W; window edge effects (requests straddling it) are ~ W/window ≈ 0.1% here.
    assert lw["L"] == pytest.approx(lw["lambda_W"], rel=0.05)
    assert lw["L"] > 5                                            # a busy system, not a trivially empty one


@pytest.mark.parametrize("rho", [0.5, 0.7])
def test_one_slot_with_fixed_lengths_is_an_md1_queue_within_10_percent(rho):
    """Batch cap 1 and fixed lengths make every service take the same S (deterministic), so the server is an
    M/D/1 queue: Wq = ρ/(2(1 − ρ))·S exactly in steady state. M/M/1 would need exponential service times, which
    token counts cannot give. 30,000 requests: the standard error of the mean wait at ρ = 0.7 is about 2-3%."""
    S = brute_service_s(TINY, 100, 50)
    lam = rho / S
    w = synthetic_workload(30_000, lam, 100, 50, prompt_kind="fixed", output_kind="fixed", seed=5)
    r = simulate(TINY, w, "continuous", 1)
    assert np.allclose(r.latency - r.wait, S, rtol=1e-9)             # deterministic service
    assert r.wait.mean() == pytest.approx(md1_mean_wait_s(lam, S), rel=0.10)


def test_one_slot_with_geometric_outputs_matches_pollaczek_khinchine_within_10_percent():
    w = synthetic_workload(30_000, 7.0, 100, 50, prompt_kind="fixed", output_kind="exponential", seed=9)
    S = np.array([brute_service_s(TINY, 100, o) for o in range(1, int(w.output_tokens.max()) + 1)])
    s = S[w.output_tokens - 1]                                       # each request's service, by brute force
    lam = len(w) / (w.arrival_s[-1] - w.arrival_s[0])
    r = simulate(TINY, w, "continuous", 1)
    assert 0.4 < lam * s.mean() < 0.6                                # moderate load
    assert r.wait.mean() == pytest.approx(mg1_mean_wait_s(lam, s.mean(), (s ** 2).mean()), rel=0.10)


# ------------------------------------------------------------------------------------------ 003 Details 13-14
def test_static_batch_holds_the_late_request_until_the_longest_finishes_continuous_admits_it_at_once():
    # A 50, B 120, C 20 tokens arrive together; D arrives while all three slots are busy (C ends at ~28 ms)
    w = workload([0, 0, 0, 0.010], [10, 10, 10, 10], [50, 120, 20, 30])
    st = simulate_static(TINY, w, max_batch=3)
    ct = simulate_continuous(TINY, w, max_batch=3)
    assert st.admitted[3] == pytest.approx(st.batch_end[1])             # D waits for B, the longest
    assert ct.admitted[3] == pytest.approx(ct.finish[2])                # D takes C's slot when C is done
    assert ct.slot[3] == ct.slot[2]
    # padding in the static batch: 3 slots × 119 decode steps − useful (49 + 119 + 19) = 170 slot-steps
    first_batch_pad = 3 * 119 - (49 + 119 + 19)
    assert st.padded_slot_steps == first_batch_pad + 0                  # D's batch of one has no padding
    assert ct.padded_slot_steps == 0
    assert ct.finish[3] < st.finish[3]


def test_continuous_batching_beats_static_on_the_same_arrivals():
    w = synthetic_workload(2000, 200, 200, 128, output_kind="exponential", seed=3)
    c = simulate(TINY, w, "continuous", 32).summary()
    s = simulate(TINY, w, "static", 32).summary()
    assert c["throughput_tok_s"] > 1.5 * s["throughput_tok_s"]
    assert s["padding_waste"] > 0.3 and c["padding_waste"] == 0
    assert c["ttft_p99_ms"] < s["ttft_p99_ms"]


def test_chunked_prefill_splits_a_long_prompt_and_shrinks_the_decode_stall():
    # 8 short requests decoding, then one 2,000-token prompt arrives
    w = workload([0] * 8 + [0.02], [20] * 8 + [2000], [200] * 8 + [10])
    whole = simulate_continuous(TINY, w, 16)
    chunked = simulate_continuous(TINY, w, 16, chunk_tokens=512)

    def heavy_steps(r):                # steps well above a plain decode step: the ones carrying prompt tokens
        return int((r.itl_ms > 1.5 * r.itl_ms.min()).sum())
    assert heavy_steps(whole) == 1 and heavy_steps(chunked) == math.ceil(2000 / 512)     # 4 chunks
    assert chunked.itl_ms.max() < whole.itl_ms.max() / 2                  # the worst token gap
    assert chunked.ttft[8] > whole.ttft[8]                                # the long prompt waits a little longer


def test_weighted_percentiles_equal_plain_percentiles_of_the_repeated_values():
    rng = np.random.default_rng(0)
    v, wts = rng.random(300), rng.integers(1, 9, 300)
    rep = np.repeat(v, wts)
    for q, got in zip((50, 99), weighted_percentiles(v, wts.astype(float), (50, 99))):
        assert got == np.percentile(rep, q, method="inverted_cdf")


# ------------------------------------------------------------------------------------------ traces, bad input
def test_trace_csv_and_jsonl_round_trip():
    w = synthetic_workload(50, 10, 100, 20, output_kind="uniform", seed=1)
    back = parse_trace(trace_csv(w), "t.csv")
    assert np.array_equal(back.arrival_s, w.arrival_s) and np.array_equal(back.output_tokens, w.output_tokens)
    jsonl = "\n".join(json.dumps(r | {"user": "x"}) for r in w.rows())
    assert np.array_equal(parse_trace(jsonl, "t.jsonl").prompt_tokens, w.prompt_tokens)


@pytest.mark.parametrize("text, message", [
    ("", "empty"),
    ("   \n", "empty"),
    ("arrival_s,prompt_tokens,output_tokens\n", "no requests"),
    ("time,prompt\n1,2\n", "header must name"),
    ("arrival_s,prompt_tokens,output_tokens\n0.1,abc,5\n", "line 2: prompt_tokens"),
    ("arrival_s,prompt_tokens,output_tokens\n0.1,10\n", "line 2: expected 3"),
    ("arrival_s,prompt_tokens,output_tokens\n0.1,10,0\n", "output_tokens must be a whole number"),
    ("arrival_s,prompt_tokens,output_tokens\n-1,10,5\n", "arrival_s"),
    ('{"arrival_s": 0, "prompt_tokens": 5}\n', "line 1: missing output_tokens"),
    ('{"arrival_s": 0, "prompt_tokens": 5, "output_tokens": 3}\n{oops\n', "line 2 is not valid JSON"),
    (b"\xff\xfe\x00", "not UTF-8"),
])
def test_empty_or_malformed_trace_is_a_clear_error(text, message):
    with pytest.raises(SpecError, match=message):
        parse_trace(text, "trace")


@pytest.mark.parametrize("call, message", [
    (lambda: synthetic_workload(10, 0, 100, 10), "arrival rate"),
    (lambda: synthetic_workload(10, -5, 100, 10), "arrival rate"),
    (lambda: synthetic_workload(0, 5, 100, 10), "number of requests"),
    (lambda: synthetic_workload(10, 5, 0, 10), "mean length"),
    (lambda: synthetic_workload(10, 5, 100, -3), "mean length"),
    (lambda: synthetic_workload(10, 5, 100, 10, max_tokens=50), "no room"),
    (lambda: simulate(TINY, synthetic_workload(10, 5, 100, 10), max_batch=0), "max batch"),
    (lambda: simulate(TINY, synthetic_workload(10, 5, 100, 10), kv_capacity_tokens=50), "too small for one"),
    (lambda: simulate(TINY, synthetic_workload(10, 5, 100, 10), chunk_tokens=0), "chunk"),
    (lambda: simulate(TINY, synthetic_workload(10, 5, 100, 10), "static", chunk_tokens=8), "continuous"),
    (lambda: simulate(TINY, synthetic_workload(10, 5, 100, 10), "fifo"), "policy"),
    (lambda: workload([0, 1], [10, 0], [5, 5]), "prompt_tokens"),
    (lambda: simulate(TINY, workload([0, 1], [10, 2040], [5, 9])), "more than the model's context of 2,048"),
    (lambda: simulate(TINY, workload([0, 1], [10, 3000], [5, 9]), "static"), "context"),
])
def test_bad_rates_lengths_and_sizes_are_clear_errors(call, message):
    with pytest.raises(SpecError, match=message):
        call()


# ------------------------------------------------------------------------------------------ CLI
def test_cli_simulate_json_has_the_documented_keys(capsys):
    assert cli_main(["simulate", "--requests", "300", "--rate", "40", "--max-batch", "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for pol in ("continuous", "static"):
        assert {"throughput_tok_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "utilization",
                "padding_waste", "goodput_tok_s", "requests"} <= set(out[pol])
        assert out[pol]["requests"] == 300


def test_cli_batching_and_queue_json(capsys):
    assert cli_main(["batching", "--weight-dtype", "fp16", "--batches", "1,8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["batch"] for r in out["rows"]] == [1, 8] and out["kv_critical_batch"] > 300
    assert cli_main(["queue", "--requests", "500", "--loads", "0.5", "--output-dist", "fixed", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"][0]["md1_wait_ms"] > 0


@pytest.mark.parametrize("argv", [["simulate", "--rate", "0"], ["simulate", "--trace", "/no/such/trace.csv"],
                                  ["kv-alloc", "--pool-tokens", "100", "--requests", "5"],
                                  ["queue", "--loads", "1.0"], ["simulate", "--max-batch", "0"]])
def test_cli_bad_input_is_one_line_and_status_2(argv, capsys):
    with pytest.raises(SystemExit) if "--max-batch" in argv else _nothing():
        assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "\n" not in err and "Traceback" not in err


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# ------------------------------------------------------------------------------------------ page scenarios
def test_prefill_stall_scenario_chunks_cut_the_worst_gap_and_delay_the_long_prompt():
    cases = list(prefill_stall_runs(TINY, 32, 300, 1000, 128).values())
    whole, chunked = cases[0]["row"], cases[1]["row"]
    # whole: one step carries the 1,000-token prefill plus 32 decode tokens at ≈ 310 tokens of context each;
    # 2% covers not knowing the decoders' exact context (a few tokens × 32 × 22 KB ≈ 0.1% of the bytes)
    assert whole["itl_max_ms"] == pytest.approx(
        TINY.step_ms(1000 + 32, 32 * 300 + 10 * 32, 1000 * 1001 / 2 + 32 * 300 + 10 * 32), rel=0.02)
    assert chunked["itl_max_ms"] < whole["itl_max_ms"] / 3
    assert chunked["long_prompt_ttft_ms"] > whole["long_prompt_ttft_ms"]


def test_prefix_cache_numbers_reproduce_508_to_8_tokens_and_31_blocks():
    n = prefix_cache_numbers(TINY, 500, 8, 100, 16)
    assert n["prompt_tokens"] == 508 and n["saved"]["tokens_to_prefill"] == 8
    assert round(n["saved"]["percent_saved"]) == 98 and n["blocks"]["full_blocks"] == 31
    assert round(n["prefix_kv_bytes"] / 1e6) == 11                       # 500 × 22 KB ≈ 11 MB
    t = n["times"]
    assert t["cached_ms"] == pytest.approx(TINY.prefill_ms(8, 500)) and t["cached_ms"] < t["full_ms"]


@pytest.mark.parametrize("call", [lambda: md1_mean_wait_s(10, 0.1), lambda: md1_mean_wait_s(20, 0.1),
                                  lambda: mg1_mean_wait_s(10, 0.2, 0.05), lambda: md1_mean_wait_s(0, 0.1)])
def test_closed_form_queues_refuse_utilisation_of_one_or_more(call):
    with pytest.raises(SpecError, match="utilization|arrival rate"):
        call()


def test_pollaczek_khinchine_gives_md1_for_fixed_and_mm1_for_exponential_service():
    from calculators.serving.queueing import mm1_mean_wait_s
    lam, S = 6.0, 0.1                                    # ρ = 0.6
    assert mg1_mean_wait_s(lam, S, S ** 2) == pytest.approx(md1_mean_wait_s(lam, S))        # E[S²] = S²
    assert mg1_mean_wait_s(lam, S, 2 * S ** 2) == pytest.approx(mm1_mean_wait_s(lam, S))    # exponential: 2S²
    assert mm1_mean_wait_s(lam, S) == pytest.approx(0.6 / 0.4 * S)                         # ρ/(1 − ρ)·S = 0.15 s


def test_load_trace_reads_a_real_file_sorted_by_arrival(tmp_path):
    """A CSV written to disk (extra column, rows out of order) and the same rows as JSON Lines load alike."""
    from calculators.serving.workload import load_trace
    csv = tmp_path / "requests.csv"
    csv.write_text("arrival_s,prompt_tokens,output_tokens,user\n0.5,120,40,b\n0.0,200,64,a\n2.25,8,1,c\n")
    jsonl = tmp_path / "requests.jsonl"
    jsonl.write_text('{"arrival_s": 0.5, "prompt_tokens": 120, "output_tokens": 40}\n'
                     '{"arrival_s": 0.0, "prompt_tokens": 200, "output_tokens": 64}\n'
                     '{"arrival_s": 2.25, "prompt_tokens": 8, "output_tokens": 1}\n')
    for path in (csv, jsonl):
        w = load_trace(path)
        assert [r["arrival_s"] for r in w.rows()] == [0.0, 0.5, 2.25]
        assert [r["prompt_tokens"] for r in w.rows()] == [200, 120, 8]
        assert [r["output_tokens"] for r in w.rows()] == [64, 40, 1]
    with pytest.raises(SpecError, match="cannot read trace"):
        load_trace(tmp_path / "missing.csv")


@pytest.mark.parametrize("device", ["A100 SXM 40GB", "RTX 4090"])
def test_suggested_slo_targets_are_met_by_a_lone_request_and_scale_with_the_hardware(device):
    """`slo.suggested_targets`: the simulator's TTFT and ITL of one request alone on the server (nothing queued)
    are the unloaded figures the targets multiply, so that request meets them with room (TTFT 3×, ITL 2×); and a
    slower device gets proportionally looser targets instead of the fixed 15 ms / 2 ms the page had."""
    from calculators.serving.slo import goodput, suggested_targets
    model = step_model_for(load_preset("tinyllama"), load_device(device), "fp16")
    hint = suggested_targets(model, 100, 50)
    one = simulate(model, Workload(np.array([0.0]), np.array([100]), np.array([50])), max_batch=16)
    assert float(one.ttft[0]) * 1e3 == pytest.approx(hint["unloaded_ttft_ms"], rel=1e-9)
    assert float(one.tpot[0]) * 1e3 == pytest.approx(hint["unloaded_itl_ms"], rel=0.02)   # contexts 101..149 vs 125
    assert hint["ttft_ms"] == pytest.approx(3 * hint["unloaded_ttft_ms"], rel=0.05)         # two digits
    assert hint["itl_ms"] == pytest.approx(2 * hint["unloaded_itl_ms"], rel=0.05)
    assert goodput(one, hint["ttft_ms"], hint["itl_ms"])["fraction_meeting_slo"] == 1.0
    fast = suggested_targets(step_model_for(load_preset("tinyllama"), load_device("H100"), "fp16"), 100, 50)
    assert fast["ttft_ms"] < hint["ttft_ms"]


def test_a_suggested_rate_sits_below_what_the_simulator_serves_on_slow_and_fast_hardware():
    """`slo.suggested_rate_for` (80% of the closed-form capacity) against the simulator's own capacity (a
    saturated run): below it and above half of it, on an A100 and on a device 50 times slower."""
    import dataclasses
    from calculators.serving.slo import capacity_rps, suggested_rate_for
    fast = step_model_for(load_preset("tinyllama"), load_device("A100 SXM 40GB"), "fp16")
    slow = dataclasses.replace(fast, bandwidth_bytes_per_s=fast.bandwidth_bytes_per_s / 50,
                               peak_flop_s=fast.peak_flop_s / 50)
    for m in (fast, slow):
        sim = capacity_rps(m, 200, 128, 16, output_kind="exponential")
        assert 0.5 * sim < suggested_rate_for(m, 200, 128, 16) < sim
