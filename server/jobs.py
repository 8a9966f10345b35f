"""Heavy one-off jobs (a quantization measurement, a profiling run, a model load) through a bounded queue.

On a shared server such jobs must not all run at once: each one wants every core and some want gigabytes (the
quantization measurement builds a second copy of the model's matrices). A `JobQueue` lets `max_running` run at a
time, keeps at most `max_waiting` in line (refusing the next one with a clear message), and checks memory before a
job starts: what it says it needs against what the machine has free at that moment.

    jobs = JobQueue(max_running=1, max_waiting=8)
    with jobs.slot("quantization measurement", memory_bytes=0.54e9, on_wait=show_place):
        rows = measure_quantization(model, schemes)
"""
from __future__ import annotations

import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator

from engine.errors import ModelError

MEMORY_HEADROOM = 0.9            # a job may take at most this share of the memory free when it starts
BUSY_RETRY_AFTER_S = 10          # what a refusal for a full line tells the user to wait


class JobRefused(ModelError):
    """A heavy job that cannot start: the line is full, or the memory it needs is not free. `retry_after_s`: when
    trying again may succeed (the message says it too)."""

    def __init__(self, message: str, retry_after_s: int = BUSY_RETRY_AFTER_S) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


def available_memory_bytes() -> int | None:
    """Memory the OS can still give this process (Linux MemAvailable), or None where unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_memory(label: str, need_bytes: float, free_bytes: float | None) -> None:
    """Refuse (JobRefused) when `need_bytes` exceeds MEMORY_HEADROOM of the memory free; unknown free = allowed."""
    if free_bytes is None or need_bytes <= 0:
        return
    if need_bytes > MEMORY_HEADROOM * free_bytes:
        raise JobRefused(f"{label} needs about {need_bytes / 1e9:,.2f} GB of memory, but only "
                         f"{free_bytes / 1e9:,.2f} GB of memory is free on the server right now; try again later or pick a "
                         f"smaller model")


@dataclass(eq=False)
class Ticket:
    """One job's place: waiting in line, then running."""
    label: str
    memory_bytes: float
    entered_at: float = field(default_factory=time.monotonic)
    started_at: float | None = None


class JobQueue:
    """At most `max_running` heavy jobs at a time, at most `max_waiting` waiting, first come first served."""

    def __init__(self, max_running: int = 1, max_waiting: int = 8,
                 free_memory: Callable[[], float | None] = available_memory_bytes) -> None:
        if max_running < 1 or max_waiting < 0:
            raise ValueError("max_running must be ≥ 1 and max_waiting ≥ 0")
        self.max_running, self.max_waiting, self.free_memory = max_running, max_waiting, free_memory
        self._cond = threading.Condition()
        self._line: deque[Ticket] = deque()
        self._running: list[Ticket] = []

    def position(self, ticket: Ticket) -> int | None:
        """1-based place in line, None once running (or gone)."""
        with self._cond:
            try:
                return self._line.index(ticket) + 1
            except ValueError:
                return None

    def status(self) -> dict:
        with self._cond:
            return dict(running=[t.label for t in self._running], waiting=[t.label for t in self._line])

    def enter(self, label: str, memory_bytes: float = 0.0) -> Ticket:
        """Join the line; refused at once if the line is full or the job could not fit even on an idle server."""
        check_memory(label, memory_bytes, self.free_memory())
        with self._cond:
            free_now = max(0, self.max_running - len(self._running))     # tickets that may start at once
            if len(self._line) - free_now >= self.max_waiting:
                raise JobRefused(f"busy: {len(self._line)} heavy jobs are already waiting (the limit is "
                                 f"{self.max_waiting}); try {label} again in {BUSY_RETRY_AFTER_S} s")
            ticket = Ticket(label, float(memory_bytes))
            self._line.append(ticket)
            self._cond.notify_all()
            return ticket

    def wait(self, ticket: Ticket, timeout_s: float | None = None) -> bool:
        """Block until `ticket` may run (True) or `timeout_s` passes (False). Memory is checked when its turn
        comes; JobRefused then (the ticket leaves the line)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            while not (self._line and self._line[0] is ticket and len(self._running) < self.max_running):
                if ticket not in self._line:
                    raise JobRefused(f"{ticket.label} was taken out of the line")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
            try:
                check_memory(ticket.label, ticket.memory_bytes, self.free_memory())
            except JobRefused:
                self._line.popleft()
                self._cond.notify_all()
                raise
            self._line.popleft()
            ticket.started_at = time.monotonic()
            self._running.append(ticket)
            self._cond.notify_all()      # the next in line is now first: with a free place it may start too
            return True

    def leave(self, ticket: Ticket) -> None:
        """The job ended (or gave up waiting): free its place."""
        with self._cond:
            if ticket in self._running:
                self._running.remove(ticket)
            elif ticket in self._line:
                self._line.remove(ticket)
            self._cond.notify_all()

    @contextmanager
    def slot(self, label: str, memory_bytes: float = 0.0, on_wait: Callable[[int], None] | None = None,
             poll_s: float = 0.25) -> Iterator[Ticket]:
        """Run the body when the job's turn comes; `on_wait(k)` is told its place k in line while it waits."""
        ticket = self.enter(label, memory_bytes)
        try:
            while not self.wait(ticket, timeout_s=poll_s):
                k = self.position(ticket)
                if on_wait is not None and k is not None:
                    on_wait(k)
            yield ticket
        finally:
            self.leave(ticket)
