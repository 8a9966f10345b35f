"""specs/stacks.json: every stack has its sources, limits and fitted values; device classes."""
import pytest

from specs.devices import load_device
from specs.stacks import algorithm_doc, device_class, list_stacks, load_stack


@pytest.mark.parametrize("key", ["vllm", "sglang", "trtllm", "llamacpp", "nccl"])
def test_every_stack_has_sources_and_sane_numbers(key):
    s = load_stack(key)
    assert s.scheduler_source and s.doc["kv_reservation_source"] and s.fit_rows
    assert s.kv_reservation in ("full", "on_demand") and 0 < s.gpu_memory_utilization <= 1
    assert s.max_num_seqs >= 1 and s.max_num_batched_tokens >= 1
    assert all(v >= 0 for v in s.step_overhead_ms.values())
    if s.custom_allreduce:
        assert s.custom_allreduce.source and 0 < s.custom_allreduce.alpha_s < 20e-6


def test_algorithms_cite_nccl_or_the_stack_source():
    for name in ("ring", "tree", "nvls", "one_shot", "two_shot"):
        assert algorithm_doc(name)["source"]
    assert list_stacks()[0] == "vllm"


def test_device_classes():
    assert device_class(load_device("h100")) == "datacenter-gpu"
    assert device_class(load_device("rtx4090")) == "consumer-gpu"
    assert device_class(load_device("m2-ultra")) == "apple"
    assert device_class(load_device("tpu-v5e")) == "tpu"


def test_a_stack_on_hardware_it_does_not_run_on_is_one_message():
    from calculators.sizing.latency import Efficiency
    from specs.model_config import SpecError
    with pytest.raises(SpecError, match="TensorRT-LLM does not run on MI300X \\(AMD\\).*choose vLLM, SGLang"):
        Efficiency.for_stack("trtllm", load_device("mi300x"))
    Efficiency.for_stack("vllm", load_device("mi300x"))                 # vLLM runs on ROCm


def test_measured_host_reads_a_vendors_own_step_cost_where_it_has_one():
    """`measured_host(vendor)`: a vendor listed under step_overhead_ms_by_vendor gets its own fixed step cost and
    its compute and memory scales; any other vendor the stack's step cost and scales of 1."""
    from dataclasses import replace
    s = load_stack("vllm")
    doc = dict(s.doc, measured_host=dict(step_overhead_ms=1.5, sequence_overhead_us=8.0,
                                         borrowed_compute_scale={"AMD": 1.25}, borrowed_memory_scale={"AMD": 1.75},
                                         step_overhead_ms_by_vendor={"AMD": 3.5}))
    t = replace(s, doc=doc)
    assert t.measured_host("AMD") == dict(step_overhead_ms=3.5, sequence_overhead_us=8.0, borrowed_compute_scale=1.25,
                                          borrowed_memory_scale=1.75)
    assert t.measured_host("NVIDIA") == dict(step_overhead_ms=1.5, sequence_overhead_us=8.0,
                                             borrowed_compute_scale=1.0, borrowed_memory_scale=1.0)
    del doc["measured_host"]["borrowed_memory_scale"]           # a fit from before the memory scale: 1
    assert t.measured_host("AMD")["borrowed_memory_scale"] == 1.0
    del doc["measured_host"]["step_overhead_ms_by_vendor"]
    assert t.measured_host("AMD")["step_overhead_ms"] == 1.5


def test_a_build_keeps_its_stacks_scheduler_and_host_and_brings_its_own_vendor_factors():
    """`load_stack("vllm@amd-mlperf-5.1")`: the stack's key, scheduler and efficiencies, its name saying the build,
    and `measured_host` with the build's vendor fields over the stack's (the step and per-sequence costs stay the
    stack's). An unknown build, or a build of a stack that lists none, is one message naming what exists."""
    from dataclasses import replace
    from specs.model_config import SpecError
    base, b = load_stack("vllm"), load_stack("vllm@amd-mlperf-5.1")
    assert (b.key, b.build, b.full_key, base.full_key) == ("vllm", "amd-mlperf-5.1", "vllm@amd-mlperf-5.1", "vllm")
    assert b.name.startswith(base.name + " (") and "MLPerf" in b.name
    assert (b.max_num_seqs, b.max_num_batched_tokens, b.efficiency, b.kv_reservation) == \
        (base.max_num_seqs, base.max_num_batched_tokens, base.efficiency, base.kv_reservation)
    host = dict(step_overhead_ms=1.5, sequence_overhead_us=8.0, borrowed_compute_scale={"AMD": 2.0},
                borrowed_memory_scale={"AMD": 1.75}, step_overhead_ms_by_vendor={"AMD": 2.0})
    own = dict(borrowed_compute_scale={"AMD": 1.25}, borrowed_memory_scale={"AMD": 1.0},
               step_overhead_ms_by_vendor={"AMD": 3.0})
    t = replace(b, doc=dict(base.doc, measured_host=host), build_doc=dict(b.build_doc, measured_host=own))
    assert t.measured_host("AMD") == dict(step_overhead_ms=3.0, sequence_overhead_us=8.0,
                                          borrowed_compute_scale=1.25, borrowed_memory_scale=1.0)
    assert t.measured_host("NVIDIA") == dict(step_overhead_ms=1.5, sequence_overhead_us=8.0,
                                             borrowed_compute_scale=1.0, borrowed_memory_scale=1.0)
    assert replace(t, doc=dict(base.doc, measured_host=None)).measured_host("AMD") is None   # no stack fit: none
    with pytest.raises(SpecError, match="vllm has no build 'nightly'; its builds: amd-mlperf-5.1"):
        load_stack("vllm@nightly")
    with pytest.raises(SpecError, match="sglang has no build 'x' \\(it lists none\\)"):
        load_stack("sglang@x")
