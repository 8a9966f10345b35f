"""Device profiles by name: the project's own files and, when it is installed, aiconfigurator-core's databases.

Names (see `available_profiles`):
- a file in `specs/profiles/` is named by its stem: `specs/profiles/h200-vllm-0.24.0.json.gz` -> "h200-vllm-0.24.0"
  (the profiler's scheme: device slug, stack, stack version);
- aiconfigurator-core's are "<device slug>-<stack>-<version>@aiconfigurator-core-<package version>", e.g.
  "h200-vllm-0.24.0@aiconfigurator-core-0.12.0" (one per GPU the project knows, framework and version with a
  GEMM table; `specs.aiconfigurator_source`).
Each profile is read once per process (`load_profile` is cached; a file is read again only when it changes).
The format itself and its validation: `specs.profile_format`.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from specs import aiconfigurator_source as aic
from specs.devices import load_device
from specs.model_config import SpecError
from specs.profile_format import Profile, read_profile_file, write_profile_file

PROFILES_DIR = Path(__file__).parent / "profiles"
SUFFIXES = (".json", ".json.gz")

__all__ = ["Profile", "available_profiles", "load_profile", "profile_for", "save_profile"]


def _stem(path: Path) -> str:
    return next(path.name[: -len(s)] for s in SUFFIXES if path.name.endswith(s))


def _files(directory: Path) -> dict[str, Path]:
    if not directory.is_dir():
        return {}
    return {_stem(p): p for p in sorted(directory.iterdir()) if p.name.endswith(SUFFIXES)}


@lru_cache(maxsize=1)
def _shipped() -> dict[str, tuple[str, str, str]]:
    version = aic.package_version()
    return {aic.profile_name(g, f, v, version): (g, f, v) for g, f, v in aic.shipped()}


def available_profiles(directory: Path | None = None) -> list[str]:
    """Every profile name: the files in `directory` (default specs/profiles/), then aiconfigurator-core's."""
    return [*_files(directory or PROFILES_DIR), *_shipped()]


@lru_cache(maxsize=None)
def _read_file(path: str, mtime_ns: int) -> Profile:
    return read_profile_file(Path(path))


@lru_cache(maxsize=None)
def _convert(gpu: str, framework: str, version: str) -> Profile:
    return aic.convert(gpu, framework, version)


def load_profile(path_or_name: str | Path, directory: Path | None = None) -> Profile:
    """A profile from a file path, or by name (`available_profiles`); SpecError naming what exists otherwise."""
    if isinstance(path_or_name, Path) or str(path_or_name).endswith(SUFFIXES):
        p = Path(path_or_name)
        try:
            return _read_file(str(p.resolve()), p.stat().st_mtime_ns)
        except FileNotFoundError:
            raise SpecError(f"profile file {p} does not exist") from None
    name = str(path_or_name)
    files = _files(directory or PROFILES_DIR)
    if name in files:
        return load_profile(files[name])
    if name in _shipped():
        return _convert(*_shipped()[name])
    have = available_profiles(directory)
    raise SpecError(f"unknown profile {name!r}; available: {', '.join(have) or 'none'}"
                    + ("" if aic.package_dir() else f" (install {aic.PACKAGE} for its measured databases: "
                                                     "pip install -r requirements-profiles.txt)"))


def save_profile(profile: Profile, path: str | Path) -> Path:
    """Write a profile as JSON (.json) or gzip-compressed JSON (.json.gz); returns the path."""
    p = Path(path)
    if not p.name.endswith(SUFFIXES):
        raise SpecError(f"a profile file name must end in .json or .json.gz, got {p.name!r}")
    return write_profile_file(profile, p)


def _matches(name: str, device: str, stack: str, directory: Path | None) -> tuple[bool, str]:
    """(whether the profile is of this device and stack, its stack version), read without loading parquet."""
    if name in _shipped():
        gpu, framework, version = _shipped()[name]
        return aic.GPU_DEVICES[gpu] == device and framework == stack, version
    p = load_profile(name, directory)
    return p.device == device and p.stack == stack, p.stack_version


def profile_for(device: str, stack: str, version: str | None = None, directory: Path | None = None) -> Profile | None:
    """The profile of `device` (any name specs.devices knows) on `stack` at `version`, or at its newest version
    when `version` is None; None when there is none. A project file wins over aiconfigurator-core's for the same
    version (it was measured here)."""
    try:
        want = load_device(device).name
    except SpecError:
        want = str(device)
    stack = str(stack).lower()
    found = []
    for order, name in enumerate(available_profiles(directory)):
        ok, v = _matches(name, want, stack, directory)
        if ok and (version is None or v == str(version)):
            found.append((aic.version_key(v), -order, name))
    return load_profile(max(found)[2], directory) if found else None


def profiled_devices(stack: str, directory: Path | None = None) -> list[str]:
    """The devices some profile measured on `stack`, read without loading any parquet (project files are read:
    they are small)."""
    stack = str(stack).lower()
    out = []
    for name in available_profiles(directory):
        if name in _shipped():
            gpu, framework, _ = _shipped()[name]
            dev = aic.GPU_DEVICES[gpu]
        else:
            p = load_profile(name, directory)
            dev, framework = p.device, p.stack
        if framework == stack and dev not in out:
            out.append(dev)
    return out
