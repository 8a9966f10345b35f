"""Device profiles: the measured latency of each operation a serving step runs, on one (device, stack, version).

A `Profile` holds tables of measurements, one per operation, each a dict column -> 1-D NumPy array (all the same
length). Latencies are in milliseconds (column `ms`); sizes are plain counts (tokens, elements) or bytes where the
column says so. Two sources write the same format: the adapter of aiconfigurator-core's databases
(`specs.aiconfigurator_source`) and the project's own profiler.

Tables and the columns each must have (extra columns are allowed and kept, e.g. `kernel`):

- gemm: one weight GEMM, [m, k] x [k, n]: dtype, m, n, k, ms
- context_attention: prefill of `batch` sequences of `tokens` new tokens after `prefix` cached ones: dtype,
  kv_dtype, batch, tokens, prefix, heads, kv_heads, head_dim, window, ms
- generation_attention: one decode step of `batch` sequences each reading `context` KV positions: dtype, kv_dtype,
  batch, context, heads, kv_heads, head_dim, window, ms
- moe: one MoE layer's grouped GEMMs over `tokens` tokens: dtype, tokens, hidden, inter, experts, topk, tp, ep,
  distribution, ms
- allreduce: one all-reduce of `bytes` bytes across `gpus` GPUs, algorithm family `kind`: dtype, bytes, gpus, kind, ms
- allgather, reduce_scatter (optional): one all-gather (or reduce-scatter) whose whole buffer is `bytes` bytes
  across `gpus` GPUs: dtype, bytes, gpus, kind, ms
- mla_context, mla_generation, moe_a2a (optional): the source's own columns (see the adapter) and ms

`window` 0 means full attention. `dtype` strings are the project's precision names where one exists (bf16, fp16,
fp32, fp8, fp4, int8) and the source's name otherwise (fp8_block, int4_wo, w4a16_mxfp4, ...).

The file (JSON, or gzip-compressed JSON when the name ends in .gz):
    {"format": "inference-lab/profile-1", "name", "device", "stack", "stack_version",
     "source": {"kind": "aiconfigurator-core" | "profiler", "version", "detail"},
     "provenance": {...}, "datasheet": {...} (optional),
     "tables": {table: {"columns": [...], "rows": [[...], ...]}}}
`device` is a name `specs.devices.load_device` knows ("H200", "h100-sxm"); a device it does not know needs its own
`datasheet`: {"memory_bandwidth_bytes_per_s": float, "peak_flops": {precision: FLOP/s}}. A table name outside the
list above is ignored with a warning (a newer profiler may add tables an older planner does not read). Anything
else wrong (format tag, missing key, ragged rows, a latency that is not a positive number, truncated file) is one
SpecError naming the file and the problem.
"""
from __future__ import annotations

import gzip
import json
import math
import warnings
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from specs.devices import Device, load_device, precision_name
from specs.model_config import SpecError

FORMAT = "inference-lab/profile-1"
SOURCE_KINDS = ("aiconfigurator-core", "profiler")
TEXT_COLUMNS = frozenset({"dtype", "kv_dtype", "distribution", "kind", "kernel", "phase"})
TABLE_COLUMNS = {
    "gemm": ("dtype", "m", "n", "k", "ms"),
    "context_attention": ("dtype", "kv_dtype", "batch", "tokens", "prefix", "heads", "kv_heads", "head_dim",
                          "window", "ms"),
    "generation_attention": ("dtype", "kv_dtype", "batch", "context", "heads", "kv_heads", "head_dim", "window",
                             "ms"),
    "moe": ("dtype", "tokens", "hidden", "inter", "experts", "topk", "tp", "ep", "distribution", "ms"),
    "allreduce": ("dtype", "bytes", "gpus", "kind", "ms"),
    "allgather": ("dtype", "bytes", "gpus", "kind", "ms"),
    "reduce_scatter": ("dtype", "bytes", "gpus", "kind", "ms"),
    "mla_context": ("ms",),
    "mla_generation": ("ms",),
    "moe_a2a": ("ms",),
    # a gated-delta-rule layer (Qwen3-Next's linear attention) on one GPU: the causal conv and the delta rule of a
    # phase (context: `tokens` per sequence; generation: one token) for `batch` sequences, heads after TP
    "linear_attention": ("phase", "batch", "tokens", "k_heads", "v_heads", "head_k_dim", "head_v_dim", "ms"),
    "launch": ("kind", "ms"),        # the profiler's floor of a tiny op (dispatch or kernel launch)
}
NUMBER_COLUMNS = frozenset(c for cols in TABLE_COLUMNS.values() for c in cols) - TEXT_COLUMNS


@dataclass(frozen=True)
class Profile:
    """One (device, stack, version)'s measured op latencies; `tables[name][column]` is a 1-D array."""
    name: str
    device: str                      # the project's device name (specs/devices.json), or the profile's own
    stack: str                       # vllm, trtllm, sglang, numpy, torch, ...
    stack_version: str
    source: dict                     # kind, version, detail (which files)
    provenance: dict                 # device as measured, driver, library versions, date, host
    tables: dict                     # table -> column -> np.ndarray
    datasheet: dict = field(default_factory=dict)   # memory_bandwidth_bytes_per_s, peak_flops (unknown devices)

    def table(self, name: str) -> dict:
        """The columns of one table; SpecError naming the tables it has when it lacks this one."""
        if name not in self.tables:
            raise SpecError(f"profile {self.name!r} has no {name!r} table (it has: {', '.join(self.tables)})")
        return self.tables[name]

    def rows(self, name: str) -> int:
        return len(self.table(name)["ms"])

    def device_spec(self) -> Device:
        """The datasheet beside the measurements: devices.json's entry, else the profile's own datasheet."""
        return resolve_device(self.device, self.datasheet, self.name)


def resolve_device(device: str, datasheet: dict, where: str) -> Device:
    try:
        return load_device(device)
    except SpecError:
        pass
    bw, peaks = (datasheet or {}).get("memory_bandwidth_bytes_per_s"), (datasheet or {}).get("peak_flops")
    if not _positive(bw) or not isinstance(peaks, dict) or not peaks or not all(map(_positive, peaks.values())):
        raise SpecError(f"{where}: unknown device {device!r} and no usable datasheet in the profile; name a device "
                        "specs/devices.json knows, or add datasheet.memory_bandwidth_bytes_per_s (a positive number) "
                        "and datasheet.peak_flops {precision: FLOP/s}")
    memory = datasheet.get("memory_bytes")
    try:
        peaks = {precision_name(k): float(v) for k, v in peaks.items()}
    except SpecError as e:
        raise SpecError(f"{where}: datasheet.peak_flops: {e}") from None
    return Device(name=device, memory_bytes=float(memory) if _positive(memory) else 0.0,
                  memory_bandwidth_bytes_per_s=float(bw), peak_flops=peaks, kind="custom",
                  source=f"the datasheet in profile {where}")


def _positive(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def _types(values) -> tuple:
    """(all strings, all numbers, all whole numbers) of a column's values: a list (JSON's types; bool is not a
    number) or an array (its dtype)."""
    if isinstance(values, np.ndarray) and values.dtype.kind in "iufUS":
        k = values.dtype.kind
        return k in "US", k in "iuf", k in "iu"
    types = set(map(type, values.tolist() if isinstance(values, np.ndarray) else values))
    number = all(issubclass(t, (int, float)) and not issubclass(t, bool) for t in types)
    return (all(issubclass(t, str) for t in types), number,
            number and all(issubclass(t, (int, np.integer)) for t in types))


def _column(values, column: str, where: str) -> np.ndarray:
    """A table column (a list or an array) as an array: text columns as str, the others as int64 (all whole) or
    float64."""
    text, number, whole = _types(values)
    if column in TEXT_COLUMNS or (column not in NUMBER_COLUMNS and text):
        if not text:
            raise SpecError(f"{where}: column {column!r} must hold strings")
        return np.array(values, dtype=str)
    if not number:
        raise SpecError(f"{where}: column {column!r} must hold numbers")
    arr = np.array(values, dtype=float)
    if not np.all(np.isfinite(arr)):
        raise SpecError(f"{where}: column {column!r} holds NaN or infinity")
    if column == "ms" and not np.all(arr > 0):
        bad = int(np.argmax(~(arr > 0)))
        raise SpecError(f"{where}: latency ms must be positive, row {bad} has {values[bad]!r}")
    if column != "ms" and np.any(arr < 0):
        raise SpecError(f"{where}: column {column!r} must not be negative")
    return arr.astype(np.int64) if whole else arr


def tables_from_doc(doc: dict, where: str) -> dict:
    """{"gemm": {"columns": [...], "rows": [[...]]}, ...} -> {"gemm": {column: array}}, validated."""
    if not isinstance(doc, dict) or not doc:
        raise SpecError(f"{where}: 'tables' must be a non-empty object of tables")
    columns = {}
    for name, t in doc.items():
        at = f"{where}: table {name!r}"
        if not isinstance(t, dict) or not isinstance(t.get("columns"), list) or not isinstance(t.get("rows"), list):
            raise SpecError(f"{at} must have a 'columns' list and a 'rows' list")
        cols, rows = t["columns"], t["rows"]
        if len(set(map(str, cols))) != len(cols):
            raise SpecError(f"{at} names a column twice")
        for i, r in enumerate(rows):
            if not isinstance(r, list) or len(r) != len(cols):
                raise SpecError(f"{at} is ragged: row {i} has {len(r) if isinstance(r, list) else 'no list of'} "
                                f"values for {len(cols)} columns")
        columns[name] = {str(c): [r[j] for r in rows] for j, c in enumerate(cols)}
    return tables_from_columns(columns, where)


def tables_from_columns(tables: dict, where: str) -> dict:
    """{"gemm": {column: list of values}} -> {"gemm": {column: read-only array}}, validated: known tables only
    (others ignored with a warning), their required columns, equal lengths, at least one row, positive ms."""
    unknown = sorted(set(tables) - set(TABLE_COLUMNS))
    if unknown:
        warnings.warn(f"{where}: ignoring tables this version does not read: {', '.join(unknown)}", stacklevel=3)
    out = {}
    for name in (t for t in TABLE_COLUMNS if t in tables):
        at, cols = f"{where}: table {name!r}", tables[name]
        missing = [c for c in TABLE_COLUMNS[name] if c not in cols]
        if missing:
            raise SpecError(f"{at} lacks columns {', '.join(missing)}")
        lengths = {c: len(v) for c, v in cols.items()}
        if len(set(lengths.values())) != 1:
            raise SpecError(f"{at} is ragged: column lengths differ ({lengths})")
        if not lengths["ms"]:
            raise SpecError(f"{at} has no rows")
        out[name] = {c: _frozen(_column(v if isinstance(v, np.ndarray) else list(v), c, at))
                     for c, v in cols.items()}
    if not out:
        raise SpecError(f"{where}: no table this version reads (expected some of: {', '.join(TABLE_COLUMNS)})")
    return out


def _frozen(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False          # a loaded profile is shared by every caller in the process (cached)
    return a


def tables_to_doc(tables: dict) -> dict:
    """The inverse of `tables_from_doc` (numbers as JSON ints where the column is integral)."""
    out = {}
    for name, cols in tables.items():
        names = list(cols)
        lists = [np.asarray(cols[c]).tolist() for c in names]
        out[name] = {"columns": names, "rows": [list(r) for r in zip(*lists)]}
    return out


def profile_from_doc(doc, where: str) -> Profile:
    if not isinstance(doc, dict):
        raise SpecError(f"{where}: a profile must be a JSON object")
    if doc.get("format") != FORMAT:
        raise SpecError(f"{where}: format tag is {doc.get('format')!r}, expected {FORMAT!r}")
    missing = [k for k in ("name", "device", "stack", "stack_version", "source", "provenance", "tables")
               if k not in doc]
    if missing:
        raise SpecError(f"{where}: missing keys {', '.join(missing)}")
    src = doc["source"]
    if not isinstance(src, dict) or src.get("kind") not in SOURCE_KINDS or not src.get("version"):
        raise SpecError(f"{where}: source must say its kind ({' or '.join(SOURCE_KINDS)}) and version")
    if not isinstance(doc["provenance"], dict):
        raise SpecError(f"{where}: provenance must be an object")
    datasheet = doc.get("datasheet") or {}
    if not isinstance(datasheet, dict):
        raise SpecError(f"{where}: datasheet must be an object")
    device = resolve_device(str(doc["device"]), datasheet, where)
    known = device.kind != "custom"
    return Profile(name=str(doc["name"]), device=device.name if known else str(doc["device"]),
                   stack=str(doc["stack"]).lower(), stack_version=str(doc["stack_version"]), source=dict(src),
                   provenance=dict(doc["provenance"]), tables=tables_from_doc(doc["tables"], where),
                   datasheet=dict(datasheet))


def profile_to_doc(p: Profile) -> dict:
    doc = {"format": FORMAT, "name": p.name, "device": p.device, "stack": p.stack, "stack_version": p.stack_version,
           "source": p.source, "provenance": p.provenance, "tables": tables_to_doc(p.tables)}
    if p.datasheet:
        doc["datasheet"] = p.datasheet
    return doc


def read_profile_file(path: Path) -> Profile:
    """A profile from a .json or .json.gz file; one SpecError for a missing, truncated or malformed file."""
    path = Path(path)
    try:
        raw = gzip.decompress(path.read_bytes()) if path.name.endswith(".gz") else path.read_bytes()
        doc = json.loads(raw.decode("utf-8"))
    except FileNotFoundError:
        raise SpecError(f"profile file {path} does not exist") from None
    except (OSError, EOFError, zlib.error) as e:
        raise SpecError(f"profile file {path} is not a readable gzip file (truncated?): {e}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SpecError(f"profile file {path} is not valid JSON (truncated?): {e}") from None
    return profile_from_doc(doc, str(path))


def write_profile_file(p: Profile, path: Path) -> Path:
    """Write `p` as JSON (gzip-compressed when the name ends in .gz); returns the path. The document is checked as
    a reader would check it first, so a file this writes always loads."""
    return write_profile_doc(profile_to_doc(p), path)


def write_profile_doc(doc: dict, path: Path) -> Path:
    """Write a profile document (the file's JSON as a dict) after checking it as a reader would (`profile_from_doc`;
    tables this version does not read are kept in the file), gzip-compressed when the name ends in .gz."""
    path = Path(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        profile_from_doc(doc, f"profile {doc.get('name')!r} (not written to {path})")
    data = json.dumps(doc, separators=(",", ":")).encode("utf-8")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(data, mtime=0) if path.name.endswith(".gz") else data)
    return path

