"""Launch commands for a plan: the command line that starts the planned deployment on vLLM (`vllm serve`),
SGLang (`python -m sglang.launch_server`) and TensorRT-LLM (`trtllm-serve`), with a note on every assumption a
command line cannot carry.

A plan is a dict (a row of `planner.plan_rows`, or typed by hand):
    model                 preset name (its Hugging Face repository is used) or a Hugging Face id "org/name"
    device                device name (specs/devices.json); optional, used for the vendor and memory
    gpus, tp, pp, ep, dp  GPUs in all; tensor-, pipeline-, expert-parallel degree; attention data-parallel ranks
                          per server instance (default 1: dp > 1 is the DeepSeek-style layout, attention in dp
                          copies, experts spread over ep GPUs)
    replicas              independent server instances (default gpus / (tp·pp·dp))
    weight_dtype, kv_dtype   bf16 | fp16 | fp8 | int4 | fp4, and bf16 | fp16 | fp8
    batch_cap             most sequences in flight per instance (vLLM max_num_seqs)
    max_batched_tokens    most tokens one step carries (prefill chunk budget), optional
    gpu_memory_utilization   fraction of each GPU's memory the server may use (vLLM's meaning), optional
    max_model_len         longest request (prompt + output), optional
    per_gpu_weight_bytes  optional; with the device, turns the memory fraction into TensorRT-LLM's KV fraction

One instance spans tp·pp·dp GPUs. How each stack spells that layout:
- vLLM: --tensor-parallel-size tp --pipeline-parallel-size pp --data-parallel-size dp, and
  --enable-expert-parallel when ep > 1 (vLLM then sets EP = TP × DP itself; a plan with another EP is noted).
- SGLang (0.5.23): --tp-size is the GPUs of one pipeline stage (tp·dp); --attn-dp-size dp runs attention in dp
  copies of tp GPUs (older releases: --dp dp --enable-dp-attention); --ep-size ep; --pp-size pp.
- TensorRT-LLM: --tp_size tp·dp, --pp_size, --ep_size; attention data parallelism and the KV-cache precision are
  set in the extra options YAML (`enable_attention_dp`, `kv_cache_config.dtype`), passed with --config.

Memory fraction: vLLM's --gpu-memory-utilization is the fraction of the whole GPU the instance may use; SGLang's
--mem-fraction-static the fraction for weights and KV pool (the same number is passed; SGLang keeps the rest for
activations and CUDA graphs); TensorRT-LLM's --kv_cache_free_gpu_memory_fraction is the fraction of the memory
left FREE after the weights that goes to the KV cache, so u·M of a GPU of M bytes holding W bytes of weights
becomes (u·M − W) / (M − W).

Every flag emitted for SGLang and TensorRT-LLM is in the documented argument list kept in specs/stack_flags.json
(with its source); vLLM's command is parsed by vLLM's own argument parser in a test when vLLM is installed.
"""
from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from specs.devices import load_device
from specs.model_config import SpecError
from specs.presets import is_preset, load_preset, preset_document

STACK_FLAGS_FILE = Path(__file__).resolve().parents[2] / "specs" / "stack_flags.json"
STACKS = ("vllm", "sglang", "trtllm")
WEIGHT_DTYPES = ("bf16", "fp16", "fp8", "int4", "fp4")
KV_DTYPES = ("bf16", "fp16", "fp8")
GPUS_PER_NODE = 8
TRTLLM_OPTIONS_FILE = "extra_llm_api_options.yaml"


@dataclass(frozen=True)
class LaunchCommand:
    """One stack's command for one server instance: argv, the files it needs (name -> text), and notes."""
    stack: str
    argv: tuple[str, ...]
    notes: tuple[str, ...] = ()
    files: dict = field(default_factory=dict)
    supported: bool = True

    @property
    def shell(self) -> str:
        """The command as one shell line (files it needs written first with a here-document)."""
        lines = [f"cat > {name} <<'EOF'\n{text.rstrip()}\nEOF" for name, text in self.files.items()]
        return "\n".join(lines + [shlex.join(self.argv)])

    @property
    def shell_lines(self) -> str:
        """The same command with one flag and its value a line (a backslash ends each but the last), so a narrow
        screen breaks it between flags, never inside one."""
        files = [f"cat > {name} <<'EOF'\n{text.rstrip()}\nEOF" for name, text in self.files.items()]
        parts: list[list[str]] = []
        for a in self.argv:
            if a.startswith("-") or not parts:
                parts.append([a])
            else:
                parts[-1].append(a)
        lines = [shlex.join(p) for p in parts]
        return "\n".join(files + [" \\\n  ".join(lines)])

    @property
    def flags(self) -> list[str]:
        """The option names the command uses ('--tp', ...), in order."""
        return [a for a in self.argv if a.startswith("--")]

    def to_dict(self) -> dict:
        return dict(stack=self.stack, argv=list(self.argv), shell=self.shell, notes=list(self.notes),
                    files=dict(self.files), supported=self.supported)


@dataclass(frozen=True)
class _Plan:
    model: str
    hf_id: str
    device: object
    gpus: int
    tp: int
    pp: int
    ep: int
    dp: int
    replicas: int
    weight_dtype: str
    kv_dtype: str
    batch_cap: int
    max_batched_tokens: int | None
    gpu_memory_utilization: float | None
    max_model_len: int | None
    per_gpu_weight_bytes: float | None
    checkpoint_fp8_block: tuple[int, int] | None = None    # the preset's checkpoint is block-scaled FP8 already

    @property
    def instance_gpus(self) -> int:
        return self.tp * self.pp * self.dp


def stack_flags() -> dict:
    """specs/stack_flags.json: each stack's documented argument list with its source."""
    return json.loads(STACK_FLAGS_FILE.read_text(encoding="utf-8"))


def _whole(plan: dict, key: str, default=None, lo: int = 1) -> int | None:
    v = plan.get(key, default)
    if v is None:
        return None
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise SpecError(f"{key.replace('_', ' ')} must be a whole number of at least {lo}, got {v!r}")
    return v


def _hf_id(model) -> str:
    if not isinstance(model, str) or not model.strip():
        raise SpecError("the plan names no model: give a preset name or a Hugging Face id (org/name)")
    m = model.strip()
    if is_preset(m):
        repo = preset_document(m).get("hf_repo")
        if repo:
            return repo
        raise SpecError(f"the preset {m!r} names no Hugging Face repository: give the model's id (org/name)")
    if "/" in m and not any(c.isspace() for c in m):
        return m
    raise SpecError(f"unknown model {m!r}: give a preset name or a Hugging Face id such as "
                    "meta-llama/Llama-3.1-8B-Instruct")


def normalise_plan(plan: dict) -> _Plan:
    """Check a plan dict and fill its defaults; SpecError naming the first bad field."""
    if not isinstance(plan, dict):
        raise SpecError("a plan must be a dict of its fields (model, gpus, tp, ...)")
    hf = _hf_id(plan.get("model"))
    dev = plan.get("device")
    device = load_device(dev) if isinstance(dev, str) and dev.strip() else None
    tp, pp, ep, dp = (_whole(plan, k, 1) for k in ("tp", "pp", "ep", "dp"))
    per = tp * pp * dp
    gpus = _whole(plan, "gpus", None)
    replicas = _whole(plan, "replicas", None)       # None, or absent: gpus / (tp·pp·dp)
    if gpus is None:
        gpus = per * (replicas or 1)
    if replicas is None:
        if gpus % per:
            raise SpecError(f"{gpus} GPUs do not split into instances of TP {tp} × PP {pp} × DP {dp} = {per}")
        replicas = gpus // per
    if replicas * per != gpus:
        raise SpecError(f"{replicas} replicas × (TP {tp} × PP {pp} × DP {dp}) = {replicas * per} GPUs, "
                        f"but the plan has {gpus}")
    if ep > tp * dp:
        raise SpecError(f"EP {ep} is more than the GPUs of one pipeline stage (TP {tp} × DP {dp} = {tp * dp})")
    wd = str(plan.get("weight_dtype", "bf16")).lower()
    kd = str(plan.get("kv_dtype") or ("bf16" if wd not in ("fp16",) else "fp16")).lower()
    if wd not in WEIGHT_DTYPES:
        raise SpecError(f"weight precision must be one of {', '.join(WEIGHT_DTYPES)}, got {wd!r}")
    if kd not in KV_DTYPES:
        raise SpecError(f"KV-cache precision must be one of {', '.join(KV_DTYPES)}, got {kd!r}")
    cap = _whole(plan, "batch_cap", _whole(plan, "max_num_seqs", 256))
    mbt = _whole(plan, "max_batched_tokens", None)
    mml = _whole(plan, "max_model_len", None)
    u = plan.get("gpu_memory_utilization")
    if u is not None and (isinstance(u, bool) or not isinstance(u, (int, float)) or not 0 < u <= 1):
        raise SpecError(f"GPU memory fraction must be a number in (0, 1], got {u!r}")
    w = plan.get("per_gpu_weight_bytes")
    if w is not None and (isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w <= 0):
        raise SpecError(f"per-GPU weight bytes must be a positive number, got {w!r}")
    block = load_preset(plan["model"].strip()).fp8_weight_block if is_preset(plan["model"].strip()) else None
    return _Plan(model=str(plan["model"]).strip(), hf_id=hf, device=device, gpus=gpus, tp=tp, pp=pp, ep=ep, dp=dp,
                 replicas=replicas, weight_dtype=wd, kv_dtype=kd, batch_cap=cap, max_batched_tokens=mbt,
                 gpu_memory_utilization=None if u is None else float(u), max_model_len=mml,
                 per_gpu_weight_bytes=None if w is None else float(w), checkpoint_fp8_block=block)


def trtllm_kv_fraction(u: float, memory_bytes: float, weight_bytes: float) -> float:
    """TensorRT-LLM's KV fraction of the free memory for vLLM's whole-GPU fraction u: (u·M − W) / (M − W)."""
    if weight_bytes >= u * memory_bytes:
        raise SpecError(f"the weights ({weight_bytes / 1e9:.1f} GB per GPU) do not fit in {u:.0%} of "
                        f"{memory_bytes / 1e9:.1f} GB")
    return (u * memory_bytes - weight_bytes) / (memory_bytes - weight_bytes)


def _fmt(x: float) -> str:
    return f"{x:.4g}"


# ------------------------------------------------------------------------------------------- shared notes
def _common_notes(p: _Plan, stack: str) -> list[str]:
    notes = []
    if p.replicas > 1:
        router = {"vllm": "an HTTP load balancer (or vLLM's router)",
                  "sglang": "SGLang's router (python -m sglang_router.launch_router)",
                  "trtllm": "an HTTP load balancer"}[stack]
        notes.append(f"the plan has {p.replicas} replicas: run this command {p.replicas} times, each on its own "
                     f"{p.instance_gpus} GPU(s) (CUDA_VISIBLE_DEVICES) and port, behind {router}")
    if p.instance_gpus > GPUS_PER_NODE:
        how = {"vllm": "a Ray cluster across the nodes (or --nnodes/--node-rank with --data-parallel-size)",
               "sglang": "--nnodes, --node-rank and --dist-init-addr on every node",
               "trtllm": "mpirun or srun with one rank per GPU (trtllm-llmapi-launch)"}[stack]
        notes.append(f"one instance spans {p.instance_gpus} GPUs, more than {GPUS_PER_NODE} per node: it needs {how}")
    if p.weight_dtype == "fp4":
        notes.append("fp4 weights: point the model at an NVFP4 checkpoint quantized beforehand (NVIDIA ModelOpt); "
                     "FP4 runs natively only on Blackwell GPUs")
    if p.weight_dtype == "int4":
        notes.append("int4 weights: point the model at an AWQ or GPTQ int4 checkpoint; the server reads the "
                     "method from its quantization_config")
    if p.max_model_len is None:
        notes.append("no max model length in the plan: the server takes the model's full context and sizes its "
                     "KV cache for it")
    return notes


def _weight_flags(p: _Plan, a: list, notes: list, name: str) -> None:
    """vLLM's and SGLang's weight precision (both spell it the same): --quantization for fp8 and fp4, --dtype for
    16-bit weights, nothing for int4 (read from the checkpoint)."""
    if p.weight_dtype == "fp8" and p.checkpoint_fp8_block:
        rows, cols = p.checkpoint_fp8_block
        notes.append(f"fp8 weights: {p.hf_id} is published in FP8 (scaled per {rows} × {cols} block), so {name} "
                     "reads the method from the checkpoint: no --quantization flag")
    elif p.weight_dtype == "fp8":
        a += ["--quantization", "fp8"]
        notes.append(f"--quantization fp8 quantizes a 16-bit checkpoint when it loads; with a checkpoint quantized "
                     f"beforehand (e.g. an -FP8 repository) drop the flag: {name} reads the method from the "
                     "checkpoint")
    elif p.weight_dtype == "fp4":
        a += ["--quantization", "modelopt_fp4"]
    elif p.weight_dtype in ("bf16", "fp16"):
        a += ["--dtype", "bfloat16" if p.weight_dtype == "bf16" else "float16"]
        if p.checkpoint_fp8_block:
            notes.append(f"{p.weight_dtype} weights: {p.hf_id} is published in FP8, and as published it loads in "
                         "FP8 whatever --dtype says; a 16-bit plan needs a 16-bit conversion of it (point the model "
                         "at that copy)")


# --------------------------------------------------------------------------------------------------- vLLM
def vllm_command(plan: dict, port: int = 8000) -> LaunchCommand:
    """`vllm serve` for one instance of the plan."""
    p = normalise_plan(plan)
    a = ["vllm", "serve", p.hf_id, "--host", "0.0.0.0", "--port", str(port),
         "--tensor-parallel-size", str(p.tp), "--pipeline-parallel-size", str(p.pp)]
    notes = _common_notes(p, "vllm")
    if p.dp > 1:
        a += ["--data-parallel-size", str(p.dp)]
    if p.ep > 1:
        a.append("--enable-expert-parallel")
        if p.ep != p.tp * p.dp:
            notes.append(f"vLLM sets EP = TP × DP = {p.tp * p.dp} when expert parallelism is on; the plan assumed "
                         f"EP {p.ep}")
    per_rank = math.ceil(p.batch_cap / p.dp)
    a += ["--max-num-seqs", str(per_rank)]
    if p.dp > 1:
        notes.append(f"--max-num-seqs is per data-parallel rank: {per_rank} × {p.dp} ranks = the plan's "
                     f"{p.batch_cap} sequences per instance")
    if p.max_batched_tokens:
        a += ["--max-num-batched-tokens", str(p.max_batched_tokens)]
    a += ["--kv-cache-dtype", "fp8" if p.kv_dtype == "fp8" else "auto"]
    _weight_flags(p, a, notes, "vLLM")
    if p.gpu_memory_utilization is not None:
        a += ["--gpu-memory-utilization", _fmt(p.gpu_memory_utilization)]
    if p.max_model_len:
        a += ["--max-model-len", str(p.max_model_len)]
    return LaunchCommand("vllm", tuple(a), tuple(notes))


# ------------------------------------------------------------------------------------------------- SGLang
def sglang_command(plan: dict, port: int = 30000) -> LaunchCommand:
    """`python -m sglang.launch_server` for one instance of the plan."""
    p = normalise_plan(plan)
    a = ["python", "-m", "sglang.launch_server", "--model-path", p.hf_id, "--host", "0.0.0.0", "--port", str(port),
         "--tp-size", str(p.tp * p.dp)]
    notes = _common_notes(p, "sglang")
    if p.pp > 1:
        a += ["--pp-size", str(p.pp)]
    if p.dp > 1:
        a += ["--attn-dp-size", str(p.dp)]
        notes.append(f"--tp-size {p.tp * p.dp} --attn-dp-size {p.dp}: attention runs in {p.dp} copies of TP {p.tp}, "
                     f"the dense and expert layers over all {p.tp * p.dp} GPUs (SGLang before 0.5.23 spells it "
                     f"--tp {p.tp * p.dp} --dp {p.dp} --enable-dp-attention)")
    if p.ep > 1:
        a += ["--ep-size", str(p.ep)]
    a += ["--max-running-requests", str(p.batch_cap)]
    if p.dp > 1:
        notes.append(f"--max-running-requests is for the whole instance: SGLang gives each of the {p.dp} attention "
                     f"copies {p.batch_cap} // {p.dp} = {max(1, p.batch_cap // p.dp)}")
    if p.max_batched_tokens:
        a += ["--chunked-prefill-size", str(p.max_batched_tokens)]
    if p.kv_dtype == "fp8":
        a += ["--kv-cache-dtype", "fp8_e4m3"]
    _weight_flags(p, a, notes, "SGLang")
    if p.gpu_memory_utilization is not None:
        a += ["--mem-fraction-static", _fmt(p.gpu_memory_utilization)]
        notes.append("--mem-fraction-static covers weights and the KV pool only; SGLang keeps the rest of the "
                     "GPU for activations and CUDA graphs, so the KV pool is a little smaller than vLLM's at the "
                     "same fraction")
    if p.max_model_len:
        a += ["--context-length", str(p.max_model_len)]
    return LaunchCommand("sglang", tuple(a), tuple(notes))


# ------------------------------------------------------------------------------------------- TensorRT-LLM
def trtllm_command(plan: dict, port: int = 8000) -> LaunchCommand:
    """`trtllm-serve` (PyTorch backend) for one instance of the plan, with its extra options YAML where needed."""
    p = normalise_plan(plan)
    notes = _common_notes(p, "trtllm")
    supported = True
    if p.device is not None and p.device.vendor != "NVIDIA":
        supported = False
        notes.insert(0, f"TensorRT-LLM runs on NVIDIA GPUs only; {p.device.name} is {p.device.vendor or 'not NVIDIA'}")
    a = ["trtllm-serve", p.hf_id, "--backend", "pytorch", "--host", "0.0.0.0", "--port", str(port),
         "--tp_size", str(p.tp * p.dp), "--pp_size", str(p.pp)]
    if p.ep > 1:
        a += ["--ep_size", str(p.ep)]
    per_rank = math.ceil(p.batch_cap / p.dp) if p.dp > 1 else p.batch_cap
    a += ["--max_batch_size", str(per_rank)]
    if p.dp > 1:
        notes.append(f"with attention data parallelism each rank schedules its own batch: --max_batch_size "
                     f"{per_rank} per rank for the plan's {p.batch_cap} sequences per instance")
    if p.max_batched_tokens:
        a += ["--max_num_tokens", str(p.max_batched_tokens), "--enable_chunked_prefill"]
    if p.max_model_len:
        a += ["--max_seq_len", str(p.max_model_len)]
    if p.gpu_memory_utilization is not None:
        if p.device is not None and p.per_gpu_weight_bytes is not None:
            f = trtllm_kv_fraction(p.gpu_memory_utilization, p.device.memory_bytes, p.per_gpu_weight_bytes)
            a += ["--kv_cache_free_gpu_memory_fraction", f"{math.floor(f * 100) / 100:.2f}"]
            notes.append(f"--kv_cache_free_gpu_memory_fraction is of the memory free after the weights: "
                         f"({_fmt(p.gpu_memory_utilization)} × {p.device.memory_bytes / 1e9:.1f} GB − "
                         f"{p.per_gpu_weight_bytes / 1e9:.1f} GB) / ({p.device.memory_bytes / 1e9:.1f} GB − "
                         f"{p.per_gpu_weight_bytes / 1e9:.1f} GB) = {f:.3f}, rounded down")
        else:
            a += ["--kv_cache_free_gpu_memory_fraction", _fmt(p.gpu_memory_utilization)]
            notes.append("--kv_cache_free_gpu_memory_fraction is of the memory free after the weights, not of the "
                         "whole GPU: the plan's fraction is passed as is (give the device and per-GPU weight "
                         "bytes to convert it)")
    yaml_lines = []
    if p.dp > 1:
        yaml_lines.append("enable_attention_dp: true")
        if p.tp > 1:
            notes.append(f"TensorRT-LLM's attention data parallelism makes every one of the {p.tp * p.dp} GPUs its "
                         f"own attention rank: the plan's attention TP {p.tp} within each of {p.dp} copies is not "
                         f"expressible, the command runs {p.tp * p.dp} attention copies of TP 1")
    if p.kv_dtype == "fp8":
        yaml_lines += ["kv_cache_config:", "  dtype: fp8"]
    if p.weight_dtype in ("fp8", "fp4"):
        notes.append(f"{p.weight_dtype} weights: TensorRT-LLM reads the precision from the checkpoint, so point it "
                     f"at one quantized beforehand (NVIDIA ModelOpt, e.g. an -{p.weight_dtype.upper()} repository)")
    files = {}
    if yaml_lines:
        files[TRTLLM_OPTIONS_FILE] = "\n".join(yaml_lines) + "\n"
        a += ["--config", TRTLLM_OPTIONS_FILE]
    return LaunchCommand("trtllm", tuple(a), tuple(notes), files, supported)


COMMANDS = {"vllm": vllm_command, "sglang": sglang_command, "trtllm": trtllm_command}


def launch_commands(plan: dict) -> dict[str, LaunchCommand]:
    """The three stacks' commands for the plan, by stack name."""
    return {s: f(plan) for s, f in COMMANDS.items()}


def launch_command(plan: dict, stack: str) -> LaunchCommand:
    if stack not in COMMANDS:
        raise SpecError(f"unknown stack {stack!r}; choose one of: {', '.join(STACKS)}")
    return COMMANDS[stack](plan)


def plan_from_row(row: dict, model: str, max_model_len: int | None = None,
                  gpu_memory_utilization: float | None = None) -> dict:
    """A launch plan from a row of `planner.plan_rows` (device, gpus, tp, pp, ep, dp, replicas, batch_cap, weight and
    KV precision, per-GPU weight bytes; a row with dp > 1 counts attention replicas and sequences per replica, a
    launch plan instances and sequences per instance), the model it was planned for, the longest request it sized the KV cache
    for and the memory fraction it assumed."""
    keys = ("device", "gpus", "tp", "pp", "ep", "dp", "replicas", "batch_cap", "weight_dtype", "kv_dtype",
            "per_gpu_weight_bytes", "max_batched_tokens")
    plan = {k: row[k] for k in keys if row.get(k) is not None}
    for k in ("gpus", "tp", "pp", "ep", "dp", "replicas", "batch_cap", "max_batched_tokens"):
        if k in plan:
            plan[k] = int(plan[k])
    if plan.get("dp", 1) > 1:     # the planner counts attention replicas and sequences per replica: dp replicas
        if "replicas" in plan:    # meet in one EP group, one server instance
            plan["replicas"] //= plan["dp"]
        if "batch_cap" in plan:
            plan["batch_cap"] *= plan["dp"]
    plan.update(model=model, max_model_len=max_model_len, gpu_memory_utilization=gpu_memory_utilization)
    return plan


__all__ = ["LaunchCommand", "plan_from_row", "STACKS", "launch_command", "launch_commands", "normalise_plan", "stack_flags",
           "sglang_command", "trtllm_command", "trtllm_kv_fraction", "vllm_command"]
