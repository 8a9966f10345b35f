"""A model on several GPUs: per-GPU memory (fit verdict), decode and prefill time with communication, for a layout
of tensor (tp), pipeline (pp) and expert (ep) parallelism, replicated `gpus / (tp·pp)` times (data parallel).

Rules (Megatron-LM, Shoeybi et al. 2019; vLLM's sharded layers):
- TP splits every projection by heads / FFN columns: a GPU holds 1/tp of each layer's matrices and the
  vocabulary-parallel embedding and LM head. K/V projections and the KV cache cannot split below one KV head:
  past tp = h_kv they are replicated, max(1, tp / h_kv) copies. MLA's latent cache is replicated on every TP rank.
- PP places ceil(L / pp) layers on the heaviest stage; the first stage also holds the embedding, the last the head.
- EP places whole experts on devices (bytes per GPU as under TP); it swaps the MoE layers' all-reduce for two
  all-to-alls (dispatch, combine).
- Communication is not overlapped with compute (an upper bound, as the peer tools assume by default).
Each stage's time is the roofline max(bytes / (bandwidth·MBU), FLOPs / (peak·MFU)) on its share, plus its
collectives (`calculators.multi_gpu.parallel`, alpha-beta over the link's per-direction bandwidth).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from calculators import arch
from calculators.sizing.kv_cache import kv_cache_bytes
from calculators.sizing.latency import IDEAL, Efficiency, step_weight_bytes
from calculators.sizing.memory import (DEFAULT_GPU_MEMORY_UTILIZATION, DEFAULT_PREFILL_CHUNK, RuntimeOverheads,
                                _largest, ffn_width, prefill_scratch_bytes, resident_weight_bytes)
from calculators.multi_gpu.collectives import allreduce_ms
from calculators.multi_gpu.deepep import wide_ep_buffer_bytes
from calculators.multi_gpu.moe import ep_problem, exchange_bytes, moe_layer_comm_ms, routing_imbalance
from calculators.multi_gpu.parallel import kv_head_replication, p2p_ms, tp_allreduce_bytes
from calculators.sizing.params import bytes_per_param, expert_params, param_breakdown
from calculators.sizing.roofline import forward_flops_split, gpu_time, step_peaks
from calculators.units import bytes_per_element, check_fraction, check_int, default_kv_dtype
from specs.devices import Device, Link, device_link
from specs.model_config import ModelConfig, SpecError
from specs.stacks import Stack, load_stack


@dataclass(frozen=True)
class Mesh:
    """A parallel layout: `tp` × `pp` GPUs serve one copy of the model; `ep` of the tp GPUs hold disjoint
    experts; `gpus` in all (a multiple of tp·pp: the rest are data-parallel replicas)."""
    tp: int = 1
    pp: int = 1
    ep: int = 1
    gpus: int | None = None

    @property
    def gpus_per_replica(self) -> int:
        return self.tp * self.pp

    @property
    def total_gpus(self) -> int:
        return self.gpus or self.gpus_per_replica

    @property
    def replicas(self) -> int:
        return self.total_gpus // self.gpus_per_replica

    @property
    def communicating_gpus(self) -> int:
        """GPUs one step's collectives span: a replica's tp·pp, or the EP group when it spans replicas."""
        return max(self.gpus_per_replica, self.ep * self.pp)


def mesh_problem(config: ModelConfig, mesh: Mesh) -> str | None:
    """Why this layout cannot run this model (None if it can): TP must divide the query heads and split the KV
    heads evenly (or replicate them evenly), PP at most the layer count, EP only for MoE, dividing the experts,
    and a divisor or a multiple of TP (`moe.ep_problem`), the GPU count a multiple of tp·pp (of ep·pp when the
    EP group spans several data-parallel replicas)."""
    c = config
    try:
        tp, pp, ep = check_int("tp", mesh.tp, limit=4096), check_int("pp", mesh.pp, limit=4096), \
            check_int("ep", mesh.ep, limit=4096)
        gpus = check_int("gpus", mesh.total_gpus, limit=1 << 20)
    except SpecError as e:
        return str(e)
    if c.num_heads % tp:
        return (f"TP {tp} does not divide {c.name}'s {c.num_heads} attention heads: choose TP among "
                f"{', '.join(str(d) for d in range(1, c.num_heads + 1) if c.num_heads % d == 0 and d <= 64)}")
    if not arch.is_mla(c) and c.num_kv_heads % tp and tp % c.num_kv_heads:
        return f"TP {tp} cannot split or evenly replicate {c.num_kv_heads} KV heads"
    if pp > c.num_layers:
        return f"PP {pp} exceeds the {c.num_layers} layers: a stage needs at least one layer"
    problem = ep_problem(c, ep, tp)
    if problem:
        return problem
    if gpus % (tp * pp):
        return f"{gpus} GPUs are not a multiple of TP {tp} × PP {pp} = {tp * pp}"
    if ep > tp and gpus % (ep * pp):
        fits = [e for e in range(1, gpus // pp + 1) if (gpus // pp) % e == 0 and ep_problem(c, e, tp) is None]
        return (f"an EP group of {ep} GPUs spans {ep // tp} data-parallel replicas: {gpus} GPUs are not a multiple "
                f"of EP {ep} × PP {pp} = {ep * pp}; with {gpus} GPUs at TP {tp} × PP {pp} choose EP among "
                f"{', '.join(map(str, fits))}")
    return None


def check_mesh(config: ModelConfig, mesh: Mesh) -> Mesh:
    """`mesh` if valid, else SpecError with `mesh_problem`'s reason."""
    problem = mesh_problem(config, mesh)
    if problem:
        raise SpecError(problem)
    return mesh


def stage_layers(config: ModelConfig, pp: int) -> int:
    """Layers on the heaviest pipeline stage: ceil(L / pp). 80 layers over 4 stages: 20."""
    return math.ceil(config.num_layers / check_int("pp", pp))


def per_gpu_weight_bytes(config: ModelConfig, mesh: Mesh, weight_dtype: str = "bf16",
                         group_size: int | None = None, embeddings_16bit: bool = True) -> float:
    """Weights resident on the busiest GPU: (layer weights × stage_layers / L) / tp + the KV-projection copies
    past tp = h_kv + the embedding or head table(s) of that stage / tp."""
    check_mesh(config, mesh)
    c, tp, pp = config, mesh.tp, mesh.pp
    b = param_breakdown(c)
    bpp = bytes_per_param(weight_dtype, group_size)
    total = resident_weight_bytes(c, weight_dtype, group_size, embeddings_16bit)
    tbl_bpp = 2.0 if embeddings_16bit and bpp < 2 else bpp
    emb, head = b.embedding * tbl_bpp, b.lm_head * tbl_bpp
    layers_bytes = total - emb - head
    share = stage_layers(c, pp) / c.num_layers
    if pp == 1:
        tables = emb + head
    else:                                  # first stage: embedding; last: head (a tied model keeps a copy there)
        tables = max(emb, head if b.lm_head else emb)
    extra = 0.0
    if not arch.is_mla(c) and tp > c.num_kv_heads:
        per_layer_kv_proj = 2 * c.hidden_size * c.head_dim * bpp          # one KV head's k and v projections
        extra = per_layer_kv_proj * (1 - c.num_kv_heads / tp) * stage_layers(c, pp)
    routed = 0.0
    if mesh.ep > tp:                       # EP across replicas: routed experts split ep ways, the rest tp ways
        routed = b.experts_routed * bpp * share
    return (layers_bytes * share - routed) / tp + routed / mesh.ep + extra + tables / tp


def ep_tokens(mesh: Mesh, rows: float) -> float:
    """Tokens that meet in one EP group's MoE layer when each replica brings `rows`: rows × max(1, ep / tp)."""
    return rows * max(1.0, mesh.ep / mesh.tp)


def expert_imbalance_for(config: ModelConfig, mesh: Mesh, rows: float, imbalance: float | None) -> float:
    """The busiest EP rank's load ÷ the mean: `imbalance` if given (≥ 1), else uniform random routing's."""
    if not arch.is_moe(config) or mesh.ep == 1:
        return 1.0
    if imbalance is not None:
        if not imbalance >= 1:
            raise SpecError(f"expert imbalance is the busiest GPU's load over the mean: at least 1, got {imbalance!r}")
        return float(imbalance)
    return routing_imbalance(ep_tokens(mesh, rows), config.num_experts, config.num_experts_per_tok, mesh.ep)


def _expert_flops_extra(config: ModelConfig, mesh: Mesh, tokens: float, imbalance: float) -> float:
    """FLOPs the busiest GPU does beyond its mean share of the routed experts: (imbalance − 1) × tokens · k ·
    2 · expert params × MoE layers / tp."""
    if imbalance <= 1:
        return 0.0
    c = config
    per_token = c.num_experts_per_tok * 2 * expert_params(c) * arch.moe_layer_count(c)
    return (imbalance - 1) * tokens * per_token / mesh.tp


def per_gpu_kv_bytes(config: ModelConfig, mesh: Mesh, context_tokens: int, batch: int = 1,
                     kv_dtype: str = "bf16") -> float:
    """KV cache on the busiest GPU: total × (stage_layers / L) / tp × max(1, tp / h_kv); MLA's latent is not
    split by heads, so every TP rank keeps the whole latent of its layers."""
    check_mesh(config, mesh)
    c = config
    kv = kv_cache_bytes(c, context_tokens, batch, kv_dtype) * stage_layers(c, mesh.pp) / c.num_layers
    if arch.is_mla(c):
        return kv
    return kv / mesh.tp * kv_head_replication(c.num_kv_heads, mesh.tp)


def per_gpu_activation_bytes(config: ModelConfig, mesh: Mesh, context_tokens: int, batch: int = 1,
                             act_dtype: str = "bf16", prefill_chunk: int = DEFAULT_PREFILL_CHUNK) -> float:
    """004's scratch formula with the head- and FFN-sharded widths divided by tp (the residual stream is not),
    plus this GPU's slice of the fp32 logits."""
    c, tp = config, mesh.tp
    rows = max(min(check_int("context_tokens", context_tokens, minimum=0, limit=1 << 40),
                   check_int("prefill_chunk", prefill_chunk)), check_int("batch", batch, limit=1 << 30))
    kv_w = c.kv_dim if arch.is_mla(c) else max(c.kv_dim // tp, c.head_dim)
    scratch = prefill_scratch_bytes(rows, c.hidden_size, max(c.q_dim // tp, 1), max(kv_w, 1),
                                    max(ffn_width(c) // tp, 1), bytes_per_element(act_dtype))
    return scratch + batch * c.vocab_size / tp * 4.0


def per_gpu_memory(config: ModelConfig, device: Device, mesh: Mesh, context_tokens: int, batch: int = 1,
                   weight_dtype: str = "bf16", kv_dtype: str | None = None,
                   usable_fraction: float = DEFAULT_GPU_MEMORY_UTILIZATION,
                   overheads: RuntimeOverheads = RuntimeOverheads(), embeddings_16bit: bool = True,
                   group_size: int | None = None, kv_fraction_of_free: bool = False,
                   moe_dp_comm: str = "allgather_reducescatter") -> dict:
    """The busiest GPU's memory: weights + KV (`batch` sequences of `context_tokens`, spread over the replicas'
    pipelines as they are) + activations + runtime overheads + DeepEP's all-to-all buffers where the EP group spans
    several attention replicas and the stack exchanges the tokens by DeepEP (`moe_dp_comm` "all_to_all", the
    stack's `Stack.moe_dp_comm`; `deepep.wide_ep_buffer_bytes`, vLLM's defaults; the default gathers through
    NCCL's own buffers, in the runtime overheads) vs usable = device ×
    gpu_memory_utilization (vLLM: the fraction bounds everything). `kv_fraction_of_free` (TensorRT-LLM's
    free_gpu_memory_fraction): the fraction bounds the KV cache alone, as a share of what the weights, activations,
    overheads and buffers leave free, so usable = those + fraction × (device − those). `batch` is the number of
    sequences ONE replica holds."""
    kd = kv_dtype or default_kv_dtype(weight_dtype)
    w = per_gpu_weight_bytes(config, mesh, weight_dtype, group_size, embeddings_16bit)
    kv = per_gpu_kv_bytes(config, mesh, context_tokens, batch, kd)
    act = per_gpu_activation_bytes(config, mesh, context_tokens, batch)
    over = overheads.total_bytes(mesh.communicating_gpus)      # communication buffers past 1 GPU
    a2a = deepep_buffer_bytes(config, mesh, moe_dp_comm)       # DeepEP's, with attention DP only
    frac = check_fraction("usable_fraction", usable_fraction)
    rest = w + act + over + a2a
    usable = rest + frac * max(device.memory_bytes - rest, 0.0) if kv_fraction_of_free else device.memory_bytes * frac
    needed = rest + kv
    return dict(per_gpu_weight_bytes=w, per_gpu_kv_bytes=kv, per_gpu_activation_bytes=act, overhead_bytes=over,
                a2a_buffer_bytes=a2a,
                per_gpu_needed_bytes=needed, usable_bytes=usable, device_bytes=device.memory_bytes,
                fits=needed <= usable, headroom_bytes=usable - needed, short_by_bytes=max(0.0, needed - usable),
                stage_layers=stage_layers(config, mesh.pp),
                kv_head_copies=1.0 if arch.is_mla(config) else kv_head_replication(config.num_kv_heads, mesh.tp))


def deepep_buffer_bytes(config: ModelConfig, mesh: Mesh, moe_dp_comm: str) -> float:
    """DeepEP's buffers on one GPU of `mesh` (`deepep.wide_ep_buffer_bytes`) where the stack exchanges a wide-EP
    MoE layer's tokens by all-to-all; 0 where it gathers them (`Stack.moe_dp_comm`)."""
    return wide_ep_buffer_bytes(config, mesh.tp, mesh.ep) if moe_dp_comm == "all_to_all" else 0.0


def max_batch_per_replica(config: ModelConfig, device: Device, mesh: Mesh, context_tokens: int,
                          weight_dtype: str = "bf16", kv_dtype: str | None = None, limit: int = 1 << 16,
                          **kw) -> int:
    """Most sequences of `context_tokens` one replica holds (0 if the weights alone do not fit)."""
    def ok(b):
        return b == 0 or per_gpu_memory(config, device, mesh, context_tokens, b, weight_dtype, kv_dtype, **kw)["fits"]
    return _largest(ok, limit)


def _link_for(device: Device, link: Link | None) -> Link | None:
    return link if link is not None else device_link(device)


def _need_link(mesh: Mesh, link: Link | None, device: Device) -> None:
    if mesh.gpus_per_replica > 1 and link is None:
        raise SpecError(f"{device.name} has no interconnect in specs/devices.json: choose one (NVLink, PCIe, "
                        "InfiniBand, Ethernet) to cost the communication")


def _weight_read_ratio(config: ModelConfig, weight_dtype: str, rows: int) -> float:
    """Share of resident weights one step reads (1 for dense; the touched experts for MoE)."""
    return step_weight_bytes(config, weight_dtype, rows=rows) / step_weight_bytes(config, weight_dtype, rows=1 << 30)


def exchange_tokens(rows: int, mesh: Mesh) -> int:
    """Tokens one GPU sends in a wide-EP MoE layer's exchange: its replica's `rows` split over the replica's tp
    GPUs (after attention's all-reduce each holds them all, and each sends its share), at least one."""
    return max(1, math.ceil(rows / mesh.tp))


def _comm_per_stage_ms(config: ModelConfig, mesh: Mesh, rows: int, link: Link | None,
                       stack: Stack | str | None = None, imbalance: float = 1.0, weight_dtype: str = "bf16") -> float:
    """Collectives one stage runs for `rows` tokens: an all-reduce after attention in each of its layers; after
    the FFN an all-reduce (dense, MoE without EP or with EP inside the TP group), or, when the EP group spans
    data-parallel replicas, the stack's token exchange in the MoE layers (`moe.moe_layer_comm_ms` by
    `Stack.moe_dp_comm`: all-gather + reduce-scatter, or dispatch + combine all-to-alls; the tokens in NVFP4 for
    FP4 experts). The all-reduce is the one `stack` runs (`calculators.multi_gpu.collectives`; vLLM when None)."""
    c, tp = config, mesh.tp
    if (tp == 1 and mesh.ep == 1) or link is None:
        return 0.0
    n_layers = stage_layers(c, mesh.pp)
    share_moe = arch.moe_layer_count(c) / c.num_layers if mesh.ep > 1 else 0.0
    ar = allreduce_ms(tp_allreduce_bytes(c.hidden_size, rows), tp, link, stack)
    if mesh.ep > tp:                       # data-parallel attention, EP across replicas: two all-to-alls per MoE layer
        s = stack if isinstance(stack, Stack) else load_stack(stack)
        a2a = moe_layer_comm_ms(exchange_tokens(rows, mesh), c, mesh.ep, link, exchange_bytes(weight_dtype),
                                imbalance, method=s.moe_dp_comm)
        return n_layers * (ar + (1 - share_moe) * ar + share_moe * a2a)
    # EP inside the TP group: after attention's all-reduce every rank holds every token, runs its own experts on
    # them and the partial outputs are summed by the FFN's all-reduce, exactly as for a TP-split dense FFN
    return n_layers * 2 * ar


def _stage(c: ModelConfig, device: Device, mesh: Mesh, tokens: int, kd: str, weight_dtype: str,
           embeddings_16bit: bool, kv: float, f: dict, mbu: float, mfu: float, efficiency: Efficiency,
           link: Link | None, stack, expert_imbalance: float | None, sequences: int) -> dict:
    """One pipeline stage carrying `tokens` token rows on the busiest GPU: the weights they touch and `kv` bytes
    read, the FLOPs `f` (`forward_flops_split`) split by TP and the stage's share of the layers, the weight GEMMs
    and attention each on its own roofline (`roofline.gpu_time`) at `mbu`/`mfu`, its collectives, and the host's
    fixed work for `sequences` sequences (`Efficiency.stage_ms`)."""
    share = stage_layers(c, mesh.pp) / c.num_layers
    imb = expert_imbalance_for(c, mesh, tokens, expert_imbalance)
    w = per_gpu_weight_bytes(c, mesh, weight_dtype, None, embeddings_16bit) * \
        _weight_read_ratio(c, weight_dtype, math.ceil(ep_tokens(mesh, tokens)))
    fl = dict(weights=(f["weights"] / mesh.tp + _expert_flops_extra(c, mesh, tokens, imb)) * share,
              attention=f["attention"] / mesh.tp * share)
    pk = step_peaks(device, weight_dtype, kd)
    bw = device.memory_bandwidth_bytes_per_s * mbu
    mem_w, mem_kv = w / bw * 1e3, kv / bw * 1e3
    comp_w = fl["weights"] / (pk["weights"] * mfu) * 1e3
    comp_a = fl["attention"] / (pk["attention"] * mfu) * 1e3
    comm_ms = _comm_per_stage_ms(c, mesh, tokens, link, stack, imb, weight_dtype)
    return dict(weight_bytes=w, kv_bytes=kv, flops=fl["weights"] + fl["attention"], precision=pk["precision"],
                memory_ms=mem_w + mem_kv, compute_ms=comp_w + comp_a, comm_ms=comm_ms,
                stage_ms=float(efficiency.stage_ms(gpu_time(mem_w, comp_w, mem_kv, comp_a) + comm_ms, sequences)))


def decode_step_parallel(config: ModelConfig, device: Device, mesh: Mesh, context_tokens: int, batch: int = 1,
                         weight_dtype: str = "bf16", kv_dtype: str | None = None,
                         efficiency: Efficiency = IDEAL, link: Link | None = None, microbatches: int | None = None,
                         embeddings_16bit: bool = True, stack: Stack | str | None = None,
                         expert_imbalance: float | None = None) -> dict:
    """One decode step of `batch` sequences on one replica. The batch runs as m = min(batch, pp) microbatches;
    a stage's time is the roofline of its share for batch/m rows plus its collectives; a token of one sequence
    waits for every stage and every microbatch: ITL = max(m, pp) × stage + (pp − 1) × stage-boundary send, a stage
    being max(memory, compute) + its collectives (as `stack` runs them) + the fixed step cost.
    Why PP does not speed up one request: max(1, pp) × (a stage with 1/pp of the layers) = the whole model."""
    check_mesh(config, mesh)
    c = config
    kd = kv_dtype or default_kv_dtype(weight_dtype)
    B = check_int("batch", batch, limit=1 << 30)
    link = _link_for(device, link)
    _need_link(mesh, link, device)
    m = min(B, mesh.pp) if microbatches is None else check_int("microbatches", microbatches)
    rows = math.ceil(B / m)
    st = _stage(c, device, mesh, rows, kd, weight_dtype, embeddings_16bit, per_gpu_kv_bytes(c, mesh, context_tokens,
                rows, kd), forward_flops_split(c, 1, context_tokens, rows), efficiency.decode_mbu,
                efficiency.decode_mfu, efficiency, link, stack, expert_imbalance, rows)
    w, kv, flops, prec = st["weight_bytes"], st["kv_bytes"], st["flops"], st["precision"]
    mem_ms, comp_ms, comm_ms, stage_ms = st["memory_ms"], st["compute_ms"], st["comm_ms"], st["stage_ms"]
    send_ms = p2p_ms(tp_allreduce_bytes(c.hidden_size, rows), link) if mesh.pp > 1 else 0.0
    itl = max(m, mesh.pp) * stage_ms + (mesh.pp - 1) * send_ms
    return dict(itl_ms=itl, stage_ms=stage_ms, memory_ms=mem_ms, compute_ms=comp_ms, comm_ms_per_stage=comm_ms,
                overhead_ms=efficiency.overhead_ms(rows),
                allreduce_ms_per_token=mesh.pp * comm_ms, pp_send_ms=send_ms, microbatches=m,
                bubble_fraction=max(0, mesh.pp - m) / mesh.pp, total_tok_s=B / itl * 1e3 * mesh.replicas,
                replica_tok_s=B / itl * 1e3, bound="memory" if mem_ms >= comp_ms else "compute",
                comm_fraction=max(m, mesh.pp) * comm_ms / itl if itl else 0.0,
                bytes_per_gpu=w + kv, flops_per_gpu=flops, precision=prec)


def prefill_parallel(config: ModelConfig, device: Device, mesh: Mesh, prompt_tokens: int, batch: int = 1,
                     weight_dtype: str = "bf16", kv_dtype: str | None = None, efficiency: Efficiency = IDEAL,
                     link: Link | None = None, embeddings_16bit: bool = True,
                     stack: Stack | str | None = None, expert_imbalance: float | None = None) -> dict:
    """Prefill of `batch` prompts of `prompt_tokens` on one replica: each stage runs its share of the FLOPs
    (/tp) or of the bytes, whichever is slower, plus 2 all-reduces per layer of a [batch·P, D] activation; the
    stages run one after the other for a single prompt: TTFT = pp × stage + (pp − 1) × boundary send."""
    check_mesh(config, mesh)
    c = config
    kd = kv_dtype or default_kv_dtype(weight_dtype)
    P, B = check_int("prompt_tokens", prompt_tokens), check_int("batch", batch, limit=1 << 30)
    link = _link_for(device, link)
    _need_link(mesh, link, device)
    st = _stage(c, device, mesh, B * P, kd, weight_dtype, embeddings_16bit, per_gpu_kv_bytes(c, mesh, P, B, kd),
                forward_flops_split(c, P, P, B), efficiency.prefill_mbu, efficiency.prefill_mfu, efficiency, link,
                stack, expert_imbalance, B)
    flops, prec = st["flops"], st["precision"]
    mem_ms, comp_ms, comm_ms, stage_ms = st["memory_ms"], st["compute_ms"], st["comm_ms"], st["stage_ms"]
    send_ms = p2p_ms(tp_allreduce_bytes(c.hidden_size, B * P), link) if mesh.pp > 1 else 0.0
    ttft = mesh.pp * stage_ms + (mesh.pp - 1) * send_ms
    return dict(prefill_ms=ttft, stage_ms=stage_ms, compute_ms=comp_ms, memory_ms=mem_ms,
                overhead_ms=efficiency.overhead_ms(B),
                allreduce_ms_prefill=mesh.pp * comm_ms, pp_send_ms=send_ms,
                bound="compute" if comp_ms > mem_ms else "memory", flops_per_gpu=flops, precision=prec,
                comm_fraction=mesh.pp * comm_ms / ttft if ttft else 0.0)


def fit_advice(config: ModelConfig, device: Device, mesh: Mesh, context_tokens: int, batch: int = 1,
               weight_dtype: str = "bf16", kv_dtype: str | None = None, **kw) -> list[str]:
    """What would make a setup fit, each checked: a larger TP (same precision), fewer sequences, FP8 KV cache,
    8-bit or 4-bit weights. Empty when it already fits."""
    mem = per_gpu_memory(config, device, mesh, context_tokens, batch, weight_dtype, kv_dtype, **kw)
    if mem["fits"]:
        return []
    out = []
    for tp in (2, 4, 8, 16, 32, 64):
        m2 = Mesh(tp=tp, pp=mesh.pp, ep=1)
        if tp > mesh.tp and mesh_problem(config, m2) is None and \
                per_gpu_memory(config, device, m2, context_tokens, batch, weight_dtype, kv_dtype, **kw)["fits"]:
            out.append(f"TP {tp} ({tp * mesh.pp} GPUs per replica)")
            break
    for pp in (2, 4, 8, 16):
        m2 = Mesh(tp=mesh.tp, pp=pp, ep=mesh.ep)
        if pp > mesh.pp and mesh_problem(config, m2) is None and \
                per_gpu_memory(config, device, m2, context_tokens, batch, weight_dtype, kv_dtype, **kw)["fits"]:
            out.append(f"PP {pp} ({mesh.tp * pp} GPUs per replica)")
            break
    b = max_batch_per_replica(config, device, mesh, context_tokens, weight_dtype, kv_dtype, limit=batch, **kw)
    if 0 < b < batch:
        out.append(f"at most {b:,} sequences of {context_tokens:,} tokens per replica")
    kd = kv_dtype or default_kv_dtype(weight_dtype)
    if bytes_per_element(kd) > 1 and per_gpu_memory(config, device, mesh, context_tokens, batch, weight_dtype,
                                                    "fp8", **kw)["fits"]:
        out.append("an FP8 KV cache")
    for wd in ("fp8", "int4"):
        if bytes_per_element(wd) < bytes_per_element(weight_dtype) and per_gpu_memory(
                config, device, mesh, context_tokens, batch, wd, kd, **kw)["fits"]:
            out.append(f"{wd.upper()} weights")
            break
    return out or ["nothing within TP 64 / PP 16, FP8 KV and INT4 weights: a device with more memory"]


def fit_verdict(config: ModelConfig, device: Device, mesh: Mesh, context_tokens: int, batch: int = 1,
                weight_dtype: str = "bf16", kv_dtype: str | None = None, **kw) -> dict:
    """The per-GPU memory check in words, for every page that shows a latency or a cost: fits (with headroom),
    or short by how much and what would make it fit."""
    from calculators.units import fmt_bytes
    mem = per_gpu_memory(config, device, mesh, context_tokens, batch, weight_dtype, kv_dtype, **kw)
    where = f"{mesh.total_gpus} × {device.name} (TP {mesh.tp}, PP {mesh.pp}" + \
        (f", EP {mesh.ep}" if mesh.ep > 1 else "") + ")"
    if mem["fits"]:
        text = (f"Fits: {batch:,} × {context_tokens:,} tokens on {where} need {fmt_bytes(mem['per_gpu_needed_bytes'])}"
                f" per GPU of {fmt_bytes(mem['usable_bytes'])} usable ({fmt_bytes(mem['headroom_bytes'])} spare).")
        advice = []
    else:
        advice = fit_advice(config, device, mesh, context_tokens, batch, weight_dtype, kv_dtype, **kw)
        text = (f"Does NOT fit: {batch:,} × {context_tokens:,} tokens on {where} need "
                f"{fmt_bytes(mem['per_gpu_needed_bytes'])} per GPU but only {fmt_bytes(mem['usable_bytes'])} is "
                f"usable: {fmt_bytes(mem['short_by_bytes'])} short. Would fit with: {'; or '.join(advice)}.")
    return dict(fits=mem["fits"], text=text, advice=advice, memory=mem)


def generation_latency_parallel(config: ModelConfig, device: Device, mesh: Mesh, prompt_tokens: int,
                                output_tokens: int, batch: int = 1, weight_dtype: str = "bf16",
                                kv_dtype: str | None = None, efficiency: Efficiency | None = None,
                                link: Link | None = None, embeddings_16bit: bool = True,
                                stack: Stack | str | None = None) -> dict:
    """`latency.generation_latency` on a mesh: ideal and realistic TTFT, ITL (at the reply's mean context),
    total, tokens/s (all replicas) and cost per request and per 1M input / output tokens (`calculators.planning.cost`),
    with the all-reduce time of each phase. Realistic numbers default to `stack`'s efficiencies and fixed step
    cost on this device (vLLM when None)."""
    from calculators.planning.cost import cost_per_request
    eff = efficiency or Efficiency.for_stack(stack, device, config=config)
    P, N = check_int("prompt_tokens", prompt_tokens), check_int("output_tokens", output_tokens)
    mean_ctx = P + max(N - 1, 0) // 2 + 1
    out = {}
    for label, e in (("ideal", IDEAL), ("realistic", eff)):
        pre = prefill_parallel(config, device, mesh, P, batch, weight_dtype, kv_dtype, e, link, embeddings_16bit,
                               stack=stack)
        dec = decode_step_parallel(config, device, mesh, mean_ctx, batch, weight_dtype, kv_dtype, e, link,
                                   embeddings_16bit=embeddings_16bit, stack=stack)
        row = dict(ttft_ms=pre["prefill_ms"], prefill_ms=pre["prefill_ms"], prefill_bound=pre["bound"],
                   itl_ms=dec["itl_ms"], decode_bound=dec["bound"],
                   total_ms=pre["prefill_ms"] + dec["itl_ms"] * (N - 1), per_stream_tok_s=1e3 / dec["itl_ms"],
                   total_tok_s=dec["total_tok_s"], allreduce_ms_per_token=dec["allreduce_ms_per_token"],
                   allreduce_ms_prefill=pre["allreduce_ms_prefill"], decode_comm_fraction=dec["comm_fraction"],
                   step_overhead_ms=e.step_overhead_ms)
        if device.price_usd_per_hour:
            row.update(cost_per_request(device.price_usd_per_hour, mesh.gpus_per_replica, pre["prefill_ms"],
                                        dec["itl_ms"], batch, P, N))
        out[label] = row
    out["mean_context_tokens"] = mean_ctx
    out["efficiency"] = {k: getattr(eff, k) for k in ("decode_mbu", "prefill_mfu", "prefill_mbu", "decode_mfu",
                                                      "step_overhead_ms")}
    return out


def max_context_per_replica(config: ModelConfig, device: Device, mesh: Mesh, batch: int = 1,
                            weight_dtype: str = "bf16", kv_dtype: str | None = None, **kw) -> int:
    """Longest context (capped at the model's window) for which `batch` sequences fit per replica; 0 if the
    weights alone do not fit."""
    def ok(t):
        return per_gpu_memory(config, device, mesh, t, batch, weight_dtype, kv_dtype, **kw)["fits"]
    if not ok(0):
        return 0
    return _largest(lambda t: t == 0 or ok(t), config.max_position_embeddings)
