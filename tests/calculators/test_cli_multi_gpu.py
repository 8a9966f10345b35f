"""`python -m calculators memory|floor|latency --gpus/--tp/--pp/--ep` and `plan`: JSON fields, verdicts, reasons."""
import json

import pytest

from calculators.cli import main


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("command", ["memory", "floor", "latency"])
def test_parallel_json_fields(capsys, command):
    tokens = 8000 if command == "latency" else 8192        # a request's prompt + 192 output tokens fit the window
    code, out, err = run(capsys, command, "--model", "llama-3-70b", "--gpu", "h100", "--tokens", str(tokens),
                         "--output-tokens", "192", "--batch", "32", "--weight-dtype", "fp8", "--kv-dtype", "fp8",
                         "--gpus", "8", "--tp", "8", "--json")
    d = json.loads(out)
    assert code == 0 and err == ""
    for key in ("per_gpu_weight_bytes", "per_gpu_kv_bytes", "fits", "allreduce_ms_per_token", "allreduce_ms_prefill"):
        assert key in d
    # 8 KV heads over TP 8: one head per GPU; 32 sequences × `tokens` tokens × 80 layers × 2 × 128 × 1 B
    assert d["per_gpu_kv_bytes"] == 32 * tokens * 80 * 2 * 128
    assert d["fits"] is True and d["gpus"] == 8 and d["replicas"] == 1 and d["max_batch_per_replica"] >= 32
    # 160 all-reduces of a [32, 8,192] bf16 activation = 512 KiB: vLLM (the default stack) runs its two-shot kernel
    # above 256 KiB on 8 GPUs: 2 × 4.5 µs + 2 × 7/8 × 524,288 B / 450 GB/s per direction
    two_shot = 2 * 4.5e-3 + 2 * 7 / 8 * 32 * 8192 * 2 / 450e9 * 1e3
    assert d["allreduce_ms_per_token"] == pytest.approx(160 * two_shot)
    # plain NCCL picks its ring here: alpha 6.6 + 14 × 0.6 µs, the same bytes on the wire
    code, out, err = run(capsys, command, "--model", "llama-3-70b", "--gpu", "h100", "--tokens", str(tokens),
                         "--output-tokens", "192", "--batch", "32", "--weight-dtype", "fp8", "--kv-dtype", "fp8",
                         "--gpus", "8", "--tp", "8", "--json", "--stack", "nccl")
    ring = (6.6 + 14 * 0.6) * 1e-3 + 2 * 7 / 8 * 32 * 8192 * 2 / 450e9 * 1e3
    assert json.loads(out)["allreduce_ms_per_token"] == pytest.approx(160 * ring)


def test_floor_per_gpu_is_the_busiest_gpus_bytes_over_bandwidth(capsys):
    # 003's TP rule (weights / tp / bandwidth) on the real Llama-2-70B preset at INT4 on A100s (1,555 GB/s);
    # --quantize-embeddings makes every weight 4-bit, one token of context keeps the KV read at 2·8·128·80·2 B
    from calculators.sizing.params import total_params
    from specs.presets import load_preset
    n = total_params(load_preset("llama-2-70b"))
    for tp in (2, 4, 8):
        code, out, _ = run(capsys, "floor", "--model", "llama-2-70b", "--gpu", "a100", "--weight-dtype", "int4",
                           "--tokens", "1", "--tp", str(tp), "--quantize-embeddings", "--json")
        d = json.loads(out)
        assert d["per_gpu_bandwidth_floor_ms"] == pytest.approx(
            (n * 0.5 / tp + 2 * 8 * 128 * 80 * 2 / tp) / 1555e9 * 1e3, rel=1e-9)


def test_data_parallel_replicas_and_one_gpu_default(capsys):
    code, out, _ = run(capsys, "latency", "--model", "tinyllama", "--gpus", "4", "--tp", "2", "--tokens", "1000",
                       "--json")
    d = json.loads(out)
    assert code == 0 and d["replicas"] == 2 and d["tp"] == 2
    code, out, _ = run(capsys, "memory", "--model", "tinyllama", "--json")
    d = json.loads(out)
    assert d["gpus"] == 1 and d["gpu_memory_utilization"] == 0.9 and d["fits"] is True


def test_does_not_fit_says_by_how_much(capsys):
    code, out, _ = run(capsys, "latency", "--model", "deepseek-v2", "--gpu", "a100", "--tokens", "4096", "--json")
    d = json.loads(out)
    assert code == 0 and d["fits"] is False and d["fits_in_memory"] is False
    assert "short" in d["fit_verdict"] and "Would fit with" in d["fit_verdict"]


def test_a_tp_that_does_not_divide_the_heads_is_one_line_exit_2(capsys):
    code, out, err = run(capsys, "memory", "--model", "llama-3-70b", "--tp", "3")
    assert code == 2 and out == "" and "does not divide" in err and "Traceback" not in err


def test_plan_json_returns_ranked_plans_with_their_binding_constraint(capsys):
    code, out, err = run(capsys, "plan", "--model", "llama-3-8b", "--gpu", "h100,l40s", "--tokens", "1000",
                         "--output-tokens", "200", "--rate", "2", "--ttft-ms", "1500", "--itl-ms", "40", "--json")
    d = json.loads(out)
    assert code == 0 and d["plans"] and d["no_feasible_plan"] is None and d["candidates"] >= 10_000
    costs = [p["usd_per_million_tokens"] for p in d["plans"]]
    assert costs == sorted(costs)
    assert all(p["binding"] in ("memory", "bandwidth", "compute", "communication", "queueing") for p in d["plans"])
    assert all(p["itl_ms"] <= 40 and p["ttft_p99_ms"] <= 1500 for p in d["plans"])


@pytest.mark.parametrize("argv, words", [(("--rate", "0"), "rate"), (("--itl-ms", "0.0001"), "itl"),
                                         (("--model", "llama-3.1-405b", "--gpu", "t4"), "memory")])
def test_plan_without_a_feasible_plan_gives_the_reason(capsys, argv, words):
    base = {"--model": "llama-3-8b", "--gpu": "h100"}
    args = list(argv)
    for k, v in base.items():
        if k not in args:
            args += [k, v]
    code, out, err = run(capsys, "plan", *args, "--json")
    d = json.loads(out)
    assert code == 1 and d["plans"] == [] and d["no_feasible_plan"].startswith("no feasible plan")
    assert words in d["no_feasible_plan"]
    code, out, err = run(capsys, "plan", *args)
    assert code == 1 and "no feasible plan" in out and "Traceback" not in out + err
