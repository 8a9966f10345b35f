"""`python -m calculators memory|floor|roofline|latency ...`: JSON keys, tables, and one-line errors (exit 2)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from calculators.cli import main
from specs.presets import preset_document

ROOT = Path(__file__).resolve().parents[2]


def run_main(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_floor_json_reproduces_the_a100_floor(capsys):
    code, out, err = run_main(capsys, "floor", "--model", "tinyllama", "--gpu", "a100", "--tokens", "300",
                              "--weight-dtype", "fp16", "--json")
    assert code == 0 and err == ""
    d = json.loads(out)
    for key in ("params", "weight_bytes", "kv_bytes_per_token", "kv_bytes", "bandwidth_floor_ms", "formulas"):
        assert key in d
    assert d["kv_bytes_per_token"] == 22528 and round(d["bandwidth_floor_ms"], 2) == 1.42
    assert d["kv_bytes"] == 300 * 22528 and d["formulas"]["kv_bytes_per_token"].startswith("2 × 22 × 4 × 64 × 2")


def test_latency_json_has_ttft_itl_and_total(capsys):
    code, out, _ = run_main(capsys, "latency", "--model", "llama-3-8b", "--gpu", "h100", "--tokens", "1000",
                            "--output-tokens", "200", "--json")
    d = json.loads(out)
    assert code == 0
    for key in ("ttft_ms", "itl_ms", "total_ms", "ideal_ttft_ms", "ideal_itl_ms", "bandwidth_floor_ms"):
        assert d[key] > 0
    # JSON floats summed in another order: default rel 1e-6
    assert d["total_ms"] == pytest.approx(d["ttft_ms"] + 199 * d["itl_ms"])
    assert d["itl_ms"] >= d["ideal_itl_ms"] and d["usd_per_million_tokens"] > 0


def test_memory_json_says_what_fits(capsys):
    code, out, _ = run_main(capsys, "memory", "--model", "llama-2-70b", "--gpu", "a100-80gb", "--weight-dtype",
                            "int4", "--tokens", "4096", "--batch", "2", "--json")
    d = json.loads(out)
    assert code == 0 and d["fits"] is True and d["max_batch"] >= 2 and d["kv_dtype"] == "bf16"
    assert d["total_bytes"] == pytest.approx(d["resident_weight_bytes"] + d["kv_bytes"] + d["activation_bytes"])
    # INT4 checkpoint: the two 32,000 × 8,192 tables stay 16-bit, 1.5 B more per entry than the 0.5 B of INT4
    assert d["resident_weight_bytes"] - d["weight_bytes"] == pytest.approx(2 * 32_000 * 8192 * 1.5)


def test_roofline_json_has_a_layer_table_and_totals(capsys):
    code, out, _ = run_main(capsys, "roofline", "--model", "qwen3-next", "--gpu", "h100", "--tokens", "2048",
                            "--phase", "prefill", "--json")
    d = json.loads(out)
    assert code == 0 and d["phase"] == "prefill" and d["totals"]["flops"] > 0
    assert {"name", "shape", "flops", "bytes_read", "intensity_flop_per_byte", "bound"} <= set(d["layer_rows"][0])


@pytest.mark.parametrize("command", ["memory", "floor", "roofline", "latency"])
def test_human_readable_tables(capsys, command):
    code, out, err = run_main(capsys, command, "--model", "deepseek-v2", "--gpu", "mi300x", "--tokens", "4096")
    assert code == 0 and err == "" and out.startswith(f"{command}: DeepSeek-V2 on MI300X")
    assert "formulas:" in out and "kv_bytes_per_token" in out


def test_model_may_be_a_config_json_path(capsys, tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(preset_document("gemma-2-9b")["config"]))
    code, out, _ = run_main(capsys, "floor", "--model", str(p), "--gpu", "l4", "--json")
    assert code == 0 and json.loads(out)["params"] > 9e9


@pytest.mark.parametrize("argv, words", [
    (["floor", "--model", "no-such-model"], "unknown model preset"),
    (["floor", "--gpu", "voodoo"], "unknown device"),
    (["floor", "--weight-dtype", "int3"], "unknown precision"),
    (["floor", "--tokens", "-5"], "at least 1"),
    (["floor", "--tokens", "many"], "whole number"),
    (["teleport"], "invalid choice"),
    (["floor", "--model", "missing/config.json"], "not found"),
])
def test_bad_input_is_one_line_on_stderr_and_exit_2(capsys, argv, words):
    with pytest.raises(SystemExit) as e:
        code = main(argv)
        raise SystemExit(code)
    out, err = capsys.readouterr()
    assert e.value.code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: ") and words in err and "Traceback" not in err


@pytest.mark.parametrize("content, words", [("[1, 2]", "JSON object"), ("{oops", "not valid JSON"),
                                            ('{"model_type": "t5", "d_model": 512}', "encoder-decoder")])
def test_bad_config_files(capsys, tmp_path, content, words):
    p = tmp_path / "config.json"
    p.write_text(content)
    code, out, err = run_main(capsys, "memory", "--model", str(p))
    assert code == 2 and out == "" and err.count("\n") == 1 and words in err


def test_python_dash_m_entry_point():
    ok = subprocess.run([sys.executable, "-m", "calculators", "floor", "--json"], cwd=ROOT, capture_output=True,
                        text=True, timeout=60)
    assert ok.returncode == 0 and json.loads(ok.stdout)["bandwidth_floor_ms"] > 0
    bad = subprocess.run([sys.executable, "-m", "calculators", "floor", "--gpu", "nope"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stdout == "" and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr
