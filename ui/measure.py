"""Widgets of the Measure-a-server page: the target and load form, the sweep run (progress bar and Stop), and the
views of a result (measured table, measured vs predicted charts, the fit). Numbers come from `server.loadgen`
(measured) and `calculators.planning.measured_sweep` (predicted, fitted); nothing here computes.
"""
from __future__ import annotations

import json
import threading

import pandas as pd
import streamlit as st
from plotly.subplots import make_subplots

from server.loadgen import APIS, MAX_IN_FLIGHT, MODES, LoadError, SweepPlan, SweepResult, Target, measure, \
    parse_levels
from specs.model_config import SpecError
from ui.charts import style as chart_style
from ui.model_source import choice_field
from ui.widgets import df_with_download, int_field, remember, show_error

K = "measure."
RESULT_KEY = K + "result"             # the session's last SweepResult (grows while it runs)
STOP_KEY = K + "stop_event"
MAX_UI_REQUESTS = 2000
MAX_UI_LEVELS = 8
TABLE_COLUMNS = {"level": "level", "completed": "completed", "failed": "failed",
                 "mean_prompt_tokens": "prompt tokens (mean)", "mean_output_tokens": "output tokens (mean)",
                 "ttft_p50_ms": "TTFT p50 (ms)", "ttft_p90_ms": "TTFT p90 (ms)", "ttft_p99_ms": "TTFT p99 (ms)",
                 "itl_p50_ms": "ITL p50 (ms)", "itl_p90_ms": "ITL p90 (ms)", "itl_p99_ms": "ITL p99 (ms)",
                 "tpot_mean_ms": "TPOT mean (ms)", "e2e_p50_ms": "end-to-end p50 (ms)",
                 "e2e_p99_ms": "end-to-end p99 (ms)", "output_tok_s": "output tokens/s", "requests_per_s": "requests/s",
                 "tokens_from": "tokens counted from", "first_error": "first error"}
METRIC_LABELS = {"ttft_ms": "TTFT (ms)", "itl_ms": "ITL (ms)", "e2e_ms": "end-to-end (ms)",
                 "output_tok_s": "output tokens/s"}


def _text(label: str, default: str, key: str, **kw) -> str:
    store = remember(K + key, default)
    return st.text_input(label, key=K + key, on_change=store, **kw)


def target_and_plan() -> tuple[Target, SweepPlan] | None:
    """The form: server URL, model name, API key, API, load mode, levels and lengths (URL and model may come from
    the page link's ?url=...&model=...). None (with the reason, or a hint when no URL is typed yet) until
    everything is valid."""
    c = st.columns([3, 2, 2])
    linked = st.query_params                  # ?url=...&model=... opens the page with the server filled in
    with c[0]:
        url = _text("Server URL", linked.get("url", ""), "url", placeholder="http://127.0.0.1:8000",
                    help="Any OpenAI-compatible server: ours (`python -m engine serve`), vLLM (`vllm serve`), "
                         "SGLang, TGI, llama.cpp's server. With or without /v1.")
    with c[1]:
        model = _text("Served model name", linked.get("model", ""), "model", help="As the server's /v1/models lists it.")
    with c[2]:
        key = _text("API key (optional)", "", "key", type="password")
    c = st.columns(3)
    api = choice_field("API", APIS, "completions", key=K + "api", where=c[0],
                       help="/v1/completions or /v1/chat/completions (the server's chat template adds tokens).")
    mode = choice_field("Load", MODES, "concurrency", key=K + "mode", where=c[1],
                        help="concurrency: keep c requests in flight; rate: Poisson arrivals at r requests/s.")
    with c[2]:
        levels_text = _text("Levels", "1,4" if mode == "concurrency" else "0.5,1",
                            "levels." + mode, help=f"Comma-separated, at most {MAX_UI_LEVELS}: concurrencies "
                            f"(1 to {MAX_IN_FLIGHT}) or rates in requests/s.")
    c = st.columns(3)
    n = int_field("Requests per level", 16, 1, MAX_UI_REQUESTS, key=K + "requests", where=c[0])
    p = int_field("Prompt tokens", 128, 1, 100_000, key=K + "prompt", where=c[1],
                  help="Random common words sized to the server's tokenizer (two probe requests).")
    o = int_field("Output tokens", 64, 1, 16_384, key=K + "output", where=c[2],
                  help="max_tokens, with ignore_eos where the server knows it (vLLM, SGLang).")
    if not url.strip():
        st.info("Type the address of a running OpenAI-compatible server above, e.g. `http://127.0.0.1:8000`, "
                "and the model name it serves. Start one with `python -m engine serve` (this app's engine) or "
                "`vllm serve MODEL` (see docs/serving.md).", icon=":material/dns:")
        return None
    if not model.strip() or None in (n, p, o):
        if not model.strip():
            st.info("Type the served model name (the server's /v1/models lists it).")
        return None
    try:
        levels = parse_levels(levels_text)
        if len(levels) > MAX_UI_LEVELS:
            raise LoadError(f"at most {MAX_UI_LEVELS} levels here, got {len(levels)}")
        return (Target(url, model, key or None, api),
                SweepPlan(levels, mode=mode, requests=n, prompt_tokens=p, output_tokens=o, level_timeout_s=600.0))
    except SpecError as e:
        show_error(e)
        return None


def request_stop() -> None:
    """The Stop button: end the sweep now, keeping what was measured."""
    stop = st.session_state.get(STOP_KEY)
    if stop is not None:
        stop.set()
    result = st.session_state.get(RESULT_KEY)
    if result is not None:
        result.stop_now()


def run_sweep(target: Target, plan: SweepPlan) -> None:
    """Run the sweep in this script run with a progress bar and a Stop button; the result goes in the session
    (filled as it runs, so a Stop keeps the levels measured)."""
    stop = threading.Event()
    result = SweepResult(target, plan)
    st.session_state[STOP_KEY] = stop
    st.session_state[RESULT_KEY] = result
    stop_slot, bar_slot = st.empty(), st.empty()
    stop_slot.button("Stop", key=K + "stop", on_click=request_stop, icon=":material/stop_circle:",
                     help="End the sweep now; the requests measured so far are kept.")
    bar = bar_slot.progress(0.0, text=f"Checking {target.url} ...")

    def progress(done: int, total: int, label: str) -> None:
        bar.progress(min(done / total, 1.0), text=f"{label}: {done} of {total} requests done")

    try:
        measure(target, plan, on_progress=progress, stop=stop, result=result)
    except SpecError as e:
        st.session_state.pop(RESULT_KEY, None)
        show_error(e)
    finally:
        st.session_state.pop(STOP_KEY, None)
    stop_slot.empty()
    bar_slot.empty()


def show_measured(result: SweepResult) -> pd.DataFrame:
    """Status line, the per-level table (CSV) and the whole result as JSON."""
    if result.error:
        show_error(result.error)
    elif result.stopped:
        st.warning("Stopped: the requests measured before the Stop are kept.", icon=":material/stop_circle:")
    rows = result.rows()
    df = pd.DataFrame(rows)
    if df.empty:
        st.info("No request finished.")
        return df
    shown = df[[c for c in TABLE_COLUMNS if c in df.columns]].rename(columns=TABLE_COLUMNS)
    unit = "concurrency" if result.plan.mode == "concurrency" else "requests/s"
    st.subheader(f"Measured at the client ({result.target.model}, {unit} sweep)")
    df_with_download(shown, "measured_sweep", column_config={
        c: st.column_config.NumberColumn(format="%.1f") for c in shown.columns if shown[c].dtype.kind == "f"})
    fit = result.prompt_fit or {}
    st.caption(f"{result.plan.requests} requests per level, {result.plan.prompt_tokens} prompt and "
               f"{result.plan.output_tokens} output tokens asked; token counts from the server's `usage` "
               f"({'measured prompt tokens = ' + format(fit.get('fixed_tokens', 0), '.1f') + ' + ' + format(fit.get('tokens_per_word', 0), '.2f') + ' per word' if fit.get('from_usage') else 'the server reports no usage: tokens counted as text chunks'}). "
               "TTFT and ITL are the client's own clock, HTTP and tokenization included.")
    st.download_button("Download JSON", json.dumps(result.to_json(), indent=2, default=str).encode(),
                       file_name="measured_sweep.json", mime="application/json", key=K + "json",
                       on_click="ignore", icon=":material/download:")
    return df


def show_comparison(cmp: dict, mode: str) -> None:
    """Measured vs predicted (defaults) vs fitted, per level: four small charts, the fit and the errors."""
    for w in cmp["warnings"]:
        st.warning(w, icon=":material/warning:")
    rows = pd.DataFrame(cmp["rows"])
    x = rows["level"]
    fig = make_subplots(rows=1, cols=4, horizontal_spacing=0.08)
    for i, (m, label) in enumerate(METRIC_LABELS.items(), 1):
        for which, name, dash, color in (("measured", "measured", "solid", "#000000"),
                                         ("predicted", "predicted (defaults)", "dot", "#e45756"),
                                         ("fitted", "predicted (fitted)", "dash", "#4c78a8")):
            fig.add_scatter(x=x, y=rows[f"{which}_{m}"], mode="lines+markers", name=name, legendgroup=which,
                            showlegend=i == 1, line=dict(dash=dash, color=color, width=3), marker=dict(size=9),
                            row=1, col=i)
        fig.update_xaxes(title_text="concurrency" if mode == "concurrency" else "requests/s", row=1, col=i)
        fig.update_yaxes(title_text=label, row=1, col=i)        # (subplot titles would sit under the legend)
    fig.update_layout(height=430, title="Measured vs the calculators, per level")
    st.plotly_chart(chart_style(fig))
    c = st.columns(3)
    c[0].metric("Decode MBU (fitted)", f"{cmp['decode_mbu']:.3f}")
    c[1].metric("Prefill MFU (fitted)", f"{cmp['prefill_mfu']:.3f}")
    c[2].metric("Overhead per step (fitted)", f"{cmp['overhead_ms']:.1f} ms")
    mae = cmp["mean_abs_error_percent"]
    err = pd.DataFrame([dict(metric=METRIC_LABELS[m], **{"defaults: mean |error| (%)": mae[f"predicted_{m}"],
                                                          "fitted: mean |error| (%)": mae[f"fitted_{m}"]})
                        for m in METRIC_LABELS])
    st.markdown("**How much closer the fitted model gets**")
    df_with_download(err, "fit_errors", column_config={c: st.column_config.NumberColumn(format="%.1f")
                                                       for c in err.columns[1:]})
    eff = cmp["efficiency_before"]
    st.caption(f"Defaults: decode MBU {eff['decode_mbu']:g}, prefill MFU {eff['prefill_mfu']:g}, overhead "
               f"{cmp['overhead_ms_before']:g} ms per step. Fitted: the same step model with the three fitted "
               "numbers. Error = predicted / measured − 1.")
    df_with_download(rows, "measured_vs_predicted", column_config={
        c: st.column_config.NumberColumn(format="%.2f") for c in rows.columns if rows[c].dtype.kind == "f"})
