"""Sizing one GPU: parameters and weight bytes, KV cache (MHA/GQA/MQA/MLA/sliding window/linear), memory and what
fits, the roofline and FLOP/byte counts, bandwidth floors and latency, FlashAttention traffic, quantization, and the
engine's own floor on this machine. Pure functions of a `specs.ModelConfig` and a `specs.devices.Device`.
May import: specs, calculators.units/arch/explain-free helpers, and this folder. Never engine, server, ui.
"""
