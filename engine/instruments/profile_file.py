"""A device profile as a file: the format `inference-lab/profile-1` and where a profile came from.

    {"format": "inference-lab/profile-1", "name", "device", "stack": "numpy" | "torch", "stack_version",
     "source": {"kind": "profiler", "version", "detail"}, "provenance": {...},
     "tables": {name: {"columns": [...], "rows": [[...], ...]}}}

Latencies are in milliseconds (column `ms`). A CPU has no datasheet entry, so its profile also carries what the
profiler measured in place of one: `memory_bandwidth_bytes_per_s` and `peak_flops` {"fp32": FLOP/s}.
A run stopped early (budget spent, Ctrl-C) still writes what it measured: provenance `partial` is true and
`not_measured` counts, per table, the planned rows it has no time for.
"""
from __future__ import annotations

import os
import platform
import re
import time
from pathlib import Path

from specs.profile_format import FORMAT, TABLE_COLUMNS, write_profile_doc

PROFILES_DIR = Path(__file__).resolve().parents[2] / "specs" / "profiles"
# the columns of every table the format reads (specs/profile_format.py), in order, and the step table only this
# profiler's GPU script writes (whole forward steps, tools/gpu_step_profile.py: what the ops should sum to)
COLUMNS = {**{name: list(cols) for name, cols in TABLE_COLUMNS.items() if cols != ("ms",)},
           "step": ["model", "dtype", "phase", "batch", "tokens", "context", "layers", "layers_timed", "layer_ms",
                    "lm_head_ms", "ms"]}
MS_DIGITS = 5                       # significant digits kept of each latency


def round_ms(ms: float) -> float:
    return float(f"{ms:.{MS_DIGITS}g}")


def table(name: str, rows: list[tuple]) -> dict:
    """One table in the file's shape: its columns and its rows sorted by key, ms rounded."""
    cols = COLUMNS[name]
    out = []
    for row in sorted(rows, key=lambda r: tuple(str(v) if isinstance(v, str) else v for v in r[:-1])):
        if len(row) != len(cols):
            raise ValueError(f"{name}: a row of {len(row)} values for {len(cols)} columns")
        out.append([*row[:-1], round_ms(row[-1])])
    return {"columns": cols, "rows": out}


def project_version() -> str:
    """The project's version from pyproject.toml (the profiler is part of the project, not a package)."""
    path = PROFILES_DIR.parents[1] / "pyproject.toml"
    m = re.search(r'^version\s*=\s*"([^"]+)"', path.read_text(), re.M) if path.exists() else None
    return m.group(1) if m else "unknown"


def cpu_model() -> str:
    """The processor's model name (/proc/cpuinfo on Linux; what `platform` knows elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def cpu_device_name() -> str:
    """A CPU as a profile's device: 'CPU: AMD EPYC (2 cores)'."""
    return f"CPU: {cpu_model()} ({cores()} cores)"


def blas_libraries() -> list[dict]:
    """The BLAS libraries NumPy (and torch) loaded, as threadpoolctl reports them: which, version, threads."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return []
    keep = ("internal_api", "version", "num_threads", "threading_layer", "architecture")
    return [{k: i.get(k) for k in keep} for i in threadpool_info() if i.get("user_api") == "blas"]


def host() -> dict:
    return {"platform": platform.platform(), "machine": platform.machine(), "python": platform.python_version(),
            "cpus": os.cpu_count()}


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def slug(text: str) -> str:
    """A file-name-safe short form: 'CPU: AMD EPYC (2 cores)' -> 'cpu-amd-epyc-2-cores'."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def profile_document(*, name: str, device: str, stack: str, stack_version: str, detail: str,
                     provenance: dict, tables: dict[str, list[tuple]], datasheet: dict | None = None) -> dict:
    """The whole file as a dict. `datasheet`: memory_bandwidth_bytes_per_s and peak_flops for a device that has
    no entry in specs/devices.json (a CPU)."""
    doc = {"format": FORMAT, "name": name, "device": device, "stack": stack, "stack_version": stack_version}
    if datasheet:                                    # specs.profile_format reads a device's own datasheet here
        doc["datasheet"] = dict(datasheet)
    doc["source"] = {"kind": "profiler", "version": project_version(), "detail": detail}
    doc["provenance"] = provenance
    doc["tables"] = {t: table(t, rows) for t, rows in tables.items() if rows}
    return doc


def write_profile(doc: dict, path: str | Path) -> Path:
    """Write `doc` where specs.profiles reads it (`specs.profile_format.write_profile_doc`: checked as a reader
    checks it first, gzip-compressed when the name ends in .gz; folders made as needed)."""
    return write_profile_doc(doc, Path(path))


def default_path(name: str) -> Path:
    return PROFILES_DIR / f"{name}.json.gz"
