"""The model's math: one forward pass as short named steps, its KV cache, sampling and the token loop.

ops (math on arrays, shapes in comments) <- forward (embed, attention_block, feed_forward, lm_head) <- model (`Model`:
weights + forward) <- token_loop <- generate. hooks and trace are the per-call instruments forward() takes.
May import: specs, engine.errors, and the modules of this folder. Never calculators, serving, the server or streamlit.
"""
