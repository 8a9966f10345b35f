"""One `python -m engine serve` (the default model, a free loopback port) shared by the HTTP tests."""
import pytest


@pytest.fixture(scope="session")
def engine_server(default_gguf_path):
    from server.process import EngineServerProcess
    with EngineServerProcess() as srv:
        yield srv


@pytest.fixture(scope="session")
def client(engine_server):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=engine_server.base_url, api_key="not-needed", timeout=300, max_retries=0)
