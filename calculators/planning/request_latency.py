"""One request (or a static batch of them) on a deployment, priced by the deployment's step (`step.step_cost`), the
same step `throughput`, `serve-at` and the planner use, so the same work gets the same number in every command:
    TTFT  = step(0 decode rows, batch × P prompt tokens)            the prompts alone, in one step
    ITL   = step(batch decode rows at the mean context, 0 prompt tokens)
    total = TTFT + ITL × (O − 1)
The mean context is P + ⌊(O − 1)/2⌋ + 1 (exact for the KV read, which is linear in the context).
"""
from __future__ import annotations

from calculators.multi_gpu.tensor_parallel import Mesh, check_mesh
from calculators.planning.step import pricing_words, step_cost
from calculators.planning.throughput import deployment_defaults
from calculators.sizing.latency import Efficiency
from calculators.units import check_int
from specs.devices import Device, Link
from specs.model_config import ModelConfig, SpecError
from specs.stacks import Stack, load_stack


def mean_decode_context(prompt_tokens: int, output_tokens: int) -> int:
    """P + ⌊(O − 1)/2⌋ + 1: the context of the middle decode step."""
    return prompt_tokens + max(output_tokens - 1, 0) // 2 + 1


def request_latency(config: ModelConfig, device: Device, mesh: Mesh, prompt_tokens: int, output_tokens: int,
                    batch: int = 1, weight_dtype: str = "bf16", kv_dtype: str | None = None,
                    stack: Stack | str | None = None, efficiency: Efficiency | None = None,
                    link: Link | None = None, profile=None) -> dict:
    """TTFT, ITL and total latency of `batch` requests of P prompt and O output tokens sent together to one
    replica of `mesh`, on the deployment's step (see the module docstring), with the step's parts (measured and
    roofline where a profile priced it) and what it was priced from."""
    s = stack if isinstance(stack, Stack) else load_stack(stack)
    check_mesh(config, mesh)
    P = check_int("prompt tokens", prompt_tokens, limit=1 << 24)
    O = check_int("output tokens", output_tokens, limit=1 << 24)
    B = check_int("batch", batch, limit=1 << 20)
    if P + O > config.max_position_embeddings:
        raise SpecError(f"prompt + output = {P + O:,} tokens exceeds {config.name}'s context window of "
                        f"{config.max_position_embeddings:,}")
    kd, _, eff, lk = deployment_defaults(device, mesh, weight_dtype, kv_dtype, s, None, efficiency, link, config)
    ctx = mean_decode_context(P, O)
    cost = step_cost(config, device, mesh, weight_dtype, kd, eff, lk, s, ctx, P, profile=profile)
    pre = {k: float(v) for k, v in cost.parts(0, B * P).items()}
    dec = {k: float(v) for k, v in cost.parts(B, 0).items()}
    ttft, itl = pre["step_ms"], dec["step_ms"]
    return dict(ttft_ms=ttft, prefill_ms=ttft, itl_ms=itl, total_ms=ttft + itl * (O - 1),
                per_stream_tok_s=1e3 / itl, total_tok_s=B * mesh.replicas * 1e3 / itl, mean_context_tokens=ctx,
                prefill_parts=pre, decode_parts=dec, kv_dtype=kd, stack=s.name, priced_from=pricing_words(profile),
                efficiency=dict(decode_mbu=eff.decode_mbu, decode_mfu=eff.decode_mfu,
                                gemm_half_tokens=eff.gemm_half_tokens, step_overhead_ms=eff.step_overhead_ms))
