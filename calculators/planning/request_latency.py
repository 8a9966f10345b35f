"""One request (or a static batch of them) on a deployment, priced by the deployment's step (`step.step_cost`), the
same step `throughput`, `serve-at` and the planner use, so the same work gets the same number in every command:
    TTFT  = step(0 decode rows, batch × P prompt tokens)            the prompts alone, in one step
    ITL   = step(batch decode rows at the mean context, 0 prompt tokens)
    total = TTFT + ITL × (O − 1)
The mean context is P + ⌊(O − 1)/2⌋ + 1 (exact for the KV read, which is linear in the context). The collectives
each phase waits for are the step's own: passes × its stage's collectives (`step_collectives_ms`), so "all-reduce is
x% of the ITL" is a share of the ITL reported beside it. `latency_with_floor` adds the floor (the same step at the
datasheet peaks) and the cost, for a page.
"""
from __future__ import annotations

from calculators.multi_gpu.tensor_parallel import Mesh, check_mesh
from calculators.planning.measured_step import default_profile_choice, resolve_profile
from calculators.planning.step import pricing_words, step_cost
from calculators.planning.throughput import deployment_defaults
from calculators.planning.cost import cost_if_priced
from calculators.sizing.latency import IDEAL, Efficiency
from calculators.units import check_int
from specs.devices import Device, Link
from specs.model_config import ModelConfig, SpecError
from specs.stacks import Stack, load_stack


def mean_decode_context(prompt_tokens: int, output_tokens: int) -> int:
    """P + ⌊(O − 1)/2⌋ + 1: the context of the middle decode step."""
    return prompt_tokens + max(output_tokens - 1, 0) // 2 + 1


def step_collectives_ms(parts: dict) -> float:
    """The collectives (all-reduces; all-to-alls where EP spans replicas) on one step's critical path: `step.parts`
    prices them per microbatch stage (`comm_ms`) and the step runs `passes` such stages one after another."""
    return float(parts["passes"] * parts["comm_ms"])


def step_collectives(config: ModelConfig, device: Device, mesh: Mesh, context_tokens: int, batch: int = 1,
                     weight_dtype: str = "bf16", kv_dtype: str | None = None, stack: Stack | str | None = None,
                     link: Link | None = None) -> dict:
    """The collectives of the deployment's step for `batch` sequences of `context_tokens`: one decode step
    (step(batch, 0), ms per token) and the prefill of their prompts (step(0, batch × context)), as `request_latency`
    reports them. They come from the interconnect and the stack's all-reduce (specs/stacks.json) whatever prices the
    GPU's work, so the closed form's step gives them for a measured one too."""
    s = stack if isinstance(stack, Stack) else load_stack(stack)
    check_mesh(config, mesh)
    T = check_int("context tokens", context_tokens, limit=1 << 24)
    B = check_int("batch", batch, limit=1 << 20)
    kd, _, eff, lk = deployment_defaults(device, mesh, weight_dtype, kv_dtype, s, None, None, link, config)
    cost = step_cost(config, device, mesh, weight_dtype, kd, eff, lk, s, T, T)
    return dict(allreduce_ms_per_token=step_collectives_ms({k: float(v) for k, v in cost.parts(B, 0).items()}),
                allreduce_ms_prefill=step_collectives_ms({k: float(v) for k, v in cost.parts(0, B * T).items()}))


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
    comm_token, comm_prefill = step_collectives_ms(dec), step_collectives_ms(pre)
    return dict(ttft_ms=ttft, prefill_ms=ttft, itl_ms=itl, total_ms=ttft + itl * (O - 1),
                allreduce_ms_per_token=comm_token, allreduce_ms_prefill=comm_prefill,
                decode_comm_fraction=comm_token / itl if itl else 0.0,
                per_stream_tok_s=1e3 / itl, total_tok_s=B * mesh.replicas * 1e3 / itl, mean_context_tokens=ctx,
                prefill_parts=pre, decode_parts=dec, kv_dtype=kd, stack=s.name,
                priced_from=pricing_words(profile, weight_dtype),
                efficiency=dict(decode_mbu=eff.decode_mbu, decode_mfu=eff.decode_mfu,
                                gemm_half_tokens=eff.gemm_half_tokens, step_overhead_ms=eff.step_overhead_ms))


def latency_with_floor(config: ModelConfig, device: Device, mesh: Mesh, prompt_tokens: int, output_tokens: int,
                       batch: int = 1, weight_dtype: str = "bf16", kv_dtype: str | None = None,
                       stack: Stack | str | None = None, link: Link | None = None, profile=None) -> dict:
    """What the Bandwidth floor page shows for a layout: "realistic", the `request_latency` the `latency` command
    reports (the stack's fitted efficiencies, or `profile`'s measured kernels); "floor", the same step closed form at
    the datasheet peaks with no host cost (IDEAL: no step can be faster); each with its cost per request and per 1M
    input / output tokens where the device has a price (`calculators.planning.cost`). `priced_from` says what priced
    the realistic row."""
    out = dict(realistic=request_latency(config, device, mesh, prompt_tokens, output_tokens, batch, weight_dtype,
                                         kv_dtype, stack, link=link, profile=profile),
               floor=request_latency(config, device, mesh, prompt_tokens, output_tokens, batch, weight_dtype,
                                     kv_dtype, stack, IDEAL, link))
    for row in out.values():
        row.update(cost_if_priced(device.price_usd_per_hour, mesh.gpus_per_replica, row["ttft_ms"], row["itl_ms"],
                                  batch, prompt_tokens, output_tokens))
    out.update(priced_from=out["realistic"]["priced_from"], stack=out["realistic"]["stack"],
               mean_context_tokens=out["realistic"]["mean_context_tokens"])
    return out


def default_pricing(device: Device, config: ModelConfig, measured: bool = True, stack: Stack | str | None = None):
    """(profile or None, a sentence saying which and why): what `latency` prices this device, model and stack with
    when not told (`default_profile_choice`, resolved by `resolve_profile`), or the closed form where `measured` is
    off; a page's measured-kernels switch, so that it shows the command's numbers."""
    s = stack if isinstance(stack, Stack) else load_stack(stack)
    choice = default_profile_choice()
    if measured and choice == "none":
        choice = "auto"
    return resolve_profile(choice if measured else None, device, s.full_key, config)
