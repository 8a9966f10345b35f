"""The two figures that price a step's small memory-bound kernels (norms, residual adds, RoPE, the gate's
activation, the sampler) for a device profile: the fraction of the datasheet bandwidth they reach and each
kernel's fixed latency. Where they come from, by the profile's source:
- aiconfigurator-core: its own per-GPU figures, `mem_bw_empirical_scaling_factor` and
  `mem_empirical_constant_latency` in systems/<gpu>.yaml (0.8 and 3 us on the data-centre GPUs of 0.12.0);
- the project's profiler: the `launch` table it measured (the median fixed cost of a tiny op); the bandwidth is
  the profile's own datasheet, which the profiler measured, so its fraction is 1.
None when a profile says neither.
"""
from __future__ import annotations

import numpy as np

from specs import aiconfigurator_source as aic
from specs.model_config import SpecError


def small_kernel_constants(profile) -> dict | None:
    """{"elementwise_bandwidth_fraction", "kernel_latency_ms", "source"} for `profile`, or None."""
    own = getattr(profile, "constants", None)
    if own:
        return dict(own)
    src = getattr(profile, "source", None) or {}
    if src.get("kind") == aic.PACKAGE:
        gpu = (getattr(profile, "provenance", None) or {}).get("gpu_id")
        root = aic.package_dir()
        if not gpu or root is None:
            return None
        try:
            system = aic._yaml(root / "systems" / f"{gpu}.yaml").get("gpu") or {}
        except SpecError:
            return None
        frac, lat = system.get("mem_bw_empirical_scaling_factor"), system.get("mem_empirical_constant_latency")
        if frac is None or lat is None:
            return None
        return dict(elementwise_bandwidth_fraction=float(frac), kernel_latency_ms=float(lat) * 1e3,
                    source=f"{aic.PACKAGE} systems/{gpu}.yaml (mem_bw_empirical_scaling_factor, "
                           "mem_empirical_constant_latency)")
    launch = (getattr(profile, "tables", None) or {}).get("launch")
    if launch is not None and len(launch.get("ms", ())):
        return dict(elementwise_bandwidth_fraction=1.0, kernel_latency_ms=float(np.median(launch["ms"])),
                    source=f"profile {profile.name}: launch table (median of {len(launch['ms'])})")
    return None
