"""The classroom load test, short: the real app server on 127.0.0.1, four real sessions speaking Streamlit's
websocket protocol press Generate together with the default model, one closes its tab mid-reply, and a fifth
(the teacher) watches the Class page refresh itself.

Every remaining session gets its whole reply with no error element or traceback, and afterwards the Class page
shows every KV block free again (the closed session's blocks came back). The full run (N = 30, with the figures)
is `bench/bench_classroom.py`.
"""
import shutil

import pytest

from bench.bench_classroom import run

pytest.importorskip("websockets")


@pytest.mark.live_server
def test_four_sessions_generate_together_and_blocks_come_back(default_gguf_path):
    if shutil.which("streamlit") is None and not __import__("importlib").util.find_spec("streamlit"):
        pytest.skip("streamlit is not installed")
    r = run(4, timeout_s=240, close_one=True, max_new_tokens=8, warm_up=False)
    cls = r["class_"]
    assert cls["closed_early"] == 1
    assert cls["complete"] == 3, cls                          # the three that stayed got their whole reply
    assert cls["errors"] == []
    assert cls["tokens"] == 3 * 8                              # 8 new tokens each (greedy; the default prompt
                                                               # does not end within 8 tokens)
    assert r["requests_left"] == 0
    assert r["free_blocks_after"] == r["total_blocks"] > 0     # every block back in the pool
    assert r["server_peak_rss_bytes"] > 0
    assert r["class_page"]["errors"] == []                   # the teacher's live view ran beside the class
