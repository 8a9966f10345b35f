""""This machine" as a device: measured with NumPy on an explicit action, stamped with when and under what load.

Measurements form a shared, append-only history (one server, many sessions). Each session pins the measurement
it uses; "Measure again" adds a new stamped entry and moves only *this* session to it. Another session keeps what
it had and is told a newer measurement exists. The first session to choose "This machine" (or open the Your
machine page) on a fresh server takes the first measurement.

    from ui.machine import measured_machine, machine_controls
    device = measured_machine()               # specs.devices.Device (this session's pinned measurement)
    machine_controls(st.sidebar, key="device")  # its stamp, "Measure again", "use the newer one"
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Any

import streamlit as st

from server.registry import process_wide
from specs.devices import Device, measure_this_machine

THIS_MACHINE = "This machine (measured with NumPy)"   # the device pickers' option for this computer
PIN_KEY = "machine.pinned"                 # index into the shared history this session uses
MEASURE_SECONDS = 2.0
QUICK_SECONDS = 0.5                        # a page load that finds no measurement yet takes this short one
MEASURE_MEMORY_BYTES = 0.6e9               # measure_this_machine copies a 256 MB array into a second one


@dataclass(frozen=True)
class MachineMeasurement:
    device: Device
    measured_at: float                     # time.time()
    load: str                              # what else the machine was doing, in words
    seconds: float = MEASURE_SECONDS       # the measurement's time budget

    @property
    def quick(self) -> bool:
        return self.seconds < MEASURE_SECONDS

    @property
    def stamp(self) -> str:
        kind = (f"a quick {self.seconds:g} s measurement, taken when a page first needed one (Measure again for "
                f"the full {MEASURE_SECONDS:g} s one)" if self.quick else "measured")
        return f"{kind} {time.strftime('%H:%M:%S', time.localtime(self.measured_at))} under {self.load}"


class MachineHistory:
    """Every measurement taken by this server process, oldest first; entries are never replaced."""

    def __init__(self) -> None:
        self._entries: list[MachineMeasurement] = []
        self._lock = threading.Lock()

    def add(self, m: MachineMeasurement) -> int:
        with self._lock:
            self._entries.append(m)
            return len(self._entries) - 1

    def entries(self) -> list[MachineMeasurement]:
        with self._lock:
            return list(self._entries)


@process_wide
def machine_history() -> MachineHistory:
    return MachineHistory()


def current_load() -> str:
    """The machine's load at this moment: the OS load average and the generation requests being served."""
    from ui.server import active_requests
    cores = os.cpu_count() or 1
    try:
        load1 = f"load average {os.getloadavg()[0]:.2f} on {cores} cores"
    except OSError:
        load1 = f"{cores} cores"
    requests = active_requests()
    return f"{load1}, {requests} generation request{'s' if requests != 1 else ''} being served"


def measure_now(where: Any = None, seconds: float | None = None) -> int:
    """Measure this machine for `seconds` (default MEASURE_SECONDS) through the heavy-job queue, add it to the
    history, pin this session to it."""
    from ui.server import heavy_job
    seconds = MEASURE_SECONDS if seconds is None else min(seconds, MEASURE_SECONDS)
    with heavy_job("measuring this machine", MEASURE_MEMORY_BYTES, where=where):
        load = current_load()                          # the load it is measured under, taken just before
        with st.spinner(f"Measuring this machine's memory bandwidth and matrix-multiply speed "
                        f"(about {seconds:g} s) …"):
            device = measure_this_machine(seconds_budget=seconds)
    index = machine_history().add(MachineMeasurement(device, time.time(), load, seconds))
    st.session_state[PIN_KEY] = index
    return index


def pinned(quick: bool = False) -> MachineMeasurement:
    """This session's measurement: the one it pinned; on first use the newest shared one, or a new one (a quick
    QUICK_SECONDS one if `quick`: a page load must not wait for the full measurement). Reruns measure nothing."""
    entries = machine_history().entries()
    index = st.session_state.get(PIN_KEY)
    if index is None or not 0 <= index < len(entries):
        index = len(entries) - 1 if entries else measure_now(seconds=QUICK_SECONDS if quick else None)
        st.session_state[PIN_KEY] = index
        entries = machine_history().entries()
    return entries[index]


def measured_machine(quick: bool = False) -> Device:
    """This machine as this session measured (or adopted) it; `quick`: see `pinned`."""
    return pinned(quick).device


def machine_controls(box: Any, key: str) -> None:
    """Under the device: the measurement's stamp, "Measure again" (a new entry, for this session only), and,
    when someone measured later, a button to switch to the newer measurement."""
    m = pinned()
    entries = machine_history().entries()
    index = st.session_state.get(PIN_KEY, len(entries) - 1)
    box.caption(f"This machine: {m.stamp}.")
    if box.button("Measure again", key=f"{key}.remeasure",
                  help="Repeat the NumPy measurement now; other users keep the measurement they are using."):
        measure_now(box)
        st.rerun()
    if index < len(entries) - 1:
        newer = entries[-1]
        box.caption(f"A newer measurement exists ({newer.stamp}).")
        if box.button("Use the newer measurement", key=f"{key}.use_newer"):
            st.session_state[PIN_KEY] = len(entries) - 1
            st.rerun()
