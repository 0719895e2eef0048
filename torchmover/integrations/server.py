"""A reward server (``torchmover serve``): HTTP reward requests answered by a batched reward.

Endpoints (JSON in, JSON out):

- ``POST /get_reward`` (and ``POST /``): OpenRLHF's remote reward model protocol (``--reward.remote_url
  http://HOST:PORT/get_reward``). Body ``{"query": [...], "prompts": [...], "labels": [...]}``: each
  query is the prompt followed by the response, decoded with special tokens. The samples are read and
  scored by a :class:`~torchmover.integrations.configured.ConfiguredReward`, exactly as the OpenRLHF
  adapter file reads and scores them, with the same settings
  (:class:`~torchmover.integrations.config.RewardConfig`: reference field, completion parser, special
  tokens, prompt-mismatch policy, missing-reference score). Answer ``{"rewards": [...], "scores":
  [...], "extra_logs": {"torchmover_<method>[_<direction>]": [...], "torchmover_failures": [...]}}``
  (``scores`` = ``rewards``, as OpenRLHF's own server); a sample that cannot be scored fails its
  request with 400, logged at WARNING with the running count of failed samples.
- ``POST /score``: ``{"hyps": [...], "refs": [...]}`` (a str or a list of str per hypothesis) ->
  ``{"rewards": [...]}``.
- ``GET /health``: ``{"status": "ok", "signature": ..., "device": ..., ...}``.

Every request goes through one :class:`~torchmover.reward.batching.BatchedReward`, so concurrent requests
(OpenRLHF sends one sample per request) are scored together, on the scorer's device. A malformed
request gets a 4xx answer ``{"error": "..."}`` naming what is wrong (400: not JSON, a missing field,
a wrong type, mismatched lengths; 413: a body over ``max_request_bytes``; 404/405: unknown path or
method) and never affects other requests. Needs the ``serve`` extra (``pip install
"torchmover[serve]"``, which installs ``aiohttp``).
"""
from __future__ import annotations

import asyncio
import json
import threading
from typing import Sequence

from ..reward.batching import BatchedReward
from .config import RewardConfig
from .configured import ConfiguredReward
from .parsing import response_from_query

__all__ = ["DEFAULT_MAX_REQUEST_BYTES", "RewardServer", "require_aiohttp", "response_from_query"]

DEFAULT_MAX_REQUEST_BYTES = 8 * 2**20

def require_aiohttp() -> None:
    """Raise an ``ImportError`` that says how to install the server's dependency if it is missing."""
    try:
        import aiohttp  # noqa: F401
    except ImportError as error:
        raise ImportError('the reward server needs aiohttp: pip install "torchmover[serve]"') from error


class _BadRequest(ValueError):
    """A request the client must fix: answered with status 400 and the message."""


def _field(body: dict, name: str) -> list:
    if name not in body:
        raise _BadRequest(f"missing field {name!r}")
    value = body[name]
    if not isinstance(value, list):
        raise _BadRequest(f"{name} must be a list, got {type(value).__name__}")
    return value


class RewardServer:
    """An HTTP server (``aiohttp``) in front of a :class:`~torchmover.reward.batching.BatchedReward`,
    reading OpenRLHF's requests as ``config`` says (default: the default
    :class:`~torchmover.integrations.config.RewardConfig`; a ``reference_field`` into verl's
    ``extra_info`` is refused).

    ``start()`` serves from a background thread and returns once the socket listens (``port=0``
    takes a free port: see :attr:`url`); ``stop()`` closes it (the batcher is left to its owner).
    Also a context manager.

    Example:
        >>> with RewardServer(BatchedReward(reward), port=8000) as server:  # doctest: +SKIP
        ...     print(server.url)  # POST {"hyps": [...], "refs": [...]} to server.url + "/score"
    """

    def __init__(self, batched: BatchedReward, *, config: RewardConfig | None = None, host: str = "127.0.0.1",
                 port: int = 0, max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES):
        self.reward = ConfiguredReward(batched, RewardConfig() if config is None else config)
        self.reward.check_labels_only()
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port < 65536:
            raise ValueError(f"port must be an int in [0, 65535], got {port!r}")
        if isinstance(max_request_bytes, bool) or not isinstance(max_request_bytes, int) or max_request_bytes < 1:
            raise ValueError(f"max_request_bytes must be a positive int, got {max_request_bytes!r}")
        self.batched, self.host, self.port, self.max_request_bytes = batched, host, port, max_request_bytes
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped: asyncio.Event | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # --- the application ---------------------------------------------------------------------------

    def app(self):
        """The ``aiohttp.web.Application`` (routes, JSON errors, request-size limit)."""
        from aiohttp import web

        @web.middleware
        async def json_errors(request, handler):
            try:
                return await handler(request)
            except web.HTTPException as error:  # 404, 405, 413 raised by aiohttp
                if error.status < 400:
                    raise
                return web.json_response({"error": error.reason if error.text is None else error.text},
                                         status=error.status)
            except _BadRequest as error:
                return web.json_response({"error": str(error)}, status=400)
            except Exception as error:  # noqa: BLE001 — the server stays up and says what happened
                return web.json_response({"error": f"{type(error).__name__}: {error}"}, status=500)

        async def read_body(request) -> dict:
            try:
                body = await request.json()
            except (json.JSONDecodeError, UnicodeDecodeError) as error:
                raise _BadRequest(f"the body is not valid JSON: {error}") from None
            if not isinstance(body, dict):
                raise _BadRequest(f"the body must be a JSON object, got {type(body).__name__}")
            return body

        async def rewards(hyps: Sequence, refs: Sequence) -> list[float]:
            try:
                future = self.batched.submit(hyps, refs)  # validates the call
            except (TypeError, ValueError) as error:
                raise _BadRequest(str(error)) from None
            return (await asyncio.wrap_future(future)).tolist()

        async def openrlhf(request):
            body = await read_body(request)
            queries, prompts, labels = _field(body, "query"), _field(body, "prompts"), _field(body, "labels")
            try:
                with self.reward.counting(len(queries)):
                    values = await self.reward.ascore(self.reward.openrlhf_pending(queries, prompts, labels))
            except (TypeError, ValueError) as error:
                raise _BadRequest(str(error)) from None
            return web.json_response(self.reward.openrlhf_answer(values))

        async def score(request):
            body = await read_body(request)
            return web.json_response({"rewards": await rewards(_field(body, "hyps"), _field(body, "refs"))})

        async def health(request):
            reward = self.batched.reward
            return web.json_response({"status": "ok", "signature": reward.signature,
                                      "device": str(reward.scorer.encoder.device),
                                      "max_batch_size": self.batched.max_batch_size,
                                      "max_wait_ms": self.batched.max_wait_ms, **self.batched.stats(),
                                      "failures": self.reward.failures})

        app = web.Application(middlewares=[json_errors], client_max_size=self.max_request_bytes)
        app.add_routes([web.post("/", openrlhf), web.post("/get_reward", openrlhf), web.post("/score", score),
                        web.get("/health", health)])
        return app

    # --- lifetime ----------------------------------------------------------------------------------

    def start(self) -> "RewardServer":
        """Serve from a background thread; returns once listening (raises if it cannot listen)."""
        if self._thread is not None:
            raise RuntimeError("this RewardServer was already started")
        require_aiohttp()

        ready = threading.Event()
        failure: list[BaseException] = []
        self._thread = threading.Thread(target=self._serve, args=(ready, failure), name="torchmover-serve", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            self._thread.join()
            raise failure[0]
        return self

    def _serve(self, ready: threading.Event, failure: list) -> None:
        from aiohttp import web

        async def main():
            runner = web.AppRunner(self.app(), access_log=None)
            try:
                await runner.setup()
                await web.TCPSite(runner, self.host, self.port).start()
                self.port = runner.addresses[0][1]
                self._loop, self._stopped = asyncio.get_running_loop(), asyncio.Event()
            except BaseException as error:  # e.g. the port is taken: raised by start()
                failure.append(error)
                await runner.cleanup()
                return
            finally:
                ready.set()
            await self._stopped.wait()
            await runner.cleanup()

        try:
            asyncio.run(main())
        finally:
            ready.set()

    def wait(self) -> None:
        """Block until the server stops (interruptible by Ctrl-C)."""
        while self._thread is not None and self._thread.is_alive():
            self._thread.join(0.5)

    def stop(self) -> None:
        """Stop serving (idempotent)."""
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stopped.set)
            self._thread.join()

    def __enter__(self) -> "RewardServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
