"""The adapter from NVIDIA aiconfigurator-core's measured databases to the project's `Profile` format.

Source: the PyPI wheel `aiconfigurator-core` (Apache-2.0; pinned 0.12.0 in requirements-profiles.txt;
https://github.com/ai-dynamo/aiconfigurator). Its files stay in the installed package and are read from there:
`systems/data/<gpu>/<family>/<framework>/<version>/<op>_perf.parquet`, one row per measured shape, latency in ms,
`systems/<gpu>.yaml` (its datasheet, kept in the profile's provenance) and each folder's collection_meta.yaml
(how and when it was collected). pyarrow, pandas and PyYAML are imported here only, inside the functions, so the
project runs without them and without the package.

One profile per (GPU, framework, version) that has a GEMM table, for the GPUs the project knows (`GPU_DEVICES`).
Every other table comes from the same version, or else the newest older version that has it (the package's own
backward-fill rule; never a newer one); `source["detail"]` lists the file behind each table.

Kernels: one row per shape, its kernel named in column `kernel`. Most shapes were measured with one kernel, the one
the framework dispatches to for that shape (vLLM's fp8_block GEMMs split between DeepGEMM, CUTLASS and FlashInfer by
shape). Where several measured the same shape, attention keeps the framework's default kernel on that GPU generation
when the package records one (systems/attention_lane_defaults.yaml: SGLang 0.5.14 runs triton on SM100, not the
faster trtllm_mha it also measured), and every other case keeps the fastest.

How each table maps (`_TABLES`; latency -> ms everywhere; dtypes through `_DTYPES`, bfloat16 -> bf16):
- gemm <- gemm/gemm_perf: gemm_dtype, m, n, k.
- context_attention <- attention/context_attention_perf: attn_dtype, kv_cache_dtype, batch_size, isl -> tokens,
  step -> prefix (0 in every shipped table), num_heads, num_key_value_heads, head_dim, window_size (0 where an
  older table has none). Rows with beam_width != 1 are dropped.
- generation_attention <- attention/generation_attention_perf: context = isl + step. The tables store isl = 1 and
  step = 2^j - 1, so context = 2^j KV positions: the package's own table view (`sdk/engine_table_view.py`,
  `_generation_attention_data`) keys its last level by isl + step, and latency grows with it.
- moe <- moe/moe_perf: moe_dtype, num_tokens, hidden_size, inter_size, num_experts, topk, moe_tp_size, moe_ep_size,
  distribution. Every distribution is kept ("balanced", "power_law_1.01", "power_law_1.2": the router's skew);
  a consumer without a reason to choose reads "balanced".
- allreduce <- comm/custom_allreduce_perf (the stack's own kernels) + comm/nccl/<v>/nccl_perf (op all_reduce; the
  NCCL version the GPU's yaml names, else the newest). message_size counts ELEMENTS, so bytes = message_size x the
  dtype's size: the package factors it as tokens x hidden elements (`sdk/perf_database.py` `_factor_message_size`),
  and NCCL's int8 rows take ~0.66x the time of its half rows at the same message_size. `kind`: custom_graph /
  custom_eager (vLLM, SGLang under CUDA graphs or eager), custom (TensorRT-LLM), mnnvl_oneshot / mnnvl_twoshot
  (TensorRT-LLM across NVLink domains), nccl. Kinds are kept apart, never min-ed: which one runs is the stack's choice.
- mla_context / mla_generation <- mla/context_mla_perf, generation_mla_perf (the attention kernel alone, scope
  "kernel") where the framework has them, else mla_context_module_perf / mla_generation_module_perf (the whole MLA
  module with its projections, scope "module", with gemm_dtype and model). Columns: dtype, kv_dtype, batch, tokens
  and prefix (context) or context (generation, isl + step), heads (the source's num_heads), tp, scope, kernel, ms.
- allgather, reduce_scatter <- comm/nccl/<v>/nccl_perf (ops all_gather, reduce_scatter; the all-reduce's NCCL
  version): dtype, bytes (the whole gathered or reduced buffer: message_size elements x the dtype's size), gpus,
  kind nccl. The MoE exchange of attention data-parallel ranks (`Stack.moe_dp_comm`) runs on them.
- moe_a2a <- comm/moe_a2a_perf (DeepEP dispatch/combine): backend, phase, dtype, ep, nodes, hidden, topk, experts,
  tokens, sms, ms.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import re
from pathlib import Path

from specs.devices import load_device
from specs.model_config import SpecError
from specs.profile_format import Profile, tables_from_columns

PACKAGE = "aiconfigurator-core"
# aiconfigurator's GPU ids -> the project's device names (specs/devices.json)
GPU_DEVICES = {"h100_sxm": "H100 SXM", "h100_pcie": "H100 PCIe", "h200_sxm": "H200", "b200_sxm": "B200",
               "b300_sxm": "B300", "gb200": "GB200", "gb300": "GB300", "a100_sxm": "A100 SXM 80GB", "l40s": "L40S",
               "l4": "L4"}
FRAMEWORKS = ("vllm", "trtllm", "sglang")            # its frameworks are the project's stack keys
_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "nvfp4": "fp4",
           "sq": "int8"}                             # sq: SmoothQuant W8A8; other names pass through
_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "int8": 1, "fp8": 1}
_ALLREDUCE_KINDS = {"vllm_custom_graph": "custom_graph", "vllm_custom_eager": "custom_eager",
                    "sglang_customallreduce_graph": "custom_graph", "sglang_customallreduce_eager": "custom_eager",
                    "trtllm": "custom", "trtllm_mnnvl_oneshot": "mnnvl_oneshot",
                    "trtllm_mnnvl_twoshot": "mnnvl_twoshot", "nccl": "nccl"}


def package_dir() -> Path | None:
    """Where the installed package lives (found without importing it), or None."""
    spec = importlib.util.find_spec("aiconfigurator_core")
    return Path(next(iter(spec.submodule_search_locations))) if spec and spec.submodule_search_locations else None


def package_version() -> str | None:
    try:
        return importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return None


def version_key(v: str) -> tuple:
    """'1.3.0rc20' < '1.3.0' < '1.3.1': release numbers, then a pre-release sorts before its release."""
    m = re.match(r"(\d+(?:\.\d+)*)(.*)", str(v))
    if not m:
        return ((), 0, (), str(v))
    nums = tuple(int(x) for x in m.group(1).split("."))
    rest = m.group(2)
    return (nums, 0 if re.match(r"\.?(a|b|rc|dev)", rest) else 1, tuple(int(x) for x in re.findall(r"\d+", rest)), rest)


def _versions(data: Path, gpu: str, family: str, framework: str, filename: str) -> list[str]:
    base = data / gpu / family / framework
    if not base.is_dir():
        return []
    return sorted((d.name for d in base.iterdir() if (d / filename).is_file()), key=version_key)


def readers_installed() -> bool:
    """Whether the libraries that read the package's files are here (its own dependencies)."""
    return all(importlib.util.find_spec(m) is not None for m in ("pyarrow", "pandas", "yaml"))


def shipped(root: Path | None = None) -> list[tuple[str, str, str]]:
    """(gpu id, framework, version) of every profile the package can give for a device the project knows; none
    when the package or the libraries that read it are missing."""
    root = root or package_dir()
    if root is None or not (root / "systems" / "data").is_dir() or not readers_installed():
        return []
    data = root / "systems" / "data"
    return [(gpu, fw, v) for gpu in GPU_DEVICES for fw in FRAMEWORKS
            for v in _versions(data, gpu, "gemm", fw, "gemm_perf.parquet")]


def profile_name(gpu: str, framework: str, version: str, package: str | None = None) -> str:
    """'h200-vllm-0.24.0@aiconfigurator-core-0.12.0': device slug, stack, its version, the source and its version."""
    slug = re.sub(r"[^a-z0-9]+", "-", GPU_DEVICES.get(gpu, gpu).lower()).strip("-")
    return f"{slug}-{framework}-{version}@{PACKAGE}-{package or package_version() or 'unknown'}"


def _pick(data: Path, gpu: str, family: str, framework: str, filename: str, version: str) -> Path | None:
    """The file of this version, else of the newest older version that has one (never a newer one)."""
    older = [v for v in _versions(data, gpu, family, framework, filename) if version_key(v) <= version_key(version)]
    return data / gpu / family / framework / older[-1] / filename if older else None


def _read(path: Path):
    import pyarrow.parquet as pq                      # only here: the project runs without pyarrow
    try:
        return pq.read_table(path).to_pandas()
    except Exception as e:                            # a broken file in the package: one message, no traceback
        raise SpecError(f"cannot read {path}: {e}") from None


def _dtype(s):
    return s.astype(str).str.lower().map(lambda x: _DTYPES.get(x, x))


def _fastest(df, keys: list[str], prefer: str | None = None):
    """One row per shape: the `prefer`red kernel's where it measured the shape, else the fastest kernel's."""
    df = df.assign(_other=df.kernel != prefer).sort_values(["_other", "ms"], kind="stable")
    return df.drop_duplicates(keys, keep="first").sort_values(keys, kind="stable").drop(columns="_other")


def _gemm(df):
    out = df.assign(dtype=_dtype(df.gemm_dtype), kernel=df.kernel_source, ms=df.latency)
    return _fastest(out, ["dtype", "m", "n", "k"])[["dtype", "m", "n", "k", "kernel", "ms"]]


def _attention(df, generation: bool, prefer: str | None = None):
    df = df[df.beam_width == 1] if "beam_width" in df else df
    out = df.assign(dtype=_dtype(df.attn_dtype), kv_dtype=_dtype(df.kv_cache_dtype), batch=df.batch_size,
                    heads=df.num_heads, kv_heads=df.num_key_value_heads,
                    window=df.window_size if "window_size" in df else 0,     # older tables: full attention only
                    kernel=df.kernel_source, ms=df.latency)
    lengths = ["context"] if generation else ["tokens", "prefix"]
    out = out.assign(context=df.isl + df.step) if generation else out.assign(tokens=df.isl, prefix=df.step)
    keys = ["dtype", "kv_dtype", "batch", *lengths, "heads", "kv_heads", "head_dim", "window"]
    return _fastest(out, keys, prefer)[keys + ["kernel", "ms"]]


# kernels of an opt-in mode the stack does not run by default: TensorRT-LLM's min-latency fused MoE (the PyTorch
# backend's `enable_min_latency`, off unless asked for; aiconfigurator prices TensorRT-LLM's MoE from its CUTLASS
# rows). Read only for a shape no other kernel measured.
OPT_IN_KERNELS = ("min_latency",)


def _moe(df):
    opt_in = df.kernel_source.astype(str).str.contains("|".join(OPT_IN_KERNELS))
    keys_raw = ["moe_dtype", "num_tokens", "hidden_size", "inter_size", "num_experts", "topk", "moe_tp_size",
                "moe_ep_size", "distribution"]
    covered = df[~opt_in].set_index(keys_raw).index
    df = df[~(opt_in & df.set_index(keys_raw).index.isin(covered))]
    out = df.assign(dtype=_dtype(df.moe_dtype), tokens=df.num_tokens, hidden=df.hidden_size, inter=df.inter_size,
                    experts=df.num_experts, tp=df.moe_tp_size, ep=df.moe_ep_size, kernel=df.kernel_source,
                    ms=df.latency)
    keys = ["dtype", "tokens", "hidden", "inter", "experts", "topk", "tp", "ep", "distribution"]
    return _fastest(out, keys)[keys + ["kernel", "ms"]]


def _allreduce(custom, nccl):
    import pandas as pd
    parts = []
    for df, dtype_col in ((custom, "allreduce_dtype"), (nccl, "nccl_dtype")):
        if df is None:
            continue
        df = df[df.op_name == "all_reduce"] if "op_name" in df else df
        dtype = _dtype(df[dtype_col])
        unknown = sorted(set(dtype) - set(_BYTES))
        if unknown:
            raise SpecError(f"all-reduce rows in dtype {', '.join(unknown)}: element size unknown")
        kind = df.kernel_source.str.lower().map(lambda k: _ALLREDUCE_KINDS.get(k, k))
        parts.append(df.assign(dtype=dtype, bytes=df.message_size * dtype.map(_BYTES), gpus=df.num_gpus, kind=kind,
                               kernel=df.kernel_source, ms=df.latency))
    out = pd.concat(parts)
    keys = ["dtype", "bytes", "gpus", "kind"]
    return _fastest(out, keys)[keys + ["kernel", "ms"]]


def _ring_collective(nccl, op: str):
    """NCCL's `op` rows (all_gather, reduce_scatter) as (dtype, bytes, gpus, kind, kernel, ms); message_size
    counts the ELEMENTS of the whole gathered (or reduced) buffer, as for the all-reduce: at 64 Mi elements on
    8 B200 an all-gather takes 0.54x the all-reduce's time, the ratio of their ring traffic, (n - 1)/n against
    2 (n - 1)/n of the same buffer."""
    df = nccl[nccl.op_name == op]
    if df.empty:
        return None
    dtype = _dtype(df.nccl_dtype)
    unknown = sorted(set(dtype) - set(_BYTES))
    if unknown:
        raise SpecError(f"{op} rows in dtype {', '.join(unknown)}: element size unknown")
    out = df.assign(dtype=dtype, bytes=df.message_size * dtype.map(_BYTES), gpus=df.num_gpus, kind="nccl",
                    kernel=df.kernel_source, ms=df.latency)
    keys = ["dtype", "bytes", "gpus", "kind"]
    return _fastest(out, keys)[keys + ["kernel", "ms"]]


def _mla(df, generation: bool, scope: str):
    out = df.assign(dtype=_dtype(df.mla_dtype), kv_dtype=_dtype(df.kv_cache_dtype), batch=df.batch_size,
                    heads=df.num_heads, tp=df.tp_size, scope=scope, kernel=df.kernel_source, ms=df.latency)
    out = out.assign(context=df.isl + df.step) if generation else out.assign(tokens=df.isl, prefix=df.step)
    keys = ["dtype", "kv_dtype", "batch", *(["context"] if generation else ["tokens", "prefix"]), "heads", "tp"]
    if scope == "module":
        out = out.assign(gemm_dtype=_dtype(df.gemm_type), model=df.model)
        keys += ["gemm_dtype", "model"]
    return _fastest(out, keys)[keys + ["scope", "kernel", "ms"]]


def _moe_a2a(df):
    """DeepEP's dispatch and combine. Their latency is in MICROseconds, unlike the other tables' milliseconds: the
    file keeps it beside its parts in µs (`transmit_us`, `notify_us`), and 128 tokens of 7,168 values take 60-110
    there, as DeepEP's own intranode figures."""
    out = df.assign(backend=df.comm_backend, dtype=df.comm_dtype, ep=df.ep_size, nodes=df.node_num,
                    hidden=df.hidden_size, experts=df.num_experts, tokens=df.num_tokens, kernel=df.kernel_source,
                    ms=df.latency / 1e3)
    keys = ["backend", "phase", "dtype", "ep", "nodes", "hidden", "topk", "experts", "tokens", "sms"]
    return _fastest(out, keys)[keys + ["kernel", "ms"]]


def _gdn(df):
    """A gated-delta-rule layer per shape and phase: its two kernels (the causal conv and the delta rule) summed,
    each the fastest measured at the shape (several models share a shape; the hidden size does not enter them)."""
    keys = ["phase", "batch", "tokens", "k_heads", "v_heads", "head_k_dim", "head_v_dim"]
    out = df.assign(phase=df.phase.astype(str), batch=df.batch_size, tokens=df.seq_len, k_heads=df.num_k_heads,
                    v_heads=df.num_v_heads, ms=df.latency)
    best = out.groupby(keys + ["kernel_source"], as_index=False)["ms"].min()
    layer = best.groupby(keys, as_index=False).agg(ms=("ms", "sum"), kernels=("kernel_source", "nunique"))
    return layer[layer.kernels == 2][keys + ["ms"]]


# table -> (family, file, converter); the MLA tables list the kernel file first, the module file second
_TABLES = {
    "gemm": [("gemm", "gemm_perf.parquet", _gemm)],
    "context_attention": [("attention", "context_attention_perf.parquet", lambda d, k: _attention(d, False, k))],
    "generation_attention": [("attention", "generation_attention_perf.parquet", lambda d, k: _attention(d, True, k))],
    "moe": [("moe", "moe_perf.parquet", _moe)],
    "mla_context": [("mla", "context_mla_perf.parquet", lambda d: _mla(d, False, "kernel")),
                    ("mla", "mla_context_module_perf.parquet", lambda d: _mla(d, False, "module"))],
    "mla_generation": [("mla", "generation_mla_perf.parquet", lambda d: _mla(d, True, "kernel")),
                       ("mla", "mla_generation_module_perf.parquet", lambda d: _mla(d, True, "module"))],
    "moe_a2a": [("comm", "moe_a2a_perf.parquet", _moe_a2a)],
    "linear_attention": [("linear_attention", "gdn_perf.parquet", _gdn)],
}


def _converted(conv, frames: list, path: Path):
    """conv(*frames), with a column the converter needs and the file lacks as one SpecError naming the file."""
    try:
        return conv(*frames)
    except (KeyError, AttributeError) as e:
        raise SpecError(f"{path}: not the columns this adapter reads ({e})") from None


def _yaml(path: Path) -> dict:
    if not path.is_file():
        return {}
    import yaml                                       # a dependency of aiconfigurator-core
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise SpecError(f"cannot read {path}: {e}") from None
    return doc if isinstance(doc, dict) else {}


def _datasheet(system: dict) -> dict:
    """The package's own datasheet (systems/<gpu>.yaml `gpu`) in the profile's units."""
    gpu = system.get("gpu") or {}
    peaks = {p: float(gpu[f"{k}_tc_flops"]) for p, k in (("bf16", "bfloat16"), ("fp8", "fp8"), ("int8", "int8"),
                                                         ("fp4", "fp4")) if gpu.get(f"{k}_tc_flops")}
    out = {"memory_bandwidth_bytes_per_s": float(gpu["mem_bw"])} if gpu.get("mem_bw") else {}
    if gpu.get("mem_capacity"):
        out["memory_bytes"] = float(gpu["mem_capacity"])
    return {**out, "peak_flops": peaks} if peaks else out


def _default_attention_kernel(root: Path, framework: str, version: str, system: dict) -> str | None:
    """The attention kernel the framework runs by default on this GPU generation, where the package records one
    (systems/attention_lane_defaults.yaml: SGLang 0.5.14 runs fa3 on SM90, triton on SM100/103); None otherwise."""
    lanes = (_yaml(root / "systems" / "attention_lane_defaults.yaml").get(framework) or {}).get(version) or {}
    lane = lanes.get((system.get("gpu") or {}).get("sm_version"))
    return None if lane in (None, "default") else str(lane)


def _nccl_file(data: Path, gpu: str, system: dict) -> Path | None:
    versions = _versions(data, gpu, "comm", "nccl", "nccl_perf.parquet")
    named = str((system.get("misc") or {}).get("nccl_version", ""))
    v = named if named in versions else (versions[-1] if versions else None)
    return data / gpu / "comm" / "nccl" / v / "nccl_perf.parquet" if v else None


def _meta(path: Path) -> dict:
    """What the folder's collection_meta.yaml says about how the table was collected."""
    meta = _yaml(path.parent / "collection_meta.yaml")
    runtime = meta.get("runtime") or {}
    dates = sorted({str(c.get("collected_at")) for t in (meta.get("tables") or {}).values() if isinstance(t, dict)
                    for c in (t.get("collections") or []) if isinstance(c, dict) and c.get("collected_at")})
    return {k: v for k, v in {"provenance": meta.get("provenance"), "image": runtime.get("image"),
                              "collected_at": dates}.items() if v}


def convert(gpu: str, framework: str, version: str, root: Path | None = None) -> Profile:
    """The profile of one (gpu id, framework, version) the package ships, e.g. ('h200_sxm', 'vllm', '0.24.0')."""
    root = root or package_dir()
    if root is None or not readers_installed():
        raise SpecError(f"{PACKAGE} and the libraries that read it (pyarrow, pandas, PyYAML) are needed: "
                        "pip install -r requirements-profiles.txt")
    data = root / "systems" / "data"
    if _pick(data, gpu, "gemm", framework, "gemm_perf.parquet", version) != \
            data / gpu / "gemm" / framework / version / "gemm_perf.parquet":
        raise SpecError(f"{PACKAGE} has no GEMM table for {gpu}/{framework}/{version}")
    system = _yaml(root / "systems" / f"{gpu}.yaml")
    lane = _default_attention_kernel(root, framework, version, system)
    tables, files, measured_on = {}, [], set()
    for table, options in _TABLES.items():
        for family, filename, conv in options:
            path = _pick(data, gpu, family, framework, filename, version)
            if path is not None:
                df = _read(path)
                tables[table] = _converted(conv, [df, lane] if family == "attention" else [df], path)
                measured_on |= set(df.device.astype(str)) if "device" in df else set()
                files.append(path)
                break
    custom = _pick(data, gpu, "comm", framework, "custom_allreduce_perf.parquet", version)
    nccl = _nccl_file(data, gpu, system)
    if custom or nccl:
        tables["allreduce"] = _converted(_allreduce, [custom and _read(custom), nccl and _read(nccl)], custom or nccl)
        files += [p for p in (custom, nccl) if p]
    for table, op in (("allgather", "all_gather"), ("reduce_scatter", "reduce_scatter")):
        ring = _converted(lambda df: _ring_collective(df, op), [_read(nccl)], nccl) if nccl else None
        if ring is not None:
            tables[table] = ring
    rel = [str(p.relative_to(root)) for p in files]
    pkg = package_version() or "unknown"
    columns = {name: {c: df[c].tolist() for c in df.columns} for name, df in tables.items()}
    device = GPU_DEVICES.get(gpu, gpu)
    datasheet = _datasheet(system)
    return Profile(name=profile_name(gpu, framework, version, pkg),
                   device=load_device(device).name if gpu in GPU_DEVICES else device, stack=framework,
                   stack_version=version, source={"kind": PACKAGE, "version": pkg, "detail": ", ".join(rel)},
                   provenance={"device": ", ".join(sorted(measured_on)), "gpu_id": gpu,
                               "nccl": nccl.parent.name if nccl else None, "datasheet": datasheet,
                               "tables": {p: _meta(root / p) for p in rel}},
                   tables=tables_from_columns(columns, f"{PACKAGE} {gpu}/{framework}/{version}"),
                   datasheet=datasheet if gpu not in GPU_DEVICES else {})
