"""Published Llama-3.x-70B figures on a Tenstorrent Galaxy (bench/published_galaxy.csv: tt-metal's PERF.md and
models/README.md, read at a commit) next to the 8 × 4 mesh model (`calculators.multi_gpu.mesh2d`, datasheet peaks,
nothing fitted). Error = predicted speed / published speed − 1 (+ = too optimistic).

    python bench/bench_galaxy.py
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from calculators.planning.published_galaxy import compare_all, table_text  # noqa: E402

if __name__ == "__main__":
    print(table_text(compare_all()))
