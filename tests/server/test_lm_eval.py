"""lm-evaluation-harness through `python -m engine serve` equals lm-eval's Hugging Face backend on the same weights.

Reference run (skips unless an interpreter with lm-eval, torch and transformers is at hand; see docs/lm_eval.md):

    LM_EVAL_PYTHON=/path/to/venv/bin/python  python -m pytest -q tests/server/test_lm_eval.py

The tasks are local files (tests/data/lm_eval: a multiple-choice task scored by loglikelihood and a generate_until
task; no network). One lm-eval run is `local-completions` against our server (loglikelihood through echo + logprobs
on /v1/completions, generation with stop strings; the tokenizer through the server's /tokenizer_info and /tokenize);
the other is `hf` (transformers + torch, float32) on a Hugging Face folder of the engine's own weights
(`engine.load.hf_export`). The reference is transformers' forward pass, not our code: the same accuracies, every
choice's loglikelihood within 1e-3 (and its is-greedy flag), the same generated text for every item."""
import glob
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TASKS_DIR = ROOT / "tests" / "data" / "lm_eval"
TASKS = {"inferencelab_mc": TASKS_DIR / "mc.jsonl", "inferencelab_gen": TASKS_DIR / "gen.jsonl"}
METRICS = {"inferencelab_mc": ("acc,none", "acc_norm,none"), "inferencelab_gen": ("exact_match,strip",)}
TOL = 1e-3
RUN_TIMEOUT_S = 1200           # one lm-eval run; about a minute each on a quiet 2-core machine
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HF_HUB_DISABLE_TELEMETRY": "1", "TOKENIZERS_PARALLELISM": "false"}

pytestmark = pytest.mark.live_server


@pytest.fixture(scope="module")
def lm_eval_python() -> str:
    """The interpreter that has lm-eval, torch and transformers: LM_EVAL_PYTHON, else this one; skip if none."""
    python = os.environ.get("LM_EVAL_PYTHON") or sys.executable
    try:
        ok = subprocess.run([python, "-c", "import lm_eval, torch, transformers, tenacity"], capture_output=True,
                            timeout=300).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    if not ok:
        pytest.skip(f"no lm-eval: {python} cannot import lm_eval, torch, transformers and tenacity; set "
                    f"LM_EVAL_PYTHON to a venv's python with `pip install 'lm-eval[api,hf]' torch transformers` "
                    f"(docs/lm_eval.md)")
    return python


def _lm_eval(python: str, model: str, model_args: str, out: Path, extra: tuple[str, ...] = ()) -> dict:
    """One `lm_eval` CLI run of both tasks; -> {"results": ..., "samples": {task: {doc_id: sample}}, "seconds"}."""
    cmd = [python, "-m", "lm_eval", "--model", model, "--model_args", model_args, "--include_path", str(TASKS_DIR),
           "--tasks", ",".join(TASKS), "--log_samples", "--output_path", str(out), *extra]
    t0 = time.monotonic()
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
                       env={**os.environ, **OFFLINE, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})
    seconds = time.monotonic() - t0
    assert r.returncode == 0, f"lm_eval --model {model} failed:\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    results = [Path(p) for p in glob.glob(str(out / "**" / "results_*.json"), recursive=True)]
    assert len(results) == 1, results
    samples = {}
    for task in TASKS:
        files = glob.glob(str(out / "**" / f"samples_{task}_*.jsonl"), recursive=True)
        assert len(files) == 1, (task, files)
        with open(files[0], encoding="utf-8") as f:
            samples[task] = {s["doc_id"]: s for s in map(json.loads, f)}
    return {"results": json.loads(results[0].read_text())["results"], "samples": samples, "seconds": seconds}


@pytest.fixture(scope="module")
def runs(lm_eval_python, tmp_path_factory, default_model):      # the skip comes before the model loads
    python = lm_eval_python
    from engine.load.hf_export import export_hf
    from server.process import EngineServerProcess
    folder = os.environ.get("LM_EVAL_HF_MODEL") or str(export_hf(default_model, tmp_path_factory.mktemp("hf")))
    out = tmp_path_factory.mktemp("lm_eval")
    with EngineServerProcess() as srv:
        # no tokenizer argument: lm-eval finds /tokenizer_info and /tokenize and tokenizes through the server
        api = _lm_eval(python, "local-completions",
                       f"model=smollm2,base_url={srv.base_url}/completions,num_concurrent=1,max_retries=1",
                       out / "server")
    hf = _lm_eval(python, "hf", f"pretrained={folder},dtype=float32", out / "hf", ("--device", "cpu"))
    return api, hf


def _rows(path: Path) -> int:
    return sum(1 for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip())


def test_every_item_was_scored_by_both(runs):
    for run in runs:
        for task, data in TASKS.items():
            assert sorted(run["samples"][task]) == list(range(_rows(data))), task


def test_the_same_accuracy_as_the_hf_backend(runs):
    api, hf = runs
    for task, keys in METRICS.items():
        for key in keys:
            assert api["results"][task][key] == pytest.approx(hf["results"][task][key], abs=1e-12), (task, key)


def test_every_choice_has_the_hf_backends_loglikelihood(runs):
    api, hf = runs
    worst = 0.0
    for doc_id, ours in api["samples"]["inferencelab_mc"].items():
        theirs = hf["samples"]["inferencelab_mc"][doc_id]
        assert len(ours["filtered_resps"]) == len(theirs["filtered_resps"]) == len(ours["doc"]["choices"])
        for (ll, greedy), (ll_ref, greedy_ref) in zip(ours["filtered_resps"], theirs["filtered_resps"]):
            worst = max(worst, abs(float(ll) - float(ll_ref)))
            assert float(ll) == pytest.approx(float(ll_ref), abs=TOL), (doc_id, ll, ll_ref)
            assert str(greedy) == str(greedy_ref), (doc_id, greedy, greedy_ref)
    print(f"\nlargest loglikelihood difference {worst:.2e}; lm-eval through the server "
          f"{api['seconds']:.0f} s, hf backend {hf['seconds']:.0f} s")


def test_every_generation_has_the_hf_backends_text(runs):
    api, hf = runs
    for doc_id, ours in api["samples"]["inferencelab_gen"].items():
        theirs = hf["samples"]["inferencelab_gen"][doc_id]
        assert ours["resps"] == theirs["resps"], (doc_id, ours["resps"], theirs["resps"])
        assert ours["resps"][0][0].strip(), doc_id               # a reply, not an empty string on both sides
