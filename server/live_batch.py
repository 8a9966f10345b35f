"""The live batch as JSON (GET /v1/batch) and back: what the Class page draws, across a process boundary.

`snapshot_json(worker.snapshot(), ...)` on the server; `snapshot_from_json(doc)` in the app gives back a
`WorkerSnapshot`, so the page's charts and tables read the same object whether the worker is local or remote.
Step times are sent as "seconds before the snapshot" (clocks of two processes do not compare).
"""
from __future__ import annotations

from server.worker import RequestView, StepView, WorkerSnapshot

SCHEMA = "inference-lab.batch/1"


def snapshot_json(snap: WorkerSnapshot, model_name: str, config=None) -> dict:
    doc = {
        "schema": SCHEMA, "model": model_name, "model_display_name": snap.model_name,
        "free_blocks": snap.free_blocks, "num_blocks": snap.num_blocks, "block_size": snap.block_size,
        "max_batch": snap.max_batch, "max_waiting": snap.max_waiting,
        "running": snap.running, "waiting": snap.waiting,
        "requests": [{"label": r.label, "status": r.status, "prompt_tokens": r.prompt_tokens,
                      "generated_tokens": r.generated_tokens, "max_new_tokens": r.max_new_tokens,
                      "block_table": list(r.block_table), "position": r.position} for r in snap.requests],
        "steps": [{"ago_s": snap.taken_at - s.ended_at, "seconds": s.seconds, "decode_requests": s.decode_requests,
                   "prefill_tokens": s.prefill_tokens, "tokens_out": s.tokens_out, "mean_context": s.mean_context}
                  for s in snap.steps],
    }
    if config is not None:
        doc["max_model_len"] = config.max_position_embeddings
    return doc


def snapshot_from_json(doc: dict, now: float) -> WorkerSnapshot:
    """The snapshot again, its step times placed before `now` (the caller's perf_counter). KeyError/TypeError/
    ValueError when `doc` is not this schema."""
    if doc.get("schema") != SCHEMA:
        raise ValueError(f"not a live-batch document (schema {doc.get('schema')!r}, expected {SCHEMA!r})")
    reqs = tuple(RequestView(label=str(r["label"]), status=str(r["status"]), prompt_tokens=int(r["prompt_tokens"]),
                             generated_tokens=int(r["generated_tokens"]), max_new_tokens=int(r["max_new_tokens"]),
                             block_table=tuple(int(b) for b in r["block_table"]),
                             position=None if r["position"] is None else int(r["position"]))
                 for r in doc["requests"])
    steps = tuple(StepView(ended_at=now - float(s["ago_s"]), seconds=float(s["seconds"]),
                           decode_requests=int(s["decode_requests"]), prefill_tokens=int(s["prefill_tokens"]),
                           tokens_out=int(s["tokens_out"]), mean_context=float(s["mean_context"]))
                  for s in doc["steps"])
    return WorkerSnapshot(model_name=str(doc["model_display_name"]), taken_at=now, requests=reqs,
                          free_blocks=int(doc["free_blocks"]), num_blocks=int(doc["num_blocks"]),
                          block_size=int(doc["block_size"]), max_batch=int(doc["max_batch"]),
                          max_waiting=int(doc["max_waiting"]), steps=steps)
