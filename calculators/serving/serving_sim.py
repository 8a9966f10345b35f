"""A discrete-event simulator of one accelerator's serving loop, timed by the step-time model
(`batching.StepModel`): static versus continuous batching on the same arrivals (003 Details 13, 14 and 21).

Continuous batching (the scheduler of 003 Detail 14): before every step, retire finished requests, admit waiting
ones in arrival order while a slot is free (and, with a KV budget, while prompt + output tokens fit), then run
ONE step: the new requests' prompts (whole, or at most `chunk_tokens` prompt tokens per step with chunked
prefill) together with one decode token for every running request. A request's first token comes out of the step
that finishes its prompt; it then gains one token per step.

Static batching (Detail 13): when the accelerator is free, wait until `max_batch` requests are waiting or the head
of the queue has waited `batch_timeout_s`, take up to `max_batch` of them, prefill them padded to the longest
prompt, and decode all slots in lockstep until the longest output is done. Finished slots are padding; late
arrivals wait for the whole batch.

Between events the running set does not change, so a stretch of decode steps is summed in closed form (each
step's time is linear in the step index, the max of a memory line and a compute line): 10,000 requests simulate
in well under a second.
"""
from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from calculators.serving.batching import StepModel
from calculators.units import check_int, check_nonneg
from calculators.serving.workload import Workload
from specs.model_config import SpecError

POLICIES = ("continuous", "static")


# ============================================================================================ step-time lines
@dataclass(frozen=True)
class _Lines:
    """Step k of a stretch takes max(am + bm·k, ac + bc·k) + ov ms (memory line, compute line)."""
    am: float
    bm: float
    ac: float
    bc: float
    ov: float

    def at(self, k: np.ndarray | float):
        return np.maximum(self.am + self.bm * k, self.ac + self.bc * k) + self.ov

    def total(self, n: int) -> float:
        """Σ_{k<n} step_k in ms (closed form, split where the lines cross)."""
        if n <= 0:
            return 0.0
        split = self._split(n)
        return _sum_line(*self._first(), 0, split) + _sum_line(*self._second(), split, n) + n * self.ov

    def _split(self, n: int) -> int:
        if self.bm == self.bc:
            return n
        x = (self.ac - self.am) / (self.bm - self.bc)           # where the lines meet
        return int(min(max(math.ceil(x), 0), n))

    def _first(self) -> tuple[float, float]:                    # the line on top before the crossing
        return (self.am, self.bm) if self.am >= self.ac else (self.ac, self.bc)

    def _second(self) -> tuple[float, float]:                   # the line on top after it (larger slope)
        return (self.am, self.bm) if self.bm > self.bc else (self.ac, self.bc)

    def steps_to_reach(self, ms: float, n_max: int) -> int:
        """Smallest n ≤ n_max with total(n) ≥ ms (n_max if none): the quadratic of each piece, solved."""
        if n_max <= 1 or self.total(n_max) < ms:
            return max(n_max, 1)
        split = self._split(n_max)
        head = self.total(split)
        a, b, i, rest = (*self._first(), 0, ms) if ms <= head else (*self._second(), split, ms - head)
        c = a + self.ov + b * i - b / 2                 # Σ_{k=i}^{i+m-1} (a + ov + b·k) = b/2·m² + c·m
        m = rest / c if b == 0 else (-c + math.sqrt(c * c + 2 * b * rest)) / b
        n = min(max(int(math.ceil(m)) + i, 1), n_max)
        while n > 1 and self.total(n - 1) >= ms:       # guard against rounding in the square root
            n -= 1
        while n < n_max and self.total(n) < ms:
            n += 1
        return n


def _sum_line(a: float, b: float, i: int, j: int) -> float:
    """Σ_{k=i}^{j-1} (a + b·k)."""
    n = j - i
    return 0.0 if n <= 0 else n * a + b * n * (i + j - 1) / 2


def _expand(stretches: list[tuple]) -> tuple[np.ndarray, np.ndarray]:
    """Every step time of every stretch (vectorised) and the streams each served."""
    if not stretches:
        return np.zeros(0), np.zeros(0)
    am, bm, ac, bc, ov, steps, streams = (np.array(c) for c in zip(*stretches))
    steps = steps.astype(np.int64)
    start = np.repeat(np.cumsum(steps) - steps, steps)
    k = np.arange(int(steps.sum())) - start
    idx = np.repeat(np.arange(len(steps)), steps)
    t = np.maximum(am[idx] + bm[idx] * k, ac[idx] + bc[idx] * k) + ov[idx]
    return t, streams[idx].astype(float)


def _decode_lines(m: StepModel, batch: int, context_total: float) -> _Lines:
    """b sequences decoding, cached positions summed = context_total at k = 0, growing by b per step."""
    kvb = m.kv_bytes_per_token / m.bandwidth_bytes_per_s * 1e3
    ap = m.attn_flops_per_pair / m.peak_flop_s * 1e3
    return _Lines(am=m.weight_bytes / m.bandwidth_bytes_per_s * 1e3 + kvb * (context_total + batch),
                  bm=kvb * batch, ac=m.flops_per_token * batch / m.peak_flop_s * 1e3 + ap * context_total,
                  bc=ap * batch, ov=m.overhead_ms)


# ============================================================================================ results
@dataclass(repr=False)
class SimResult:
    """Per-request arrays (index = request in arrival order) and the run's totals.

    Times in seconds: arrival, admitted (slot taken), first_token, finish, batch_end (static: when the slot is
    released; continuous: = finish). ttft = first_token − arrival; wait = admitted − arrival;
    latency = finish − arrival; tpot = (finish − first_token) / (output − 1), the mean inter-token latency.
    `itl_ms` / `itl_weight`: every step time once, weighted by how many streams got a token after it (a
    token-level ITL distribution)."""
    policy: str
    max_batch: int
    arrival: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    admitted: np.ndarray
    first_token: np.ndarray
    finish: np.ndarray
    batch_end: np.ndarray
    slot: np.ndarray
    busy_s: float
    padded_slot_steps: int = 0
    slot_steps: int = 0
    padded_prompt_tokens: int = 0
    steps: int = 0
    itl_ms: np.ndarray = field(default_factory=lambda: np.zeros(0))
    itl_weight: np.ndarray = field(default_factory=lambda: np.zeros(0))

    @property
    def ttft(self) -> np.ndarray:
        return self.first_token - self.arrival

    @property
    def wait(self) -> np.ndarray:
        return self.admitted - self.arrival

    @property
    def latency(self) -> np.ndarray:
        return self.finish - self.arrival

    @property
    def tpot(self) -> np.ndarray:
        gen = self.output_tokens - 1
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(gen > 0, (self.finish - self.first_token) / np.maximum(gen, 1), np.nan)

    @property
    def makespan_s(self) -> float:
        return float(self.batch_end.max() - self.arrival.min())

    def summary(self) -> dict:
        """Throughput, utilisation, padding waste and TTFT/ITL/latency percentiles (documented in docs/planner.md)."""
        span = self.makespan_s
        out_tokens = int(self.output_tokens.sum())
        tpot = self.tpot[np.isfinite(self.tpot)]
        itl = weighted_percentiles(self.itl_ms, self.itl_weight, (50, 99))
        return dict(
            policy=self.policy, requests=len(self.arrival), max_batch=self.max_batch, makespan_s=span,
            output_tokens=out_tokens, throughput_tok_s=out_tokens / span if span > 0 else math.inf,
            throughput_req_s=len(self.arrival) / span if span > 0 else math.inf,
            utilization=self.busy_s / span if span > 0 else 1.0,
            padding_waste=self.padded_slot_steps / self.slot_steps if self.slot_steps else 0.0,
            padded_prompt_tokens=self.padded_prompt_tokens, steps=self.steps,
            mean_batch=self.slot_steps / self.steps if self.steps else 0.0,
            ttft_p50_ms=_pct(self.ttft, 50), ttft_p99_ms=_pct(self.ttft, 99),
            ttft_mean_ms=float(1e3 * self.ttft.mean()), wait_mean_ms=float(1e3 * self.wait.mean()),
            wait_p99_ms=_pct(self.wait, 99),
            itl_p50_ms=itl[0], itl_p99_ms=itl[1],
            tpot_p50_ms=_pct(tpot, 50) if len(tpot) else 0.0, tpot_p99_ms=_pct(tpot, 99) if len(tpot) else 0.0,
            latency_p50_ms=_pct(self.latency, 50), latency_p99_ms=_pct(self.latency, 99),
            latency_mean_ms=float(1e3 * self.latency.mean()))

    def requests_table(self) -> list[dict]:
        tpot = self.tpot
        return [dict(request=i, slot=int(self.slot[i]), arrival_s=float(self.arrival[i]),
                     prompt_tokens=int(self.prompt_tokens[i]), output_tokens=int(self.output_tokens[i]),
                     admitted_s=float(self.admitted[i]), first_token_s=float(self.first_token[i]),
                     finish_s=float(self.finish[i]), slot_released_s=float(self.batch_end[i]),
                     wait_ms=1e3 * float(self.wait[i]), ttft_ms=1e3 * float(self.ttft[i]),
                     tpot_ms=None if not np.isfinite(tpot[i]) else 1e3 * float(tpot[i]),
                     latency_ms=1e3 * float(self.latency[i])) for i in range(len(self.arrival))]

    def gantt(self, limit: int = 200) -> list[dict]:
        """Bars for a slot timeline, first `limit` requests: prefill (admitted → first token), decode (→ finish)
        and padding (→ slot released). Time spent queueing holds no slot, so it has no bar (see `wait`)."""
        rows = []
        for i in range(min(limit, len(self.arrival))):
            for phase, a, b in (("prefill", self.admitted[i], self.first_token[i]),
                                ("decode", self.first_token[i], self.finish[i]),
                                ("padding", self.finish[i], self.batch_end[i])):
                if b > a:
                    rows.append(dict(request=i, slot=int(self.slot[i]), phase=phase, start_s=float(a),
                                     end_s=float(b), duration_s=float(b - a)))
        return rows


def _pct(x: np.ndarray, q: float) -> float:
    return float(1e3 * np.percentile(x, q)) if len(x) else 0.0


def weighted_percentiles(values: np.ndarray, weights: np.ndarray, qs) -> list[float]:
    """Percentiles of `values` where each counts `weights` times (inverted CDF)."""
    if len(values) == 0 or weights.sum() <= 0:
        return [0.0 for _ in qs]
    order = np.argsort(values, kind="stable")
    v, c = values[order], np.cumsum(weights[order])
    return [float(v[min(np.searchsorted(c, q / 100 * c[-1], side="left"), len(v) - 1)]) for q in qs]


# ============================================================================================ checks
def _check(workload: Workload, max_batch: int, kv_capacity_tokens: int | None, chunk_tokens: int | None,
           context_tokens: int | None = None):
    if not isinstance(workload, Workload):
        raise SpecError("expected a Workload (see calculators.serving.workload)")
    if context_tokens is not None:
        need = workload.prompt_tokens + workload.output_tokens
        i = int(np.argmax(need))
        if need[i] > context_tokens:
            raise SpecError(f"request {i} needs {int(need[i]):,} tokens (prompt {int(workload.prompt_tokens[i]):,} + "
                            f"output {int(workload.output_tokens[i]):,}), more than the model's context of "
                            f"{context_tokens:,}")
    b = check_int("max batch", max_batch, limit=1_000_000)
    if chunk_tokens is not None:
        check_int("chunk size (tokens)", chunk_tokens)
    if kv_capacity_tokens is not None:
        cap = check_int("KV pool (tokens)", kv_capacity_tokens)
        need = workload.prompt_tokens + workload.output_tokens
        i = int(np.argmax(need))
        if need[i] > cap:
            raise SpecError(f"the KV pool ({cap:,} tokens) is too small for one request: request {i} needs "
                            f"{int(need[i]):,} tokens (prompt {int(workload.prompt_tokens[i]):,} + output "
                            f"{int(workload.output_tokens[i]):,})")
    return b


# ============================================================================================ continuous
def simulate_continuous(model: StepModel, workload: Workload, max_batch: int, kv_capacity_tokens: int | None = None,
                        chunk_tokens: int | None = None) -> SimResult:
    """Continuous batching (see the module docstring). `kv_capacity_tokens`: admit only while every admitted
    request's prompt + output fits (reserved at admission, so memory is never over-committed); None = slots
    only. `chunk_tokens`: at most this many prompt tokens per step (chunked prefill); None = whole prompts."""
    B = _check(workload, max_batch, kv_capacity_tokens, chunk_tokens, model.context_tokens)
    arr, P, O = workload.arrival_s, workload.prompt_tokens, workload.output_tokens
    arr_l, P_l, O_l = arr.tolist(), P.tolist(), O.tolist()
    n = len(arr_l)
    admitted, first, finish, slot = [0.0] * n, [0.0] * n, [0.0] * n, [0] * n
    cap = math.inf if kv_capacity_tokens is None else kv_capacity_tokens
    budget = math.inf if chunk_tokens is None else chunk_tokens
    free_slots = list(range(B))
    waiting: deque[int] = deque()
    prefilling: deque[list] = deque()            # [request, prompt tokens done]
    finishing: list[tuple[int, int]] = []        # heap of (finish step, request)
    join_step = [0] * n
    running = 0                                  # requests decoding
    ctx_total = 0.0                              # their cached positions, summed
    kv_used = 0
    nxt, done, G, now_ms, busy_ms = 0, 0, 0, arr_l[0] * 1e3, 0.0
    stretches: list[tuple] = []                  # (am, bm, ac, bc, ov, steps, streams): for the ITL distribution
    slot_steps = 0

    def retire(step: int, t_ms: float) -> None:
        nonlocal running, ctx_total, kv_used, done
        while finishing and finishing[0][0] <= step:
            _, r = heapq.heappop(finishing)
            finish[r] = t_ms / 1e3
            running -= 1
            ctx_total -= P_l[r] + (step - join_step[r])
            kv_used -= P_l[r] + O_l[r]
            heapq.heappush(free_slots, slot[r])
            done += 1

    while done < n:
        while nxt < n and arr_l[nxt] * 1e3 <= now_ms:
            waiting.append(nxt)
            nxt += 1
        while waiting and free_slots and kv_used + P_l[waiting[0]] + O_l[waiting[0]] <= cap:
            r = waiting.popleft()
            slot[r] = heapq.heappop(free_slots)
            admitted[r] = now_ms / 1e3
            kv_used += P_l[r] + O_l[r]
            prefilling.append([r, 0])
        if not running and not prefilling:
            if nxt >= n:
                raise SpecError("internal: nothing to run but requests are unfinished")   # pragma: no cover
            now_ms = max(now_ms, arr_l[nxt] * 1e3)
            continue
        if prefilling:                               # one mixed step: prompt chunks + a token for every runner
            left, new, read, pairs, completed = budget, 0.0, 0.0, 0.0, []
            for item in prefilling:
                if left <= 0:
                    break
                r, s = item
                T = int(min(P_l[r] - s, left))
                new, read, pairs = new + T, read + s, pairs + T * s + T * (T + 1) / 2
                item[1] += T
                left -= T
                if item[1] == P_l[r]:
                    completed.append(r)
            dt = model.step_ms(new + running, read + ctx_total, pairs + ctx_total)
            now_ms += dt
            busy_ms += dt
            if running:
                stretches.append((dt, 0.0, dt, 0.0, 0.0, 1, running))
            slot_steps += running + len(completed)
            ctx_total += running
            G += 1
            retire(G, now_ms)
            for r in completed:
                prefilling.popleft()
                first[r] = now_ms / 1e3
                join_step[r] = G
                if O_l[r] == 1:
                    finish[r] = now_ms / 1e3
                    kv_used -= P_l[r] + O_l[r]
                    heapq.heappush(free_slots, slot[r])
                    done += 1
                else:
                    running += 1
                    ctx_total += P_l[r]
                    heapq.heappush(finishing, (G + O_l[r] - 1, r))
            continue
        # a stretch of pure decode steps until the next finish, or until an arrival could take a free slot
        lines = _decode_lines(model, running, ctx_total)
        steps = finishing[0][0] - G
        if nxt < n and free_slots and not waiting:
            steps = min(steps, lines.steps_to_reach(arr_l[nxt] * 1e3 - now_ms, steps))
        steps = max(steps, 1)
        dt = lines.total(steps)
        stretches.append((lines.am, lines.bm, lines.ac, lines.bc, lines.ov, steps, running))
        slot_steps += running * steps
        now_ms += dt
        busy_ms += dt
        ctx_total += running * steps
        G += steps
        retire(G, now_ms)
    fin = np.array(finish)
    return SimResult("continuous", B, arr.copy(), P.copy(), O.copy(), np.array(admitted), np.array(first), fin,
                     fin.copy(), np.array(slot), busy_ms / 1e3, 0, slot_steps, 0, G, *_expand(stretches))


# ============================================================================================ static
def simulate_static(model: StepModel, workload: Workload, max_batch: int, batch_timeout_s: float = 0.0,
                    kv_capacity_tokens: int | None = None) -> SimResult:
    """Static batching (see the module docstring). With a KV budget, a batch reserves b × (longest prompt +
    longest output) tokens (every slot padded to the longest) and is cut short to fit."""
    B = _check(workload, max_batch, kv_capacity_tokens, None, model.context_tokens)
    timeout = check_nonneg("batch timeout (s)", batch_timeout_s, limit=1e6)
    arr, P, O = workload.arrival_s, workload.prompt_tokens, workload.output_tokens
    n = len(arr)
    admitted, first, finish, end, slot = (np.zeros(n) for _ in range(5))
    cap = math.inf if kv_capacity_tokens is None else kv_capacity_tokens
    now, head, busy, padded, slot_steps, pad_prompt, steps = float(arr[0]), 0, 0.0, 0, 0, 0, 0
    itl_ms: list = []
    itl_w: list = []
    while head < n:
        now = max(now, float(arr[head]))
        full_at = float(arr[min(head + B, n) - 1])           # when max_batch requests are waiting
        now = max(now, min(full_at, float(arr[head]) + timeout))
        take = int(np.searchsorted(arr, now, side="right")) - head
        take = max(1, min(take, B))
        while take > 1 and take * (P[head:head + take].max() + O[head:head + take].max()) > cap:
            take -= 1
        idx = np.arange(head, head + take)
        pmax, omax = int(P[idx].max()), int(O[idx].max())
        admitted[idx], slot[idx] = now, np.arange(take)
        pre = model.step_ms(take * pmax, 0, take * pmax * (pmax + 1) / 2)
        lines = _decode_lines(model, take, take * pmax)
        t0 = now + pre / 1e3
        first[idx] = t0
        for i in idx:                                        # each slot's last useful step
            finish[i] = t0 + lines.total(int(O[i]) - 1) / 1e3
        end[idx] = t0 + lines.total(omax - 1) / 1e3            # = the longest request's finish, exactly
        batch_ms = (end[idx[0]] - now) * 1e3
        pad_prompt += int((pmax - P[idx]).sum())
        useful = int((O[idx] - 1).sum())
        slot_steps += take * (omax - 1) + take
        padded += take * (omax - 1) - useful
        if omax > 1:                                         # token gaps: stream i gets one at steps < O_i − 1
            k = np.arange(omax - 1)
            itl_ms.append(lines.at(k))
            itl_w.append((O[idx][None, :] - 1 > k[:, None]).sum(axis=1).astype(float))
        steps += omax
        busy += batch_ms / 1e3
        now = float(end[idx][0])
        head += take
    return SimResult("static", B, arr.copy(), P.copy(), O.copy(), admitted, first, finish, end,
                     slot.astype(int), busy, padded, slot_steps, pad_prompt, steps,
                     np.concatenate(itl_ms) if itl_ms else np.zeros(0),
                     np.concatenate(itl_w) if itl_w else np.zeros(0))


def simulate(model: StepModel, workload: Workload, policy: str = "continuous", max_batch: int = 32,
             kv_capacity_tokens: int | None = None, chunk_tokens: int | None = None,
             batch_timeout_s: float = 0.0) -> SimResult:
    """`simulate_continuous` or `simulate_static` by name."""
    if policy == "continuous":
        return simulate_continuous(model, workload, max_batch, kv_capacity_tokens, chunk_tokens)
    if policy == "static":
        if chunk_tokens is not None:
            raise SpecError("chunked prefill needs continuous batching (a static batch prefills once)")
        return simulate_static(model, workload, max_batch, batch_timeout_s, kv_capacity_tokens)
    raise SpecError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")


# ============================================================================================ Little's law
def littles_law(result: SimResult, trim: float = 0.1, samples: int = 20_000) -> dict:
    """L (time-average number of requests in the system, sampled on a grid over the middle of the run) next to
    λ·W (arrival rate in that window × mean time in system of the requests that arrived in it)."""
    a, f = result.arrival, result.finish
    t0, t1 = float(a.min()), float(a.max())
    lo, hi = t0 + trim * (t1 - t0), t1 - trim * (t1 - t0)
    if hi <= lo:
        raise SpecError("the run is too short to measure Little's law")
    grid = np.linspace(lo, hi, samples)
    in_system = np.searchsorted(np.sort(a), grid, side="right") - np.searchsorted(np.sort(f), grid, side="right")
    inside = (a >= lo) & (a <= hi)
    lam = inside.sum() / (hi - lo)
    W = float((f - a)[inside].mean())
    return dict(L=float(in_system.mean()), arrival_rate=float(lam), mean_time_in_system_s=W, lambda_W=lam * W)


def explain_summary(result: SimResult) -> list:
    """The arithmetic behind a run's headline numbers, with this run's values substituted."""
    from calculators.explain import explain
    s = result.summary()
    src = "003 Details 13-14 and 21; measured on this simulation"
    out = [explain("throughput_tok_s", "tokens / makespan", "tok/s", src, "output tokens over first arrival to "
                   "last finish", tokens=s["output_tokens"], makespan=s["makespan_s"]),
           explain("utilization", "busy / makespan", "", src, "fraction of the time a step was running",
                   busy=result.busy_s, makespan=s["makespan_s"]),
           explain("mean_batch", "slot_steps / steps", "sequences", src, "requests served per step on average",
                   slot_steps=result.slot_steps, steps=max(result.steps, 1))]
    if result.policy == "static":
        out.append(explain("padding_waste", "padded / slot_steps", "", src, "slot-steps of finished requests "
                           "kept in the batch", padded=result.padded_slot_steps, slot_steps=result.slot_steps))
    return out


def prefill_stall_runs(model: StepModel, streams: int, context_tokens: int, prompt_tokens: int,
                       chunk_tokens: int) -> dict:
    """003 Detail 21's scenario on the simulator: `streams` requests decoding at `context_tokens`, then one
    `prompt_tokens` prompt arriving ten decode steps after the last stream's first token (in the chunked run too),
    prefilled whole and in chunks. Per case: its SimResult and the decoders' token gaps (max, p50, p99), the long
    prompt's TTFT."""
    b = check_int("streams", streams, limit=100_000)
    ctx = check_int("context (tokens)", context_tokens)
    P = check_int("long prompt (tokens)", prompt_tokens)
    c = check_int("chunk (tokens)", chunk_tokens)
    out = max(64, 2 * -(-P // c))
    warm = simulate_continuous(model, Workload([0.0] * b, [ctx] * b, [out] * b), b + 1, chunk_tokens=c)
    arrive = float(warm.first_token.max()) + 10 * model.decode_step_ms(b, b * ctx) / 1e3
    w = Workload([0.0] * b + [arrive], [ctx] * b + [P], [out] * b + [2], source="stall")
    cases = {}
    for label, chunk in (("whole prefill", None), (f"chunks of {c:,}", c)):
        r = simulate_continuous(model, w, b + 1, chunk_tokens=chunk)
        p50, p99 = weighted_percentiles(r.itl_ms, r.itl_weight, (50, 99))
        cases[label] = dict(result=r, row=dict(prefill=label, steps=r.steps, itl_max_ms=float(r.itl_ms.max()),
                                               itl_p50_ms=p50, itl_p99_ms=p99,
                                               long_prompt_ttft_ms=float(1e3 * r.ttft[-1])))
    return cases
