"""Process-wide objects (the engine servers, the model store, the heavy-job queue, the class backend) held where
no browser message can reach them.

Streamlit's `st.cache_resource` is emptied for every user by a "clear cache" message that any browser may send
(the "Clear cache" menu item, or the C key): a student could then drop the registry of engine servers (the
next Generate starts another child process while the old one runs on, unreachable) or reset the heavy-job line.
A `process_wide` object lives in this module's table, guarded by a lock, for as long as the process runs:

    @process_wide
    def heavy_jobs() -> JobQueue:
        return JobQueue(...)

    heavy_jobs()          # built on first call, the same object on every later call, from any thread
    heavy_jobs.reset()    # for tests only: drop it (its close() is called when it has one)
"""
from __future__ import annotations

import threading
from typing import Callable, Generic, TypeVar

T = TypeVar("T")

_LOCK = threading.RLock()                # re-entrant: a factory may use another process-wide object
_OBJECTS: dict[str, object] = {}


class ProcessWide(Generic[T]):
    """A zero-argument factory called once per process; every call returns that one object."""

    def __init__(self, factory: Callable[[], T]) -> None:
        self.factory = factory
        self.key = f"{factory.__module__}.{factory.__qualname__}"
        self.__doc__, self.__name__ = factory.__doc__, factory.__name__

    def __call__(self) -> T:
        obj = _OBJECTS.get(self.key)              # a dict read is atomic: no lock on the hot path
        if obj is None:
            with _LOCK:
                obj = _OBJECTS.get(self.key)
                if obj is None:
                    obj = self.factory()
                    _OBJECTS[self.key] = obj
        return obj  # type: ignore[return-value]

    def exists(self) -> bool:
        return self.key in _OBJECTS

    def reset(self) -> None:
        """Tests only: forget the object (closing it first where it can be closed); the next call builds anew."""
        with _LOCK:
            obj = _OBJECTS.pop(self.key, None)
        close = getattr(obj, "close", None)
        if callable(close):
            close()


def process_wide(factory: Callable[[], T]) -> ProcessWide[T]:
    return ProcessWide(factory)
