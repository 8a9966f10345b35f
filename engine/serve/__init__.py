"""Serving many requests on one shared, read-only model: a request (sequence), the block pool (block_manager), the
paged KV cache, continuous batching (scheduler), speculative decoding, and the small measured runs the serving
lessons show (serving_runs).
May import: specs, engine.errors, engine.model.model, engine.instruments. Never the server or streamlit.
"""
