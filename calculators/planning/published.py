"""Published data-centre serving measurements next to the planner's prediction with the default settings of the
stack each source names (`bench/published_serving.csv`: every row read in its source, with the URL).

Row modes:
- offline (all requests queued, fixed lengths): with the number of requests the run queued (`requests`, stated by
  TensorRT-LLM's perf overview for each length pair), that finite run followed to its end
  (`serve_at.finite_run_at` at an unbounded rate): N·O / makespan, the ramp while the batch fills and the drain of
  the last wave included; without it, `throughput.max_throughput`'s steady output tokens/s;
- concurrency C (a closed loop of C users, AIPerf/genai-perf): ITL = one steady-state step with C sequences,
  TTFT = the prompt's prefill (the deployment's step at 0 decode rows, `request_latency`), output tokens/s =
  C·O / (TTFT + (O − 1)·ITL), or the maximum throughput once C exceeds the batch the deployment can hold;
- static batch B (every sequence starts together): end-to-end = prefill of B prompts + (O − 1) decode steps at
  the mean context; output tokens/s = B·O / end-to-end.
Error = predicted speed / published speed − 1 (+ = the prediction is too optimistic), whatever the unit.
- server (MLPerf Server: Poisson arrivals, p99 TTFT and TPOT limits): the highest rate whose steady state
  (`serve_at.max_rate_under_slo`) meets both limits, × the mean output length; at a stated rate, the steady
  state's TTFT in the statistic the source states (`statistic`: mean or p50) and its mean ITL.
Attention data-parallel rows (dp > 1: each of dp ranks runs attention for its own requests, the experts spread over
ep GPUs) are the mesh tp = tp / dp, ep, gpus: EP across the data-parallel replicas.
An MLPerf row (`lengths`: its dataset) is priced at that dataset's length distributions (`row_lengths`:
specs/mlperf_lengths.json, the prompts as they are and the reference answers rescaled to the row's generated mean):
Offline as the saturated steady state of those lengths (the highest rate at which it exists × the mean output:
requests of different lengths end at different steps, so the batch refills continuously), Server as above.
Rows whose lengths the source does not state load all the same and are listed apart as `unpriced` by
`compare_all`.
Each row carries a declared `split` (every third row `test`, fixed before any fit): the efficiencies in
specs/stacks.json are fitted on `fit` rows only (`fit_stack`), and the `test` rows' error is the accuracy reported.
"""
from __future__ import annotations

import csv
import math
import statistics
from pathlib import Path

from calculators import arch
from calculators.planning.accuracy import BAR_GROUPS, meets_bar
from calculators.sizing.latency import Efficiency
from calculators.multi_gpu.tensor_parallel import Mesh, _link_for
from calculators.planning.measured_step import resolve_profile
from calculators.planning.request_latency import request_latency
from calculators.planning.serve_at import finite_run_at, max_rate_under_slo, serve_at
from calculators.planning.step import borrowed as borrowed_profile
from calculators.planning.throughput import batch_limits, max_throughput, step_time
from calculators.serving.lengths import dataset_lengths
from specs.devices import load_device
from specs.model_config import SpecError
from specs.presets import load_preset
from specs.stacks import load_stack
from specs.workloads import mlperf_length_datasets

SERVING_CSV = Path(__file__).resolve().parents[2] / "bench" / "published_serving.csv"
TIME_METRICS = ("itl_ms", "ttft_ms", "e2e_ms")
COLUMNS = ("source", "url", "stack", "model", "device", "gpus", "tp", "ep", "weights", "kv", "prompt_tokens",
           "output_tokens", "mode", "concurrency", "metric", "published", "settings")
PRICED_MODES = ("offline", "concurrency", "static", "server")


def load_rows(path: Path = SERVING_CSV) -> list[dict]:
    """The published rows as read (strings), each checked to have every column."""
    with Path(path).open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    for i, r in enumerate(rows, 2):
        missing = [c for c in COLUMNS if c not in r]
        if missing:
            raise SpecError(f"{path}: line {i} lacks {', '.join(missing)}")
    return rows


def mesh_of(row: dict) -> Mesh:
    """The row's layout: dp > 1 is attention data-parallel (tp / dp GPUs per attention replica, experts over ep)."""
    tp, ep, dp = int(row["tp"]), int(row["ep"] or 1), int(row.get("dp") or 1)
    if dp > 1:
        if tp % dp:
            raise SpecError(f"{row['model']}: tp {tp} is not a multiple of dp {dp}")
        tp //= dp
    return Mesh(tp=tp, ep=ep, gpus=int(row["gpus"]))


def stack_key_of(row: dict) -> str:
    """The stack a row ran: its `stack`, or `stack@build` where its `build` names one (specs/stacks.json
    `builds`: AMD's MLPerf harness is vLLM with its own kernels)."""
    return f"{row['stack']}@{row['build']}" if row.get("build") else row["stack"]


def _setup(row: dict, eff: Efficiency | None = None):
    c, dev = load_preset(row["model"]), load_device(row["device"])
    stack = load_stack(stack_key_of(row))
    return c, dev, mesh_of(row), stack, eff or Efficiency.for_stack(stack, dev, row["weights"], c)


def _prefill(row: dict, c, dev, mesh, stack, eff, profile, batch: int = 1) -> float:
    """The row's prompt(s) alone: the deployment's step at 0 decode rows (`request_latency`)."""
    I, O = int(row["prompt_tokens"]), int(row["output_tokens"])
    return request_latency(c, dev, mesh, I, O, batch, row["weights"], row["kv"], stack, eff,
                           profile=profile)["ttft_ms"]


def caps(row: dict) -> dict:
    """The scheduler caps the row's source configured (`max_num_seqs`, `max_num_batched_tokens`; blank: the
    stack's defaults), as keyword arguments of the planning functions."""
    return {k: int(row[k]) for k in ("max_num_seqs", "max_num_batched_tokens") if row.get(k)}


def length_datasets() -> dict:
    """The MLPerf datasets' length histograms (specs/mlperf_lengths.json, with their sources)."""
    return mlperf_length_datasets()


def row_lengths(row: dict) -> tuple:
    """The row's (prompt, output) lengths: its stated token counts, or for a row whose workload is a dataset
    (`lengths`: a key of specs/mlperf_lengths.json) that dataset's distributions: its prompts' lengths as they
    are, its reference answers' lengths rescaled to the tokens the row's system generated per sample
    (`output_tokens`): the shape of the answers, the mean of the run."""
    I, O = int(row["prompt_tokens"]), int(row["output_tokens"])
    key = row.get("lengths")
    if not key:
        return I, O
    d = length_datasets().get(key)
    if d is None:
        raise SpecError(f"{row['model']}: no length distribution {key!r} in specs/mlperf_lengths.json")
    prompt, answers = dataset_lengths(d)
    return prompt, answers.rescaled(O)


def _concurrency(row: dict, c, dev, mesh, stack, eff, profile=None) -> float:
    I, O, C = int(row["prompt_tokens"]), int(row["output_tokens"]), int(row["concurrency"])
    w, kv = row["weights"], row["kv"]
    lim = batch_limits(c, dev, mesh, I, O, w, kv, stack, stack.gpu_memory_utilization, **caps(row))
    if row["metric"] == "ttft_ms":
        return _prefill(row, c, dev, mesh, stack, eff, profile)
    if C > lim["batch"] * mesh.replicas and row["metric"] == "output_tok_s":
        return max_throughput(c, dev, mesh, I, O, w, kv, stack, efficiency=eff, profile=profile,
                              **caps(row))["output_tok_s"]
    rows = min(max(1, -(-C // mesh.replicas)), lim["batch"])
    itl = step_time(c, dev, mesh, rows, I, O, w, kv, eff, _link_for(dev, None), stack, profile=profile,
                    prompting_rows=rows - 1)["step_ms"]          # the other users' prompts, not its own
    if row["metric"] == "itl_ms":
        return itl
    ttft = _prefill(row, c, dev, mesh, stack, eff, profile)
    return C * O / (ttft + (O - 1) * itl) * 1e3


def _static(row: dict, c, dev, mesh, stack, eff, profile=None) -> float:
    I, O, B = int(row["prompt_tokens"]), int(row["output_tokens"]), int(row["concurrency"])
    r = request_latency(c, dev, mesh, I, O, B, row["weights"], row["kv"], stack, eff, profile=profile)
    e2e = r["total_ms"]
    return e2e if row["metric"] == "e2e_ms" else B * O / e2e * 1e3


_SAME_RUN = ("stack", "model", "device", "gpus", "tp", "ep", "dp", "weights", "kv", "prompt_tokens", "output_tokens",
             "rate_rps", "requests", "max_num_seqs", "max_num_batched_tokens")   # a run's columns, not its metric's


def _server(row: dict, c, dev, mesh, stack, eff, profile=None, memo: dict | None = None) -> float:
    """MLPerf Server (limits given): the highest rate meeting them × mean output. A stated rate (an online
    benchmark of `requests` requests sent at a QPS): the steady state at the rate SENT where the deployment
    sustains it (the run's middle is that steady state); past capacity there is no steady state, and the run is
    followed to its end (`serve_at.finite_run_at`: the requests in flight pile up while they arrive, then drain).
    The throughput such a run reports (`achieved_rps`) is requests / makespan, below the rate sent even when the
    server keeps up, so it is never the rate fed to the model. Without a stated number of requests: the steady
    state at 99% of capacity when the rate exceeds it."""
    I, O = int(row["prompt_tokens"]), int(row["output_tokens"])
    if row.get("ttft_p99_ms") and row.get("tpot_p99_ms"):
        prompt, output = row_lengths(row)
        rate = max_rate_under_slo(c, dev, mesh, prompt, output, row["weights"], row["kv"], stack, eff,
                                  ttft_p99_ms=float(row["ttft_p99_ms"]), tpot_ms=float(row["tpot_p99_ms"]),
                                  profile=profile, **caps(row))
        return rate * O
    rate = float(row["rate_rps"])
    metric = row["metric"]
    key = (tuple(row.get(k) for k in _SAME_RUN), id(profile), repr(eff))
    if memo is not None and key in memo:               # a source's ITL and TTFT of one run: one steady state
        r, f, _ = memo[key]
    else:
        r = serve_at(c, dev, mesh, rate, I, O, row["weights"], row["kv"], stack, efficiency=eff, profile=profile,
                     **caps(row))
        f = finite_run_at(c, dev, mesh, rate, int(row["requests"]), I, O, row["weights"], row["kv"], stack, eff,
                          profile=profile, **caps(row)) if not r["stable"] and row.get("requests") else None
        if memo is not None:                           # the profile kept with them: its id stays its own
            memo[key] = (r, f, profile)
    if f is not None:
        return {"itl_ms": f["itl_ms"], "ttft_ms": f["ttft_ms"], "output_tok_s": f["achieved_rps"] * O}[metric]
    if not r["stable"]:
        r = serve_at(c, dev, mesh, 0.99 * r["capacity_requests_per_s"], I, O, row["weights"], row["kv"], stack,
                     efficiency=eff, profile=profile, **caps(row))
    if metric == "itl_ms":
        return r["tpot_ms"]
    if metric == "ttft_ms":
        return _ttft_statistic(row, r)
    if metric == "output_tok_s":
        return r["output_tok_s"]
    raise SpecError(f"a server row at a rate predicts itl_ms, ttft_ms or output_tok_s, not {metric!r}")


def _saturated(row: dict, c, dev, mesh, stack, eff, profile=None) -> float:
    """An offline run of lengths that differ (an MLPerf dataset's): the output tokens/s of its saturated steady
    state, the highest rate at which the steady state exists (`max_rate_under_slo` with no limits: its grid
    resolves 0.05% of the maximum throughput, which bounds it as it bounds `serve_at`'s capacity)."""
    prompt, output = row_lengths(row)
    return max_rate_under_slo(c, dev, mesh, prompt, output, row["weights"], row["kv"], stack, eff, profile=profile,
                              **caps(row)) * output.mean_tokens


def _ttft_statistic(row: dict, r: dict) -> float:
    """The TTFT the source states (`statistic`: mean, the default for Triton/genai-perf and `vllm bench serve`
    tables, or p50), read from the steady state `r`. A mean the steady state does not compute (chunked prompts)
    is a SpecError, never a median passed off as one."""
    stat = row.get("statistic") or "p50"
    if stat == "p50":
        return r["ttft_p50_ms"]
    if stat == "mean":
        if r.get("ttft_mean_ms") is None:
            raise SpecError(f"{row['model']}: the steady state gives no mean TTFT for chunked prompts; the source "
                            "states a mean")
        return r["ttft_mean_ms"]
    raise SpecError(f"a row's TTFT statistic is mean or p50, not {stat!r}")


def predict(row: dict, efficiency: Efficiency | None = None, profile=None, memo: dict | None = None) -> float:
    """The planner's figure for one row, in the row's unit, with the row's stack's defaults (or `efficiency`),
    its step priced by the closed form or, with `profile` ("auto", a name or a Profile), by measured kernels."""
    c, dev, mesh, stack, eff = _setup(row, efficiency)
    if profile is not None:
        profile, _ = resolve_profile(profile, dev, stack.full_key, c)
    mode = row["mode"]
    if mode == "offline" and row.get("requests"):
        f = finite_run_at(c, dev, mesh, math.inf, int(row["requests"]), int(row["prompt_tokens"]),
                          int(row["output_tokens"]), row["weights"], row["kv"], stack, eff, profile=profile,
                          **caps(row))
        return f["achieved_rps"] * int(row["output_tokens"])
    if mode == "offline" and row.get("lengths"):         # lengths that differ: a saturated steady state
        return _saturated(row, c, dev, mesh, stack, eff, profile)
    if mode == "offline":
        return max_throughput(c, dev, mesh, int(row["prompt_tokens"]), int(row["output_tokens"]), row["weights"],
                              row["kv"], stack, efficiency=eff, profile=profile, **caps(row))["output_tok_s"]
    if mode == "concurrency":
        return _concurrency(row, c, dev, mesh, stack, eff, profile)
    if mode == "static":
        return _static(row, c, dev, mesh, stack, eff, profile)
    if mode == "server":
        return _server(row, c, dev, mesh, stack, eff, profile, memo)
    raise SpecError(f"unknown mode {mode!r}: offline, concurrency, static or server")


def speed_error(row: dict, predicted: float) -> float:
    """Predicted speed / published speed − 1 (times are inverted first)."""
    pub = float(row["published"])
    return (pub / predicted if row["metric"] in TIME_METRICS else predicted / pub) - 1


def priced(row: dict) -> bool:
    """Whether `predict` prices this row: a mode it models and both lengths stated."""
    return row["mode"] in PRICED_MODES and bool(row["prompt_tokens"]) and bool(row["output_tokens"])


def compare_all(rows: list[dict] | None = None, profile=None) -> dict:
    """Every priced row with its prediction and error, the median and worst |error|, and the rows left unpriced.
    `profile` ("auto"): each row priced from the kernels measured on its device and stack where a profile exists
    (`measured_step.resolve_profile`; the row's `pricing` says which). Rows of one run (a source's ITL and TTFT at
    one rate) share its steady state."""
    out, unpriced, memo = [], [], {}
    for r in rows if rows is not None else load_rows():
        if not priced(r):
            unpriced.append(r)
            continue
        pricing = "closed form"
        if profile is not None:
            c, dev, _, stack, _ = _setup(r)
            prof, pricing = resolve_profile(profile, dev, stack.full_key, c)
        else:
            prof = None
        p = predict(r, profile=prof if prof is not None else None, memo=memo)
        out.append(dict(r, predicted=p, error=speed_error(r, p), pricing=pricing))
    return _summary(out, unpriced)


def _summary(out: list[dict], unpriced: list[dict]) -> dict:
    """The priced rows, the rows left unpriced, and the median and worst |error| of the priced ones."""
    errs = [abs(r["error"]) for r in out]
    return dict(rows=out, unpriced=unpriced, median_abs_error=statistics.median(errs) if errs else None,
                worst_abs_error=max(errs) if errs else None)


def committed_comparison(pricing: str = "closed form", rows: list[dict] | None = None) -> dict | None:
    """`compare_all`'s answer as bench/bench_published.py last wrote it (`accuracy.committed_predictions`), without
    pricing the table again: "closed form" or "measured kernels". None where the file does not hold a prediction
    for every priced row (older than the table, or that pricing never ran here): then price it."""
    from calculators.planning.accuracy import committed_predictions
    got = committed_predictions(pricing)
    out, unpriced = [], []
    for i, r in enumerate(rows if rows is not None else load_rows(), 1):
        if not priced(r):
            unpriced.append(r)
        elif i not in got:
            return None
        else:
            out.append(dict(r, predicted=got[i][0], error=got[i][1], pricing=pricing))
    return _summary(out, unpriced)


def _kind(r: dict) -> str:
    return "MoE" if load_preset(r["model"]).num_experts else "dense"


def _experts_layout(r: dict) -> str:
    """How an MoE row spreads its experts: wide EP (attention data-parallel, experts over the replicas), EP inside
    the TP group, or none (dense, or every GPU holds every expert)."""
    ep, dp = int(r.get("ep") or 1), int(r.get("dp") or 1)
    return "wide EP (attention DP)" if ep > 1 and dp > 1 else ("EP inside TP" if ep > 1 else "no EP")


GROUPS = {"regime": lambda r: r["regime"], "dense/MoE": _kind, "experts": _experts_layout,
          "vendor": lambda r: r["vendor"],
          "precision": lambda r: r["weights"], "regime, dense/MoE": lambda r: f"{r['regime']}, {_kind(r)}"}


def error_table(rows: list[dict]) -> list[dict]:
    """Median and worst |error| by split, and within each split by regime, dense/MoE, vendor and precision."""
    out = []
    for split in ("test", "fit"):
        part = [r for r in rows if r.get("split") == split]
        if not part:
            continue
        errs = [abs(r["error"]) for r in part]
        out.append(dict(split=split, group="all", value="all", n=len(part), median_abs_error=statistics.median(errs),
                        worst_abs_error=max(errs)))
        for name, key in GROUPS.items():
            for v in sorted({key(r) for r in part}):
                e = [abs(r["error"]) for r in part if key(r) == v]
                out.append(dict(split=split, group=name, value=v, n=len(e), median_abs_error=statistics.median(e),
                                worst_abs_error=max(e)))
    return out


# ------------------------------------------------------------------------------------------ fitting (fit rows only)
FIT_GRID = {"decode_mbu": (0.35, 0.45, 0.55, 0.65, 0.75, 0.85, 0.9),
            "decode_mfu": (0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8), "gemm_half_tokens": (0.0, 64.0, 256.0, 1024.0),
            "prefill_mfu": (0.2, 0.3, 0.4, 0.5, 0.6, 0.7), "step_overhead_ms": (0.0, 0.5, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0),
            "sequence_overhead_us": (0.0, 4.0, 8.0, 16.0)}


# issue 36's bar on held-out rows (accuracy.BAR_GROUPS: each regime as a group of the error table, and its value)
BAR_REGIMES = tuple((words, lambda r, g=group, v=value: GROUPS[g](r) == v)
                    for words, group, value in BAR_GROUPS)


def bar_table(rows: list[dict]) -> list[dict]:
    """Issue 36's bar on the held-out (test) rows, regime by regime: median ≤ 8% and worst ≤ 25%, or no priced
    held-out row at all (a regime the table cannot judge yet)."""
    out = []
    for name, keep in BAR_REGIMES:
        e = [abs(r["error"]) for r in rows if r.get("split") == "test" and keep(r)]
        if not e:
            out.append(dict(regime=name, n=0, median_abs_error=None, worst_abs_error=None, meets=None))
            continue
        med, worst = statistics.median(e), max(e)
        out.append(dict(regime=name, n=len(e), median_abs_error=med, worst_abs_error=worst,
                        meets=meets_bar(med, worst)))
    return out


PRICED_KEYS = ("predicted", "error", "pricing")      # what compare_all adds to a row


def source_row(priced_row: dict) -> dict:
    """A row of `compare_all` back as it was read (without what the comparison added)."""
    return {k: v for k, v in priced_row.items() if k not in PRICED_KEYS}


def row_id(row: dict, rows: list[dict]) -> int:
    """A row's 1-based position among the data rows of the table (its id in specs/stacks.json's fitted_on)."""
    return rows.index(row) + 1


def _loss(rows: list[dict], eff: Efficiency) -> float:
    """Mean |ln(predicted / published speed)|: symmetric in over- and under-prediction."""
    return sum(abs(math.log1p(speed_error(r, predict(r, eff)))) for r in rows) / len(rows)


def fit_efficiency(rows: list[dict], start: Efficiency, fields=tuple(FIT_GRID), sweeps: int = 2) -> tuple:
    """Coordinate search over FIT_GRID, one field at a time, `sweeps` times: the efficiency with the smallest mean
    |log error| over `rows`, which must all be `fit` rows (SpecError otherwise: a test row would leak)."""
    from dataclasses import replace
    leaked = [r for r in rows if r.get("split") != "fit"]
    if leaked:
        raise SpecError(f"{len(leaked)} rows are not fit rows: the test rows stay out of every fit")
    best, best_loss = start, _loss(rows, start)
    for _ in range(sweeps):
        for f in fields:
            for v in FIT_GRID[f]:
                cand = replace(best, **{f: v})
                loss = _loss(rows, cand)
                if loss < best_loss - 1e-12:
                    best, best_loss = cand, loss
    return best, best_loss


# The groups fitted, each on its own fit rows (a stack's base on all its NVIDIA FP8/BF16 rows; then what differs for
# mixture-of-experts models (their grouped expert GEMMs), by precision or by vendor, each group starting from the
# base), and where each result goes in specs/stacks.json. The groups apply in this order: a later one wins where two
# match (an FP4 MoE model takes the FP4 group's values).
def _moe(row: dict) -> bool:
    return arch.is_moe(load_preset(row["model"]))


FIT_GROUPS = {
    ("trtllm", "base"): dict(select=lambda r: r["stack"] == "trtllm" and r["vendor"] == "NVIDIA" and r["weights"] != "fp4",
                             fields=tuple(FIT_GRID)),
    ("trtllm", "moe"): dict(select=lambda r: r["stack"] == "trtllm" and r["weights"] != "fp4" and _moe(r),
                            when={"moe": True}, fields=("decode_mbu", "decode_mfu")),
    ("trtllm", "fp4"): dict(select=lambda r: r["stack"] == "trtllm" and r["weights"] == "fp4", when={"precision": "fp4"},
                            fields=("decode_mbu", "decode_mfu", "prefill_mfu", "gemm_half_tokens")),
    ("vllm", "AMD"): dict(select=lambda r: r["stack"] == "vllm" and r["vendor"] == "AMD", when={"vendor": "AMD"},
                          fields=("decode_mbu", "decode_mfu", "prefill_mfu", "gemm_half_tokens")),
}


def fit_groups(rows: list[dict] | None = None) -> dict:
    """Fit every FIT_GROUPS entry on its fit rows (the base first: the groups start from it)."""
    from dataclasses import replace
    rows = rows if rows is not None else load_rows()
    fit_rows = [r for r in rows if r["split"] == "fit" and priced(r)]
    out, base = {}, {}
    for key, g in FIT_GROUPS.items():
        part = [r for r in fit_rows if g["select"](r)]
        if not part:
            continue
        stack, dev = load_stack(key[0]), load_device(part[0]["device"])
        start = Efficiency.for_stack(stack, dev, part[0]["weights"], load_preset(part[0]["model"]))
        if key[1] != "base" and key[0] in base:
            start = replace(base[key[0]], **{f: getattr(start, f) for f in g["fields"]})
        best, _ = fit_efficiency(part, start, g["fields"])
        if key[1] == "base":
            base[key[0]] = best
        errs = [abs(speed_error(r, predict(r, best))) for r in part]
        out[key] = dict(efficiency=best, rows=[row_id(r, rows) for r in part], median=statistics.median(errs),
                        worst=max(errs), when=g.get("when"), fields=g["fields"])
    return out


def write_fit(key: tuple, g: dict, path: Path | None = None) -> None:
    """Write one fitted group into specs/stacks.json (the base into `efficiency`, a group into `efficiency_by`),
    with the fit rows' ids and errors."""
    import json
    from dataclasses import asdict
    from specs.stacks import STACKS_FILE
    path = path or STACKS_FILE
    doc = json.loads(Path(path).read_text(encoding="utf-8"))
    st = doc["stacks"][key[0]]
    e = asdict(g["efficiency"])
    note = (f"fitted by bench/bench_published.py --fit on the {len(g['rows'])} split=fit rows of "
            f"bench/published_serving.csv in fitted_on: median |error| {100 * g['median']:.1f}%, worst "
            f"{100 * g['worst']:.1f}%")
    if key[1] == "base":
        st["efficiency"] = {k: e[k] for k in ("decode_mbu", "prefill_mfu", "prefill_mbu", "decode_mfu",
                                              "sequence_overhead_us", "gemm_half_tokens")}
        st["step_overhead_ms"] = {k: e["step_overhead_ms"] for k in st["step_overhead_ms"]}
        st["fit_rows"], st["efficiency_fitted_on"] = note, g["rows"]
    else:
        entry = dict(when=g["when"], set={f: e[f] for f in g["fields"]}, source=note, fitted_on=g["rows"])
        kept = [x for x in st.get("efficiency_by", []) if x["when"] != g["when"]] + [entry]
        order = [v.get("when") for k, v in FIT_GROUPS.items() if k[0] == key[0]]
        st["efficiency_by"] = sorted(kept, key=lambda x: order.index(x["when"]) if x["when"] in order else len(order))
    Path(path).write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    import specs.stacks as stacks_module
    stacks_module._doc.cache_clear()
    load_stack.cache_clear()


# ------------------------------------------------------------- the host's work under measured kernels (fit rows only)
HOST_GRID = {"step_overhead_ms": (0.0, 0.25, 0.5, 1.0, 2.0, 4.0), "sequence_overhead_us": (0.0, 4.0, 8.0, 16.0, 32.0),
             "borrowed_compute_scale": (1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0),
             "borrowed_memory_scale": (1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0)}


def _host_entry(doc: dict, stack_key: str) -> dict:
    """The entry of specs/stacks.json that holds `stack_key`'s `measured_host`: the stack's, or its build's."""
    base, _, build = stack_key.partition("@")
    entry = doc["stacks"][base]
    return entry["builds"][build] if build else entry


def _with_host(stack_key: str, host: dict | None):
    """Set a candidate `measured_host` in the loaded stacks document (in memory; `fit_measured_host` restores it)."""
    from specs.stacks import _doc
    _host_entry(_doc(), stack_key)["measured_host"] = host


def plausible_host(host: dict) -> bool:
    """Whether a candidate `measured_host` keeps every vendor's own fixed step at or above the stack's."""
    return all(v >= host["step_overhead_ms"] for v in (host.get("step_overhead_ms_by_vendor") or {}).values())


def fit_measured_host(stack_key: str, rows: list[dict] | None = None, sweeps: int = 2,
                      fitted_on: list[int] | None = None) -> dict:
    """The host's work per step that, with each row's GPU priced from kernels measured on it (or on the nearest
    profiled device, its compute-bound and memory-bound work slowed by `borrowed_compute_scale` and
    `borrowed_memory_scale` per vendor: `step.derated`), best fits the stack's FIT rows (coordinate search over
    HOST_GRID, mean |log error|). A vendor's own fixed step is never below the stack's (`plausible_host`: the same
    scheduler and sampler run on the host; a smaller one would only stand in for the GPU factors). Test rows never
    enter. `fitted_on` (row ids): refit on those fit rows only (the rows a fit was declared on, after the pricing
    changed). Returns the fitted entry, its rows' ids and errors.
    A build (`stack@build`: rows whose `build` names it) fits only its vendors' factors and fixed step, over the
    stack's own host fit (the same scheduler and sampler; its kernels are what differ): fit the stack first."""
    from specs.stacks import _doc
    rows = rows if rows is not None else load_rows()
    part = [r for i, r in enumerate(rows, 1) if r["split"] == "fit" and priced(r) and stack_key_of(r) == stack_key
            and (fitted_on is None or i in fitted_on)]
    if not part:
        raise SpecError(f"no fit rows for {stack_key}")
    saved = _host_entry(_doc(), stack_key).get("measured_host")
    base_key, _, build = stack_key.partition("@")
    under = _host_entry(_doc(), base_key).get("measured_host") if build else {}
    if build and not under:
        raise SpecError(f"{base_key} has no measured_host fit for its build {build} to sit on: fit {base_key} first")

    def borrowed(r) -> bool:
        """Whether the row's GPU is priced from another device's kernels (the nearest profiled one)."""
        dev = load_device(r["device"])
        prof = resolve_profile("auto", dev, base_key, load_preset(r["model"]))[0]
        return borrowed_profile(prof, dev)
    vendors = sorted({r["vendor"] for r in part if borrowed(r)})
    per_vendor = ("borrowed_compute_scale", "borrowed_memory_scale", "step_overhead_ms_by_vendor")
    if build and not vendors:
        raise SpecError(f"{stack_key}: a build fits its vendors' factors, and none of its fit rows borrows a profile")
    if build:                            # the stack's host stays; its vendors' values are the start
        best = {k: {v: float(_vendor_value(under, k, v)) for v in vendors} for k in per_vendor}
    else:
        best = dict(step_overhead_ms=0.5, sequence_overhead_us=4.0, borrowed_compute_scale={v: 1.0 for v in vendors},
                    borrowed_memory_scale={v: 1.0 for v in vendors})
        if vendors:                      # a borrowing vendor's stack build has its own fixed step cost
            best["step_overhead_ms_by_vendor"] = {v: 0.5 for v in vendors}

    def loss(h):
        _with_host(stack_key, h)
        return sum(abs(math.log1p(speed_error(r, predict(r, profile="auto")))) for r in part) / len(part)
    try:
        best_loss = loss(best)
        grid = dict(HOST_GRID, step_overhead_ms_by_vendor=HOST_GRID["step_overhead_ms"]) if vendors else HOST_GRID
        if build:
            grid = {k: v for k, v in grid.items() if k in per_vendor}
        for _ in range(sweeps):
            for field, values in grid.items():
                targets = [(field, None)] if field not in per_vendor else [(field, v) for v in vendors]
                for f, vendor in targets:
                    for v in values:
                        cand = dict(best, **{k: dict(best[k]) for k in per_vendor if k in best})
                        if vendor is None:
                            cand[f] = v
                        else:
                            cand[f][vendor] = v
                        if not plausible_host(dict(under, **cand) if build else cand):
                            continue
                        c_loss = loss(cand)
                        if c_loss < best_loss - 1e-12:
                            best, best_loss = cand, c_loss
        _with_host(stack_key, best)
        errs = [abs(speed_error(r, predict(r, profile="auto"))) for r in part]
    finally:
        _with_host(stack_key, saved)
    return dict(host=best, rows=[row_id(r, rows) for r in part], median=statistics.median(errs), worst=max(errs))


def _vendor_value(host: dict, field: str, vendor: str) -> float:
    """A stack's `measured_host` value of a per-vendor field for `vendor` (its fixed step where the vendor has
    none of its own; factors 1)."""
    if field == "step_overhead_ms_by_vendor":
        return (host.get(field) or {}).get(vendor, host["step_overhead_ms"])
    return (host.get(field) or {}).get(vendor, 1.0)


def write_measured_host(stack_key: str, g: dict, path: Path | None = None) -> None:
    """Write one stack's (or build's) fitted `measured_host` into specs/stacks.json with its fit rows and
    errors."""
    import json
    from specs.stacks import STACKS_FILE
    path = path or STACKS_FILE
    doc = json.loads(Path(path).read_text(encoding="utf-8"))
    over = (f"; a build of {stack_key.partition('@')[0]}: these vendor factors and fixed step sit over the "
            f"stack's measured_host (its step and per-sequence costs)") if "@" in stack_key else ""
    _host_entry(doc, stack_key)["measured_host"] = dict(
        g["host"], fitted_on=g["rows"],
        source=(f"fitted by bench/bench_published.py --fit-measured on the {len(g['rows'])} split=fit rows of "
                f"bench/published_serving.csv in fitted_on, each row's GPU priced from kernels measured on it "
                f"(aiconfigurator-core 0.12.0; the nearest profiled GPU for one nothing measured, its "
                f"compute-bound and memory-bound work slowed by borrowed_compute_scale and borrowed_memory_scale, "
                f"and that vendor's stack build with its own "
                f"fixed step cost, step_overhead_ms_by_vendor){over}: median |error| {100 * g['median']:.1f}%, "
                f"worst {100 * g['worst']:.1f}%"))
    Path(path).write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
