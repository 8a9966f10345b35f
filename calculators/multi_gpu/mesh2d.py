"""Llama 3 70B on a Tenstorrent Galaxy: 32 Wormhole chips on an 8 × 4 mesh (reference 001, "Llama3-70B Galaxy:
Prefill Operations Detailed Report"), sized from datasheets: what each chip holds, which collective runs along which
mesh axis after each matmul, its bytes and time on the Ethernet links, memory per chip and the step times.

The layout (001, and the tt-metal code it documents: models/demos/llama3_70b_galaxy/tt/llama_attention.py and
llama_mlp.py, https://github.com/tenstorrent/tt-metal). Mesh shape (R, C) = (8, 4): axis 0 has R = 8 chips, axis 1
has C = 4. Every weight is cut both ways (ttnn.ShardTensor2dMesh):
- wqkv [D, (h_q + 2·h_kv)·d]: its columns by KV group over axis 0 (each of the 8 rows owns h_q/R = 8 query heads and
  h_kv/R = 1 KV head: 001's n_local_heads 8, n_local_kv_heads 1), its rows (the hidden D) over axis 1: a chip holds
  [D/C, (h_q/R + 2·h_kv/R)·d] = [2,048, 1,280] and its product is a partial sum over the C chips of its row, so
  001's QKV all-reduce runs along cluster_axis 1.
- wo [h_q·d, D]: heads over axis 0, D over axis 1 -> [1,024, 2,048]; its partial [T, D/C] is all-reduced along
  axis 0 (the code's "WO" all-reduce; 001 does not cover the output projection).
- w1, w3 [D, F]: D over axis 1, F over axis 0 -> [2,048, 3,584]; the partial [T, F/R] is reduce-scattered along
  axis 1 (001's FF1/FF3 reduce-scatter) to [T, F/(R·C)], SiLU(w1)·w3 is taken there, then all-gathered along axis 1
  back to [T, F/R] (001's all-gather).
- w2 [F, D]: F over axis 0, D over axis 1 -> [3,584, 2,048]; its partial [T, D/C] is all-reduced along axis 0
  (001's FF2 all-reduce, cluster_axis 0).
Where 001 prints other numbers than these (the 1,280-wide input, 12,288, 14,336 and 14,336/8), `reference_001_check`
sets each beside what the Llama 3 70B config gives, and says why.

Collective times reuse the project's alpha-beta ring (`collectives.ring_ms` for an all-reduce: alpha + 2(n−1)/n · M
/ B; `parallel.all_gather_ms` / `reduce_scatter_ms`: alpha + (n−1)/n · M / B; Patarasuk & Yuan 2009), with B = the
links a collective uses on that axis × 12.5 GB/s a direction (specs/topologies.json, specs/devices.json `wh_eth`).
A line (the 4U Galaxy has no wraparound) has the same bandwidth term as a one-way ring: its end chip receives
(n−1)/n of the data over its single link. Step times: every stage's roofline max(bytes / bandwidth, FLOPs / peak)
plus its collectives, not overlapped (an upper bound on the communication, a lower bound on the rest at IDEAL
efficiency). Formats are tt-metal's: bfloat8_b weights and KV cache (1 + 1/16 bytes an element), bfloat4_b w1/w3
(LlamaOptimizations: 70B models run bfp4 MLPs), matmuls at the BLOCKFP8 rate (HiFi2), attention at the FP16 rate
(HiFi4).
"""
from __future__ import annotations

from calculators import arch
from calculators.multi_gpu.collectives import ring_ms
from calculators.multi_gpu.parallel import all_gather_ms, reduce_scatter_ms
from calculators.sizing.latency import IDEAL, Efficiency
from calculators.units import check_fraction, check_int
from specs.model_config import ModelConfig, SpecError
from specs.topologies import Topology, block_format_bytes, load_topology

TILE = 32                   # tt-metal tiles are 32 × 32: a decode batch of 1-32 rows moves as 32 rows
RING_CORES = 24             # decode ring matmul: 12 DRAM readers × 2 receivers (tt-metal get_core_ranges(12, 2))
MAX_USERS = 32              # "Supports up to 32 users per batch" (tt-metal llama3_70b_galaxy README)
OPS = ("all_reduce", "reduce_scatter", "all_gather")
SOURCE_CODE = "tt-metal models/demos/llama3_70b_galaxy/tt/"


def _topo(topology: Topology | str | None) -> Topology:
    return topology if isinstance(topology, Topology) else load_topology(topology or "galaxy-wormhole-4u")


def check_layout(config: ModelConfig, topology: Topology | str | None = None) -> Topology:
    """The topology if `config` can be laid out the Galaxy way on it, else one SpecError saying what fails: each of
    the R rows owns whole KV heads (R divides h_kv) with their query heads, C divides D, R divides F and C divides
    F/R (the reduce-scatter splits a row's FFN slice over the C chips)."""
    t = _topo(topology)
    R, C = t.mesh_shape
    c = config
    if arch.is_mla(c):
        raise SpecError(f"{c.name} uses MLA: the Galaxy layout splits ordinary K/V heads over the mesh rows")
    problems = []
    if c.num_kv_heads % R or c.num_heads % R:
        problems.append(f"{R} mesh rows must divide the {c.num_kv_heads} KV heads and {c.num_heads} query heads")
    if c.hidden_size % C:
        problems.append(f"{C} mesh columns must divide D = {c.hidden_size}")
    if c.intermediate_size % (R * C):
        problems.append(f"{R} × {C} chips must divide F = {c.intermediate_size}")
    if problems:
        raise SpecError(f"{c.name} does not fit the {R} × {C} Galaxy layout: " + "; ".join(problems)
                        + " (Llama-3-70B, 3.1-70B and 3.3-70B do)")
    return t


def ring_padded(width: int) -> int:
    """A per-chip width as the decode ring matmul stores it: rounded up to whole tiles on each of the 24 ring
    cores, a multiple of 24 × 32 = 768. 1,280 -> 1,536, 2,048 -> 2,304, 3,584 -> 3,840: the tt-metal comment
    "[1, 1, 8192, 10240] -> [2304, 1536]" (llama_attention.py) and pad_to_next_multiple's 9,216 = 4 × 2,304 and
    30,720 = 8 × 3,840 (llama_mlp.py)."""
    w = check_int("width", width)
    step = RING_CORES * TILE
    return -(-w // step) * step


def _bytes(fmt: str) -> float:
    return block_format_bytes(fmt)


def weight_shards(config: ModelConfig, topology: Topology | str | None = None, bfp4_mlp: bool = True) -> list[dict]:
    """Every weight of one layer (and the vocabulary matrices) as ONE chip holds it: full shape, per-chip shape
    (rows × columns of the [in, out] matrix), the ring-padded copy decode reads, which mesh axis splits which side,
    the storage format and bytes. Embedding and LM head: taken as split over all R·C chips (an assumption: 001
    does not give their layout)."""
    t = check_layout(config, topology)
    R, C = t.mesh_shape
    c, d = config, config.head_dim
    D, F, V = c.hidden_size, c.intermediate_size, c.vocab_size
    qkv_full = (c.num_heads + 2 * c.num_kv_heads) * d
    qkv = (c.num_heads // R + 2 * (c.num_kv_heads // R)) * d
    w13 = "bfp4_b" if bfp4_mlp else "bfp8_b"
    rows = [
        ("wqkv", (D, qkv_full), (D // C, qkv), "in (D) over axis 1, out (heads) over axis 0", "bfp8_b"),
        ("wo", (c.num_heads * d, D), (c.num_heads * d // R, D // C), "in (heads) over axis 0, out (D) over axis 1",
         "bfp8_b"),
        ("w1", (D, F), (D // C, F // R), "in (D) over axis 1, out (F) over axis 0", w13),
        ("w3", (D, F), (D // C, F // R), "in (D) over axis 1, out (F) over axis 0", w13),
        ("w2", (F, D), (F // R, D // C), "in (F) over axis 0, out (D) over axis 1", "bfp8_b"),
    ]
    out = []
    for name, full, shard, split, fmt in rows:
        padded = (ring_padded(shard[0]), ring_padded(shard[1]))
        out.append(dict(weight=name, full_shape=full, per_chip_shape=shard, ring_padded_shape=padded, split=split,
                        format=fmt, per_layer=True, bytes_per_chip=shard[0] * shard[1] * _bytes(fmt),
                        ring_bytes_per_chip=padded[0] * padded[1] * _bytes(fmt)))
    chips = R * C
    n_vocab = 1 if c.tie_word_embeddings else 2
    vocab_bytes = n_vocab * V * D * _bytes("bfp8_b") / chips
    out.append(dict(weight="embedding + LM head" if n_vocab == 2 else "tied embedding", full_shape=(V, D),
                    per_chip_shape=None, ring_padded_shape=None, split=f"over all {chips} chips (assumed)",
                    format="bfp8_b", per_layer=False, bytes_per_chip=vocab_bytes, ring_bytes_per_chip=0.0))
    return out


def weight_bytes_per_chip(config: ModelConfig, topology: Topology | str | None = None, bfp4_mlp: bool = True,
                          copy: str = "both") -> float:
    """Weight bytes on one chip. tt-metal keeps two copies of every layer matrix: an interleaved one prefill reads
    (`wqkv_interleaved`, `w1_interleaved`, ...) and a ring-sharded, padded one decode's prefetcher streams
    (`wqkv`, `w1`, ...; llama_attention.py, llama_mlp.py). `copy`: 'prefill', 'decode' or 'both' (what memory holds)."""
    if copy not in ("prefill", "decode", "both"):
        raise SpecError(f"copy must be 'prefill', 'decode' or 'both', got {copy!r}")
    L = config.num_layers
    total = 0.0
    for w in weight_shards(config, topology, bfp4_mlp):
        if not w["per_layer"]:
            total += w["bytes_per_chip"]
            continue
        if copy in ("prefill", "both"):
            total += L * w["bytes_per_chip"]
        if copy in ("decode", "both"):
            total += L * w["ring_bytes_per_chip"]
    return total


def kv_bytes_per_chip(config: ModelConfig, topology: Topology | str | None, batch: int, context_tokens: int,
                      kv_format: str = "bfp8_b") -> float:
    """KV cache on one chip: L × ceil(B / C) users × (h_kv / R) heads × tokens × d × 2 (K and V) × bytes. A row of
    chips holds one KV head (001: kv_cache [batch, n_kv_heads, max_seq_len, head_dim], stored as bfloat8_b); the
    users are dealt over the C columns, 8 per column at batch 32 (tt-metal batch_size_per_device_group)."""
    t = check_layout(config, topology)
    R, C = t.mesh_shape
    B, S = check_int("batch", batch), check_int("context_tokens", context_tokens)
    users = -(-B // C)
    return config.num_layers * users * (config.num_kv_heads // R) * S * config.head_dim * 2 * _bytes(kv_format)


def prefill_op_shapes(config: ModelConfig, seq_len: int, topology: Topology | str | None = None) -> list[dict]:
    """001's prefill, step by step, as the per-chip tensor shapes (ttnn's 4-D [1, 1, S, width] convention) and the
    matmul each step picks: QKV input reshaped into 2,048-token chunks past 2,048; MLP input into 1,024-token chunks
    for 1,024 ≤ S < 4,096; `minimal_matmul` for w1/w3/w2 from 4,096 tokens; 8 query heads and 1 KV head a chip;
    scores [1, h_q/R, S, S] (as 001 writes them; the kernel computes them in chunks)."""
    t = check_layout(config, topology)
    R, C = t.mesh_shape
    c, d = config, config.head_dim
    S = check_int("seq_len", seq_len, limit=1 << 22)
    Dc, Fr = c.hidden_size // C, c.intermediate_size // R
    hq, hkv = c.num_heads // R, c.num_kv_heads // R
    qkv = (hq + 2 * hkv) * d
    qkv_in = [1, S // 2048, 2048, Dc] if S > 2048 and S % 2048 == 0 else [1, 1, S, Dc]
    mlp_in = [1, S // 1024, 1024, Dc] if 1024 <= S < 4096 and S % 1024 == 0 else [1, 1, S, Dc]
    mm = "minimal_matmul" if S >= 4096 else "linear"
    return [
        dict(step="QKV input", shape=qkv_in, op="linear"),
        dict(step="xqkv (partial, then all-reduced along axis 1)", shape=[1, 1, S, qkv], op="linear"),
        dict(step="q heads", shape=[1, hq, S, d], op="nlp_create_qkv_heads"),
        dict(step="k heads", shape=[1, hkv, S, d], op="nlp_create_qkv_heads"),
        dict(step="v heads", shape=[1, hkv, S, d], op="nlp_create_qkv_heads"),
        dict(step="attention scores", shape=[1, hq, S, S], op="scaled_dot_product_attention"),
        dict(step="attention output", shape=[1, hq, S, d], op="scaled_dot_product_attention"),
        dict(step="MLP input", shape=mlp_in, op=mm),
        dict(step="w1_out / w3_out (partial)", shape=[1, 1, S, Fr], op=mm),
        dict(step="after the FF1/FF3 reduce-scatter (axis 1)", shape=[1, 1, S, Fr // C], op="line_reduce_scatter"),
        dict(step="SiLU(w1) · w3", shape=[1, 1, S, Fr // C], op="mul"),
        dict(step="w2 input after the all-gather (axis 1)", shape=[1, 1, S, Fr], op="line_all_gather"),
        dict(step="w2_out (partial, then all-reduced along axis 0)", shape=[1, 1, S, Dc], op=mm),
    ]


def _collective(key, op, axis, shape_in, shape_out, t: Topology, fmt: str, in_001: bool, source: str) -> dict:
    n = t.mesh_shape[axis]
    link = t.axis_link(axis)
    b = _bytes(fmt)
    full = shape_in if op in ("all_reduce", "reduce_scatter") else shape_out
    M = full[0] * full[1] * b                      # the whole per-chip tensor the collective is defined on
    if op == "all_reduce":
        sent, ms = 2 * (n - 1) / n * M, ring_ms(M, n, link)
    elif op == "reduce_scatter":
        sent, ms = (n - 1) / n * M, reduce_scatter_ms(M, n, link)
    else:
        sent, ms = (n - 1) / n * M, all_gather_ms(M, n, link)
    return dict(key=key, op=op, axis=axis, devices=n, shape_in=shape_in, shape_out=shape_out, format=fmt,
                message_bytes=M, bytes_sent_per_chip=sent, link_gb_s=link.bytes_per_s / 1e9, ms=ms, in_001=in_001,
                source=source)


def layer_collectives(config: ModelConfig, tokens: int, phase: str = "prefill",
                      topology: Topology | str | None = None, batch: int = 1, fmt: str = "bfp8_b") -> list[dict]:
    """The collectives of one layer, in order, as ONE chip sees them: operation, mesh axis and its chip count,
    per-chip tensor before and after, the message M (the whole per-chip tensor: the input of an all-reduce or
    reduce-scatter, the output of an all-gather), bytes each chip sends (all-reduce 2(n−1)/n·M, reduce-scatter and
    all-gather (n−1)/n·M) and the time. `tokens`: rows in the pass (prefill: batch × prompt; decode: the batch,
    moved as whole 32-row tiles).

    prefill (001, with the code's WO all-reduce and, above 1,024 tokens at batch 1, the ring SDPA's two
    all-gathers): QKV all-reduce (axis 1) · [SDPA all-gathers (axis 1)] · WO all-reduce (axis 0) · FF1 and FF3
    reduce-scatter (axis 1) · all-gather of SiLU(w1)·w3 (axis 1) · FF2 all-reduce (axis 0).
    decode (tt-metal forward_decode; 001 covers prefill only): QKV reduce-scatter into heads (axis 1) · all-gather
    of the heads (axis 1) · WO all-reduce (axis 0) · FF1, FF3 reduce-scatter, all-gather, FF2 all-reduce as above,
    on the ring-padded widths."""
    t = check_layout(config, topology)
    if phase not in ("prefill", "decode"):
        raise SpecError(f"phase must be 'prefill' or 'decode', got {phase!r}")
    R, C = t.mesh_shape
    c, d = config, config.head_dim
    T = check_int("tokens", tokens, limit=1 << 24)
    B = check_int("batch", batch)
    qkv = (c.num_heads // R + 2 * (c.num_kv_heads // R)) * d
    heads = c.num_heads // R * d
    Dc, Fr = c.hidden_size // C, c.intermediate_size // R
    code = SOURCE_CODE
    if phase == "prefill":
        rows = [_collective("QKV", "all_reduce", 1, (T, qkv), (T, qkv), t, fmt, True, "001 (cluster_axis 1)")]
        if T > 1024 and B == 1 and T % (2 * C) == 0:
            for key in ("SDPA", "SDPA_REVERSE"):
                rows.append(_collective(key, "all_gather", 1, (T // (2 * C), heads), (T // 2, heads), t, fmt, False,
                                        code + "llama_attention.py (ring_distributed SDPA, ring_size 4)"))
        rows.append(_collective("WO", "all_reduce", 0, (T, Dc), (T, Dc), t, fmt, False,
                                code + "llama_attention.py forward_prefill (cluster_axis 0)"))
        rows += [_collective("FF1", "reduce_scatter", 1, (T, Fr), (T, Fr // C), t, fmt, True, "001 (cluster_axis 1)"),
                 _collective("FF3", "reduce_scatter", 1, (T, Fr), (T, Fr // C), t, fmt, True, "001 (cluster_axis 1)"),
                 _collective("FF3 all-gather", "all_gather", 1, (T, Fr // C), (T, Fr), t, fmt, True,
                             "001 (cluster_axis 1)"),
                 _collective("FF2", "all_reduce", 0, (T, Dc), (T, Dc), t, fmt, True, "001 (cluster_axis 0)")]
        return rows
    Tp = -(-T // TILE) * TILE
    qkv_p, D_p, F_p = ring_padded(qkv), ring_padded(Dc), ring_padded(Fr)
    return [
        _collective("QKV heads", "reduce_scatter", 1, (Tp, qkv_p), (Tp // C, qkv_p), t, fmt, False,
                    code + "llama_attention.py forward_decode (RS create heads)"),
        _collective("SDPA concat", "all_gather", 1, (Tp // C, heads), (Tp, heads), t, fmt, False,
                    code + "llama_attention.py forward_decode (all_gather_concat, [1, 1, 32, 1024])"),
        _collective("WO", "all_reduce", 0, (Tp, D_p), (Tp, D_p), t, fmt, False,
                    code + "llama_attention.py forward_decode ([1, 1, 32, 2304])"),
        _collective("FF1", "reduce_scatter", 1, (Tp, F_p), (Tp, F_p // C), t, fmt, False, code + "llama_mlp.py"),
        _collective("FF3", "reduce_scatter", 1, (Tp, F_p), (Tp, F_p // C), t, fmt, False, code + "llama_mlp.py"),
        _collective("FF3 all-gather", "all_gather", 1, (Tp, F_p // C), (Tp, F_p), t, fmt, False, code + "llama_mlp.py"),
        _collective("FF2", "all_reduce", 0, (Tp, D_p), (Tp, D_p), t, fmt, False, code + "llama_mlp.py"),
    ]


def per_axis_summary(rows: list[dict]) -> list[dict]:
    """One layer's collectives added up by mesh axis: how many, bytes each chip sends, time."""
    out = []
    for axis in sorted({r["axis"] for r in rows}):
        mine = [r for r in rows if r["axis"] == axis]
        out.append(dict(axis=axis, devices=mine[0]["devices"], collectives=len(mine),
                        ops=", ".join(f"{r['key']} ({r['op'].replace('_', '-')})" for r in mine),
                        bytes_sent_per_chip=sum(r["bytes_sent_per_chip"] for r in mine), ms=sum(r["ms"] for r in mine)))
    return out


def _layer_elements(config: ModelConfig, topology: Topology) -> float:
    return sum(w["per_chip_shape"][0] * w["per_chip_shape"][1]
               for w in weight_shards(config, topology) if w["per_layer"])


def decode_step(config: ModelConfig, batch: int, context_tokens: int, topology: Topology | str | None = None,
                bfp4_mlp: bool = True, efficiency: Efficiency = IDEAL) -> dict:
    """One decode step on the mesh: memory = (ring-padded weights + this chip's KV) / bandwidth / MBU; compute =
    2 · (per-chip weight elements) · rows / fp8 peak / MFU (every chip multiplies all 32-row tiles by its shard) +
    attention 4 · (users on the chip) · context · (h_q/R) · d · L / bf16 peak; step = max(memory, compute) +
    L × the layer's collectives. ITL = step."""
    t = check_layout(config, topology)
    dev = t.device
    B, S = check_int("batch", batch), check_int("context_tokens", context_tokens)
    R, C = t.mesh_shape
    L = config.num_layers
    w_bytes = weight_bytes_per_chip(config, t, bfp4_mlp, copy="decode")
    kv = kv_bytes_per_chip(config, t, B, S)
    memory_ms = (w_bytes + kv) / dev.memory_bandwidth_bytes_per_s / efficiency.decode_mbu * 1e3
    rows = -(-B // TILE) * TILE
    users = -(-B // C)
    mm_flops = 2 * L * _layer_elements(config, t) * rows
    attn_flops = 4 * users * S * (config.num_heads // R) * config.head_dim * L
    compute_ms = (mm_flops / dev.peak("fp8") + attn_flops / dev.peak("bf16")) / efficiency.decode_mfu * 1e3
    layer = layer_collectives(config, B, "decode", t)
    comm_ms = L * sum(r["ms"] for r in layer)
    step = max(memory_ms, compute_ms) + comm_ms + efficiency.step_overhead_ms
    return dict(batch=B, context_tokens=S, weight_bytes_read=w_bytes, kv_bytes_read=kv, memory_ms=memory_ms,
                matmul_flops=mm_flops, attention_flops=attn_flops, compute_ms=compute_ms, comm_ms=comm_ms,
                step_ms=step, binds="memory" if memory_ms >= compute_ms else "compute",
                formula="step = max((W_ring + KV_chip) / BW, 2·E_chip·32⌈B/32⌉ / P_fp8 + 4·⌈B/C⌉·S·(h_q/R)·d·L / "
                        "P_bf16) + L · Σ collectives")


def prefill(config: ModelConfig, prompt_tokens: int, batch: int = 1, topology: Topology | str | None = None,
            bfp4_mlp: bool = True, efficiency: Efficiency = IDEAL) -> dict:
    """A prefill of `batch` prompts of `prompt_tokens` on the mesh (T = batch × prompt rows): memory = interleaved
    weights / bandwidth / MBU; compute = 2 · E_chip · T / fp8 peak + causal attention 2 · S² · (h_q/R) · d · L ·
    batch / (C if the ring SDPA splits the sequence over the row's C chips, S > 1,024 at batch 1, else 1) / bf16
    peak, over MFU; time = max(memory, compute) + L × the layer's collectives."""
    t = check_layout(config, topology)
    dev = t.device
    S, B = check_int("prompt_tokens", prompt_tokens, limit=1 << 22), check_int("batch", batch, limit=MAX_USERS)
    R, C = t.mesh_shape
    L, T = config.num_layers, S * B
    w_bytes = weight_bytes_per_chip(config, t, bfp4_mlp, copy="prefill")
    memory_ms = w_bytes / dev.memory_bandwidth_bytes_per_s / efficiency.prefill_mbu * 1e3
    ring = S > 1024 and B == 1 and S % (2 * C) == 0
    mm_flops = 2 * L * _layer_elements(config, t) * T
    attn_flops = 2 * S * S * (config.num_heads // R) * config.head_dim * L * B / (C if ring else 1)
    compute_ms = (mm_flops / dev.peak("fp8") + attn_flops / dev.peak("bf16")) / efficiency.prefill_mfu * 1e3
    layer = layer_collectives(config, T, "prefill", t, batch=B)
    comm_ms = L * sum(r["ms"] for r in layer)
    total = max(memory_ms, compute_ms) + comm_ms + efficiency.step_overhead_ms
    return dict(prompt_tokens=S, batch=B, weight_bytes_read=w_bytes, memory_ms=memory_ms, matmul_flops=mm_flops,
                attention_flops=attn_flops, ring_sdpa=ring, compute_ms=compute_ms, comm_ms=comm_ms, ms=total,
                binds="memory" if memory_ms >= compute_ms else "compute",
                formula="prefill = max(W_interleaved / BW, 2·E_chip·T / P_fp8 + 2·S²·(h_q/R)·d·L·B / (C if ring "
                        "SDPA else 1) / P_bf16) + L · Σ collectives")


def max_users_by_kv(config: ModelConfig, context_tokens: int, topology: Topology | str | None = None,
                    bfp4_mlp: bool = True, usable_fraction: float = 0.9) -> int:
    """Most users whose KV of `context_tokens` fits beside the weights: each column holds ⌊(usable − weights) /
    KV per user per chip⌋ users, C columns; capped at the demo's 32 users."""
    t = check_layout(config, topology)
    S = check_int("context_tokens", context_tokens)
    f = check_fraction("usable_fraction", usable_fraction)
    free = t.device.memory_bytes * f - weight_bytes_per_chip(config, t, bfp4_mlp)
    per_user = kv_bytes_per_chip(config, t, 1, S)
    if free < per_user:
        return 0
    return min(MAX_USERS, int(free // per_user) * t.mesh_shape[1])


def galaxy_plan(config: ModelConfig, prompt_tokens: int, output_tokens: int, batch: int = 32,
                topology: Topology | str | None = None, bfp4_mlp: bool = True, usable_fraction: float = 0.9,
                efficiency: Efficiency = IDEAL) -> dict:
    """Size the Galaxy for a workload: memory per chip and its fit, most users the KV memory allows, decode ITL at
    the batch (at the last context, prompt + output), prefill time of one prompt (TTFT of a lone request) and of the
    whole batch, tokens/s; every number with the formula that made it."""
    t = check_layout(config, topology)
    P, O = check_int("prompt_tokens", prompt_tokens, limit=1 << 22), check_int("output_tokens", output_tokens)
    B = check_int("batch", batch)
    if B > MAX_USERS:
        raise SpecError(f"batch {B} exceeds the {MAX_USERS} users the Galaxy demo serves at once; choose 1-{MAX_USERS}")
    ctx = P + O
    if ctx > config.max_position_embeddings:
        raise SpecError(f"prompt + output = {ctx:,} tokens exceeds {config.name}'s {config.max_position_embeddings:,}-"
                        "token window: shorten them or pick a longer-context model")
    R, C = t.mesh_shape
    dev = t.device
    w = weight_bytes_per_chip(config, t, bfp4_mlp)
    kv = kv_bytes_per_chip(config, t, B, ctx)
    usable = dev.memory_bytes * check_fraction("usable_fraction", usable_fraction)
    dec = decode_step(config, B, ctx, t, bfp4_mlp, efficiency)
    pre1 = prefill(config, P, 1, t, bfp4_mlp, efficiency)
    users = max_users_by_kv(config, ctx, t, bfp4_mlp, usable_fraction)
    return dict(
        topology=t.name, device=dev.name, chips=t.chips, mesh_shape=list(t.mesh_shape), model=config.name,
        prompt_tokens=P, output_tokens=O, batch=B, context_tokens=ctx,
        weight_bytes_per_chip=w, kv_bytes_per_chip=kv, memory_bytes_per_chip=w + kv, usable_bytes_per_chip=usable,
        fits=w + kv <= usable, max_users_by_kv=users,
        itl_ms=dec["step_ms"], decode=dec, ttft_ms=pre1["ms"], prefill=pre1,
        output_tok_s=B / dec["step_ms"] * 1e3, tok_s_per_user=1e3 / dec["step_ms"],
        request_ms=pre1["ms"] + (O - 1) * dec["step_ms"],
        formulas=dict(
            weight_bytes_per_chip="Σ layers (interleaved + ring-padded copy) + vocabulary / chips, bfp8_b = 1.0625 "
                                  "B, bfp4_b = 0.5625 B per element",
            kv_bytes_per_chip=f"L · ⌈B/{C}⌉ · (h_kv/{R}) · (prompt + output) · d · 2 · 1.0625",
            fits="weights + KV ≤ usable_fraction × chip memory",
            max_users_by_kv=f"min({MAX_USERS}, ⌊(usable − weights) / KV per user per chip⌋ × {C})",
            itl_ms=dec["formula"], ttft_ms=pre1["formula"], output_tok_s="batch / ITL",
            request_ms="TTFT + (output − 1) × ITL"))


def reference_001_check(config: ModelConfig, topology: Topology | str | None = None) -> list[dict]:
    """Each shape 001 prints beside what the config and the 8 × 4 layout give, with the arithmetic that explains
    001's number where they differ (001 is a generated report; the layout above follows the tt-metal code)."""
    t = check_layout(config, topology)
    R, C = t.mesh_shape
    c, d = config, config.head_dim
    qkv = (c.num_heads // R + 2 * (c.num_kv_heads // R)) * d
    Fr = c.intermediate_size // R
    return [
        dict(what="local query heads", reference=8, layout=c.num_heads // R, agrees=c.num_heads // R == 8,
             why="h_q / R"),
        dict(what="local KV heads", reference=1, layout=c.num_kv_heads // R, agrees=c.num_kv_heads // R == 1,
             why="h_kv / R"),
        dict(what="head_dim", reference=128, layout=d, agrees=d == 128, why="D / h_q"),
        dict(what="QKV width after the all-reduce (001: 12,288)", reference=12288, layout=R * ring_padded(qkv),
             agrees=R * ring_padded(qkv) == 12288,
             why=f"the whole QKV of the R rows in the ring-padded decode layout: {R} × ring_padded({qkv}); a chip "
                 f"holds {qkv} = (h_q/R + 2·h_kv/R)·d columns of it (unpadded in prefill)"),
        dict(what="input width per chip (001: 1,280)", reference=1280, layout=c.hidden_size // C,
             agrees=c.hidden_size // C == 1280,
             why=f"D / C = {c.hidden_size // C}; 1,280 is the per-chip QKV width (h_q/R + 2·h_kv/R)·d = {qkv}"),
        dict(what="w1/w3 output width per chip (001: 14,336)", reference=14336, layout=Fr, agrees=Fr == 14336,
             why=f"F / R = {Fr}; 14,336 is Llama 3 8B's F (Llama 3 70B's is {c.intermediate_size})"),
        dict(what="after the FF1/FF3 reduce-scatter (001: 14,336 / 8 = 1,792)", reference=1792, layout=Fr // C,
             agrees=Fr // C == 1792, why=f"F / (R·C) = {Fr // C}: the scatter runs over the C = {C} chips of "
                                         f"axis 1, not 8"),
        dict(what="w2 output width per chip (001: 1,280)", reference=1280, layout=c.hidden_size // C,
             agrees=c.hidden_size // C == 1280, why=f"D / C = {c.hidden_size // C}"),
    ]


def galaxy_summary_text(plan: dict) -> str:
    """A few lines for a terminal: the plan's headline numbers."""
    gb = 1e9
    return "\n".join([
        f"{plan['model']} on {plan['topology']} ({plan['chips']} × {plan['device']})",
        f"  weights per chip       {plan['weight_bytes_per_chip'] / gb:.3f} GB (two copies: prefill + decode)",
        f"  KV per chip            {plan['kv_bytes_per_chip'] / gb:.3f} GB at batch {plan['batch']}, "
        f"{plan['context_tokens']:,} tokens",
        f"  fits                   {plan['fits']} (usable {plan['usable_bytes_per_chip'] / gb:.2f} GB a chip)",
        f"  max users by KV        {plan['max_users_by_kv']}",
        f"  TTFT (one prompt)      {plan['ttft_ms']:.2f} ms",
        f"  ITL                    {plan['itl_ms']:.3f} ms ({plan['tok_s_per_user']:.1f} tok/s/user)",
        f"  output tok/s           {plan['output_tok_s']:.1f}",
    ])
