"""Beyond one GPU: collectives (alpha-beta; by serving stack in collectives.py), tensor/pipeline/context/expert
parallelism (MoE across GPUs: moe.py), per-GPU memory and step
time on a TP/PP/EP mesh with its fit verdict, pipeline stages, one layer sharded on a device mesh.
May import: specs, calculators.units/arch, calculators.sizing, calculators.serving. Never engine, server, ui.
"""
