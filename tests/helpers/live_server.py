"""A live OpenAI-compatible server on 127.0.0.1 over an LLM loaded in the test process (uvicorn in a thread),
for the tests that talk to it with the ``openai`` client and httpx."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from .net_helpers import free_port


@contextmanager
def serve_in_thread(llm: Any, name: str, **app_kw: Any) -> Iterator[str]:
    """Serve ``llm`` as model ``name`` while the block runs; yields the base URL (``http://127.0.0.1:PORT``)."""
    import uvicorn

    from mistral_kernels.serve.app import build_app

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(build_app(llm, name, **app_kw), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 60
    while not server.started:
        assert time.time() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


@dataclass
class Live:
    """A live server's base URL, the LLM behind it and the model name it serves."""

    url: str
    llm: Any
    name: str

    def client(self) -> Any:
        """An ``openai`` client of this server (no retries: a test sees the first answer)."""
        import openai

        return openai.OpenAI(base_url=self.url + "/v1", api_key="none", max_retries=0)
