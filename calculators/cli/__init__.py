"""`python -m calculators COMMAND ...`: one command line, whose commands each area registers.

    sizing  (calculators/cli/sizing.py):  memory, floor, roofline, latency, plan
    serving (calculators/cli/serving.py): simulate, batching, kv-alloc, queue
    planning (calculators/cli/planning.py): throughput
    serve-at (calculators/cli/serve_at.py): serve-at (a layout at a request rate: TTFT, TPOT, ITL)
    mesh    (calculators/cli/mesh.py):    mesh (a model on a Tenstorrent Galaxy 8 × 4 mesh)
An area module has COMMANDS (its command names) and main(argv); argv[0] picks the area.
"""
from __future__ import annotations

import sys

from calculators.cli import mesh, planning, serve_at, serving, sizing

AREAS = (sizing, serving, planning, serve_at, mesh)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    for area in AREAS:
        if argv and argv[0] in area.COMMANDS:
            return area.main(argv)
    names = [c for area in AREAS for c in area.COMMANDS]
    if argv and not argv[0].startswith("-"):
        print(f"error: invalid choice: {argv[0]!r} (choose from {', '.join(names)})", file=sys.stderr)
        raise SystemExit(2)
    return sizing.main(argv)          # no command: its parser says what is missing, in one line
