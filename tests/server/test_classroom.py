"""The app as a shared server: sessions never see each other's records, hooks or results; heavy jobs wait their
turn with a clear place in line and a memory check; models are evicted only when no session uses them;
"this machine" is never replaced under another user; classroom mode refuses what it must, with clear messages.
"""
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from engine import Hooks, Model, ModelError, record_generation
from server.classroom import ClassroomPolicy
from server.jobs import JobQueue, JobRefused
from helpers_models import prompt, tiny
import ui.machine  # noqa: F401  (so sys.modules holds it)
from ui.model_picker import CHOICE_KEY, LOCAL_CHOICE, PATH_KEY, RANDOM_PREFIX, REPO_CHOICE, REPO_KEY, SharedModels

TIMEOUT = 60
from helpers_apptest import errors, walkthrough_problems

ROOT = Path(__file__).resolve().parents[2]
APP, ROOFLINE = str(ROOT / "app.py"), str(ROOT / "pages" / "23_Roofline.py")
SMALL_RANDOM = RANDOM_PREFIX + "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def model():
    return Model.random(tiny(), seed=3)


# ------------------------------------------------------------------------------------------ session isolation
def test_two_sessions_recording_at_once_each_get_only_their_own_record_and_hook_calls(model):
    """Two sessions record generations on the shared model at the same time, each with its own hooks; each
    record (and each hook's captures) equals the same call made alone."""
    a, b = prompt(9, seed=1), prompt(14, seed=2)

    def session(ids, out):
        seen = []
        hooks = Hooks().add("blocks.0.hook_resid_post", lambda name, x: seen.append(x.shape))
        rec = record_generation(model, ids, max_new_tokens=6, attention_layers=[0], kv_layers=[1])
        logits = model.forward(np.array([ids]), model.new_cache(1, len(ids)), hooks=hooks)
        out.update(rec=rec, seen=seen, logits=logits)

    ra, rb = {}, {}
    threads = [threading.Thread(target=session, args=(a, ra)), threading.Thread(target=session, args=(b, rb))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
        assert not t.is_alive(), "a recording session did not finish within its deadline"
    for ids, got in ((a, ra), (b, rb)):
        solo = record_generation(model, ids, max_new_tokens=6, attention_layers=[0], kv_layers=[1])
        assert got["rec"].prompt_ids == ids
        assert got["rec"].generated_ids == solo.generated_ids
        for s, t in zip(got["rec"].steps, solo.steps):
            assert s.attention.keys() == t.attention.keys() == {(0, h) for h in range(model.config.num_heads)}
            assert s.cache_tokens == t.cache_tokens
        assert got["seen"] == [(1, len(ids), model.config.hidden_size)]     # its own pass only, once
    assert not hasattr(model, "hooks")                                 # nothing installed on the shared model


def test_two_browser_sessions_see_only_their_own_reply():
    at_a = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at_b = AppTest.from_file(APP, default_timeout=TIMEOUT)
    for at in (at_a, at_b):
        at.session_state[CHOICE_KEY] = SMALL_RANDOM
        at.session_state["prompt"] = "alpha" if at is at_a else "beta gamma"
        at.run()
    at_a.text_input(key="gen.max_new_tokens").set_value("3")
    at_a = at_a.button(key="generate").click().run()
    assert not at_a.exception and not errors(at_a)
    assert "last_generation" in at_a.session_state
    at_b = at_b.run()
    assert "last_generation" not in at_b.session_state                 # B never sees A's reply
    at_b.text_input(key="gen.max_new_tokens").set_value("2")
    at_b = at_b.button(key="generate").click().run()
    ra, rb = at_a.session_state["last_generation"], at_b.session_state["last_generation"]
    assert "alpha" in ra.prompt_text and "beta gamma" in rb.prompt_text and "alpha" not in rb.prompt_text
    assert len(ra.tokens) == 3 and len(rb.tokens) == 2
    assert "timings measured at this client for your request" in " ".join(c.value for c in at_b.caption)


# ------------------------------------------------------------------------------------------ heavy jobs
def test_job_queue_order_busy_place_and_refusals():
    q = JobQueue(max_running=1, max_waiting=2, free_memory=lambda: 10e9)
    first, second, third = q.enter("A"), q.enter("B"), q.enter("C")
    assert q.wait(first, timeout_s=0)                                  # A runs at once
    assert (q.position(second), q.position(third)) == (1, 2)
    assert not q.wait(third, timeout_s=0.01)                           # C may not jump the line
    with pytest.raises(JobRefused, match="busy: 2 heavy jobs are already waiting"):
        q.enter("D")
    q.leave(first)
    assert q.wait(second, timeout_s=1) and q.position(third) == 1
    q.leave(second)
    with pytest.raises(JobRefused, match=r"needs about 9.50 GB of memory, but only 10.00 GB"):
        q.enter("huge", memory_bytes=9.5e9)                            # above 90 % of what is free
    q.leave(third)                                                     # C gives up waiting
    places = []
    holder = q.enter("E")
    assert q.wait(holder, timeout_s=0)
    done = threading.Event()

    def job_f():
        with q.slot("F", on_wait=places.append, poll_s=0.01) as ticket:
            assert ticket.started_at is not None
            done.set()

    worker = threading.Thread(target=job_f)
    worker.start()
    deadline = time.monotonic() + 10                                   # every wait here has a deadline
    while not places:                                                  # F is told its place while E runs
        assert time.monotonic() < deadline and worker.is_alive(), "F was never told its place in line"
        threading.Event().wait(0.01)
    assert places[0] == 1 and not done.is_set()
    q.leave(holder)
    worker.join(5)
    assert done.is_set() and q.status() == {"running": [], "waiting": []}     # F ran, then left


def test_memory_is_checked_again_when_the_job_starts():
    free = [10e9]
    q = JobQueue(max_running=1, max_waiting=4, free_memory=lambda: free[0])
    running, waiting = q.enter("first"), q.enter("needs 5 GB", memory_bytes=5e9)
    assert q.wait(running, timeout_s=0)
    free[0] = 2e9                                                      # memory ran short meanwhile
    q.leave(running)
    with pytest.raises(JobRefused, match="needs about 5.00 GB"):
        q.wait(waiting, timeout_s=1)
    assert q.status() == {"running": [], "waiting": []}


# ------------------------------------------------------------------------------------------ shared models
@pytest.fixture
def store(monkeypatch, model):
    loaded = []

    def fake_load(source, progress=None):
        loaded.append(source)
        return Model.random(tiny(), seed=len(loaded))

    monkeypatch.setattr(sys.modules["ui.model_picker"], "load_model", fake_load)   # `ui.model_picker` is also
                                                                                  # the widget's name in `ui`
    alive = {"s1": True, "s2": True, "s3": True}
    evicted = []
    s = SharedModels(max_models=1, is_alive=lambda sid: alive.get(sid, False), on_evict=evicted.append)
    return s, alive, evicted, loaded


def test_models_in_use_are_never_evicted(store):
    s, alive, evicted, loaded = store
    s.get("m1", user="s1")
    s.get("m2", user="s2")
    s.get("m3", user="s3")
    assert s.sources() == ["m1", "m2", "m3"] and evicted == []         # above the cap, but each one in use
    s.use("s1", "m3")                                                  # s1 moves: nobody uses m1 any more
    assert s.sources() == ["m2", "m3"] and evicted == ["m1"]
    assert s.users("m3") == 2 and s.users("m2") == 1


def test_a_closed_session_stops_holding_its_model(store):
    s, alive, evicted, loaded = store
    s.get("m1", user="s1")
    s.get("m2", user="s2")
    assert evicted == []
    alive["s1"] = False                                                # s1's browser closed
    assert s.evict_unused() == ["m1"] and s.sources() == ["m2"]
    s.release("s2")
    assert s.sources() == ["m2"]                                       # at the cap: nothing more to drop
    assert loaded == ["m1", "m2"]                                      # each loaded once


# ------------------------------------------------------------------------------------------ classroom mode
@pytest.fixture
def policy(tmp_path):
    return ClassroomPolicy.from_env({"INFERENCE_LAB_CLASSROOM": "1", "INFERENCE_LAB_MODELS_DIR": str(tmp_path),
                                     "INFERENCE_LAB_HUB_ALLOW": "TinyLlama/*", "INFERENCE_LAB_HUB_MAX_GB": "2.5",
                                     "INFERENCE_LAB_RANDOM_MAX_GB": "1"})


def test_classroom_refusals_say_what_rule_refused(policy, tmp_path):
    sizes = {"TinyLlama/TinyLlama-1.1B-Chat-v1.0": 2.2e9, "TinyLlama/huge": 3e9}
    check = lambda src: policy.check_model_source(src, download_bytes=sizes.__getitem__)   # noqa: E731
    with pytest.raises(ModelError, match="outside the allowed folder"):
        check("/etc/passwd")
    with pytest.raises(ModelError, match="outside the allowed folder"):
        check(str(tmp_path / ".." / "escape.gguf"))                    # '..' resolved before the check
    with pytest.raises(ModelError, match="not on the list of Hub repositories.*allowed: TinyLlama/\\*"):
        check("meta-llama/Llama-2-7b-hf")
    with pytest.raises(ModelError, match="3.00 GB download, above this server's cap of 2.50 GB"):
        check("TinyLlama/huge")
    with pytest.raises(ModelError, match="random weights of TinyLlama-1.1B take 4.40 GB .* cap of 1.00 GB"):
        check("random:TinyLlama-1.1B")                                 # 1.1 B params × 4 bytes
    with pytest.raises(ModelError, match="INFERENCE_LAB_RANDOM_MAX_GB"):
        check("random:TinyLlama-1.1B")                                 # and which setting changes the rule
    check("TinyLlama/TinyLlama-1.1B-Chat-v1.0")                        # allowed and small enough
    check(str(tmp_path / "model.gguf"))                                # inside the folder
    check("random:SmolLM2-135M-Instruct")                              # 0.54 GB
    check("smollm2")                                                   # the bundled default: always
    check("gemma3")                                                    # an installed package: offline too


def test_single_user_mode_keeps_todays_freedom(tmp_path):
    free = ClassroomPolicy.from_env({})
    assert not free.enabled
    for source in ("/etc/passwd", "meta-llama/Llama-3.1-405B", "random:Llama-3.1-405B"):
        free.check_model_source(source, download_bytes=lambda r: 1e12)
    no_folder = ClassroomPolicy.from_env({"INFERENCE_LAB_CLASSROOM": "1"})
    with pytest.raises(ModelError, match="opening local paths on the server is turned off"):
        no_folder.check_local_path(tmp_path)
    with pytest.raises(ModelError, match="INFERENCE_LAB_HUB_MAX_GB='big' is not a number"):
        ClassroomPolicy.from_env({"INFERENCE_LAB_CLASSROOM": "1", "INFERENCE_LAB_HUB_MAX_GB": "big"})


@pytest.mark.parametrize("state, message", [
    ({CHOICE_KEY: LOCAL_CHOICE, PATH_KEY: "/etc"}, "outside the allowed folder"),
    ({CHOICE_KEY: REPO_CHOICE, REPO_KEY: "someone/anything"}, "not on the list of Hub repositories"),
    ({CHOICE_KEY: RANDOM_PREFIX + "TinyLlama-1.1B"}, "above this server's cap"),
])
def test_classroom_mode_refusals_show_in_the_app(monkeypatch, tmp_path, state, message):
    monkeypatch.setenv("INFERENCE_LAB_CLASSROOM", "1")
    monkeypatch.setenv("INFERENCE_LAB_MODELS_DIR", str(tmp_path))
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    for k, v in state.items():
        at.session_state[k] = v
    at = at.run()
    assert not at.exception
    assert any(message in e and "classroom mode" in e for e in errors(at)), errors(at)


# ------------------------------------------------------------------------------------------ this machine
def test_measure_again_never_replaces_another_sessions_machine(monkeypatch):
    monkeypatch.setattr(sys.modules["ui.machine"], "MEASURE_SECONDS", 0.05)
    from ui.machine import PIN_KEY, machine_history
    machine_history.reset()
    state = {"size.source": "Preset", "device": "This machine (measured with NumPy)"}
    sessions = []
    for _ in range(2):
        at = AppTest.from_file(ROOFLINE, default_timeout=TIMEOUT)
        for k, v in state.items():
            at.session_state[k] = v
        sessions.append(at.run())
    a, b = sessions
    assert not a.exception and not b.exception
    assert a.session_state[PIN_KEY] == b.session_state[PIN_KEY] == 0   # B adopts A's measurement
    a = a.sidebar.button(key="device.remeasure").click().run()
    assert a.session_state[PIN_KEY] == 1                               # A moved to its new measurement
    b = b.run()
    assert b.session_state[PIN_KEY] == 0                               # B still sees what it saw
    captions = " ".join(c.value for c in b.sidebar.caption)
    assert "A newer measurement exists" in captions and "under load average" in captions
    b = b.sidebar.button(key="device.use_newer").click().run()
    assert b.session_state[PIN_KEY] == 1
    assert len(machine_history().entries()) == 2


# ------------------------------------------------------------------------------------------ the Class page
def test_class_page_shows_the_live_batch(monkeypatch, model):
    from server.worker import EngineWorker
    from helpers_http import InProcessServer
    from ui.model_picker import shared_models
    from ui.server import class_backend, embedded_servers
    monkeypatch.setattr(sys.modules["ui.machine"], "MEASURE_SECONDS", 0.05)
    at = AppTest.from_file(str(ROOT / "pages" / "51_Class.py"), default_timeout=TIMEOUT)
    servers = embedded_servers()
    servers.close()
    class_backend().use(None)
    at = at.run()
    assert not at.exception and any("Nobody has generated yet" in i.value for i in at.info)
    w = EngineWorker(model, start=False, block_size=4, num_blocks=40, max_batch=2, abandon_after_s=1e9)
    srv = InProcessServer(w).start()                 # the page reads the batch over HTTP, as from a real server
    servers._servers[model.source] = srv
    shared_models().put(model.source, model)
    try:
        for i, n in enumerate((6, 9, 5)):
            w.submit(f"s{i}", prompt(n, seed=i), max_new_tokens=20, stop_at_eos=False)
        for _ in range(4):
            w.step_once()
        at = at.run()
        assert not at.exception and not errors(at)
        metrics = {m.label: m.value for m in at.metric}
        assert metrics["Requests running now"] == "2" and metrics["Waiting in line now"] == "1"
        assert metrics["Free KV blocks (of 40)"] == f"{w.free_blocks}"
        table = at.dataframe[0].value
        assert list(table["request"]) == ["student 1", "student 2", "student 3"]
        assert list(table["generated tokens"]) == [4, 4, 0]           # one token per step after the prefill
        assert list(table["blocks"]) == [len(w.scheduler.block_table(h.request)) for h in w._handles]
        assert table["status"].iloc[2] == "waiting (#1 in line)"
        assert len(at.get("download_button")) == len(at.dataframe) == 2
        theory = at.dataframe[1].value
        # B / max((W + B·kv)/bw, B·f/peak) = 1 / max(W/(B·bw) + kv/bw, f/peak): never lower for a larger batch
        # (equal once a step is compute-bound, as this tiny model may be on a fast machine)
        assert list(theory["streams"]) == ["one stream alone", "the current batch (2)"]
        assert theory["predicted tokens/s"].iloc[1] >= theory["predicted tokens/s"].iloc[0]
        assert len(at.get("plotly_chart")) == 3                        # blocks, step times, roofline
        # the same server idle for over a minute (as the shared one often is in a full run): no empty step chart
        with w._cond:
            w._steps = type(w._steps)((replace(s, ended_at=s.ended_at - 120) for s in w._steps),
                                      maxlen=w._steps.maxlen)
        at = at.run()
        assert walkthrough_problems(at) == []
        assert any("the server is idle" in i.value for i in at.info)
        assert len(at.get("plotly_chart")) == 2                        # blocks and roofline; step times in words
    finally:
        servers.drop(model.source)


def test_classroom_mode_also_guards_the_sizing_pages_config_json(monkeypatch, tmp_path):
    from ui.model_source import fetch_hub_config, read_config_path
    monkeypatch.setenv("INFERENCE_LAB_CLASSROOM", "1")
    monkeypatch.setenv("INFERENCE_LAB_MODELS_DIR", str(tmp_path / "allowed"))
    with pytest.raises(ModelError, match="outside the allowed folder"):
        read_config_path(str(tmp_path))
    with pytest.raises(ModelError, match="not on the list of Hub repositories"):
        fetch_hub_config("someone/private-model")                       # refused before any network use
