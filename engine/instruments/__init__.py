"""Instruments built on a model run: a whole generation recorded step by step (record), what the activations say
(readout: nearest tokens, logit lens, per-head summary), and per-op timing (profile).
May import: specs, engine.errors, engine.model.model. Never serving, the server or streamlit.
"""
