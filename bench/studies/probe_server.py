"""Probes the reward server (``torchmover serve``) from outside and counts what it answers.

Starts ``torchmover serve`` (default model, CPU, 127.0.0.1) in a subprocess for each group of probes and
talks raw HTTP/1.1 to it over sockets (``asyncio`` streams), so that malformed, slow and abandoned
requests can be sent as they are:

- ``malformed``: about a hundred malformed requests (bad JSON, charsets, nesting, types, lengths,
  invalid Unicode, bad request lines and headers, bodies over the limits); counts 4xx answers, and
  checks ``/health`` after each;
- ``load``: ``--clients`` concurrent clients x ``--requests`` OpenRLHF requests of one WMT pair each;
  every answer compared with ``MoverReward(Scorer()).score`` in-process (largest difference);
- ``slow``: ``--slow`` clients dribbling a request head or body one byte a second: how many the server
  disconnects, and how long it took;
- ``idle``: a server whose descriptor limit is 256 and 300 idle connections: ``/health`` and
  ``/score`` must keep answering (503 while the connection cap is full, then 200) with no
  "Too many open files";
- ``abandoned``: 50 clients send a 32-pair request and disconnect; the latency of the next request,
  against that of the same request on an idle server;
- ``large``: a 1,500-pair request, then a 1-pair request one second later: the small one's latency;
- ``sigterm``: 16 requests in flight, then SIGTERM: how many are answered, the exit status.

    python bench/studies/probe_server.py                      # every probe
    python bench/studies/probe_server.py --only malformed,sigterm
    python bench/studies/probe_server.py --repo ../old-checkout  # the same probes against another checkout's server
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_batching import wmt_pairs  # noqa: E402
import harness  # noqa: E402
from harness import REPO  # noqa: E402

PROBES = ("malformed", "load", "slow", "idle", "abandoned", "large", "sigterm")
TOO_MANY = "'Too many open files' in the log"  # a figure of every probe


# --- the server and raw HTTP ---------------------------------------------------------------------

def start_server(repo: Path, *options: str, nofile: int | None = None) -> tuple[subprocess.Popen, int, Path]:
    """``torchmover serve --port 0`` of the checkout ``repo`` with ``options`` (stderr to a log file); its port."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")]))}
    log = Path(tempfile.mkstemp(prefix="probe-serve-", suffix=".log")[1])

    def limit_descriptors():
        if nofile:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    process = subprocess.Popen([sys.executable, "-m", "torchmover", "serve", "--port", "0", "--no-progress",
                                "--device", "cpu", *options], stderr=open(log, "w"), env=env, cwd=repo,
                               preexec_fn=limit_descriptors)  # cwd: "-m" imports from the working directory first
    deadline = time.monotonic() + 600
    while "serving on" not in log.read_text():
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the server did not start:\n{log.read_text()}")
        time.sleep(0.2)
    port = int(log.read_text().split("serving on http://127.0.0.1:")[1].split()[0])
    return process, port, log


def stop_server(process: subprocess.Popen) -> int:
    process.send_signal(signal.SIGTERM)
    return process.wait(timeout=120)


def http(path: str, body: bytes = b"", method: str = "POST", headers: dict | None = None) -> bytes:
    headers = {"Host": "probe", "Content-Type": "application/json", "Content-Length": str(len(body)), **(headers or {})}
    return (f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
            ).encode("latin-1") + body


def json_request(path: str, body) -> bytes:
    return http(path, json.dumps(body).encode())


async def exchange(port: int, raw: bytes, timeout: float = 60.0, close_after_send: bool = False):
    """Send ``raw``; returns ``(status, body)`` of the answer, or ``(None, reason)`` if none came."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout)
    except OSError as error:
        return None, f"connect: {error}"
    try:
        writer.write(raw)
        await writer.drain()
        if close_after_send:
            return None, "closed by the client"
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
        lines = head.decode("latin-1").split("\r\n")
        length = next((int(line.split(":")[1]) for line in lines if line.lower().startswith("content-length")), 0)
        body = await asyncio.wait_for(reader.readexactly(length), timeout)
        return int(lines[0].split()[1]), body
    except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, asyncio.LimitOverrunError) as error:
        return None, type(error).__name__
    finally:
        writer.close()


async def health(port: int) -> int | None:
    return (await exchange(port, http("/health", method="GET"), timeout=30))[0]


# --- malformed requests ---------------------------------------------------------------------------

def malformed_cases() -> list[tuple[str, bytes]]:
    """(name, raw request) of every malformed request tried."""
    ok = {"hyps": ["a cat"], "refs": ["a cat sat"]}
    orl = {"query": ["Q: a cat"], "prompts": ["Q:"], "labels": ["a cat sat"]}
    cases = [(f"score body {b[:24]!r}", http("/score", b)) for b in [
        b"", b"{", b"nul", b"[1, 2]", b'"text"', b"123", b"null", b"true", b"\xff\xfe", b'{"hyps": ["\xc3"]}',
        b"[" * 100_000, b'{"a":' * 50_000, b"[" * 1000 + b"]" * 1000, b'{"hyps": [' + b"1" * 5000 + b"]}",
        b'{"hyps": [NaN], "refs": ["a"]}', b'{"hyps": [Infinity], "refs": ["a"]}', b"{'hyps': ['a']}",
        b'{"hyps": ["a"], "refs": ["a"]', b"\x00" * 64, b"\xef\xbb\xbf" + json.dumps(ok).encode(), b"   ", b"{}",
        b'{"hyps": ["a"], "refs": ["a"]} trailing']]
    fields = [{"refs": ["a"]}, {"hyps": ["a"]}, {"hyps": None, "refs": ["a"]}, {"hyps": 1, "refs": ["a"]},
              {"hyps": "a", "refs": ["a"]}, {"hyps": {}, "refs": ["a"]}, {"hyps": ["a"], "refs": None},
              {"hyps": ["a"], "refs": 1}, {"hyps": ["a"], "refs": "a"}, {"hyps": ["a", "b"], "refs": ["a"]},
              {"hyps": ["a"], "refs": ["a", "b"]}, {"hyps": ["a"], "refs": [[]]}, {"hyps": ["a"], "refs": [[1]]},
              {"hyps": ["a"], "refs": [["a", None]]}, {"hyps": ["a"], "refs": [{}]}, {"hyps": ["a\ud800b"], "refs": ["a"]},
              {"hyps": ["a"], "refs": ["\udfff"]}, {"hyps": ["a"], "refs": [["a", "b\ud800"]]},
              {"hyps": ["a"] * 5000, "refs": ["a"] * 5000}, {"hyps": [["a"]], "refs": ["a"]},
              {"hyps": ["a", "b"], "refs": [["a"], 3]}, {"hyps": [], "refs": ["a"]}, {"hyps": ["a"], "refs": []}]
    fields += [{"hyps": [bad], "refs": ["a"]} for bad in (None, 1, 1.5, True, [], {}, ["a"])]
    cases += [(f"score {json.dumps(f)[:40]}", json_request("/score", f)) for f in fields]
    openrlhf = [{}, {"query": ["Q: a"]}, {**orl, "labels": None}, {**orl, "query": "Q: a"}, {**orl, "prompts": ["P:"]},
                {**orl, "labels": [[]]}, {**orl, "labels": [1]}, {**orl, "labels": [["a", 2]]}, {**orl, "query": [3]},
                {**orl, "prompts": [None]}, {**orl, "query": ["Q: a", "Q: b"]}, {**orl, "query": ["Q: a\ud800"]},
                {**orl, "labels": ["\ud800"]}, {**orl, "labels": {"a": 1}}, {**orl, "prompts": ["Q: a cat and more"]},
                {**orl, "query": [], "prompts": []}, {"query": ["Q: a"] * 5000, "prompts": ["Q:"] * 5000, "labels": ["a"] * 5000}]
    cases += [(f"get_reward {json.dumps(f)[:40]}", json_request("/get_reward", f)) for f in openrlhf]
    body = json.dumps(ok).encode()
    cases += [(f"charset {c}", http("/score", body, headers={"Content-Type": f"application/json; charset={c}"}))
              for c in ("no-such-charset", "latin-1", "utf-16", "utf-8; x=1\x01")]
    cases += [
        ("unknown path", json_request("/nope", ok)), ("GET /score", http("/score", method="GET")),
        ("PUT /health", http("/health", method="PUT")), ("DELETE /", http("/", method="DELETE")),
        ("BREW /score", http("/score", body, method="BREW")), ("garbage request line", b"GARBAGE\r\n\r\n"),
        ("HTTP/9.9", b"POST /score HTTP/9.9\r\nHost: x\r\nContent-Length: 0\r\n\r\n"),
        ("no version", b"POST /score\r\n\r\n"), ("long URL", http("/score?" + "x" * 20_000, body)),
        ("long header", http("/score", body, headers={"X-Long": "x" * 20_000})),
        ("200 headers", http("/score", body, headers={f"X-H{i}": "x" for i in range(200)})),
        ("header without colon", b"POST /score HTTP/1.1\r\nHost x\r\nContent-Length: 2\r\n\r\n{}"),
        ("negative Content-Length", http("/score", body, headers={"Content-Length": "-1"})),
        ("Content-Length not a number", http("/score", body, headers={"Content-Length": "abc"})),
        ("two Content-Lengths", b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 5\r\n\r\n{}"),
        ("Content-Length and chunked", b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
                                       b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"),
        ("bad chunk size", b"POST /score HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n"),
        ("chunked body over the limit", b"POST /score HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                                        + b"100000\r\n" + b" " * 0x100000 + b"\r\n" * 10 + b"0\r\n\r\n"),
        ("gzip garbage", http("/score", b"not gzip", headers={"Content-Encoding": "gzip"})),
        ("Expect garbage", http("/score", body, headers={"Expect": "200-ok"})),
        ("announced 9 MiB, sent 10 bytes", http("/score", b'{"hyps": [', headers={"Content-Length": "9437184"})),
        ("body over the limit", http("/score", b'{"hyps": ["' + b"x" * (8 * 2**20) + b'"], "refs": ["a"]}')),
        ("NUL in path", b"POST /sc\x00ore HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"),
        ("non-ASCII header", b"POST /score HTTP/1.1\r\nHost: x\r\nX-\xff: 1\r\nContent-Length: 0\r\n\r\n"),
    ]
    return cases


async def probe_malformed(port: int) -> dict:
    """Every case of :func:`malformed_cases` (names may repeat: they are cut short), counted by its answer."""
    answers, other = [], []
    for name, raw in malformed_cases():
        status, detail = await exchange(port, raw, timeout=60)
        answers.append(status)
        if status is None or not 400 <= status < 500:
            other.append(f"{name}: {status} {detail[:120]!r}")
        if await health(port) != 200:
            other.append(f"{name}: /health did not answer 200 after it")
    return {"tried": len(answers), "4xx": sum(1 for s in answers if s is not None and 400 <= s < 500),
            "5xx": sum(1 for s in answers if s is not None and s >= 500),
            "no answer": sum(1 for s in answers if s is None), "other": other}


# --- load, slow and idle clients ------------------------------------------------------------------

async def probe_load(port: int, pairs: list[tuple[str, str]], clients: int, requests: int) -> dict:
    from torchmover import Scorer
    from torchmover.reward import MoverReward

    want = MoverReward(Scorer(device="cpu")).score([h for h, _ in pairs], [r for _, r in pairs]).tolist()
    diffs, failures = [], 0

    async def client(c):
        nonlocal failures
        for k in range(requests):
            i = (c * requests + k) % len(pairs)
            prompt = f"client {c} asks {k}:\n"
            hyp, ref = pairs[i]
            status, body = await exchange(port, json_request("/get_reward", {
                "query": [prompt + hyp + "</s>"], "prompts": [prompt], "labels": [ref]}), timeout=600)
            if status != 200:
                failures += 1
                continue
            diffs.append(abs(json.loads(body)["rewards"][0] - want[i]))

    start = time.perf_counter()
    await asyncio.gather(*(client(c) for c in range(clients)))
    return {"requests": clients * requests, "answered": len(diffs), "failures": failures,
            "max diff": max(diffs, default=float("nan")), "seconds": time.perf_counter() - start}


async def dribble(port: int, raw: bytes, start_at: int, give_up: float) -> tuple[bool, float]:
    """Send ``raw[:start_at]`` at once, then one byte a second for at most ``give_up`` seconds: whether
    the server closed the connection (or answered and closed) first, and after how long."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    start = time.monotonic()
    try:
        writer.write(raw[:start_at])
        for i in range(start_at, min(len(raw), start_at + int(give_up))):
            await writer.drain()
            try:
                data = await asyncio.wait_for(reader.read(65536), 1.0)
                if data or reader.at_eof():
                    return True, time.monotonic() - start
            except asyncio.TimeoutError:
                pass
            writer.write(raw[i:i + 1])
        return False, time.monotonic() - start
    except OSError:
        return True, time.monotonic() - start
    finally:
        writer.close()


async def probe_slow(port: int, n: int, give_up: float = 120) -> dict:
    raw = json_request("/score", {"hyps": ["a cat sat on the mat"] * 20, "refs": ["the cat"] * 20})
    head_end = raw.index(b"\r\n\r\n") + 4
    results = await asyncio.gather(*(dribble(port, raw, 0 if i % 2 else head_end, give_up) for i in range(n)))
    times = [t for closed, t in results if closed]
    return {"clients": n, "disconnected": len(times), "slowest disconnect s": max(times, default=float("nan"))}


async def probe_idle(port: int, n: int) -> dict:
    """``n`` idle connections, then /health and /score until both answer 200."""
    idle = []
    for _ in range(n):
        try:
            idle.append(await asyncio.open_connection("127.0.0.1", port))
        except OSError:
            break
    start, statuses = time.monotonic(), []
    while time.monotonic() - start < 120:
        status = await health(port)
        score, _ = await exchange(port, json_request("/score", {"hyps": ["a"], "refs": ["a"]}), timeout=30)
        statuses.append((status, score))
        if status == score == 200:
            break
        await asyncio.sleep(0.5)
    for _, writer in idle:
        writer.close()
    return {"idle connections": len(idle), "first answers (health, score)": statuses[0],
            "seconds until 200": time.monotonic() - start, "answers": len(statuses)}


# --- abandoned, large, sigterm --------------------------------------------------------------------

async def probe_abandoned(port: int, pairs: list[tuple[str, str]]) -> dict:
    def request(i):
        chunk = pairs[i * 32 % len(pairs):][:32]
        return json_request("/score", {"hyps": [h for h, _ in chunk], "refs": [r for _, r in chunk]})

    async def timed(raw):
        start = time.perf_counter()
        status, _ = await exchange(port, raw, timeout=600)
        return status, time.perf_counter() - start

    async def pairs_scored():
        return json.loads((await exchange(port, http("/health", method="GET")))[1])["pairs"]

    _, idle_latency = await timed(request(0))
    before = await pairs_scored()
    await asyncio.gather(*(exchange(port, request(i + 1), close_after_send=True) for i in range(50)))
    status, latency = await timed(request(51))
    return {"next request status": status, "latency s": latency, "on an idle server s": idle_latency,
            "abandoned pairs scored": await pairs_scored() - before - 32, "abandoned pairs sent": 50 * 32}


async def probe_large(port: int, pairs: list[tuple[str, str]], n: int) -> dict:
    large = json_request("/score", {"hyps": [h for h, _ in pairs[:n]], "refs": [r for _, r in pairs[:n]]})
    small = json_request("/score", {"hyps": [pairs[-1][0]], "refs": [pairs[-1][1]]})
    start = time.perf_counter()
    large_task = asyncio.ensure_future(exchange(port, large, timeout=1200))
    await asyncio.sleep(1.0)
    small_start = time.perf_counter()
    small_status, _ = await exchange(port, small, timeout=1200)
    small_latency = time.perf_counter() - small_start
    large_status, _ = await large_task
    return {"large status": large_status, "small status": small_status, "small latency s": small_latency,
            "large latency s": time.perf_counter() - start}


async def probe_sigterm(process: subprocess.Popen, port: int, pairs: list[tuple[str, str]]) -> dict:
    bodies = [json_request("/score", {"hyps": [h for h, _ in pairs[i * 16:(i + 1) * 16]],
                                      "refs": [r for _, r in pairs[i * 16:(i + 1) * 16]]}) for i in range(16)]
    tasks = [asyncio.ensure_future(exchange(port, b, timeout=300)) for b in bodies]
    await asyncio.sleep(0.5)
    start = time.monotonic()
    process.send_signal(signal.SIGTERM)
    answers = await asyncio.gather(*tasks)
    status = await asyncio.get_running_loop().run_in_executor(None, process.wait, 300)
    return {"in flight": len(tasks), "answered 200": sum(s == 200 for s, _ in answers),
            "exit status": status, "seconds to exit": time.monotonic() - start,
            "new connection after exit": (await exchange(port, http("/health", method="GET"), timeout=5))[1][:40]}


# --- the table of the documentation -------------------------------------------------------------

DOCS_ROWS = {  # probe -> its row of the documentation's table, from its figures
    "malformed": lambda m: [f"{m['tried']} malformed requests: answered 4xx", f"**{m['4xx']}**"],
    "load": lambda m: [f"{m['requests']} OpenRLHF requests from concurrent clients: answered, largest difference to "
                       "in-process `MoverReward`", f"{m['answered']} of {m['requests']}, {m['max diff']:.1e}"],
    "slow": lambda m: ["clients dribbling a request head or body a byte a second: disconnected",
                       f"**{m['disconnected']} of {m['clients']}**, the last after {m['slowest disconnect s']:.1f} s"],
    "idle": lambda m: [f"{m['idle connections']} idle connections, descriptor limit 256: `/health` and `/score`",
                       "{} / {} at once, then 200 after {:.1f} s; \"Too many open files\" {} time(s)".format(
                           *m["first answers (health, score)"], m["seconds until 200"], m[TOO_MANY])],
    "abandoned": lambda m: ["50 clients send 32 pairs each and disconnect: pairs of theirs scored; latency of the "
                            "next request (idle server)", f"**{m['abandoned pairs scored']}** of "
                            f"{m['abandoned pairs sent']}; {m['latency s']:.1f} s ({m['on an idle server s']:.1f} s)"],
    "large": lambda m: ["a large request, then a 1-pair one a second later: the small one's latency (the large one's)",
                        f"**{m['small latency s']:.1f} s** ({m['large latency s']:.0f} s)"],
    "sigterm": lambda m: [f"SIGTERM with {m['in flight']} requests in flight: answered; exit status",
                          f"**{m['answered 200']} of {m['in flight']}**; {m['exit status']} after "
                          f"{m['seconds to exit']:.1f} s"],
}


def docs_table(results: dict) -> dict:
    """The probe table of ``docs/guide/server.md`` (``docs_probes``): a row per probe that ran."""
    return harness.table(["probe", "result"], [DOCS_ROWS[name](results[name]) for name in PROBES if name in results])


# --- main -----------------------------------------------------------------------------------------

def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data" / "wmt15-16")
    parser.add_argument("--only", default=",".join(PROBES), help=f"comma-separated, from {','.join(PROBES)}")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--requests", type=int, default=30, help="requests per client (load)")
    parser.add_argument("--slow", type=int, default=400, help="slow clients")
    parser.add_argument("--large", type=int, default=1500, help="pairs of the large request")
    parser.add_argument("--pairs", type=int, default=2000, help="distinct WMT pairs drawn for the requests")
    parser.add_argument("--threads", type=int, default=2, help="OMP_NUM_THREADS of the server")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results", help="output directory")
    parser.add_argument("--repo", type=Path, default=REPO, help="the checkout whose server is probed (default: this one)")
    parser.add_argument("--serve-options", default="", help="more options of every server, e.g. '--body-timeout 2' "
                        "(default: none, the server's own)")
    args = parser.parse_args(argv)
    only = args.only.split(",")
    unknown = sorted(set(only) - set(PROBES))
    if unknown:
        parser.error(f"unknown probes {unknown}")
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    random.seed(0)
    pairs = wmt_pairs(args.data, args.pairs, seed=0)
    results = {}

    def run(name, coroutine_factory, *options, nofile=None):
        if name not in only:
            return
        process, port, log = start_server(args.repo, *options, *shlex.split(args.serve_options), nofile=nofile)
        try:
            results[name] = asyncio.run(coroutine_factory(process, port))
            if process.poll() is None:
                results[name]["server exit on SIGTERM"] = stop_server(process)
            errors = [line for line in log.read_text().splitlines() if "Too many open files" in line]
            results[name][TOO_MANY] = len(errors)
        finally:
            process.kill()
            process.wait()
            log.unlink()
        print(f"{name}: {json.dumps(results[name], indent=1)}", flush=True)

    run("malformed", lambda p, port: probe_malformed(port))
    run("load", lambda p, port: probe_load(port, pairs[:args.clients * args.requests], args.clients, args.requests))
    run("slow", lambda p, port: probe_slow(port, args.slow))
    run("idle", lambda p, port: probe_idle(port, 300), nofile=256)
    run("abandoned", lambda p, port: probe_abandoned(port, pairs))
    run("large", lambda p, port: probe_large(port, pairs, args.large))
    run("sigterm", lambda p, port: probe_sigterm(p, port, pairs))
    harness.publish(args.out, "probe_server", "The reward server probed from outside", results,
                    {"docs_probes": docs_table(results)},
                    [*harness.counts_body(results), "## The table of the documentation", {"table": "docs_probes"}])


if __name__ == "__main__":
    main()
