"""An engine server inside the test process: `server.openai_api` on uvicorn in a thread, on a free loopback port,
over a worker the test steps by hand (so the state a page reads over HTTP is exactly known)."""
import threading
import time

import uvicorn

from server.openai_api import create_app
from server.process import free_port


class InProcessServer:
    def __init__(self, worker, model_name: str = "engine", **app_options) -> None:
        """app_options: create_app's keywords (access=..., max_body_bytes=...)."""
        self.worker, self.port = worker, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        app = create_app(worker, model_name, **app_options)
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> "InProcessServer":
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        return self

    def alive(self) -> bool:
        return self.thread.is_alive()

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.worker.close()
