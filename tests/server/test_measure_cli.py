"""`python -m server measure` against the fake OpenAI server: a table, --json with every level and the prediction,
and one line with exit status 2 for a problem the user can fix (exit 1 when the server dies mid-sweep)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers_fake_openai import FakeOpenAIServer, Script

# a dying server must be seen dying within a sweep's timing: under pytest-xdist these run on one worker, one at a
# time, beside no other test of scripted delays (test_loadgen)
pytestmark = pytest.mark.xdist_group("scripted_timing")

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "server", "measure", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


def test_json_has_every_level_and_the_prediction_and_the_table_prints():
    with FakeOpenAIServer(Script(ttft_s=0.03, itl_s=0.01)) as srv:
        common = ("--url", srv.url, "--model", "fake-model", "--concurrency", "1,2", "--requests", "2",
                  "--prompt-tokens", "16", "--output-tokens", "4")
        r = cli(*common, "--json", "--predict-model", "smollm2-135m", "--gpu", "a100", "--weight-dtype", "fp32")
        assert r.returncode == 0, r.stderr
        d = json.loads(r.stdout)
        assert [lv["level"] for lv in d["levels"]] == [1, 2]
        assert all(lv["completed"] == 2 and lv["ttft_p50_ms"] >= 30 for lv in d["levels"])
        assert {"decode_mbu", "prefill_mfu", "overhead_ms", "rows"} <= set(d["prediction"])
        r = cli(*common)
        assert r.returncode == 0 and "ttft_p50_ms" in r.stdout and "output_tok_s" in r.stdout


def test_problems_are_one_line_with_exit_2_and_a_dying_server_exit_1():
    with FakeOpenAIServer(Script(ttft_s=0.01, itl_s=0.01, die_after=2)) as srv:
        for args, words in ((("--model", "nope"), "does not serve a model named 'nope'"),
                            (("--model", "fake-model", "--concurrency", "1,x"), "numbers separated by commas"),
                            (("--model", "fake-model", "--requests", "0"), "requests")):
            r = cli("--url", srv.url, *args)
            assert r.returncode == 2 and words in r.stderr and "Traceback" not in r.stderr
            assert len(r.stderr.strip().splitlines()) == 1
        r = cli("--url", srv.url, "--model", "fake-model", "--concurrency", "1,2", "--requests", "2",
                "--output-tokens", "2")
        assert r.returncode == 1 and "stopped answering" in r.stderr and "Traceback" not in r.stderr
