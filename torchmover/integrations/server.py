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
- ``GET /health``: ``{"status": "ok", "signature": ..., "device": ..., "limits": {...}, "failures": ...,
  ...}``.

Every request goes through one :class:`~torchmover.reward.batching.BatchedReward`, so concurrent requests
(OpenRLHF sends one sample per request) are scored together, on the scorer's device. A malformed
request gets a 4xx answer ``{"error": "..."}`` naming what is wrong and never affects other requests:
400 (not UTF-8 JSON, nested too deeply, a body that its Content-Encoding cannot decode, a missing field, a wrong type, a text that is not valid
Unicode, mismatched lengths), 404/405 (unknown path or method), 408 (the body did not arrive in time),
413 (a body over ``max_request_bytes``, or more pairs than ``max_pairs_per_request``), 415 (a charset
other than UTF-8). Needs the ``serve`` extra (``pip install "torchmover[serve]"``, which installs
``aiohttp``).

Limits (:class:`ServerLimits`), so that no client can hold the server:

- a request of more pairs than ``max_pairs_per_request`` is refused (413); a request of more pairs
  than the batcher's ``max_batch_size`` is scored in slices of that size, one after the other, so a
  small request sent meanwhile is scored between two slices instead of after the whole request;
- a request whose client disconnects before its answer is dropped: its slices still queued are never
  scored (a slice already being scored finishes);
- a connection must send a complete request head within ``header_timeout`` seconds of opening or of
  its first byte after an answer, and the body within ``body_timeout`` seconds of the head (else 408);
  a keep-alive connection idle for ``idle_timeout`` seconds is closed;
- at most ``max_connections`` connections are open at once: one more is answered 503 and closed
  straight away (its descriptor is released at once; the client may also see the connection reset).

Stopping (:meth:`RewardServer.stop`, which ``torchmover serve`` calls on SIGTERM and SIGINT) drains: the
server stops listening, answers the requests in flight (for at most ``drain_timeout`` seconds; those
still running then are cut off), closes idle connections, and returns.
"""
from __future__ import annotations

import asyncio
import codecs
import dataclasses
import json
import threading
from typing import Sequence

from ..reward.batching import BatchedReward
from ..scorer.inputs import check_references, check_text, check_texts, check_unicode
from .config import RewardConfig
from .configured import ConfiguredReward
from .parsing import response_from_query

__all__ = ["DEFAULT_MAX_REQUEST_BYTES", "RewardServer", "ServerLimits", "require_aiohttp", "response_from_query"]

DEFAULT_MAX_REQUEST_BYTES = 8 * 2**20
RESERVED_DESCRIPTORS = 64  # kept for the process's own files (model, logs) below the descriptor limit


def require_aiohttp() -> None:
    """Raise an ``ImportError`` that says how to install the server's dependency if it is missing."""
    try:
        import aiohttp  # noqa: F401
    except ImportError as error:
        raise ImportError('the reward server needs aiohttp: pip install "torchmover[serve]"') from error


def default_max_connections() -> int:
    """1024, or fewer where the process may open fewer files: its descriptor limit (``ulimit -n``)
    less :data:`RESERVED_DESCRIPTORS`, so that connections alone never exhaust the descriptors."""
    try:
        import resource
    except ImportError:  # no resource module (Windows)
        return 1024
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return 1024 if soft == resource.RLIM_INFINITY else max(1, min(1024, soft - RESERVED_DESCRIPTORS))


def _limit(help: str, **kwargs):
    return dataclasses.field(metadata={"help": help}, **kwargs)


@dataclasses.dataclass(frozen=True)
class ServerLimits:
    """What one request or client may take of the server (see the module docs); each is a keyword of
    :class:`RewardServer` and an option of ``torchmover serve`` (``--header-timeout`` ...).
    Timeouts are in seconds."""

    max_request_bytes: int = _limit("larger bodies are refused with 413", default=DEFAULT_MAX_REQUEST_BYTES)
    max_pairs_per_request: int = _limit("requests of more (hypothesis, references) pairs are refused with 413",
                                        default=4096)
    max_connections: int = _limit("connections open at once; one more is answered 503 and closed (default: "
                                  "1024, or the descriptor limit less 64)", default_factory=default_max_connections)
    header_timeout: float = _limit("a connection that has not sent a complete request head this long after "
                                   "opening, or after its first byte, is closed", default=10.0)
    body_timeout: float = _limit("a body that has not arrived this long after its head is answered 408",
                                 default=30.0)
    idle_timeout: float = _limit("a keep-alive connection idle this long after an answer is closed", default=60.0)
    drain_timeout: float = _limit("on stop (SIGTERM, SIGINT), how long the requests in flight may take to finish",
                                  default=25.0)

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.type == "int":
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise ValueError(f"{field.name} must be a positive int, got {value!r}")
            elif isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
                raise ValueError(f"{field.name} must be a positive finite number of seconds, got {value!r}")


class _ClientError(ValueError):
    """A request the client must fix: answered with ``status`` and the message."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def _field(body: dict, name: str) -> list:
    if name not in body:
        raise _ClientError(f"missing field {name!r}")
    value = body[name]
    if not isinstance(value, list):
        raise _ClientError(f"{name} must be a list, got {type(value).__name__}")
    return value


def _check_openrlhf_unicode(queries: list[str], prompts: list[str], labels: list) -> None:
    """A ``ValueError`` naming the first query, prompt or label (a str or a list of str) that is not
    valid Unicode; a label read at a deeper ``reference_field`` is checked as the references it holds."""
    check_unicode("query", queries)
    check_unicode("prompts", prompts)
    for i, label in enumerate(labels):
        if isinstance(label, str):
            check_text(f"labels[{i}]", label)
        elif isinstance(label, list):
            check_unicode(f"labels[{i}]", [r for r in label if isinstance(r, str)])


def _parse_json(data: bytes, charset: str | None) -> dict:
    """The JSON object of a body (UTF-8: RFC 8259), or a :class:`_ClientError` saying why not."""
    try:
        utf8 = charset is None or codecs.lookup(charset).name == "utf-8"
    except LookupError:
        utf8 = False
    if not utf8:
        raise _ClientError(f"the body must be UTF-8 JSON, got charset={charset!r}", status=415)
    try:
        body = json.loads(data.decode("utf-8"))
    except RecursionError:
        raise _ClientError("the body is not valid JSON: nested too deeply") from None
    except ValueError as error:  # JSONDecodeError, UnicodeDecodeError, an integer of too many digits
        raise _ClientError(f"the body is not valid JSON: {error}") from None
    if not isinstance(body, dict):
        raise _ClientError(f"the body must be a JSON object, got {type(body).__name__}")
    return body


def _raw_response(status: str, error: str) -> bytes:
    """A complete HTTP response with a JSON error, for a connection that is closed straight away."""
    body = json.dumps({"error": error}).encode()
    return (f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\nRetry-After: 1\r\n\r\n").encode() + body


SERVICE_UNAVAILABLE = _raw_response("503 Service Unavailable", "too many connections (max_connections): try again later")


class _Connection(asyncio.Protocol):
    """One client connection: aiohttp's protocol inside, the server's connection cap and its header
    and idle timeouts around it. Its state is ``"head"`` (a request head is awaited), ``"request"``
    (a request is handled; the middleware says so) or ``"idle"`` (answered, nothing received since);
    a timer closes the connection if it stays in ``"head"`` or ``"idle"`` too long.

    Why a wrapper: aiohttp parses HTTP well but has no header timeout and no connection cap (its
    keep-alive timer is the idle timeout, and where it starts differs between versions); wrapping its
    protocol object adds both through the public ``asyncio.Protocol`` interface, whatever the aiohttp
    version (tested with 3.9 and 3.14)."""

    def __init__(self, server: "RewardServer", protocol_factory):
        self.server, self.protocol_factory = server, protocol_factory
        self.inner = self.transport = self.timer = None
        self.state = "head"

    def connection_made(self, transport) -> None:
        connections = self.server._connections
        if len(connections) >= self.server.limits.max_connections:
            transport.write(SERVICE_UNAVAILABLE)
            transport.close()
            return
        self.transport = transport
        connections[transport] = self
        self.inner = self.protocol_factory()
        self.inner.connection_made(transport)
        self.expect("head")

    def data_received(self, data: bytes) -> None:
        if self.inner is None:
            return
        if self.state == "idle":
            self.expect("head")
        self.inner.data_received(data)

    def eof_received(self):
        return None if self.inner is None else self.inner.eof_received()

    def connection_lost(self, exc) -> None:
        if self.inner is None:
            return
        if self.timer is not None:
            self.timer.cancel()
        self.server._connections.pop(self.transport, None)
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()

    def expect(self, state: str) -> None:
        """Enter ``state``, with its timer (none while a request is handled)."""
        if self.timer is not None:
            self.timer.cancel()
        self.state, self.timer = state, None
        limits = self.server.limits
        timeout = {"head": limits.header_timeout, "idle": limits.idle_timeout}.get(state)
        if timeout is not None and not self.transport.is_closing():
            self.timer = asyncio.get_running_loop().call_later(timeout, self.expire, state)

    def expire(self, state: str) -> None:
        if self.state == state:
            self.transport.close()


class RewardServer:
    """An HTTP server (``aiohttp``) in front of a :class:`~torchmover.reward.batching.BatchedReward`,
    reading OpenRLHF's requests as ``config`` says (default: the default
    :class:`~torchmover.integrations.config.RewardConfig`; a ``reference_field`` into verl's
    ``extra_info`` is refused).

    ``start()`` serves from a background thread and returns once the socket listens (``port=0``
    takes a free port: see :attr:`url`); ``stop()`` drains and closes it (the batcher is left to its
    owner). Also a context manager. ``limits``: the fields of :class:`ServerLimits` as keywords
    (``max_request_bytes=...``, ``header_timeout=...``); left out, their defaults.

    Example:
        >>> import json, urllib.request
        >>> from torchmover import MoverReward, Scorer
        >>> with BatchedReward(MoverReward(Scorer(device="cpu"))) as batched, RewardServer(batched) as server:
        ...     body = json.dumps({"hyps": ["the cat sat"], "refs": ["a cat sat"]}).encode()
        ...     request = urllib.request.Request(server.url + "/score", body, {"Content-Type": "application/json"})
        ...     answer = json.load(urllib.request.urlopen(request))
        >>> [round(r, 4) for r in answer["rewards"]]
        [0.9168]
    """

    def __init__(self, batched: BatchedReward, *, config: RewardConfig | None = None, host: str = "127.0.0.1",
                 port: int = 0, **limits):
        self.reward = ConfiguredReward(batched, RewardConfig() if config is None else config)
        self.reward.check_labels_only()
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port < 65536:
            raise ValueError(f"port must be an int in [0, 65535], got {port!r}")
        unknown = sorted(set(limits) - {f.name for f in dataclasses.fields(ServerLimits)})
        if unknown:
            raise TypeError(f"unknown RewardServer options {unknown}; the limits are the fields of ServerLimits")
        self.batched, self.host, self.port, self.limits = batched, host, port, ServerLimits(**limits)
        self.in_flight = 0  # requests being scored
        self.abandoned = 0  # requests whose client left before their answer
        self._connections: dict = {}  # transport -> _Connection (event loop thread only)
        self._thread: threading.Thread | None = None
        self._finished = threading.Event()  # set when the serving thread ends
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped: asyncio.Event | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # --- the application ---------------------------------------------------------------------------

    def app(self):
        """The ``aiohttp.web.Application`` (routes, JSON errors, request limits)."""
        from aiohttp import web

        limits = self.limits

        @web.middleware
        async def json_errors(request, handler):
            connection = self._connections.get(request.transport)
            if connection is not None:
                connection.expect("request")
            try:
                return await handler(request)
            except web.HTTPException as error:  # 404, 405, 413 raised by aiohttp
                if error.status < 400:
                    raise
                return web.json_response({"error": error.reason if error.text is None else error.text},
                                         status=error.status)
            except _ClientError as error:
                response = web.json_response({"error": str(error)}, status=error.status)
                if error.status in (408, 413):  # the body was not read: the connection cannot go on
                    response.force_close()
                return response
            except Exception as error:  # noqa: BLE001 — the server stays up and says what happened
                return web.json_response({"error": f"{type(error).__name__}: {error}"}, status=500)
            finally:
                if connection is not None:
                    connection.expect("idle")

        async def read_body(request) -> dict:
            if request.content_length is not None and request.content_length > limits.max_request_bytes:
                raise _ClientError(f"the body has {request.content_length} bytes; this server takes at most "
                                   f"{limits.max_request_bytes} (max_request_bytes)", status=413)
            try:
                data = await asyncio.wait_for(request.read(), limits.body_timeout)
            except asyncio.TimeoutError:
                raise _ClientError(f"the body did not arrive within {limits.body_timeout} s (body_timeout)",
                                   status=408) from None
            except web.RequestPayloadError as error:  # e.g. a Content-Encoding: gzip body that is not gzip
                raise _ClientError(f"the body cannot be read: {error}") from None
            return _parse_json(data, request.charset)

        async def rewards(hyps: Sequence, refs: Sequence) -> list[float]:
            """Validated, then scored in slices of the batcher's ``max_batch_size`` pairs, one after
            the other (see the module docs); a client that leaves cancels the slices not yet scored."""
            if len(hyps) > limits.max_pairs_per_request:
                raise _ClientError(f"the request has {len(hyps)} pairs; this server takes at most "
                                   f"{limits.max_pairs_per_request} per request (max_pairs_per_request)", status=413)
            try:
                hyps = check_texts("hyps", hyps)
                groups = check_references(hyps, refs)
                self.batched.reward.centering  # raises here if the reward's centering would depend on the batch
            except (TypeError, ValueError) as error:
                raise _ClientError(str(error)) from None
            size, values = self.batched.max_batch_size, []
            self.in_flight += 1
            try:
                for start in range(0, len(hyps), size):
                    future = self.batched.submit(hyps[start:start + size], groups[start:start + size])
                    values += (await asyncio.wrap_future(future)).tolist()
            except asyncio.CancelledError:  # the client left (or the drain deadline passed)
                self.abandoned += 1
                raise
            finally:
                self.in_flight -= 1
            return values

        async def openrlhf(request):
            body = await read_body(request)
            queries, prompts, labels = _field(body, "query"), _field(body, "prompts"), _field(body, "labels")
            with self.reward.counting(len(queries)):
                try:
                    pending = self.reward.openrlhf_pending(queries, prompts, labels)
                    _check_openrlhf_unicode(queries, prompts, labels)
                except (TypeError, ValueError) as error:
                    raise _ClientError(str(error)) from None
                values = pending.fill(await rewards(pending.texts, pending.refs) if pending.texts else [])
            return web.json_response(self.reward.openrlhf_answer(values))

        async def score(request):
            body = await read_body(request)
            return web.json_response({"rewards": await rewards(_field(body, "hyps"), _field(body, "refs"))})

        async def health(request):
            reward = self.batched.reward
            return web.json_response({"status": "ok", "signature": reward.signature,
                                      "device": str(reward.scorer.encoder.device),
                                      "max_batch_size": self.batched.max_batch_size,
                                      "max_wait_ms": self.batched.max_wait_ms, "limits": dataclasses.asdict(limits),
                                      "connections": len(self._connections), "in_flight": self.in_flight,
                                      "abandoned": self.abandoned, "failures": self.reward.failures,
                                      **self.batched.stats()})

        app = web.Application(middlewares=[json_errors], client_max_size=limits.max_request_bytes)
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
            # handler_cancellation: a client that disconnects cancels its handler (its queued slices)
            runner = web.AppRunner(self.app(), access_log=None, handler_cancellation=True,
                                   keepalive_timeout=self.limits.idle_timeout,
                                   shutdown_timeout=self.limits.drain_timeout)
            listening = None
            try:
                await runner.setup()
                loop = asyncio.get_running_loop()
                listening = await loop.create_server(lambda: _Connection(self, runner.server), self.host, self.port)
                self.port = listening.sockets[0].getsockname()[1]
                self._loop, self._stopped = loop, asyncio.Event()
            except BaseException as error:  # e.g. the port is taken: raised by start()
                failure.append(error)
                if listening is not None:
                    listening.close()
                await runner.cleanup()
                return
            finally:
                ready.set()
            await self._stopped.wait()
            listening.close()  # no new connection from here on
            await runner.cleanup()  # answers the requests in flight (at most drain_timeout), closes the rest

        try:
            asyncio.run(main())
        finally:
            self._finished.set()
            ready.set()

    def wait(self) -> None:
        """Block until the server stops (interruptible by Ctrl-C). Waits on an event, not in
        ``Thread.join``: in Python 3.11 a signal handler that raises inside ``join`` (Ctrl-C, the
        CLI's SIGTERM) makes ``join`` release the serving thread's state lock and mark it stopped
        while it still runs (the bpo-45274 branch of ``Thread._wait_for_tstate_lock``), after which
        nothing waits for its drain."""
        while self._thread is not None and not self._finished.wait(0.5):
            pass

    def stop(self) -> None:
        """Stop serving after draining (see the module docs); idempotent."""
        if self._loop is not None and not self._finished.is_set():
            self._loop.call_soon_threadsafe(self._stopped.set)
        if self._thread is not None:
            self._finished.wait()
            self._thread.join()

    def __enter__(self) -> "RewardServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
