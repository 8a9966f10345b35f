"""The Batching lesson's sentences, each built from the numbers shown beside it and the condition it tested, so it
flips when a run (or the step model) says otherwise: "climbs in proportion" only where the gain kept up with the
batch, "a ceiling" only where no measured gain went above it, "paid off" only where every round gained.

Pure functions of plain numbers (no streamlit): the theory's rows come from `calculators.serving.batching
.batch_curve`, the measurement's from `engine.serve.serving_runs.batching_run`. Batches are whole numbers in prose.
"""
from __future__ import annotations

import math

from calculators.units import fmt_num
from engine.model.ops import MATVEC_ROWS

PROPORTIONAL = 0.9     # "in proportion": batch b gives at least 90% of b× one stream's tokens/s
BARELY_LONGER = 1.25   # "barely longer": each stream's time per token grows by at most a quarter
NEAR_CEILING = 0.9     # the scheduler "reaches the ceiling" at 90% of it or more
PAID_OFF = 1.1         # a measured gain counts only above 1.1× in every round (less is noise on a shared machine)


def whole_batch(b: float) -> int | None:
    """The first whole batch at or past a critical batch b (None when it never comes): compute-bound "from
    batch ⌈b⌉"."""
    return None if math.isinf(b) or math.isnan(b) else max(1, math.ceil(b - 1e-9))


def batch_text(b: float) -> str:
    """A critical batch for a metric or a legend: a whole batch ('4', '1,234') or 'never'."""
    n = whole_batch(b)
    return "never" if n is None else f"{n:,}"


# ============================================================================================ the step model
def proportional_until(rows: list[dict]) -> dict | None:
    """The largest batch of the curve (past the first) where throughput still kept up with the batch and each
    stream barely slowed (PROPORTIONAL, BARELY_LONGER), checked at every batch up to it; None if not even the
    second."""
    first, found = rows[0], None
    for r in rows[1:]:
        ratio = r["batch"] / first["batch"]
        if r["gain_vs_first"] < PROPORTIONAL * ratio or r["itl_ms"] > BARELY_LONGER * first["itl_ms"]:
            break
        found = r
    return found


def theory_words(rows: list[dict], kv_batch: float, compute_batch: float) -> str:
    """What the step model's curve shows, from its rows (batch, gain_vs_first, itl_ms, total_tok_s, bound) and the
    two critical batches."""
    first, last = rows[0], rows[-1]
    if len(rows) < 2:
        return "Raise the largest batch to see how throughput and each stream's wait change with it."
    kept = proportional_until(rows)
    if kept is not None:
        out = (f"Up to batch **{kept['batch']:,}** the step model's throughput **climbs in proportion** "
               f"({fmt_num(kept['gain_vs_first'], 3)}× one stream's at {kept['batch']:,}× the streams) while each "
               f"stream waits **barely longer** per token ({fmt_num(first['itl_ms'], 3)} → "
               f"{fmt_num(kept['itl_ms'], 3)} ms): the streams share one weight read.")
    else:
        nxt = rows[1]
        out = (f"Here throughput does **not** climb in proportion even at batch {nxt['batch']:,}: "
               f"{fmt_num(nxt['gain_vs_first'], 3)}× one stream's, and each stream's time per token goes from "
               f"{fmt_num(first['itl_ms'], 3)} to {fmt_num(nxt['itl_ms'], 3)} ms.")
        out += (" The step is already compute-bound: this device's arithmetic, not its memory, sets the pace."
                if nxt["bound"] == "compute" else
                " Each sequence's KV read already rivals the weight read at this context.")
    n_c, n_kv = whole_batch(compute_batch), whole_batch(kv_batch)
    if kept is None and rows[1]["bound"] == "compute":                  # said above: compute-bound from the start
        out += (f" At batch {last['batch']:,}: {fmt_num(last['total_tok_s'], 3)} tokens/s in all, "
                f"{fmt_num(last['itl_ms'], 3)} ms per token for each stream.")
    elif n_c is not None and n_c <= last["batch"]:
        out += (f" From batch **{n_c:,}** a step is compute-bound: throughput levels off "
                f"({fmt_num(last['total_tok_s'], 3)} tokens/s at batch {last['batch']:,}) and each stream waits "
                f"longer ({fmt_num(last['itl_ms'], 3)} ms per token).")
    elif n_kv is not None and n_kv <= last["batch"]:
        out += (f" From batch **{n_kv:,}** the sequences' KV caches cost more to read than the weights, and each "
                f"stream's time per token grows with the batch ({fmt_num(last['itl_ms'], 3)} ms at batch "
                f"{last['batch']:,}).")
    else:
        out += (f" Up to batch {last['batch']:,} neither the KV read nor the arithmetic catches up with the weight "
                f"read: {fmt_num(last['gain_vs_first'], 3)}× one stream's throughput at batch {last['batch']:,}.")
    return out


# ============================================================================================ the measurement
def ceiling_holds(rows: list[dict]) -> bool:
    """Whether the weight products' gain was at or above every measured gain of this run."""
    return all(r["gain"] <= r["ceiling"] for r in rows)


def ceiling_label(rows: list[dict]) -> str:
    return ("ceiling: weight products alone (plain NumPy)" if ceiling_holds(rows)
            else "weight products alone (passed in this run)")


def _busy(busy: bool) -> str:
    return (" The machine was busy (see the notice above): the runs waited for the cores as well as working."
            if busy else "")


def measured_words(rows: list[dict], busy: bool) -> str:
    """What the engine's measurement shows, from its rows (streams, gain and its range, ceiling, share,
    decode_step_ms, products_gflop_s)."""
    last, one = rows[-1], rows[0]
    n = last["streams"]
    if n <= 1:
        return "Measure more than one stream to see a gain."
    gain = (f"**{fmt_num(last['gain'], 3)}×** one stream's tokens/s (rounds {fmt_num(last['gain_min'], 3)}× to "
            f"{fmt_num(last['gain_max'], 3)}×)")
    if last["gain_min"] > PAID_OFF:
        out = f"**Batching paid off:** {n} streams decoding together made {gain}. "
    else:
        out = (f"**Batching did not pay off in this run:** {n} streams made {gain}, not above 1.1× in every "
               "round." + (_busy(True) if busy else " Each step here cost about as much per stream as one stream "
                           "alone, so the weight read was not what limited it.") + " ")
    out += (f"Each stream waited {fmt_num(last['decode_step_ms'] / one['decode_step_ms'], 3)}× as long per token "
            f"({fmt_num(one['decode_step_ms'], 3)} → {fmt_num(last['decode_step_ms'], 3)} ms). ")
    ceiling = f"**{fmt_num(last['ceiling'], 3)}×**"
    if last["share"] >= NEAR_CEILING:
        out += (f"The weight products alone, in plain NumPy, allow {ceiling} at {n} rows on this machine, and the "
                f"scheduler reached **{last['share']:.0%}** of that: "
                + ("as much as this CPU's products allow. " if last["share"] >= 1 else "nearly all this CPU allows. "))
    else:
        out += (f"The weight products alone, in plain NumPy, allow {ceiling} at {n} rows, and the scheduler "
                f"reached only **{last['share']:.0%}** of that: "
                + ("the rest went to the busy machine and to work each sequence adds (attention over its KV "
                   "blocks, its own sampling). " if busy else
                   "the rest went to the work each sequence adds (attention over its KV blocks, its own sampling). "))
    passed = [r["streams"] for r in rows if r["gain"] > r["ceiling"]]
    if passed:
        out += (f"At {', '.join(f'{k:,}' for k in passed)} streams the scheduler passed the products: a step's "
                "fixed costs (Python, the norms) are shared by the batch too, and the products leave them out"
                + (f"; and for {MATVEC_ROWS} rows or fewer the engine multiplies one row at a time over cache-sized "
                   "blocks of each matrix, faster there than NumPy's own product" if min(passed) <= MATVEC_ROWS
                   else "") + ". ")
    proportional = last["ceiling"] >= PROPORTIONAL * n
    if proportional:
        out += (f"The products stayed memory-bound here: {n} rows cost about one row's time, as on a GPU, so the "
                "gain follows the dashed line.")
    else:
        out += (f"Why less than {n}×: NumPy multiplied {n} rows at {fmt_num(last['products_gflop_s'], 3)} GFLOP/s "
                f"and one row at {fmt_num(one['products_gflop_s'], 3)} GFLOP/s. The weights are read once, but this "
                f"CPU's arithmetic cannot keep up with {n} rows, so the step grows with the batch. A GPU does "
                "hundreds of FLOPs in the time it reads one byte (its ridge point, on the Roofline page): there a "
                "small batch stays memory-bound and the gain follows the dashed line much longer.")
    return out
