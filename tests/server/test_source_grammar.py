"""One grammar of model sources (engine.load.loading.parse_source) for the loader and classroom mode's policy: a
source the loader would open as a path is checked as a path, one it would fetch is checked against the Hub list."""
import pytest

from engine.errors import ModelError
from engine.load.loading import parse_source
from server.classroom import ClassroomPolicy

POLICY = ClassroomPolicy(enabled=True, models_dir=None, hub_allow=("HuggingFaceTB/*",), hub_max_bytes=1e9,
                         random_max_bytes=1e9)


@pytest.mark.parametrize("source, kind, name", [
    ("", "default", ""), ("smollm2", "default", ""), ("SmolLM2-135M-Instruct", "default", ""),
    ("gemma3", "gemma3", ""), ("random:tinyllama", "random", "tinyllama"), ("random: llama-3-70b", "random", "llama-3-70b"),
    ("/nowhere/model.gguf", "path", ""), ("./my-model", "path", ""), ("~/models/x", "path", ""),
    ("tinyllama", "repo", "TinyLlama/TinyLlama-1.1B-Chat-v1.0"), ("owner/name", "repo", "owner/name"),
    ("not a source!", "unknown", ""),
])
def test_each_form_is_read_once(source, kind, name):
    src = parse_source(source)
    assert (src.kind, src.name) == (kind, name)


@pytest.mark.parametrize("source, refusal", [
    ("/nowhere/model.gguf", "opening local paths on the server is turned off"),
    ("./my-model", "opening local paths on the server is turned off"),
    ("tinyllama", "TinyLlama/TinyLlama-1.1B-Chat-v1.0 is not on the list"),
    ("owner/name", "owner/name is not on the list"),
    ("random:llama-3-70b", "random weights of"),
])
def test_the_policy_checks_what_the_loader_would_do(source, refusal):
    with pytest.raises(ModelError, match=refusal):
        POLICY.check_model_source(source, download_bytes=lambda repo: 0.0)


def test_allowed_sources_pass_without_fetching_anything():
    POLICY.check_model_source("smollm2")
    POLICY.check_model_source("random:smollm2-135m")          # 135M params x 4 B = 0.54 GB < the 1 GB cap
    POLICY.check_model_source("HuggingFaceTB/SmolLM2-360M", download_bytes=lambda repo: 0.7e9)
