"""The chosen plan opened up (issue 27): its formulas with its numbers agree with the planner's row (a vectorised
computation of its own) and with `serve_at` (the scalar one); memory parts add up; the max-throughput formulas
give `max_throughput`'s numbers; the prompt budget is the stack's documented default."""
import json
from pathlib import Path

import pytest

from calculators.multi_gpu.tensor_parallel import Mesh
from calculators.planning.plan_explain import (formula_markdown, max_batched_tokens, memory_and_cost, plan_formulas,
                                               plan_mesh, throughput_formulas)
from calculators.planning.planner import SearchSpace, Workload, plan, plan_rows
from calculators.planning.serve_at import serve_at
from calculators.planning.throughput import max_throughput
from specs.devices import load_device
from specs.presets import load_preset

ROOT = Path(__file__).resolve().parents[2]
L8 = load_preset("llama-3-8b")
WL = Workload(requests_per_s=3.0, prompt_tokens=1000, output_tokens=200, ttft_p99_ms=1500, itl_ms=40,
              prompt_tokens_p99=3000).check()
SPACE = SearchSpace(gpu_counts=(1, 2, 4), tp=(1, 2), pp=(1,), batch_caps=(8, 64), weight_dtypes=("bf16", "fp8"),
                    kv_dtypes=("bf16",))


@pytest.fixture(scope="module")
def chosen():
    dev = load_device("h100")
    row = plan_rows(plan(L8, [dev], WL, SPACE), 1)[0]
    served = serve_at(L8, dev, plan_mesh(row), WL.requests_per_s, WL.prompt_lengths(), WL.output_lengths(),
                      row["weight_dtype"], row["kv_dtype"], None, max_num_seqs=row["batch_cap"])
    return dev, row, served, {e.name: e for e in plan_formulas(L8, dev, row, WL, None, served)}


def test_plan_formulas_give_the_rows_numbers(chosen):
    dev, row, served, f = chosen
    tau = row["step_ms_at_load"]
    lam = 3.0 / row["replicas"]
    assert f["lambda_per_replica"].value == pytest.approx(lam)
    assert f["decode_rows"].value == pytest.approx(lam * 199 * tau / 1000)            # E[O − 1] = 199
    assert f["prompt_tokens_per_step"].value == pytest.approx(lam * 1000 * tau / 1000, rel=1e-3)   # lognormal mean
    # n and p from the planner's τ are the scalar steady state's (serve_at solves it again)
    assert f["decode_rows"].value == pytest.approx(served["decode_rows_per_step"], rel=0.02)
    assert f["prompt_tokens_per_step"].value == pytest.approx(served["prompt_tokens_per_step"], rel=0.02)
    assert f["itl_at_load_ms"].value == pytest.approx(row["itl_at_load_ms"])
    assert f["ttft_p99_ms"].value == pytest.approx(row["ttft_p99_ms"], rel=0.02)
    # the step at the mean load is the max of its terms plus the rest, and never above the mean step (Jensen)
    s = f["step_ms"]
    assert s.value >= max(f["weights_memory_ms"].value, f["gemm_compute_ms"].value) + \
        max(f["kv_memory_ms"].value, f["attention_compute_ms"].value)
    assert s.value <= tau * 1.001
    # cost: the row's numbers, from the price in specs/devices.json
    price = next(d for d in json.loads((ROOT / "specs" / "devices.json").read_text())["devices"]
                 if d["name"] == dev.name)["price_usd_per_hour"]
    assert f["usd_per_million_tokens"].value == pytest.approx(row["gpus"] * price / (3.0 * 1200 * 3600) * 1e6)
    assert f["usd_per_million_tokens"].value == pytest.approx(row["usd_per_million_tokens"])
    assert f["usd_per_million_input_tokens"].value == pytest.approx(row["usd_per_million_input_tokens"], rel=1e-6)
    assert f["usd_per_million_output_tokens"].value == pytest.approx(row["usd_per_million_output_tokens"], rel=1e-6)


def test_formula_lines_carry_the_numbers(chosen):
    dev, row, served, f = chosen
    text = formula_markdown(list(f.values()), {})
    assert f"{row['itl_at_load_ms']:.4g}" in text
    assert "3 ÷ " in f["lambda_per_replica"].formula and f"{row['gpus']:,} × " in f["usd_per_million_tokens"].formula


def test_memory_parts_add_up_and_the_price_scales_with_gpus(chosen):
    dev, row, _, _ = chosen
    m = memory_and_cost(row, 2.5)
    assert m["weights_bytes"] + m["kv_bytes"] + m["other_bytes"] == pytest.approx(row["per_gpu_needed_bytes"])
    assert m["other_bytes"] > 0 and m["free_bytes"] == pytest.approx(row["usable_bytes"] - row["per_gpu_needed_bytes"])
    assert m["usd_per_hour"] == pytest.approx(2.5 * row["gpus"])
    assert memory_and_cost(row, None)["usd_per_hour"] is None


def test_max_batched_tokens_is_the_stacks_documented_default(chosen):
    dev, row, _, _ = chosen
    vllm = json.loads((ROOT / "specs" / "stacks.json").read_text())["stacks"]["vllm"]["scheduler"]
    assert max_batched_tokens(L8, dev, row, WL, "vllm") == vllm["max_num_batched_tokens"]           # 80 GB H100
    assert max_batched_tokens(L8, load_device("a100-80gb"), row, WL, "vllm") == \
        vllm["small_gpu"]["max_num_batched_tokens"]                                                  # an A100
    assert max_batched_tokens(L8, dev, {**row, "max_batched_tokens": 4096}, WL, "vllm") == 4096       # the row's own
    assert max_batched_tokens(L8, dev, {**row, "dp": 2}, WL, "vllm") == vllm["max_num_batched_tokens"]


def test_throughput_formulas_give_max_throughputs_numbers():
    dev, mesh = load_device("h100"), Mesh(tp=2, gpus=4)
    r = max_throughput(L8, dev, mesh, 1000, 200, "fp8", "fp8", "vllm")
    f = {e.name: e for e in throughput_formulas(r, mesh, 1000, 200)}
    assert f["step_ms"].value == pytest.approx(r["step_ms"], rel=1e-9)
    assert f["output_tok_s"].value == pytest.approx(r["output_tok_s"], rel=1e-9)
    assert f["total_tok_s"].value == pytest.approx(r["total_tok_s"], rel=1e-9)
    assert f"{r['max_batch']:,} ÷ " in f["output_tok_s"].formula
