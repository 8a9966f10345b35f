"""Classroom mode: what a browser may make the shared server open, download or allocate.

Off by default (single user on their own machine: any local path, any Hub repository, any preset). A teacher
serving a class turns it on with environment variables read at start:

    INFERENCE_LAB_CLASSROOM=1                 turn classroom mode on
    INFERENCE_LAB_MODELS_DIR=~/class-models   local model paths (and config.json paths) only inside this folder;
                                              unset: no local paths at all
    INFERENCE_LAB_HUB_ALLOW="HuggingFaceTB/*,TinyLlama/*"
                                              Hub repositories that may be fetched (fnmatch patterns, comma
                                              separated; "" = none). Default: the two small model families above
    INFERENCE_LAB_HUB_MAX_GB=2.5              largest download allowed, in GB (10⁹ bytes) of files fetched
    INFERENCE_LAB_RANDOM_MAX_GB=2             largest random-weights model, in GB of float32 weights
    INFERENCE_LAB_TEACHER_KEY=...             the key a browser types (Class page, sidebar) to use the teacher's
                                              controls: simulated students, where the class generates, starting
                                              the engine server. Unset: no browser has them in classroom mode
    INFERENCE_LAB_HUB_DISK_MAX_GB=10          the Hub cache's total size after a download, in GB

Teacher-only actions are checked here, on the server, for the session asking (`TeacherSessions.require`): a
student's session is refused whatever its browser sends, not only shown fewer buttons.

Every refusal is a `ModelError` that says what was refused, which rule refused it and who can change the rule.
"""
from __future__ import annotations

import fnmatch
import hmac
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

from engine.errors import ModelError

ENV_CLASSROOM = "INFERENCE_LAB_CLASSROOM"
ENV_MODELS_DIR = "INFERENCE_LAB_MODELS_DIR"
ENV_HUB_ALLOW = "INFERENCE_LAB_HUB_ALLOW"
ENV_HUB_MAX_GB = "INFERENCE_LAB_HUB_MAX_GB"
ENV_RANDOM_MAX_GB = "INFERENCE_LAB_RANDOM_MAX_GB"
ENV_TEACHER_KEY = "INFERENCE_LAB_TEACHER_KEY"
ENV_HUB_DISK_MAX_GB = "INFERENCE_LAB_HUB_DISK_MAX_GB"
DEFAULT_HUB_DISK_MAX_GB = 10.0
DEFAULT_HUB_ALLOW = ("HuggingFaceTB/*", "TinyLlama/*")
DEFAULT_HUB_MAX_GB = 2.5
DEFAULT_RANDOM_MAX_GB = 2.0
_TEACHER = "the teacher can change this when starting the server (see docs/classroom.md, Classroom mode)"


def _gb(env: Mapping[str, str], name: str, default: float) -> float:
    text = env.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise ModelError(f"{name}={text!r} is not a number of GB") from None
    if not value >= 0:
        raise ModelError(f"{name} must be ≥ 0 GB, got {text!r}")
    return value


@dataclass(frozen=True)
class ClassroomPolicy:
    enabled: bool = False
    models_dir: Path | None = None
    hub_allow: tuple[str, ...] = DEFAULT_HUB_ALLOW
    hub_max_bytes: float = DEFAULT_HUB_MAX_GB * 1e9
    random_max_bytes: float = DEFAULT_RANDOM_MAX_GB * 1e9
    teacher_key: str | None = None
    hub_disk_max_bytes: float = DEFAULT_HUB_DISK_MAX_GB * 1e9

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "ClassroomPolicy":
        env = os.environ if env is None else env
        if env.get(ENV_CLASSROOM, "").strip().lower() not in ("1", "true", "yes", "on"):
            return cls(enabled=False, hub_disk_max_bytes=_gb(env, ENV_HUB_DISK_MAX_GB, DEFAULT_HUB_DISK_MAX_GB) * 1e9)
        folder = env.get(ENV_MODELS_DIR, "").strip()
        allow = env.get(ENV_HUB_ALLOW)
        patterns = DEFAULT_HUB_ALLOW if allow is None else tuple(p.strip() for p in allow.split(",") if p.strip())
        return cls(enabled=True,
                   models_dir=Path(folder).expanduser().resolve() if folder else None,
                   hub_allow=patterns,
                   hub_max_bytes=_gb(env, ENV_HUB_MAX_GB, DEFAULT_HUB_MAX_GB) * 1e9,
                   random_max_bytes=_gb(env, ENV_RANDOM_MAX_GB, DEFAULT_RANDOM_MAX_GB) * 1e9,
                   teacher_key=env.get(ENV_TEACHER_KEY, "").strip() or None,
                   hub_disk_max_bytes=_gb(env, ENV_HUB_DISK_MAX_GB, DEFAULT_HUB_DISK_MAX_GB) * 1e9)

    # ------------------------------------------------------------------------------------ rules
    def check_local_path(self, path: str | Path) -> Path:
        """A local path the server may open: inside the allowed folder (after resolving links and '..')."""
        p = Path(path).expanduser().resolve()
        if not self.enabled:
            return p
        if self.models_dir is None:
            raise ModelError(f"classroom mode: opening local paths on the server is turned off ({_TEACHER}: "
                             f"{ENV_MODELS_DIR})")
        if p != self.models_dir and self.models_dir not in p.parents:
            raise ModelError(f"classroom mode: {path} is outside the allowed folder {self.models_dir}; only "
                             f"models inside it can be opened ({_TEACHER}: {ENV_MODELS_DIR})")
        return p

    def check_hub_repo(self, repo_id: str) -> None:
        """A Hub repository the server may fetch from: it matches the allow-list."""
        if not self.enabled:
            return
        if not any(fnmatch.fnmatchcase(repo_id, pat) for pat in self.hub_allow):
            allowed = ", ".join(self.hub_allow) or "none"
            raise ModelError(f"classroom mode: {repo_id} is not on the list of Hub repositories this server may "
                             f"download (allowed: {allowed}; {_TEACHER}: {ENV_HUB_ALLOW})")

    def check_hub_size(self, repo_id: str, total_bytes: float) -> None:
        """A download below the size cap."""
        if self.enabled and total_bytes > self.hub_max_bytes:
            raise ModelError(f"classroom mode: {repo_id} is a {total_bytes / 1e9:,.2f} GB download, above this "
                             f"server's cap of {self.hub_max_bytes / 1e9:,.2f} GB ({_TEACHER}: {ENV_HUB_MAX_GB})")

    def check_random(self, name: str, weight_bytes: float) -> None:
        """Random weights below the memory cap (`weight_bytes` in float32, as the engine holds them)."""
        if self.enabled and weight_bytes > self.random_max_bytes:
            raise ModelError(f"classroom mode: random weights of {name} take {weight_bytes / 1e9:,.2f} GB in "
                             f"float32, above this server's cap of {self.random_max_bytes / 1e9:,.2f} GB for "
                             f"random models; pick a smaller one ({_TEACHER}: {ENV_RANDOM_MAX_GB})")

    def check_model_source(self, source: str, download_bytes: Callable[[str], float] | None = None) -> None:
        """Every rule that applies to an `engine.load_model` source, before anything is opened or fetched.

        `download_bytes(repo_id)`: total size of what loading the repo would download (default: the Hub's file
        listing via `engine.load.hub.repo_download_plan`); a repo already complete in the local cache downloads 0."""
        if not self.enabled:
            return
        from engine.load.loading import parse_source
        src = parse_source(source)
        if src.kind == "random":
            from calculators.sizing.params import weight_bytes
            from specs.presets import load_preset
            config = load_preset(src.name)
            self.check_random(config.name, weight_bytes(config, dtype="fp32"))
        elif src.kind == "path":
            self.check_local_path(src.path)
        elif src.kind in ("repo", "unknown"):        # an unknown source is checked as a repository id: refused
            self.check_hub_repo(src.name or src.text)
            self.check_hub_size(src.name or src.text, (download_bytes or _download_bytes)(src.name or src.text))

    def describe(self) -> list[str]:
        """The rules in force, one line each (for the sidebar)."""
        if not self.enabled:
            return ["Single-user mode: any local path, Hub repository or preset may be loaded."]
        folder = str(self.models_dir) if self.models_dir else "none (local paths are off)"
        return [f"Local models only from: {folder}",
                f"Hub repositories allowed: {', '.join(self.hub_allow) or 'none'}, up to "
                f"{self.hub_max_bytes / 1e9:,.2f} GB each",
                f"Random-weight models up to {self.random_max_bytes / 1e9:,.2f} GB (float32)"]


class TeacherSessions:
    """Which sessions hold the teacher's controls. Outside classroom mode every session does (one user on their
    own machine); in classroom mode only a session that typed INFERENCE_LAB_TEACHER_KEY (none when it is unset).
    A wrong key makes every session wait `wrong_key_pause_s` before the next try (no guessing at speed)."""

    def __init__(self, policy: Callable[[], ClassroomPolicy] | None = None, wrong_key_pause_s: float = 1.0) -> None:
        self.policy = policy or current_policy
        self.wrong_key_pause_s = wrong_key_pause_s
        self._lock = threading.Lock()
        self._teachers: set[str] = set()
        self._next_try = 0.0

    def is_teacher(self, session: str) -> bool:
        if not self.policy().enabled:
            return True
        with self._lock:
            return session in self._teachers

    def unlock(self, session: str, key: str) -> None:
        """Make `session` the teacher's if `key` is right; ModelError (one clear line) otherwise."""
        policy = self.policy()
        if not policy.enabled:
            return
        if policy.teacher_key is None:
            raise ModelError(f"classroom mode: teacher controls are off (no {ENV_TEACHER_KEY} was set when the app "
                             f"started; {_TEACHER})")
        with self._lock:
            now = time.monotonic()
            if now < self._next_try:
                raise ModelError(f"too many tries: wait {self._next_try - now:.0f} s before the next one")
            if not hmac.compare_digest(key.encode(), policy.teacher_key.encode()):
                self._next_try = now + self.wrong_key_pause_s
                raise ModelError("that is not the teacher key")
            self._teachers.add(session)

    def lock(self, session: str) -> None:
        with self._lock:
            self._teachers.discard(session)

    def require(self, session: str, action: str) -> None:
        """ModelError unless `session` holds the teacher's controls: the server-side check of every
        teacher-only action."""
        if not self.is_teacher(session):
            raise ModelError(f"classroom mode: only the teacher can {action} (the teacher unlocks it on the Class "
                             f"page with the key set in {ENV_TEACHER_KEY})")


def _download_bytes(repo_id: str) -> float:
    from engine.load.hub import cached_repo_folder, repo_download_plan
    if cached_repo_folder(repo_id) is not None:
        return 0.0
    return float(sum(size for _, size in repo_download_plan(repo_id)))


def current_policy() -> ClassroomPolicy:
    """The policy of this server process, from its environment."""
    return ClassroomPolicy.from_env()
