"""What every command of `python -m calculators` shares: a parser that fails in one line, argument types, model and
device look-up, and printing a result as a table or JSON (bad input: one line on stderr, exit status 2).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from calculators.units import dtype_name
from specs.devices import Device, load_device, measure_this_machine
from specs.model_config import ModelConfig, SpecError
from specs.presets import load_preset
from specs.hf_config import config_from_json_file

THIS_MACHINE = {"this", "this-machine", "thismachine", "local", "measure"}


class Parser(argparse.ArgumentParser):
    def error(self, message):                      # one line, exit 2 (argparse prints usage + 2 lines)
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _whole(s: str, minimum: int, words: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {s!r}") from None
    if v < minimum:
        raise argparse.ArgumentTypeError(f"must be {words}, got {v}")
    return v


def positive_int(s: str) -> int:
    return _whole(s, 1, "at least 1")


def nonneg_int(s: str) -> int:
    return _whole(s, 0, "0 or more")


def dtype_arg(allowed):
    def parse(s: str) -> str:
        try:
            d = dtype_name(s)
        except SpecError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        if d not in allowed:
            raise argparse.ArgumentTypeError(f"{s!r} is not one of {', '.join(allowed)}")
        return d
    return parse


def nonneg_float(s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {s!r}") from None
    if not math.isfinite(v) or v < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {s}")
    return v


def load_model(spec: str) -> ModelConfig:
    p = Path(spec)
    if spec.endswith(".json") or p.is_file():
        return config_from_json_file(p)
    if p.is_dir() and (p / "config.json").is_file():
        return config_from_json_file(p / "config.json")
    return load_preset(spec)


def load_gpu(spec: str) -> Device:
    if spec.strip().lower() in THIS_MACHINE:
        return measure_this_machine(seconds_budget=1.0)
    return load_device(spec)


def run_and_print(run, render, args, failed=lambda out: False) -> int:
    """Run one command: its result as JSON (--json) or a table; a SpecError/ValueError/OSError/KeyError is one line."""
    try:
        out = run(args)
    except (SpecError, ValueError, OSError, KeyError) as e:
        msg = str(e).replace("\n", " ").strip() or type(e).__name__
        print(f"error: {msg}", file=sys.stderr)
        return 2
    try:
        print(json.dumps(out, indent=2, default=float) if args.json else render(out))
    except BrokenPipeError:        # e.g. piped into `head`
        pass
    return 1 if failed(out) else 0


def add_profile_arg(p: argparse.ArgumentParser) -> None:
    """--profile: which measured kernels price the step (calculators.planning.measured_step.resolve_profile)."""
    from calculators.planning.measured_step import PROFILE_ENV, default_profile_choice
    p.add_argument("--profile", default=default_profile_choice(),
                   help="kernels measured on the device and stack that price each op of a step: 'auto' (the "
                        "newest profile for this GPU and stack where one is installed: pip install -r "
                        "requirements-profiles.txt; the nearest profiled GPU's for one nothing measured), 'none' "
                        f"(the closed form with the stack's fitted efficiencies), or a profile name or file; "
                        f"default: ${PROFILE_ENV} or auto")


def profile_of(args, device: Device, config: ModelConfig):
    """(profile or None, the sentence saying what prices the step) for a command's --profile and --stack."""
    from calculators.planning.measured_step import resolve_profile
    from specs.stacks import load_stack
    return resolve_profile(getattr(args, "profile", "auto"), device, load_stack(args.stack).full_key, config,
                           getattr(args, "weight_dtype", None))
