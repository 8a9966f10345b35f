"""`python -m calculators throughput ... --json`: the fields issue 17 names, and one line for bad input."""
import json

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
