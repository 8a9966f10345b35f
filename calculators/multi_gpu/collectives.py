"""All-reduce as serving stacks run it: NCCL's ring, tree and NVLink SHARP (NVLS), and the stacks' own one-shot
and two-shot kernels for small messages, chosen per stack (`specs/stacks.json`).

Every algorithm is alpha + wire bytes / link bandwidth per direction (the alpha-beta model), M = message bytes:
    ring      alpha_base + 2(n-1)·hop  +  2(n-1)/n · M / B        (NCCL LL: base 6.6 us, hop 0.6 us on NVLink)
    tree      6.8 us + 2(n-1)·hop  +  2(n-1)/n · M / B             (inside one node NCCL's tree is a chain)
    nvls      23 us  +  M / B                                     (the NVSwitch reduces and multicasts; NVLink 4+)
    one-shot  alpha_stack  +  (n-1) · M / B                       (each GPU reads every peer's buffer)
    two-shot  2·alpha_stack  +  2(n-1)/n · M / B                  (reduce-scatter + all-gather, two syncs)
NCCL picks the fastest algorithm its topology allows (src/graph/tuning.cc does exactly this with its own table);
vLLM/SGLang/TensorRT-LLM use their kernels when the world size, the message size and the links allow it
(one-shot below a size threshold, two-shot above, NCCL past `max_bytes`), and NCCL otherwise. llama.cpp runs no
all-reduce: it splits layers and passes activations, so its tensor-parallel cost here is NCCL's.
Decode messages are small (a [batch, D] activation: 16 KiB for a 70B at batch 1), so alpha decides: 160 calls
per token cost 160 × 15 us = 2.4 ms with NCCL's ring on 8 H100s, 160 × 4.7 us = 0.75 ms with vLLM's one-shot.
"""
from __future__ import annotations

from calculators.units import check_int, check_nonneg
from specs.devices import Link
from specs.model_config import SpecError
from specs.stacks import Stack, algorithm_doc, load_stack

ALGORITHMS = ("ring", "tree", "nvls", "one_shot", "two_shot")


def _bw(link: Link) -> float:
    if link.bytes_per_s is None:
        raise SpecError(f"{link.name} has no bandwidth of its own here; take it from a device (device_link)")
    return link.bytes_per_s


def ring_ms(message_bytes: float, devices: int, link: Link) -> float:
    """NCCL ring: alpha_base + 2(n−1)·hop + 2(n−1)/n · M / B; 0 for one device."""
    n, m = check_int("devices", devices), check_nonneg("message_bytes", message_bytes)
    if n == 1:
        return 0.0
    return (link.alpha_base_s + 2 * (n - 1) * link.alpha_per_hop_s + 2 * (n - 1) / n * m / _bw(link)) * 1e3


def tree_ms(message_bytes: float, devices: int, link: Link) -> float:
    """NCCL tree inside one node: 6.8 us + 2(n−1)·hop + 2(n−1)/n · M / B. tuning.cc charges a tree
    2·((ranks per node − 1)·intra hop + log2(nodes)·network hop): the log term only helps across nodes."""
    n, m = check_int("devices", devices), check_nonneg("message_bytes", message_bytes)
    if n == 1:
        return 0.0
    base = float(algorithm_doc("tree")["alpha_base_us"]) * 1e-6
    return (base + 2 * (n - 1) * link.alpha_per_hop_s + 2 * (n - 1) / n * m / _bw(link)) * 1e3


def nvls_ms(message_bytes: float, devices: int, link: Link) -> float:
    """NVLink SHARP: 23 us + M / B (each GPU sends and receives the message once; the switch reduces)."""
    n, m = check_int("devices", devices), check_nonneg("message_bytes", message_bytes)
    check_algorithm("nvls", link, n)
    if n == 1:
        return 0.0
    return (float(algorithm_doc("nvls")["alpha_us"]) * 1e-6 + m / _bw(link)) * 1e3


def one_shot_ms(message_bytes: float, devices: int, link: Link, alpha_s: float) -> float:
    """Custom one-shot: alpha + (n−1) · M / B: every GPU pulls all n−1 peer buffers and reduces them itself."""
    n, m = check_int("devices", devices), check_nonneg("message_bytes", message_bytes)
    if n == 1:
        return 0.0
    return (alpha_s + (n - 1) * m / _bw(link)) * 1e3


def two_shot_ms(message_bytes: float, devices: int, link: Link, alpha_s: float) -> float:
    """Custom two-shot: 2·alpha + 2(n−1)/n · M / B (reduce-scatter, all-gather: two synchronisations)."""
    n, m = check_int("devices", devices), check_nonneg("message_bytes", message_bytes)
    if n == 1:
        return 0.0
    factor = float(algorithm_doc("two_shot").get("alpha_factor", 2.0))
    return (factor * alpha_s + 2 * (n - 1) / n * m / _bw(link)) * 1e3


def check_algorithm(algorithm: str, link: Link, devices: int = 2, stack: Stack | None = None) -> str:
    """`algorithm` if it can run over `link` (with `stack`'s kernels for one/two-shot), else one SpecError saying
    why and what can: NVLS needs an NVSwitch with multicast; custom kernels need a stack that has them."""
    if algorithm not in ALGORITHMS:
        raise SpecError(f"unknown all-reduce algorithm {algorithm!r}; choose one of: {', '.join(ALGORITHMS)}")
    if algorithm == "nvls" and not link.multicast:
        raise SpecError(f"NVLS needs an NVSwitch with multicast (NVLink 4 or later, e.g. HGX H100); {link.name} "
                        "has none: choose ring or tree")
    if algorithm in ("one_shot", "two_shot"):
        s = stack or load_stack()
        if s.custom_allreduce is None:
            raise SpecError(f"{s.name} has no custom all-reduce kernels: choose ring, tree or nvls")
        if not custom_eligible(s, devices, 0.0, link):
            raise SpecError(f"{s.name}'s custom all-reduce needs {s.custom_allreduce.needs} and a world size in "
                            f"{s.custom_allreduce.world_sizes}; {devices} GPUs over {link.name} do not qualify")
    return algorithm


def custom_eligible(stack: Stack, devices: int, message_bytes: float, link: Link) -> bool:
    """Whether `stack` runs its own kernel for this call: world size supported, message within max_bytes, and
    peer access (every GPU on NVLink, or two GPUs over PCIe where the stack allows it)."""
    c = stack.custom_allreduce
    if c is None or devices not in c.world_sizes or message_bytes > c.max_bytes:
        return False
    if link.kind == "NVLink" and (link.switched or devices == 2):
        return True
    return devices == 2 and link.kind == "PCIe" and "world size 2" in c.needs


def nccl_allreduce(message_bytes: float, devices: int, link: Link) -> tuple[float, str]:
    """(ms, algorithm): the fastest of ring, tree and (with an NVSwitch that multicasts) NVLS, as NCCL's tuner
    picks."""
    options = {"ring": ring_ms(message_bytes, devices, link), "tree": tree_ms(message_bytes, devices, link)}
    if link.multicast and devices > 1:
        options["nvls"] = nvls_ms(message_bytes, devices, link)
    best = min(options, key=options.get)
    return options[best], best


def allreduce(message_bytes: float, devices: int, link: Link, stack: Stack | str | None = None,
              algorithm: str | None = None) -> dict:
    """One all-reduce as `stack` runs it: {'ms', 'algorithm', 'why'}. `algorithm` forces one (checked)."""
    s = stack if isinstance(stack, Stack) else load_stack(stack)
    n, m = check_int("devices", devices, limit=1 << 20), check_nonneg("message_bytes", message_bytes)
    if n == 1:
        return dict(ms=0.0, algorithm="none", why="one device: nothing to reduce")
    if algorithm is not None:
        check_algorithm(algorithm, link, n, s)
        alpha = s.custom_allreduce.alpha_s if s.custom_allreduce else 0.0
        ms = {"ring": lambda: ring_ms(m, n, link), "tree": lambda: tree_ms(m, n, link),
              "nvls": lambda: nvls_ms(m, n, link), "one_shot": lambda: one_shot_ms(m, n, link, alpha),
              "two_shot": lambda: two_shot_ms(m, n, link, alpha)}[algorithm]()
        return dict(ms=ms, algorithm=algorithm, why="chosen by hand")
    if custom_eligible(s, n, m, link):
        c = s.custom_allreduce
        if m < c.one_shot_below_bytes.get(n, 0.0):
            return dict(ms=one_shot_ms(m, n, link, c.alpha_s), algorithm="one_shot",
                        why=f"{s.name} one-shot below {c.one_shot_below_bytes[n] / 1024:,.0f} KiB on {n} GPUs")
        return dict(ms=two_shot_ms(m, n, link, c.alpha_s), algorithm="two_shot",
                    why=f"{s.name} two-shot up to {c.max_bytes / 2 ** 20:.0f} MiB")
    ms, algo = nccl_allreduce(m, n, link)
    return dict(ms=ms, algorithm=algo, why="NCCL (fastest of its algorithms on this link)")


def allreduce_ms(message_bytes: float, devices: int, link: Link, stack: Stack | str | None = None) -> float:
    """Time of one all-reduce as `stack` runs it, in ms (see `allreduce`)."""
    return allreduce(message_bytes, devices, link, stack)["ms"]
