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
  request with 400, logged at WARNING with the running count of failed samples, which ``/health``
  reports as ``failures``. A request refused as a whole before its samples are read (malformed: a
  missing field, a wrong type, lengths that differ, a text that is not valid Unicode; or over a limit)
  counts no failed sample: it is counted in ``/health``'s ``refused``, and a request in one count is
  never in the other.
- ``POST /score``: ``{"hyps": [...], "refs": [...]}`` (a str or a list of str per hypothesis) ->
  ``{"rewards": [...]}``.
- ``GET /health``: ``{"status": "ok", "signature": ..., "device": ..., "limits": {...}, "failures": ...,
  "refused": ..., ...}``, ``signature`` being the configured reward's
  (:attr:`ConfiguredReward.signature <torchmover.integrations.configured.ConfiguredReward.signature>`:
  the scorer's, then the settings that change what ``/get_reward`` scores; ``/score`` scores its texts
  as given, by the scorer's signature and the reward's ``shaping``).

Every request goes through one :class:`~torchmover.reward.batching.BatchedReward`, so concurrent requests
(OpenRLHF sends one sample per request) are scored together, on the scorer's device. A malformed
request gets a 4xx answer ``{"error": "..."}`` naming what is wrong and never affects other requests:
400 (not UTF-8 JSON, nested too deeply, a body that its Content-Encoding cannot decode, a missing field, a wrong type, a text that is not valid
Unicode, mismatched lengths), 404/405 (unknown path or method), 408 (the body did not arrive in time),
413 (a body over ``max_request_bytes``, more pairs than ``max_pairs_per_request``, a hypothesis of
more references than ``max_references_per_hypothesis``, more references in all than
``max_references_per_request``), 415 (a charset other than UTF-8), 503 (the server is stopping). Each
refused request is one WARNING line (status, reason, peer; at most :data:`REFUSAL_LOG_PER_SECOND` a
second, the others counted in the next line), never a traceback, also for a request aiohttp cannot
parse. Needs the ``serve`` extra (``pip install "torchmover[serve]"``, which installs
``aiohttp``).

Limits (:class:`ServerLimits`), so that no client can hold the server:

- a request of more pairs than ``max_pairs_per_request``, or of more references than
  ``max_references_per_hypothesis`` (one hypothesis) or ``max_references_per_request`` (all), is
  refused (413): what one request costs is bounded in time; its memory is bounded anyway, a
  hypothesis's references being scored in pieces (:mod:`torchmover.scorer.references`); a request of more pairs
  than the batcher's ``max_batch_size`` is scored in slices of that size, one after the other, so a
  small request sent meanwhile is scored between two slices instead of after the whole request;
- a request whose client disconnects before its answer is dropped: its slices still queued are never
  scored (a slice already being scored finishes);
- a connection must send a complete request head within ``header_timeout`` seconds of opening or of
  its first byte after an answer, and the body within ``body_timeout`` seconds of the head (else 408);
  a keep-alive connection idle for ``idle_timeout`` seconds is closed;
- at most ``max_connections`` connections are open at once: one more is answered 503 and closed
  straight away (its descriptor is released at once; the client may also see the connection reset);
- should the process still run out of descriptors, the event loop stops accepting for a second, the
  clients waiting are answered 503 through a descriptor kept spare for it, and one WARNING a minute
  says so (no traceback).

Stopping (:meth:`RewardServer.stop`, which ``torchmover serve`` calls on SIGTERM and SIGINT) drains: the
server stops listening and finishes the requests in flight one after the other, in arrival order (no
longer interleaving their slices, so that the first ones finish); at ``drain_timeout`` seconds every
request left, and any request arriving meanwhile on an open connection, is answered 503 with
``Retry-After``, the connections are closed, and it returns, :data:`DRAIN_GRACE` seconds after the
deadline at most (a slice already on the encoder finishes in the batcher's thread, its result unused).
"""
from __future__ import annotations

import asyncio
import codecs
import dataclasses
import errno
import itertools
import json
import logging
import os
import socket
import threading
import time
from typing import Sequence, cast

from ..reward.batching import BatchedReward
from ..scorer.inputs import check_references, check_text, check_texts, check_unicode
from .config import RewardConfig
from .configured import ConfiguredReward, Refused
from .parsing import response_from_query

__all__ = ["DEFAULT_MAX_REQUEST_BYTES", "RewardServer", "ServerLimits", "require_aiohttp", "response_from_query"]

logger = logging.getLogger("torchmover")

DEFAULT_MAX_REQUEST_BYTES = 8 * 2**20
REFUSAL_LOG_PER_SECOND = 10  # lines about refused requests, at most; the others are counted in the next line
RESERVED_DESCRIPTORS = 64  # kept for the process's own files (model, logs) below the descriptor limit


def require_aiohttp() -> None:
    """Raise an ``ImportError`` that says how to install the server's dependency if it is missing."""
    try:
        import aiohttp
        del aiohttp  # the import is the check (pyflakes reads no noqa: the name is used here)
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
    max_references_per_hypothesis: int = _limit("requests with a hypothesis of more references are refused with 413",
                                                default=4096)
    max_references_per_request: int = _limit("requests of more references in all are refused with 413",
                                             default=32768)
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


class _FailedSamples(_ClientError):
    """A request whose samples were read and failed (400): counted and logged as failed samples by
    :meth:`~torchmover.integrations.configured.ConfiguredReward.counting`, not as a refused request."""


class _OverLimit(_ClientError, Refused):
    """A request over a limit (413), refused before any of its samples is scored: not a failed sample."""

    def __init__(self, message: str):
        super().__init__(message, status=413)


class _ShuttingDown(_ClientError, Refused):
    """A request the draining server cannot finish by its deadline (503, with ``Retry-After``)."""

    def __init__(self):
        super().__init__("the server is shutting down: try again (another replica) later", status=503)


class _RefusalLog:
    """One WARNING line per refused request (status, reason, peer), at most
    :data:`REFUSAL_LOG_PER_SECOND` a second; the lines left out are counted in the next one. Also the
    ``logger`` of aiohttp's request handler, so that a request aiohttp cannot parse (a framing
    attack) is one such line, not a traceback; any other exception it reports is logged with its
    traceback, as aiohttp would."""

    def __init__(self):
        self.second, self.lines, self.skipped = 0, 0, 0

    def refused(self, status: int, reason: str, peer) -> None:
        second = int(time.monotonic())
        if second != self.second:
            self.second, self.lines = second, 0
        if self.lines >= REFUSAL_LOG_PER_SECOND:
            self.skipped += 1
            return
        self.lines += 1
        skipped, self.skipped = self.skipped, 0
        more = f" ({skipped} more refused request(s) not logged)" if skipped else ""
        logger.warning("torchmover serve: refused a request from %s: %d %s%s", peer, status, reason, more)

    # the part of logging.Logger that aiohttp's request handler calls
    def exception(self, message, *args, exc_info=None, **kwargs) -> None:
        from aiohttp.http_exceptions import HttpProcessingError

        if isinstance(exc_info, HttpProcessingError):
            self.refused(exc_info.code or 400, exc_info.message, args[0] if args else None)
        else:
            logging.getLogger("aiohttp.server").exception(message, *args, exc_info=exc_info, **kwargs)

    def debug(self, message, *args, exc_info=None, **kwargs) -> None:
        if exc_info is not None:  # a first request that is not HTTP (aiohttp logs it at DEBUG)
            self.exception(message, *args, exc_info=exc_info, **kwargs)
        else:
            logging.getLogger("aiohttp.server").debug(message, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(logging.getLogger("aiohttp.server"), name)


def _field(body: dict, name: str) -> list:
    if name not in body:
        raise _ClientError(f"missing field {name!r}")
    value = body[name]
    if not isinstance(value, list):
        raise _ClientError(f"{name} must be a list, got {type(value).__name__}")
    return value


def _check_openrlhf_unicode(reward: ConfiguredReward, queries: list[str], prompts: list[str],
                            labels: list) -> None:
    """A ``ValueError`` naming the first query, prompt or label that is not valid Unicode: each label's
    references are read as ``reward`` reads them (at its ``reference_field``: a label, or a key of a dict
    label) and checked. A label whose references cannot be read is left to fail its sample."""
    check_unicode("query", queries)
    check_unicode("prompts", prompts)
    for i, label in enumerate(labels):
        where = f"labels[{i}]"
        try:
            references = reward.references(label, None, where) or []
        except (TypeError, ValueError):
            continue
        for reference in references:
            check_text(f"a reference of {where} (read at {reward.config.reference_field})", reference)


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
NO_DESCRIPTOR = _raw_response("503 Service Unavailable", "the server is out of file descriptors: try again later")
DRAIN_GRACE = 0.25  # seconds a draining server gives its last answers to be sent, after the deadline


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
        self.inner: asyncio.Protocol | None = None  # aiohttp's, the transport and the timer: from connection_made
        self.transport: asyncio.BaseTransport | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.state = "head"

    def connection_made(self, transport) -> None:
        connections = self.server._connections
        if len(connections) >= self.server.limits.max_connections:
            transport.write(SERVICE_UNAVAILABLE)
            transport.close()
            self.server.refused += 1
            self.server._refusals.refused(503, "too many connections (max_connections)",
                                          (transport.get_extra_info("peername") or ("?",))[0])
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
        if timeout is not None and not cast(asyncio.BaseTransport, self.transport).is_closing():  # connected
            self.timer = asyncio.get_running_loop().call_later(timeout, self.expire, state)

    def expire(self, state: str) -> None:
        if self.state == state:
            cast(asyncio.BaseTransport, self.transport).close()  # a timer runs on a connection


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
        self.refused = 0  # requests (and connections) answered 4xx or 503 before their samples were read
        self._refusals = _RefusalLog()
        self._active = 0  # requests being handled (event loop thread only)
        self._tickets = itertools.count()  # arrival order of the requests being scored
        self._scoring: dict[int, asyncio.Event] = {}  # ticket -> set when it is that request's turn (draining)
        self._draining = False
        # asyncio.Events (made when serving starts): no request is handled; the drain deadline passed
        self._quiet: asyncio.Event | None = None
        self._expired: asyncio.Event | None = None
        self._accepting = self._spare = None  # a duplicate of the listening socket, a spare descriptor
        self._descriptor_refusals, self._descriptor_warned = 0, float("-inf")
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

        def refuse(request, status: int, reason: str, headers: dict | None = None):
            """The answer to a refused request, counted and logged (one rate-limited line)."""
            self.refused += 1
            self._refusals.refused(status, reason, request.remote)
            return web.json_response({"error": reason}, status=status, headers=headers)

        @web.middleware
        async def json_errors(request, handler):
            connection = self._connections.get(request.transport)
            if connection is not None:
                connection.expect("request")
            self._active += 1
            self._quiet.clear()
            try:
                if self._draining:
                    raise _ShuttingDown()
                return await handler(request)
            except web.HTTPException as error:  # 404, 405, 413 raised by aiohttp
                if error.status < 400:
                    raise
                return refuse(request, error.status, error.reason if error.text is None else error.text)
            except _FailedSamples as error:  # counted (and logged) as failed samples, not refused
                return web.json_response({"error": str(error)}, status=error.status)
            except _ClientError as error:
                response = refuse(request, error.status, str(error),
                                  {"Retry-After": "1"} if error.status == 503 else None)
                if error.status in (408, 413, 503):  # the body was not read, or the server stops
                    response.force_close()
                return response
            except Exception as error:  # noqa: BLE001 — the server stays up and says what happened
                return web.json_response({"error": f"{type(error).__name__}: {error}"}, status=500)
            finally:
                self._active -= 1
                if not self._active:
                    self._quiet.set()
                if connection is not None:
                    connection.expect("idle")

        async def read_body(request) -> dict:
            if request.content_length is not None and request.content_length > limits.max_request_bytes:
                raise _ClientError(f"the body has {request.content_length} bytes; this server takes at most "
                                   f"{limits.max_request_bytes} (max_request_bytes)", status=413)
            try:
                data = await asyncio.wait_for(self._before_deadline(request.read()), limits.body_timeout)
            except asyncio.TimeoutError:
                raise _ClientError(f"the body did not arrive within {limits.body_timeout} s (body_timeout)",
                                   status=408) from None
            except web.RequestPayloadError as error:  # e.g. a Content-Encoding: gzip body that is not gzip
                raise _ClientError(f"the body cannot be read: {error}") from None
            return _parse_json(data, request.charset)

        def check_size(n_pairs: int, groups: Sequence[Sequence] = ()) -> None:
            """An :class:`_OverLimit` if the request has more pairs or references than the limits allow."""
            if n_pairs > limits.max_pairs_per_request:
                raise _OverLimit(f"the request has {n_pairs} pairs; this server takes at most "
                                 f"{limits.max_pairs_per_request} per request (max_pairs_per_request)")
            largest = max(map(len, groups), default=0)
            if largest > limits.max_references_per_hypothesis:
                raise _OverLimit(f"a hypothesis of the request has {largest} references; this server takes at most "
                                 f"{limits.max_references_per_hypothesis} (max_references_per_hypothesis)")
            total = sum(map(len, groups))
            if total > limits.max_references_per_request:
                raise _OverLimit(f"the request has {total} references; this server takes at most "
                                 f"{limits.max_references_per_request} per request (max_references_per_request)")

        async def rewards(hyps: Sequence, refs: Sequence, invalid: type[_ClientError] = _ClientError) -> list[float]:
            """Validated (a failed check raises ``invalid``), then scored in slices of the batcher's
            ``max_batch_size`` pairs, one after the other (see the module docs); a client that leaves
            cancels the slices not yet scored. While the server drains, the requests take turns in
            arrival order."""
            check_size(len(hyps))
            try:
                hyps = check_texts("hyps", hyps)
                groups = check_references(hyps, refs)
                self.batched.reward.centering  # raises here if the reward's centering would depend on the batch
            except (TypeError, ValueError) as error:
                raise invalid(str(error)) from None
            check_size(len(hyps), groups)
            size, values = self.batched.max_batch_size, []
            ticket = next(self._tickets)
            self._scoring[ticket] = asyncio.Event()
            self.in_flight += 1
            try:
                for start in range(0, len(hyps), size):
                    if self._draining and next(iter(self._scoring)) != ticket:
                        await self._before_deadline(self._scoring[ticket].wait())
                    future = self.batched.submit(hyps[start:start + size], groups[start:start + size])
                    values += (await self._before_deadline(asyncio.wrap_future(future))).tolist()
            except asyncio.CancelledError:  # the client left
                self.abandoned += 1
                raise
            finally:
                self.in_flight -= 1
                del self._scoring[ticket]
                if self._scoring:  # the next one in arrival order may go on
                    next(iter(self._scoring.values())).set()
            return values

        async def openrlhf(request):
            """The request checked as a whole (else refused), then its samples read and scored,
            counted by the reward (a sample that fails fails the request: its samples are failures)."""
            body = await read_body(request)
            queries, prompts, labels = _field(body, "query"), _field(body, "prompts"), _field(body, "labels")
            check_size(len(queries))
            try:
                self.reward.check_openrlhf(queries, prompts, labels)
                _check_openrlhf_unicode(self.reward, queries, prompts, labels)
            except (TypeError, ValueError) as error:
                raise _ClientError(str(error)) from None
            with self.reward.counting(len(queries)):
                try:
                    pending = self.reward.openrlhf_pending(queries, prompts, labels)
                except (TypeError, ValueError) as error:
                    raise _FailedSamples(str(error)) from None
                scored = await rewards(pending.texts, pending.refs, _FailedSamples) if pending.texts else []
                values = pending.fill(scored)
            return web.json_response(self.reward.openrlhf_answer(values))

        async def score(request):
            body = await read_body(request)
            return web.json_response({"rewards": await rewards(_field(body, "hyps"), _field(body, "refs"))})

        async def health(request):
            return web.json_response({"status": "ok", "signature": self.reward.signature,
                                      "device": str(self.batched.reward.scorer.encoder.device),
                                      "max_batch_size": self.batched.max_batch_size,
                                      "max_wait_ms": self.batched.max_wait_ms, "limits": dataclasses.asdict(limits),
                                      "connections": len(self._connections), "in_flight": self.in_flight,
                                      "abandoned": self.abandoned, "refused": self.refused,
                                      "failures": self.reward.failures, **self.batched.stats()})

        app = web.Application(middlewares=[json_errors], client_max_size=limits.max_request_bytes)
        app.add_routes([web.post("/", openrlhf), web.post("/get_reward", openrlhf), web.post("/score", score),
                        web.get("/health", health)])
        return app

    async def _before_deadline(self, awaitable):
        """The result of ``awaitable``, or :class:`_ShuttingDown` if the drain deadline passes first
        (``awaitable`` is then cancelled: a slice not yet scored is never scored)."""
        task = asyncio.ensure_future(awaitable)
        expired = asyncio.ensure_future(self._expired.wait())
        try:
            await asyncio.wait({task, expired}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            task.cancel()
            raise
        finally:
            expired.cancel()
        if not task.done():
            task.cancel()
            raise _ShuttingDown()
        return task.result()

    # --- descriptor exhaustion -----------------------------------------------------------------------

    def _on_loop_error(self, loop, context) -> None:
        """The event loop's exception handler: a listening socket out of descriptors (``EMFILE``; the
        loop itself stops accepting for a second) answers the clients waiting with 503 through a
        descriptor kept spare for it, and logs one WARNING a minute, no traceback; anything else
        goes to the default handler."""
        error = context.get("exception")
        if not (isinstance(error, OSError) and error.errno in (errno.EMFILE, errno.ENFILE)):
            loop.default_exception_handler(context)
            return
        refused = self._refuse_waiting()
        self._descriptor_refusals += refused
        now = time.monotonic()
        if now - self._descriptor_warned >= 60:
            self._descriptor_warned = now
            logger.warning("torchmover serve: out of file descriptors (%s; ulimit -n, max_connections): not "
                           "accepting for a second; %d connection(s) answered 503 so far", error.strerror,
                           self._descriptor_refusals)

    def _refuse_waiting(self) -> int:
        """Accept the connections waiting, through the spare descriptor, and answer each 503."""
        if self._spare is None or self._accepting is None:
            return 0
        self._spare.close()
        refused = 0
        try:
            for _ in range(256):
                try:
                    connection, _ = self._accepting.accept()
                except OSError:  # none waiting, or still no descriptor
                    break
                with connection:
                    try:
                        connection.send(NO_DESCRIPTOR)
                    except OSError:
                        pass
                refused += 1
        finally:
            self._spare = open(os.devnull, "rb")  # noqa: SIM115 — held until the server stops
        self.refused += refused
        return refused

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
                                   keepalive_timeout=self.limits.idle_timeout, shutdown_timeout=DRAIN_GRACE,
                                   logger=self._refusals)
            listening = None
            try:
                await runner.setup()
                loop = asyncio.get_running_loop()
                loop.set_exception_handler(self._on_loop_error)
                self._quiet, self._expired = asyncio.Event(), asyncio.Event()
                self._quiet.set()
                listening = await loop.create_server(lambda: _Connection(self, runner.server), self.host, self.port)
                self.port = listening.sockets[0].getsockname()[1]
                self._accepting = socket.socket(fileno=os.dup(listening.sockets[0].fileno()))
                self._spare = open(os.devnull, "rb")  # noqa: SIM115 — see _refuse_waiting
                self._loop, self._stopped = loop, asyncio.Event()
            except BaseException as error:  # e.g. the port is taken: raised by start()
                failure.append(error)
                if listening is not None:
                    listening.close()
                await runner.cleanup()
                self._close_spares()
                return
            finally:
                ready.set()
            await self._stopped.wait()
            listening.close()  # no new connection from here on
            self._accepting.close()  # (its duplicate would keep the socket listening)
            self._accepting = None
            await self._drain(loop)
            await runner.cleanup()  # closes the connections (a handler still running has DRAIN_GRACE s)
            self._close_spares()

        try:
            asyncio.run(main())
        finally:
            self._finished.set()
            ready.set()

    async def _drain(self, loop) -> None:
        """Let the requests in flight finish, in arrival order, until ``drain_timeout``; then those
        left answer 503 (:meth:`_before_deadline`), with DRAIN_GRACE seconds to send it."""
        self._draining = True
        if self._scoring:
            next(iter(self._scoring.values())).set()
        # serving: both events are made
        quiet_event, expired_event = cast(asyncio.Event, self._quiet), cast(asyncio.Event, self._expired)
        loop.call_later(self.limits.drain_timeout, expired_event.set)
        quiet = asyncio.ensure_future(quiet_event.wait())
        expired = asyncio.ensure_future(expired_event.wait())
        await asyncio.wait({quiet, expired}, return_when=asyncio.FIRST_COMPLETED)
        expired.cancel()
        try:
            await asyncio.wait_for(quiet, DRAIN_GRACE)
        except asyncio.TimeoutError:
            pass

    def _close_spares(self) -> None:
        for held in (self._accepting, self._spare):
            if held is not None:
                held.close()
        self._accepting = self._spare = None

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
            self._loop.call_soon_threadsafe(cast(asyncio.Event, self._stopped).set)  # made with the loop
        if self._thread is not None:
            self._finished.wait()
            self._thread.join()

    def __enter__(self) -> "RewardServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
