"""DeepEP's communication buffers: the memory a wide expert-parallel server (attention data-parallel, experts over
the EP group) holds per GPU for its dispatch/combine all-to-alls when they run through DeepEP (SGLang
`--moe-a2a-backend deepep`, vLLM `--all2all-backend deepep_low_latency | deepep_high_throughput`).

Sources (DeepEP v1 API, the one vLLM and SGLang call; commit 567632dd59810d77b3cc05553df953cc0f779799 of
github.com/deepseek-ai/DeepEP, unchanged as `csrc/legacy/config.hpp` at dd758caf451848bd150e1046af3d0a73e5fff38d):
- `csrc/config.hpp` `LowLatencyLayout` and `get_low_latency_rdma_size_hint`: the low-latency RDMA (NVSHMEM) buffer.
- `csrc/config.hpp` `Config::get_nvl_buffer_size_hint`: the normal (high-throughput) mode's NVLink buffer.
- `csrc/kernels/configs.cuh`: 128-byte buffer alignment, 8 NVLink peers per node, a 32 MiB workspace.
- `csrc/deep_ep.cpp` `Buffer::Buffer`: per GPU it allocates the NVLink buffer (num_nvl_bytes, when > 0), the RDMA
  buffer (num_rdma_bytes, NVSHMEM) and the 32 MiB workspace.
- `deep_ep/buffer.py` `Buffer.num_sms = 20`, `get_dispatch_config` / `get_combine_config` (per rank count).

Low-latency layout, per GPU, for hidden size h, E experts (all of them, not the local ones) and T = the most tokens
one rank dispatches per call (`num_max_dispatch_tokens_per_rank`); s = h / 128 FP8 scale groups:
    dispatch message  m_d = 16 + max(2h, h + 4s)      a 16-byte header + the larger of a BF16 token and an FP8 token
                                                      with its fp32 scales (so FP8 dispatch does not shrink it)
    combine message   m_c = 2h + 4s                   a BF16 token + a BF16 min/max pair per 128 channels (LogFMT)
    send   = max(T·m_d, E·T·m_c)
    recv   = max(E·T·m_d, E·T·m_c)
    signal = ceil128(4E)                              one int counter per expert
    layout = 2·send + 2·recv + 2·signal               odd/even double buffering
    bytes  = (floor(layout / 128) + 1) · 128          the hint rounds up past the next 128-byte boundary
The EP rank count does not enter: every GPU reserves room for T tokens from every expert's slot.

Normal (high-throughput) mode, intranode NVLink buffer for N = min(ranks, 8) peers, R = max(ranks / 8, 1) nodes,
C = num_sms / 2 channels and `nvl_recv_tokens` per channel (DeepEP's configs: 20 SMs, 256 tokens for 2-8 ranks):
    bytes = ceil128(C·N·(2R + 3)·4 + C·N·recv·(hidden_bytes + 8 + 128·8 + 128·4 + 128·4))
(per token: the hidden row, an 8-byte source record, 128 top-k indices (int64), 128 top-k weights and 128 scales
(fp32)). Its internode RDMA buffer (past 8 ranks) is not modelled; for DeepSeek-V3 on 16 ranks it is ~0.1 GB,
far below the low-latency buffer that the same `num_rdma_bytes` holds when both modes are on (SGLang takes the
max).

What the stacks ask for (the planner's default is vLLM's, the default stack):
- vLLM (`vllm/distributed/device_communicators/all2all.py` `DeepEPLLAll2AllManager._make_all2all_kwargs`, commit
  001430048e8175c8dff1bc57e1a81a1fa75460f9): num_rdma_bytes = the low-latency hint with T = `moe.max_num_tokens` =
  VLLM_MOE_DP_CHUNK_SIZE (default 256, vllm/envs.py), num_nvl_bytes = VLLM_DEEPEP_BUFFER_SIZE_MB (default 1024) MiB.
  Its high-throughput manager takes the same 1024 MiB NVLink buffer (and as much RDMA across nodes).
- SGLang (`python/sglang/srt/layers/moe/token_dispatcher/deepep.py` `DeepEPBuffer.get_deepep_buffer`, commit
  003a81bf2870c07b110de13641ad4f0ba63b1fa1): num_nvl_bytes = the normal-mode NVLink hint of DeepEP's dispatch and
  combine configs, num_rdma_bytes = the low-latency hint with T = SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK
  (default 128, python/sglang/srt/environ.py).
DeepSeek-V3/R1 (h 7,168, 256 experts), vLLM's T = 256: 3,816,818,816 B low-latency + 1 GiB NVLink + 32 MiB
workspace = 4,924,115,072 B ≈ 4.92 GB per GPU.
"""
from __future__ import annotations

from calculators.units import MiB, bytes_per_element, check_int, check_nonneg
from specs.model_config import ModelConfig, SpecError

ALIGNMENT_BYTES = 128            # configs.cuh NUM_BUFFER_ALIGNMENT_BYTES
SCALE_GROUP = 128                # hidden channels per FP8 scale / LogFMT min-max pair
MAX_NVL_PEERS = 8                # configs.cuh NUM_MAX_NVL_PEERS
WORKSPACE_BYTES = 32 * MiB       # configs.cuh NUM_WORKSPACE_BYTES, allocated by every Buffer
NORMAL_MAX_TOPK = NORMAL_MAX_SCALES = 128     # Config::get_nvl_buffer_size_hint's per-token room
SOURCE_META_BYTES = 8            # internode.cu SourceMeta: two ints
DEFAULT_NUM_SMS = 20             # deep_ep/buffer.py Buffer.num_sms
DEFAULT_NVL_RECV_TOKENS = 256    # deep_ep/buffer.py dispatch and combine configs for 2-8 ranks

# vLLM, the default stack: VLLM_MOE_DP_CHUNK_SIZE and VLLM_DEEPEP_BUFFER_SIZE_MB defaults (vllm/envs.py).
VLLM_DISPATCH_TOKENS_PER_RANK = 256
VLLM_NVL_BUFFER_BYTES = 1024 * MiB
# SGLang: SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK default (python/sglang/srt/environ.py).
SGLANG_DISPATCH_TOKENS_PER_RANK = 128


def _ceil_to(n: int, step: int) -> int:
    """n rounded up to a multiple of `step`."""
    return -(-n // step) * step


def low_latency_message_bytes(hidden: int) -> tuple[int, int]:
    """(dispatch, combine) bytes of one token's low-latency message: m_d = 16 + max(2h, h + 4·h/128),
    m_c = 2h + 4·h/128 (see the module docstring)."""
    h = check_int("hidden", hidden)
    s = h // SCALE_GROUP
    return 16 + max(2 * h, h + 4 * s), 2 * h + 4 * s


def deepep_low_latency_bytes(hidden: int, num_experts: int, max_dispatch_tokens_per_rank: int) -> int:
    """Per-GPU bytes of DeepEP's low-latency RDMA buffer (`get_low_latency_rdma_size_hint`):
    2·max(T·m_d, E·T·m_c) + 2·max(E·T·m_d, E·T·m_c) + 2·ceil128(4E), then past the next 128-byte boundary.
    It does not depend on the EP rank count, nor on FP8 dispatch (the message reserves the larger of both)."""
    E = check_int("num_experts", num_experts)
    T = check_int("max_dispatch_tokens_per_rank", max_dispatch_tokens_per_rank, limit=1 << 20)
    m_d, m_c = low_latency_message_bytes(hidden)
    send = max(T * m_d, E * T * m_c)
    recv = max(E * T * m_d, E * T * m_c)
    signal = _ceil_to(4 * E, ALIGNMENT_BYTES)
    layout = 2 * send + 2 * recv + 2 * signal
    return (layout // ALIGNMENT_BYTES + 1) * ALIGNMENT_BYTES


def deepep_normal_nvl_bytes(hidden: int, ranks: int, dispatch_dtype: str | float = "bf16",
                            num_sms: int = DEFAULT_NUM_SMS, nvl_recv_tokens: int = DEFAULT_NVL_RECV_TOKENS) -> int:
    """Per-GPU bytes of DeepEP's normal-mode NVLink buffer (`Config::get_nvl_buffer_size_hint`):
    ceil128(C·N·(2R + 3)·4 + C·N·recv·(hidden_bytes + 8 + 128·8 + 128·4 + 128·4)), C = num_sms / 2 channels,
    N = min(ranks, 8), R = max(ranks / 8, 1). hidden_bytes = hidden × the dispatched element's bytes."""
    n = check_int("ranks", ranks, limit=1 << 16)
    sms, recv = check_int("num_sms", num_sms, limit=1024), check_int("nvl_recv_tokens", nvl_recv_tokens, limit=1 << 20)
    if n > MAX_NVL_PEERS and n % MAX_NVL_PEERS:
        raise SpecError(f"DeepEP needs at most {MAX_NVL_PEERS} ranks or a multiple of {MAX_NVL_PEERS}; got {n}")
    if sms % 2:
        raise SpecError(f"DeepEP's SM count must be even; got {sms}")
    hidden_bytes = int(round(check_int("hidden", hidden) * bytes_per_element(dispatch_dtype)))
    C, N, R = sms // 2, min(n, MAX_NVL_PEERS), max(n // MAX_NVL_PEERS, 1)
    per_token = hidden_bytes + SOURCE_META_BYTES + NORMAL_MAX_TOPK * (8 + 4) + NORMAL_MAX_SCALES * 4
    return _ceil_to(C * N * (2 * R + 3) * 4 + C * N * recv * per_token, ALIGNMENT_BYTES)


def wide_ep_buffer_bytes(config: ModelConfig, tp: int, ep: int,
                         max_dispatch_tokens_per_rank: int = VLLM_DISPATCH_TOKENS_PER_RANK,
                         nvl_bytes: float = VLLM_NVL_BUFFER_BYTES) -> float:
    """Per-GPU DeepEP memory of a layout: none unless the EP group spans several attention replicas (ep > tp,
    where vLLM and SGLang run their all-to-all kernels); else the low-latency buffer at T tokens per rank + the
    NVLink buffer + the 32 MiB workspace. Defaults: vLLM's (T = 256, 1 GiB NVLink buffer)."""
    if check_int("ep", ep, limit=1 << 16) <= check_int("tp", tp, limit=1 << 16) or not config.num_experts:
        return 0.0
    ll = deepep_low_latency_bytes(config.hidden_size, config.num_experts, max_dispatch_tokens_per_rank)
    return float(ll + check_nonneg("nvl_bytes", nvl_bytes) + WORKSPACE_BYTES)
