"""Requests per second and latency of the reward server (``torchmover serve``) on loopback.

Starts ``torchmover serve`` (default model) in a subprocess on 127.0.0.1, then ``--clients``
concurrent clients send ``--requests`` OpenRLHF-style requests in all (``POST /get_reward`` with one
(query, prompt, label) each, as OpenRLHF sends them; real WMT15-16 translation / reference pairs,
all distinct), each client waiting for its answer before the next request. Measured twice: with the
server's dynamic batching (``--max-batch-size``, ``--max-wait-ms``) and with ``--max-batch-size 1``
(every request scored on its own). Publishes ``bench_serve`` (``bench_serve_cuda`` on a GPU) to ``--out``.

    python bench/bench_serve.py --threads 2
"""
from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_batching import wmt_pairs  # noqa: E402
import harness  # noqa: E402
from harness import REPO  # noqa: E402


def start_server(max_batch_size: int, max_wait_ms: float, threads: int | None,
                 device: str = "auto") -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    process = subprocess.Popen(
        [sys.executable, "-m", "torchmover", "serve", "--port", "0", "--no-progress",
         "--max-batch-size", str(max_batch_size), "--max-wait-ms", str(max_wait_ms), "--device", device],
        stderr=subprocess.PIPE, text=True, env=env)
    line = ""
    while "serving on" not in line:
        line = process.stderr.readline()
        if not line:
            raise SystemExit(f"the server exited (status {process.wait()}) before listening")
    return process, line.split("serving on ")[1].split()[0]


async def load(url: str, pairs: list[tuple[str, str]], clients: int) -> tuple[float, list[float], int]:
    """Seconds for all requests, each request's latency, and the number of failed requests."""
    import aiohttp

    latencies: list[float] = []
    failures = 0
    queue: asyncio.Queue = asyncio.Queue()
    for i, pair in enumerate(pairs):
        queue.put_nowait((i, pair))

    async def client(session):
        nonlocal failures
        while not queue.empty():
            i, (hyp, ref) = queue.get_nowait()
            prompt = f"Translate sentence {i} into English:\n"
            body = {"query": [prompt + hyp + "</s>"], "prompts": [prompt], "labels": [ref]}
            start = time.perf_counter()
            async with session.post(url + "/get_reward", json=body) as response:
                answer = await response.json()
            latencies.append(time.perf_counter() - start)
            failures += response.status != 200 or len(answer.get("rewards", ())) != 1

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        start = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(clients)))
        return time.perf_counter() - start, latencies, failures


def device_name(device: str) -> str:
    """The device a server started with ``--device device`` scores on, in words."""
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.cuda.get_device_name(device) if device.startswith("cuda") else "CPU"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def main(argv=None) -> None:
    parser = harness.wmt_parser(__doc__)
    parser.add_argument("--requests", type=int, default=512)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--max-batch-size", type=int, default=256)
    parser.add_argument("--max-wait-ms", type=float, default=5.0)
    parser.add_argument("--threads", type=int, default=None, help="the server's torch CPU threads (OMP_NUM_THREADS)")
    parser.add_argument("--device", default="auto", help="the server's device (default auto: CUDA when available)")
    args = parser.parse_args(argv)
    pairs = wmt_pairs(args.data, args.requests, args.seed)
    rows, docs_rows, figures = [], [], {}
    for label, batch_size in tqdm([("dynamic batching", args.max_batch_size), ("no batching", 1)], desc="servers"):
        process, url = start_server(batch_size, args.max_wait_ms, args.threads, args.device)
        try:
            asyncio.run(load(url, pairs[:args.clients], args.clients))  # warm-up
            seconds, latencies, failures = asyncio.run(load(url, pairs, args.clients))
        finally:
            process.terminate()
            process.wait(timeout=60)
        figures[label] = {"max_batch_size": batch_size, "seconds": seconds, "latencies_s": latencies,
                          "failures": failures}
        docs_rows.append([f"{label} (max batch {batch_size}" + (f", max wait {args.max_wait_ms:g} ms)" if batch_size > 1 else ")"),
                          f"{len(pairs) / seconds:,.0f}", f"{1000 * percentile(latencies, 50):.0f}",
                          f"{1000 * percentile(latencies, 99):.0f}"])
        rows.append([f"{label} (max batch {batch_size})", f"{len(pairs) / seconds:.1f}",
                     f"{1000 * percentile(latencies, 50):.0f}", f"{1000 * percentile(latencies, 99):.0f}",
                     f"{1000 * statistics.mean(latencies):.0f}", failures])
    device = device_name(args.device)
    harness.publish(args.out, "bench_serve" + ("" if device == "CPU" else "_cuda"),
                    "Reward server: requests/s and latency on loopback", figures,
                    {"servers": harness.table(["server", "requests/s", "p50 latency ms", "p99 latency ms", "mean ms",
                                               "failed"], rows, align="-rrrrr"),
                     "docs_server": harness.table(["server", "requests/s", "p50 latency ms", "p99 latency ms"],
                                                  [[r[0], f"**{r[1]}**" if k == 0 else r[1], *r[2:]]
                                                   for k, r in enumerate(docs_rows)], align="-rrr")}, [
        f"`torchmover serve` (default model, {device}, max wait {args.max_wait_ms:g} ms, torch threads: "
        f"{args.threads or 'torch default'}) in a subprocess on 127.0.0.1; {args.clients} concurrent aiohttp clients "
        f"send {len(pairs)} single-sample OpenRLHF requests (`POST /get_reward`, distinct WMT15-16 pairs) after a "
        f"warm-up; client and server share the machine's {os.cpu_count()} logical cores.", {"table": "servers"},
        "## The table of the documentation", {"table": "docs_server"}],
        data=harness.data_provenance(args.data, args.requests, args.seed))


if __name__ == "__main__":
    main()
