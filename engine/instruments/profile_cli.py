"""`python -m engine profile`: measure this machine op by op and write a device profile.

    python -m engine profile                                   # this CPU through NumPy, quick grid, 60 s
    python -m engine profile --backend torch --device cuda --budget-s 420 --full
    python -m engine profile --backend torch --device cpu --tiny --budget-s 20   # dry run of the torch path

Prints progress (shapes done / planned, elapsed) on stderr. Ctrl-C stops the measuring and still writes what was
measured, marked partial. The file goes to specs/profiles/<name>.json.gz unless --out names another.
"""
from __future__ import annotations

import argparse
import shlex
import sys

from engine.instruments.profile_file import default_path, write_profile
from engine.instruments.profile_grid import tiny_grid


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", choices=("numpy", "torch"), default="numpy")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cpu for numpy, cuda for torch")
    p.add_argument("--budget-s", type=float, default=60.0, help="the whole run's time, peaks included (default 60)")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="the short grid (the default)")
    size.add_argument("--full", action="store_true", help="more M values, shapes and dtypes")
    size.add_argument("--tiny", action="store_true", help="a handful of small shapes: a dry run of the backend")
    p.add_argument("--threads", type=int, default=None, help="BLAS threads for NumPy (default: the library's)")
    p.add_argument("--name", default=None, help="the profile's name (default from the device, e.g. cpu-amd-epyc-2c)")
    p.add_argument("--out", default=None, help="where to write (default specs/profiles/<name>.json.gz)")


def _progress(done: int, total: int, elapsed: float, table: str, key: tuple, ms: float | None) -> None:
    shown = "skipped" if ms is None else f"{ms:.4g} ms"
    line = f"[{done:4d}/{total}] {elapsed:6.1f} s  {table} {' '.join(str(v) for v in key)}: {shown}"
    if sys.stderr.isatty():
        print("\r" + line[:110].ljust(110), end="", file=sys.stderr, flush=True)
    elif done == total or done % 20 == 0:
        print(line, file=sys.stderr, flush=True)


def _backend(args):
    from engine.instruments.profiler import numpy_backend, torch_backend
    device = args.device or ("cpu" if args.backend == "numpy" else "cuda")
    if args.backend == "numpy":
        if device != "cpu":
            raise SystemExit("error: the numpy backend measures the CPU (--device cpu)")
        return numpy_backend()
    return torch_backend(device)


def command_line(args) -> str:
    """The command as run, every choice spelled out (the profile's source.detail)."""
    device = args.device or ("cpu" if args.backend == "numpy" else "cuda")
    size = "--tiny" if args.tiny else ("--full" if args.full else "--quick")
    words = ["python -m engine profile", f"--backend {args.backend}", f"--device {device}",
             f"--budget-s {args.budget_s:g}", size]
    words += [f"--threads {args.threads}"] if args.threads else []
    words += [f"--name {shlex.quote(args.name)}"] if args.name else []
    return " ".join(words)


def run(args) -> int:
    from engine.instruments.profiler import run_profile
    backend = _backend(args)
    detail = command_line(args)
    limits = None
    if args.threads:
        from threadpoolctl import threadpool_limits
        limits = threadpool_limits(args.threads, user_api="blas")
    try:
        doc = run_profile(backend, budget_s=args.budget_s, quick=not args.full,
                          grid=tiny_grid() if args.tiny else None, name=args.name, detail=detail,
                          progress=_progress)
    finally:
        if limits is not None:
            limits.restore_original_limits()
    path = write_profile(doc, args.out or default_path(doc["name"]))
    prov = doc["provenance"]
    rows = sum(len(t["rows"]) for t in doc["tables"].values())
    state = f"partial ({prov['stopped'] or 'time'}: not measured {prov['not_measured']})" if prov["partial"] else "complete"
    print(f"\nwrote {path}: {doc['device']}, {doc['stack']} {doc['stack_version']}, {rows} rows in "
          f"{prov['duration_s']} s, {state}" + (f"; {sum(prov['failed'].values())} failed" if prov["failed"] else ""),
          file=sys.stderr)
    return 0
