"""Bring your own load test (the Measure-a-server page's second source of measurements): import the result files
of guidellm, `vllm bench serve`, AIPerf/genai-perf or SGLang bench_serving, show every run in this app's metric
definitions, predict each run's load with the calculators, fit the efficiencies and hand them to the planner.

Numbers: `calculators.planning.load_test_import` (reading), `calculators.planning.load_test_compare` (predicted
vs measured, the fit); nothing here computes. `read_files` is the upload handler, callable with bytes.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import pandas as pd
import streamlit as st

from calculators.multi_gpu.tensor_parallel import Mesh, check_mesh
from calculators.planning.load_test_compare import ImportedRun, compare_imported, load_words
from calculators.planning.load_test_import import METRIC_SOURCES, TOOL_NAMES, TOOLS, LoadTestRecord, import_load_test
from calculators.planning.measured_sweep import KNOB_NAMES, MODES
from calculators.serving.metric_definitions import METRIC_DEFINITIONS
from specs.model_config import SpecError
from specs.stacks import list_stacks, load_stack
from ui.fitted_efficiency import FITTED_EFFICIENCY_KEY, PLANNER_PAGE, stored_fit
from ui.model_source import choice_field
from ui.widgets import df_with_download, float_field, int_field, once_per_input, remember, show_error

K = "measure.import."
UPLOAD_KEY = K + "files"              # the file_uploader
RAW_KEY = K + "raw"                   # [(name, bytes)] of the last upload: kept when the page is left and opened again
TOOL_KEY = K + "tool"
STACK_KEY = K + "stack"
COMPARE_KEY = K + "compare"           # (inputs, compare_imported result): the fit takes a second, once per input
DETECT = "detect from the content"
TOOL_CHOICES = (DETECT, *(TOOL_NAMES[t] for t in TOOLS))

METRIC_ROWS = {f"{m}_{s}_ms": f"{label} {s} (ms)" for m, label in (("ttft", "TTFT"), ("tpot", "TPOT"),
                                                                    ("itl", "ITL"), ("e2e", "end-to-end"))
               for s in ("mean", "p50", "p90", "p99")}
METRIC_ROWS.update(requests_per_s="requests/s", output_tok_s="output tokens/s", total_tok_s="total tokens/s")
DEFINITION_NAMES = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2e": "end-to-end", "requests_per_s": "requests/s",
                    "output_tok_s": "output tokens/s", "total_tok_s": "total tokens/s",
                    "mean_batch": "requests in flight"}


@dataclass(frozen=True)
class ImportedFile:
    """One uploaded file: its runs, or the one message that says why it could not be read."""
    name: str
    digest: str
    records: tuple[LoadTestRecord, ...] = ()
    error: str | None = None


def tool_key(choice: str) -> str | None:
    """The tool a Tool choice names (None: detect from the content)."""
    return next((t for t, n in TOOL_NAMES.items() if n == choice), None)


def read_files(files: list[tuple[str, bytes]], tool: str | None = None) -> list[ImportedFile]:
    """The upload handler: each (name, bytes) imported, or its error; `tool` (a key of TOOL_NAMES) when the user
    chose one, so that a file another tool wrote says so instead of importing."""
    out = []
    for name, data in files:
        digest = hashlib.sha256(data).hexdigest()[:16]
        try:
            recs = tuple(import_load_test(data, name))
            wrong = [r.tool for r in recs if tool is not None and r.tool != tool]
            if wrong:
                raise SpecError(f"this is a {TOOL_NAMES[wrong[0]]} result, not {TOOL_NAMES[tool]} (choose "
                                f"“{DETECT}” or {TOOL_NAMES[wrong[0]]} under Tool)")
            out.append(ImportedFile(name, digest, recs))
        except SpecError as e:
            out.append(ImportedFile(name, digest, error=f"{name}: {e}"))
    return out


def _on_upload() -> None:
    ss = st.session_state
    ss[RAW_KEY] = [(f.name, f.getvalue()) for f in ss.get(UPLOAD_KEY) or []]


def run_labels(files: list[ImportedFile]) -> list[tuple[str, LoadTestRecord]]:
    """(label, record) of every run read: the file name, with the run's number when a file holds several."""
    out = []
    for f in files:
        for i, r in enumerate(f.records, 1):
            out.append((f.name if len(f.records) == 1 else f"{f.name} (run {i})", r))
    return out


def runs_table(runs: list[tuple[str, LoadTestRecord]]) -> pd.DataFrame:
    """One row per run: what ran it and at what load."""
    return pd.DataFrame([{"run": f"run {i}", "file": label, "tool": TOOL_NAMES[r.tool], "version": r.tool_version or "",
                          "load": load_words(r.mode, r.level) if r.mode else "not in the file",
                          "completed": r.completed, "in flight (Little's law)": r.mean_batch,
                          "prompt tokens (mean)": r.mean_prompt_tokens,
                          "output tokens (mean)": r.mean_output_tokens} for i, (label, r) in enumerate(runs, 1)])


def metrics_table(runs: list[tuple[str, LoadTestRecord]]) -> pd.DataFrame:
    """The normalised metrics, one row per metric and one column per run (empty where the file lacks it)."""
    df = pd.DataFrame({"metric": list(METRIC_ROWS.values())})
    for label, r in runs:
        df[label] = [r.metrics.get(k) for k in METRIC_ROWS]
    return df.astype({label: float for label, _ in runs})


def upload_section() -> list[tuple[str, LoadTestRecord]]:
    """The uploader, one message per file that could not be read, the runs and their metrics in our definitions
    (each with a CSV); returns the runs read."""
    st.subheader("Import load-test result files")
    c = st.columns([3, 2])
    tool = choice_field("Tool", TOOL_CHOICES, DETECT, key=TOOL_KEY, where=c[1], help="Read from the file's content; "
                        "choose one to check that every file is that tool's.")
    c[0].file_uploader("Result files (several allowed)", accept_multiple_files=True, key=UPLOAD_KEY,
                       on_change=_on_upload,
                       help="guidellm's benchmarks JSON, `vllm bench serve --save-result` JSON, AIPerf/genai-perf "
                            "profile_export JSON or CSV, SGLang bench_serving --output-file JSONL.")
    raw = st.session_state.get(RAW_KEY) or []
    if raw and not st.session_state.get(UPLOAD_KEY):
        st.caption(f"Shown: the files uploaded earlier ({', '.join(n for n, _ in raw)}); upload others to replace "
                   "them.")
    files = read_files(raw, tool_key(tool))
    for f in files:
        if f.error:
            show_error(f.error)
    runs = run_labels(files)
    if not runs:
        if not files:
            st.info("Upload one or more result files: each run becomes a row in this app's metric definitions, "
                    "next to the calculators' prediction for its load.", icon=":material/upload_file:")
        return []
    st.markdown("**Runs read**")
    df_with_download(runs_table(runs), "imported_runs", show={
        "run": None, "file": None, "load": None, "tool": None, "completed": None,
        "output tokens (mean)": "output tokens",
        "prompt tokens (mean)": "prompt tokens", "version": None})
    st.markdown("**Their metrics, in this app's definitions**")
    # headed "run 1", "run 2", ... on screen (file names are too wide for a projector); the CSV keeps the names
    df_with_download(metrics_table(runs), "imported_metrics",
                     show={"metric": None, **{label: f"run {i}" for i, (label, _) in enumerate(runs, 1)}})
    definitions()
    for tool in dict.fromkeys(r.tool for _, r in runs):
        notes = dict.fromkeys(n for _, r in runs if r.tool == tool for n in r.notes)
        st.markdown(f"**{TOOL_NAMES[tool]}**: " + "; ".join(notes) + f". Read in {METRIC_SOURCES[tool]}.")
    return runs


def definitions() -> None:
    """This app's metric definitions (`metric_definitions.METRIC_DEFINITIONS`), every import normalised to them."""
    st.markdown("Every figure above is in this app's definitions (what `python -m server.loadgen` measures): " +
                "; ".join(f"**{DEFINITION_NAMES[k]}** = {v}" for k, v in METRIC_DEFINITIONS.items()) + ". "
                "Percentiles p50/p90/p99 are each tool's own (guidellm's the nearest rank, recomputed as guidellm does; "
                "vLLM's a linear interpolation): the figures the tool printed. An empty cell is a figure the file "
                "does not carry. "
                "How each tool's own figures were converted:")


def with_loads(runs: list[tuple[str, LoadTestRecord]]) -> list[ImportedRun]:
    """Each run with its load: the file's, or one the user gives (an AIPerf CSV does not say it). Runs still
    without one are left out, with the reason."""
    out = []
    for label, r in runs:
        if r.mode is not None and r.level:
            out.append(ImportedRun(label, r, r.mode, float(r.level)))
            continue
        st.markdown(f"**{label}** does not say its load: give it.")
        c = st.columns(2)
        mode = choice_field("Load", MODES, "concurrency", key=f"{K}mode.{label}", where=c[0])
        level = float_field("Concurrency" if mode == "concurrency" else "Requests per second", 1.0, 0.001, 100_000.0,
                            key=f"{K}level.{mode}.{label}", where=c[1])
        if level is not None:
            out.append(ImportedRun(label, r, mode, level))
    return out


def served_by() -> tuple[Mesh, str] | None:
    """GPUs, TP and the serving stack of the server that ran the load (the model, device and precisions are in
    the sidebar)."""
    c = st.columns(3)
    gpus = int_field("GPUs", 1, 1, 4096, key=K + "gpus", where=c[0], help="All the GPUs that served the load.")
    tp = int_field("TP", 1, 1, 512, key=K + "tp", where=c[1], help="Tensor-parallel degree of one replica.")
    stacks = list_stacks()
    store = remember(STACK_KEY, stacks[0])
    if st.session_state.get(STACK_KEY) not in stacks:
        st.session_state[STACK_KEY] = stacks[0]
    stack = c[2].selectbox("Serving stack", stacks, key=STACK_KEY, on_change=store,
                           format_func=lambda k: load_stack(k).name,
                           help="Its efficiencies and fixed step cost are the 'defaults' the prediction starts "
                                "from (specs/stacks.json).")
    if gpus is None or tp is None:
        return None
    return Mesh(tp=tp, gpus=gpus), stack


def comparison_section(runs: list[ImportedRun], config, device, wd: str, kd: str, mesh: Mesh, stack: str) -> None:
    """Predicted vs measured per run and metric (CSV), the fitted efficiencies, and the button to re-plan."""
    try:
        check_mesh(config, mesh)
    except SpecError as e:
        show_error(e)
        return
    key = (tuple((r.label, r.mode, r.level, repr(r.record)) for r in runs), repr(config), repr(device), wd, kd,
           repr(mesh), stack)
    cmp = once_per_input(COMPARE_KEY, key, lambda: compare_imported(config, device, runs, wd, kd, mesh, stack),
                         "Predicting every run and fitting the efficiencies ...")
    if cmp is None:
        return
    st.subheader(f"Predicted vs measured: {config.name} on {mesh.total_gpus} × {device.name}, {wd} weights")
    for note in cmp["notes"]:
        st.warning(note, icon=":material/info:")
    if cmp["rows"]:
        df = pd.DataFrame(cmp["rows"])
        df_with_download(df, "imported_predicted_vs_measured", show={
            "run": None, "metric": None, "measured": None, "predicted (defaults)": "defaults",
            "error (defaults) %": "error %", "predicted (fitted)": "fitted", "error (fitted) %": "error % (fitted)",
            "load": None, "predicted by": None})
        base = cmp["efficiency_before"]
        st.caption(f"Defaults: the {load_stack(stack).name} stack's efficiencies on {device.name} (decode MBU "
                   f"{base.decode_mbu:g}, prefill MFU {base.prefill_mfu:g}, overhead {base.step_overhead_ms:g} ms "
                   "per step). A run at a concurrency is predicted by the level model (mean figures), a run at a "
                   "rate by the steady state under a Poisson rate (percentiles). Error = predicted / measured − 1.")
    fit = cmp["fit"]
    if fit is None:
        return
    fitted_section(cmp, fit, runs, config, device, wd, kd, stack)


def fitted_section(cmp: dict, fit: dict, runs: list[ImportedRun], config, device, wd, kd, stack) -> None:
    st.subheader("Efficiencies fitted to the imported runs")
    if cmp["held_reason"]:
        st.info(cmp["held_reason"][0].upper() + cmp["held_reason"][1:], icon=":material/info:")
    for w in fit["warnings"]:
        st.warning(w, icon=":material/warning:")
    knobs = cmp["knobs"]
    c = st.columns(3)
    for col, (k, name) in zip(c, KNOB_NAMES.items()):
        value = f"{fit[k]:.1f} ms" if k == "overhead_ms" else f"{fit[k]:.3f}"
        col.metric(f"{name[0].upper() + name[1:]} ({'fitted' if k in knobs else 'held'})", value)
    if st.button("Re-plan with these efficiencies", type="primary", icon=":material/price_check:", key=K + "replan",
                 help="Opens the Capacity planner with these efficiencies in place of the stack's defaults."):
        st.session_state[FITTED_EFFICIENCY_KEY] = stored_fit(
            fit, cmp["planner_efficiency"], model=config.name, device=device.name, weight_dtype=wd, kv_dtype=kd,
            stack=stack, runs=[r.label for r in runs])
        st.switch_page(PLANNER_PAGE)


def import_view(predict) -> None:
    """The whole import path: files, their metrics, the load of each, what served it, predicted vs measured and
    the fit. `predict`: (config, device, weight dtype, KV dtype) from the sidebar, or None."""
    runs = upload_section()
    if not runs:
        return
    st.subheader("What served it")
    st.caption("The model, the device and the precisions are in the sidebar; the GPUs, TP and stack here.")
    served = served_by()
    loaded = with_loads(runs)
    if predict is None or served is None:
        return
    if not loaded:
        st.info("Give the load of at least one run to compare it with the calculators.")
        return
    comparison_section(loaded, *predict, *served)
