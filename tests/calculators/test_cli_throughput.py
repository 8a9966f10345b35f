"""`python -m calculators throughput ... --json`: the fields issue 17 names, and one line for bad input."""
import json

import pytest

from calculators.cli import main


def test_throughput_json_has_the_named_fields(capsys):
    code = main(["throughput", "--model", "llama-3-70b", "--gpu", "h100", "--gpus", "8", "--tp", "2",
                 "--weight-dtype", "fp8", "--kv-dtype", "fp8", "--prompt-tokens", "1000", "--output-tokens", "1000",
                 "--stack", "trtllm", "--gpu-memory-utilization", "0.9", "--json"])
    out, err = capsys.readouterr()
    d = json.loads(out)
    assert code == 0 and err == ""
    for k in ("output_tok_s", "total_tok_s", "max_batch", "step_ms", "binds", "batch_binding", "step_bound"):
        assert k in d
    assert d["replicas"] == 4 and d["total_tok_s"] == 2 * d["output_tok_s"]


def test_bad_stack_and_bad_ep_are_one_line(capsys):
    assert main(["throughput", "--model", "llama-3-8b", "--gpu", "h100", "--prompt-tokens", "10",
                 "--output-tokens", "10", "--stack", "tgi"]) == 2
    assert "unknown serving stack 'tgi'" in capsys.readouterr().err
    assert main(["throughput", "--model", "qwen3-30b-a3b", "--gpu", "h100", "--gpus", "6", "--ep", "6",
                 "--prompt-tokens", "10", "--output-tokens", "10"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "EP 6 does not divide" in err


def test_caps_trtllm_bench_runs_under_the_caps_that_tool_picks_and_a_given_cap_still_wins(capsys):
    """Qwen3-235B FP8 on 8 × H200, 1,000 / 1,000: trtllm-bench's rule gives 2,304 sequences and 4,608 tokens
    (worked in tests/calculators/test_trtllm_bench_caps.py) where the server defaults are 2,048 and 8,192."""
    base = ["throughput", "--model", "qwen3-235b-a22b", "--gpu", "h200", "--tp", "8", "--ep", "8",
            "--weight-dtype", "fp8", "--kv-dtype", "fp8", "--prompt-tokens", "1000", "--output-tokens", "1000",
            "--stack", "trtllm", "--json"]
    got = {}
    for extra in ([], ["--caps", "trtllm-bench"], ["--caps", "trtllm-bench", "--max-num-seqs", "1000"]):
        assert main(base + extra) == 0
        got[tuple(extra)] = json.loads(capsys.readouterr().out)
    stack, rule, given = got.values()
    assert (stack["max_num_seqs"], stack["max_num_batched_tokens"], stack["caps_from"]) == (2048, 8192, "stack")
    assert (rule["max_num_seqs"], rule["max_num_batched_tokens"], rule["caps_from"]) == (2304, 4608, "trtllm-bench")
    assert (given["max_num_seqs"], given["max_num_batched_tokens"]) == (1000, 4608)
    assert main([a if a != "trtllm" else "vllm" for a in base] + ["--caps", "trtllm-bench"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "use it with --stack trtllm" in err
    with pytest.raises(SystemExit) as bad:
        main(base[:-1] + ["--caps", "sglang"])
    assert bad.value.code == 2 and "invalid choice: 'sglang'" in capsys.readouterr().err


def test_caps_vllm_bench_takes_the_llm_class_defaults_that_vllm_bench_throughput_runs(capsys):
    """vllm/engine/arg_utils.py get_batch_defaults: the LLM class takes 16,384 tokens a step and 1,024 sequences on a
    GPU of 70 GiB or more that is not an A100 (the API server 8,192), and 8,192 and 256 otherwise (the server 2,048
    and 256). A cap given on the command line wins; another stack is one line."""
    def run(*extra):
        assert main(["throughput", "--model", "llama-3.1-8b", "--prompt-tokens", "2000", "--output-tokens", "200",
                     "--json", *extra]) == 0
        return json.loads(capsys.readouterr().out)
    got = run("--gpu", "h100", "--caps", "vllm-bench")
    assert (got["max_num_seqs"], got["max_num_batched_tokens"]) == (1024, 16384)
    assert run("--gpu", "h100")["max_num_batched_tokens"] == 8192
    got = run("--gpu", "a100-80gb", "--caps", "vllm-bench")
    assert (got["max_num_seqs"], got["max_num_batched_tokens"]) == (256, 8192)
    assert run("--gpu", "h100", "--caps", "vllm-bench", "--max-num-batched-tokens", "4096")["max_num_batched_tokens"] \
        == 4096
    assert main(["throughput", "--model", "llama-3.1-8b", "--gpu", "h100", "--prompt-tokens", "2000",
                 "--output-tokens", "200", "--stack", "trtllm", "--caps", "vllm-bench"]) == 2
    assert "use it with --stack vllm" in capsys.readouterr().err
