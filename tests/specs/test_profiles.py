"""Device profiles (specs/profile_format.py, specs/profiles.py): a profile survives a round trip through .json and
.json.gz, loads once per process, is found by name and by (device, stack, version), and every malformed file is
one SpecError that names the file and the problem."""
import gzip
import json
import os

import numpy as np
import pytest

from specs.model_config import SpecError
from specs.profile_format import FORMAT, Profile, profile_to_doc, tables_from_columns
from specs.profiles import available_profiles, load_profile, profile_for, save_profile


def small_profile(version="0.24.0", device="H200", name=None, datasheet=None) -> Profile:
    tables = tables_from_columns({
        "gemm": {"dtype": ["bf16", "bf16", "fp8"], "m": np.array([1, 8192, 1]), "n": [4096] * 3, "k": [4096] * 3,
                 "ms": [0.0126, 0.3818, 0.0080]},
        "generation_attention": {"dtype": ["bf16"], "kv_dtype": ["fp8"], "batch": [32], "context": [4096],
                                 "heads": [64], "kv_heads": [8], "head_dim": [128], "window": [0], "ms": [0.103]},
        "allreduce": {"dtype": ["bf16", "bf16"], "bytes": [16384, 1048576], "gpus": [8, 8],
                      "kind": ["custom_graph", "nccl"], "ms": [0.0052, 0.0276]},
    }, "test")
    return Profile(name=name or f"h200-vllm-{version}", device=device, stack="vllm", stack_version=version,
                   source={"kind": "profiler", "version": "1", "detail": "hand-written"},
                   provenance={"device": "NVIDIA H200", "date": "2026-11-29"}, tables=tables,
                   datasheet=datasheet or {})


def write_doc(path, doc, gz=False):
    data = json.dumps(doc).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_a_profile_survives_save_and_load(tmp_path, suffix):
    p = small_profile()
    q = load_profile(save_profile(p, tmp_path / f"h200-vllm-0.24.0{suffix}"))
    assert (q.name, q.device, q.stack, q.stack_version, q.source, q.provenance) == \
           (p.name, p.device, p.stack, p.stack_version, p.source, p.provenance)
    assert set(q.tables) == set(p.tables)
    for t in p.tables:
        for c, a in p.tables[t].items():
            assert np.array_equal(q.tables[t][c], a) and q.tables[t][c].dtype.kind == a.dtype.kind
    assert q.table("gemm")["m"].dtype == np.int64 and q.rows("gemm") == 3
    assert not q.table("gemm")["ms"].flags.writeable          # shared through the cache: read-only


def test_a_profile_loads_once_and_again_only_when_its_file_changes(tmp_path):
    path = save_profile(small_profile(), tmp_path / "a.json")
    first = load_profile(path)
    assert load_profile(path) is first
    save_profile(small_profile(version="0.25.0"), path)
    later = path.stat().st_mtime_ns + 10 ** 9          # a file system with coarse times may not tick by itself
    os.utime(path, ns=(later, later))
    assert load_profile(path).stack_version == "0.25.0"


def test_profiles_by_name_and_the_newest_for_a_device_and_stack(tmp_path):
    for v in ("0.19.0", "0.24.0", "0.24.0rc1"):
        save_profile(small_profile(version=v), tmp_path / f"h200-vllm-{v}.json.gz")
    names = available_profiles(tmp_path)
    assert names[:3] == ["h200-vllm-0.19.0", "h200-vllm-0.24.0", "h200-vllm-0.24.0rc1"]
    assert load_profile("h200-vllm-0.19.0", tmp_path).stack_version == "0.19.0"
    assert profile_for("h200", "vllm", directory=tmp_path).stack_version == "0.24.0"     # rc1 sorts before it
    assert profile_for("H200", "VLLM", "0.19.0", directory=tmp_path).stack_version == "0.19.0"
    assert profile_for("H200", "vllm", "0.1.0", directory=tmp_path) is None
    assert profile_for("h100", "numpy", directory=tmp_path) is None
    with pytest.raises(SpecError, match="unknown profile 'nope'.*h200-vllm-0.19.0"):
        load_profile("nope", tmp_path)


def test_an_unknown_device_loads_with_its_own_datasheet(tmp_path):
    sheet = {"memory_bandwidth_bytes_per_s": 1.0e12, "peak_flops": {"bf16": 2.0e14}}
    q = load_profile(save_profile(small_profile(device="Lab GPU X1", datasheet=sheet), tmp_path / "x1.json"))
    dev = q.device_spec()
    assert q.device == "Lab GPU X1" and dev.memory_bandwidth_bytes_per_s == 1.0e12 and dev.peak("bf16") == 2.0e14
    assert load_profile(save_profile(small_profile(device="h200"), tmp_path / "h.json")).device == "H200"


def good_doc():
    return profile_to_doc(small_profile())


def broken(case):
    """(how to break a good document or file, the message expected)."""
    doc = good_doc()
    if case == "ragged":
        doc["tables"]["gemm"]["rows"][1] = doc["tables"]["gemm"]["rows"][1][:-1]
        return doc, r"table 'gemm' is ragged: row 1 has 4 values for 5 columns"
    if case == "negative ms":
        doc["tables"]["gemm"]["rows"][2][-1] = -0.5
        return doc, r"latency ms must be positive, row 2 has -0.5"
    if case == "zero ms":
        doc["tables"]["allreduce"]["rows"][0][-1] = 0
        return doc, r"latency ms must be positive"
    if case == "unknown device":
        doc["device"] = "Lab GPU X1"
        return doc, r"unknown device 'Lab GPU X1' and no usable datasheet"
    if case == "datasheet precision":
        doc["device"], doc["datasheet"] = "Lab GPU X1", {"memory_bandwidth_bytes_per_s": 1e12,
                                                         "peak_flops": {"fp9": 1e14}}
        return doc, r"datasheet.peak_flops: unknown precision 'fp9'"
    if case == "format tag":
        doc["format"] = "inference-lab/profile-0"
        return doc, r"format tag is 'inference-lab/profile-0', expected 'inference-lab/profile-1'"
    if case == "missing key":
        del doc["stack_version"]
        return doc, r"missing keys stack_version"
    if case == "missing column":
        doc["tables"]["gemm"]["columns"][1] = "rows_m"
        return doc, r"table 'gemm' lacks columns m"
    if case == "text in a number column":
        doc["tables"]["gemm"]["rows"][0][1] = "one"
        return doc, r"column 'm' must hold numbers"
    if case == "all-gather without its kind":
        doc["tables"]["allgather"] = {"columns": ["dtype", "bytes", "gpus", "ms"], "rows": [["fp16", 1048576, 8, 0.02]]}
        return doc, r"table 'allgather' lacks columns kind"
    if case == "source kind":
        doc["source"] = {"kind": "guess", "version": "1"}
        return doc, r"source must say its kind"
    raise AssertionError(case)


@pytest.mark.parametrize("case", ["ragged", "negative ms", "zero ms", "unknown device", "datasheet precision",
                                  "format tag", "missing key", "missing column", "text in a number column",
                                  "all-gather without its kind", "source kind"])
def test_a_malformed_profile_is_one_spec_error_naming_the_file(tmp_path, case):
    doc, message = broken(case)
    path = write_doc(tmp_path / "bad.json", doc)
    with pytest.raises(SpecError, match=message) as e:
        load_profile(path)
    assert str(path) in str(e.value)


def test_nan_latency_and_truncated_files_are_spec_errors(tmp_path):
    text = json.dumps(good_doc()).replace("0.3818", "NaN")
    nan = tmp_path / "nan.json"
    nan.write_text(text)
    with pytest.raises(SpecError, match="holds NaN"):
        load_profile(nan)
    whole = json.dumps(good_doc()).encode()
    cut_json = tmp_path / "cut.json"
    cut_json.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(SpecError, match=r"cut.json is not valid JSON \(truncated\?\)"):
        load_profile(cut_json)
    packed = gzip.compress(whole)
    cut_gz = tmp_path / "cut.json.gz"
    cut_gz.write_bytes(packed[: len(packed) // 2])
    with pytest.raises(SpecError, match=r"cut.json.gz is not a readable gzip file \(truncated\?\)"):
        load_profile(cut_gz)
    with pytest.raises(SpecError, match="does not exist"):
        load_profile(tmp_path / "absent.json")
    with pytest.raises(SpecError, match="must end in .json or .json.gz"):
        save_profile(small_profile(), tmp_path / "p.txt")
    odd = small_profile()
    odd.tables["gemm"] = {**odd.tables["gemm"], "ms": np.array([0.01, -1.0, 0.02])}
    with pytest.raises(SpecError, match=r"not written to .*odd.json.*latency ms must be positive"):
        save_profile(odd, tmp_path / "odd.json")
    assert not (tmp_path / "odd.json").exists()


def test_an_unknown_table_is_ignored_with_a_warning(tmp_path):
    doc = good_doc()
    doc["tables"]["rope"] = {"columns": ["tokens", "ms"], "rows": [[1, 0.01]]}
    with pytest.warns(UserWarning, match="ignoring tables this version does not read: rope"):
        p = load_profile(write_doc(tmp_path / "extra.json.gz", doc, gz=True))
    assert set(p.tables) == {"gemm", "generation_attention", "allreduce"} and doc["format"] == FORMAT
