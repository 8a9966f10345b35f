"""Serving many users on one GPU: the step model (batching), workloads and traces, the discrete-event serving
simulator, KV allocation policies, paging, prefix caching, speculative decoding, queueing and SLOs/goodput.
May import: specs, calculators.units/arch, calculators.sizing, and this folder. Never engine, server, ui.
"""
