"""All-reduce by serving stack: each algorithm's alpha-beta time worked by hand from the constants in
specs/stacks.json and specs/devices.json, the choice each stack makes, and one clear message for a pair that
cannot exist."""
import pytest

from calculators.multi_gpu.collectives import allreduce, check_algorithm, nccl_allreduce
from calculators.multi_gpu.tensor_parallel import Mesh, decode_step_parallel
from specs.devices import device_link, load_device
from specs.model_config import SpecError
from specs.presets import load_preset
from specs.stacks import load_stack

H100 = device_link(load_device("h100"))          # NVLink 4 through NVSwitch: 450 GB/s a direction, multicast
H100_PCIE = device_link(load_device("h100-pcie"))
US = 1e-3                                        # one microsecond in ms


def test_vllm_runs_one_shot_below_256_kib_on_8_gpus():
    # 16 KiB (a 70B's decode activation at batch 1): alpha 4.5 us + 7 peers × 16,384 B / 450 GB/s
    r = allreduce(16384, 8, H100, "vllm")
    assert r["algorithm"] == "one_shot"
    assert r["ms"] == pytest.approx(4.5 * US + 7 * 16384 / 450e9 * 1e3)


def test_vllm_runs_two_shot_between_256_kib_and_8_mib():
    r = allreduce(512 * 1024, 8, H100, "vllm")
    assert r["algorithm"] == "two_shot"
    assert r["ms"] == pytest.approx(2 * 4.5 * US + 2 * 7 / 8 * 524288 / 450e9 * 1e3)
    assert allreduce(300 * 1024, 4, H100, "vllm")["algorithm"] == "one_shot"      # 4 GPUs: one-shot below 512 KiB


def test_past_8_mib_nccl_takes_over_and_nvls_beats_the_ring_on_an_nvswitch():
    m = 64 * 2 ** 20
    ring = 6.6 * US + 14 * 0.6 * US + 2 * 7 / 8 * m / 450e9 * 1e3        # 276 us
    nvls = 23 * US + m / 450e9 * 1e3                                     # 172 us
    r = allreduce(m, 8, H100, "vllm")
    assert r["algorithm"] == "nvls" and r["ms"] == pytest.approx(nvls) and nvls < ring


def test_plain_nccl_small_message_is_the_ring():
    ms, algo = nccl_allreduce(16384, 8, H100)
    assert algo == "ring" and ms == pytest.approx(6.6 * US + 14 * 0.6 * US + 2 * 7 / 8 * 16384 / 450e9 * 1e3)


def test_pcie_pairs_get_vllm_custom_kernels_but_not_four_gpus_or_trtllm():
    assert allreduce(16384, 2, H100_PCIE, "vllm")["algorithm"] == "one_shot"
    four = allreduce(16384, 4, H100_PCIE, "vllm")
    assert four["algorithm"] == "ring"                                    # PCIe: alpha_per_hop 1.0 us
    assert four["ms"] == pytest.approx(6.6 * US + 6 * 1.0 * US + 2 * 3 / 4 * 16384 / H100_PCIE.bytes_per_s * 1e3)
    assert allreduce(16384, 2, H100_PCIE, "trtllm")["algorithm"] == "ring"


def test_the_issues_example_llama3_70b_tp8_decode_allreduce_per_token():
    # 160 all-reduces of 16 KiB: NCCL ring 15.06 us each = 2.41 ms (the old default); vLLM one-shot 4.75 us each
    c, dev = load_preset("llama-3-70b"), load_device("h100")
    nccl = decode_step_parallel(c, dev, Mesh(tp=8), 1024, 1, "bf16", stack="nccl")["allreduce_ms_per_token"]
    vllm = decode_step_parallel(c, dev, Mesh(tp=8), 1024, 1, "bf16", stack="vllm")["allreduce_ms_per_token"]
    assert nccl == pytest.approx(160 * (15.0 * US + 2 * 7 / 8 * 16384 / 450e9 * 1e3))
    assert nccl == pytest.approx(2.41, abs=0.01)
    assert vllm == pytest.approx(160 * (4.5 * US + 7 * 16384 / 450e9 * 1e3))


def test_bad_pairs_say_why_in_one_message():
    with pytest.raises(SpecError, match="NVLS needs an NVSwitch with multicast.*choose ring or tree"):
        allreduce(16384, 4, H100_PCIE, "vllm", algorithm="nvls")
    with pytest.raises(SpecError, match="has no custom all-reduce kernels"):
        check_algorithm("one_shot", H100, 8, load_stack("nccl"))
    with pytest.raises(SpecError, match="unknown serving stack 'tgi'; choose one of: vllm, sglang, trtllm"):
        load_stack("tgi")
    with pytest.raises(SpecError, match="unknown all-reduce algorithm"):
        allreduce(16384, 8, H100, "vllm", algorithm="butterfly")


def test_one_device_costs_nothing_and_the_default_stack_is_vllm():
    assert allreduce(16384, 1, H100)["ms"] == 0.0
    assert load_stack(None).key == "vllm" and load_stack("TensorRT-LLM").key == "trtllm"
    assert load_stack("llama.cpp").key == "llamacpp"
