"""One step of a deployment as the planner prices it from measured kernels, GPU time only: what
bench/bench_anchor_steps.py sets beside aiconfigurator's own composition of the same kernels (bench/anchor_steps.csv).

    decode   `size` decode rows per attention rank at isl + osl / 2 cached positions
    prefill  one prompt of `size` tokens per attention rank
GPU time = the measured ops (`measured_gpu_ms`) + the collectives (`comm_ms`), without the stack's host work, which
aiconfigurator's step leaves out. A deployment with attention data parallel (`adp` > 1) is `Mesh(tp, ep, tp·adp
GPUs)`: each rank's own rows and prompt, the experts seeing every rank's tokens (`step.step_cost`).
"""
from __future__ import annotations

from calculators.multi_gpu.tensor_parallel import Mesh, _link_for
from calculators.planning.measured_step import resolve_profile
from calculators.planning.step import step_cost
from calculators.sizing.latency import Efficiency
from specs.devices import load_device
from specs.model_config import SpecError
from specs.presets import load_preset
from specs.stacks import load_stack


def step_gpu_ms(model: str, device: str, tp: int, adp: int, ep: int, weights: str, kv: str, kind: str, size: int,
                isl: int, osl: int, stack: str = "trtllm", profile="auto") -> float:
    """The GPU time of one decode or prefill step (see the module docstring), in ms. A SpecError where no profile
    prices the deployment (the closed form is not what this compares)."""
    c, dev, s = load_preset(model), load_device(device), load_stack(stack)
    mesh = Mesh(tp=tp, ep=ep, gpus=tp * adp)
    prof, words = resolve_profile(profile, dev, s.full_key, c, weights)
    if prof is None:
        raise SpecError(f"no measured kernels price {model} on {dev.name} with {s.name}: {words}")
    link = _link_for(dev, None) if mesh.gpus > 1 else None
    eff = Efficiency.for_stack(s, dev, weights, c)
    if kind == "decode":
        parts = step_cost(c, dev, mesh, weights, kv, eff, link, s, isl + osl / 2, isl, None, prof).parts(size, 0)
    elif kind == "prefill":
        parts = step_cost(c, dev, mesh, weights, kv, eff, link, s, size, size, None, prof).parts(0, size)
    else:
        raise SpecError(f"a step is decode or prefill, not {kind!r}")
    return float(parts["measured_gpu_ms"]) + float(parts["comm_ms"])
