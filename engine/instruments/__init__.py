"""Instruments built on a model run: a whole generation recorded step by step (record), what the activations say
(readout: nearest tokens, logit lens, per-head summary), and per-op timing (profile). The device profiler
(profiler, profile_*) times the engine's own ops (engine.model.ops, engine.model.forward) on this machine, and a
GPU's through torch, into a device profile file.
May import: specs, engine.errors, engine.model. Never serving, the server or streamlit.
"""
