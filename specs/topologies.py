"""Device meshes (`specs/topologies.json`): a multi-chip system as a 2-D mesh of one device type, with the links a
collective along each axis uses, and Tenstorrent's block-float storage formats.

    t = load_topology("galaxy")          # Tenstorrent Galaxy (Wormhole, 4U): 8 x 4, no wraparound, 3 links an axis
    t.axis_link(1)                       # the Link a collective along axis 1 runs on (3 x 12.5 GB/s a direction)
    block_format_bytes("bfp8_b")         # 1.0625 bytes an element (8 bits + an 8-bit exponent per 16)

Numbers live in the JSON files with their sources; this module only reads and checks them.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

from specs.devices import Device, Link, load_device, load_link
from specs.model_config import SpecError

TOPOLOGIES_FILE = Path(__file__).parent / "topologies.json"


def _key(name: str) -> str:
    return "".join(ch for ch in str(name).lower() if ch.isalnum())


@dataclass(frozen=True)
class Topology:
    key: str
    name: str
    device_name: str
    mesh_shape: tuple[int, int]            # (axis 0 = rows, axis 1 = columns)
    wraparound: tuple[bool, bool]          # per axis: a ring (torus) or a line
    ccl_links_per_axis: tuple[int, int]    # Ethernet links per neighbour a collective along that axis uses
    links_per_neighbour: int
    source: str
    notes: str = ""
    aliases: tuple = ()

    @property
    def chips(self) -> int:
        return self.mesh_shape[0] * self.mesh_shape[1]

    @property
    def device(self) -> Device:
        return load_device(self.device_name)

    def axis_link(self, axis: int) -> Link:
        """The link a collective along `axis` runs on: the device's link type, with the bandwidth of the links it
        uses on that axis (links × one link's per-direction bandwidth) and that link type's alpha."""
        if axis not in (0, 1):
            raise SpecError(f"a 2-D mesh has axes 0 and 1, got {axis!r}")
        base = load_link(self.device.interconnect_link)
        n = self.ccl_links_per_axis[axis]
        return replace(base, name=f"{base.name} x {n} links (axis {axis})", bytes_per_s=n * base.bytes_per_s)


@lru_cache(maxsize=None)
def _doc() -> dict:
    return json.loads(TOPOLOGIES_FILE.read_text(encoding="utf-8"))


@lru_cache(maxsize=None)
def _topologies() -> tuple[Topology, ...]:
    out = []
    for k, v in _doc()["topologies"].items():
        out.append(Topology(key=k, name=v["name"], device_name=v["device"], mesh_shape=tuple(v["mesh_shape"]),
                            wraparound=tuple(bool(w) for w in v["wraparound"]),
                            ccl_links_per_axis=tuple(int(n) for n in v["ccl_links_per_axis"]),
                            links_per_neighbour=int(v["links_per_neighbour"]), source=v["source"],
                            notes=v.get("notes", ""), aliases=tuple(v.get("aliases", ()))))
    return tuple(out)


def list_topologies() -> list[str]:
    return [t.key for t in _topologies()]


def load_topology(name: str = "galaxy-wormhole-4u") -> Topology:
    """A mesh by key or alias, case and punctuation ignored ('galaxy', 'TG', '8x4', 'galaxy-wormhole-6u')."""
    k = _key(name)
    for t in _topologies():
        if k in {_key(t.key), *(_key(a) for a in t.aliases)}:
            return t
    raise SpecError(f"unknown topology {name!r}; choose one of: {', '.join(list_topologies())}")


def block_format_bytes(fmt: str) -> float:
    """Bytes one element occupies in a Tenstorrent format: bits + the shared exponent spread over its block
    ('bfp8_b' -> 1 + 1/16 = 1.0625, 'bfp4_b' -> 0.5 + 1/16 = 0.5625, 'bf16' -> 2)."""
    formats = _doc()["block_formats"]
    if fmt not in formats:
        raise SpecError(f"unknown block format {fmt!r}; choose one of: {', '.join(formats)}")
    f = formats[fmt]
    return (f["bits_per_element"] + f["shared_exponent_bits"] / f["block"]) / 8
