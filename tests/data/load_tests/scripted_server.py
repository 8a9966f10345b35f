"""The scripted server the example result files in this folder were measured against (loopback only):
tests/helpers_fake_openai.py with TTFT 250 ms and 50 ms between tokens, one token per chunk, serving "smollm2".

    python tests/data/load_tests/scripted_server.py 8124      (from the repository root; Ctrl-C stops it)

Known timing of every request: TTFT = 250 ms, TPOT = ITL = 50 ms, end-to-end = 250 + 50·(n − 1) ms for n output
tokens (1,000 ms for 16), so at concurrency c: requests/s = c / 1.0 s and output tokens/s = 16·c / 1.0 s."""
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from tests.helpers_fake_openai import FakeOpenAIServer, Script, _QuietServer  # noqa: E402

TTFT_S, ITL_S = 0.25, 0.05


def main(port: int) -> None:
    srv = FakeOpenAIServer(Script(ttft_s=TTFT_S, itl_s=ITL_S, model="smollm2"))
    handler = srv.httpd.RequestHandlerClass
    srv.httpd.server_close()                                  # the helper listens on a free port: use `port`
    srv.httpd = _QuietServer(("127.0.0.1", port), handler)
    srv._thread = threading.Thread(target=srv.httpd.serve_forever, daemon=True)
    print(f"scripted server on http://127.0.0.1:{port}", flush=True)
    with srv:
        while True:
            time.sleep(3600)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 8124)
