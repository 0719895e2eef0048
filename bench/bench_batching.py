"""Throughput of single-sample reward calls from many threads, with and without the micro-batcher.

Frameworks such as verl and OpenRLHF call a reward once per sample from a pool of threads. This
script makes ``--calls`` such calls (one real WMT15-16 (translation, reference) pair each, all
distinct) from ``--callers`` threads, three ways: each thread calling ``MoverReward.score`` directly
(calls serialised by the reward's lock), through a ``BatchedReward`` (concurrent calls coalesced),
and, as the bound, one ``score`` call on all pairs at once. The reference cache is cleared before
every run, so every reference is encoded. Publishes ``bench_batching`` (``.json`` and ``.md``) to ``--out``.

    python bench/bench_batching.py --threads 2
"""
from __future__ import annotations

import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

from torchmover import Scorer  # noqa: E402
from torchmover.reward.batching import BatchedReward  # noqa: E402
from torchmover.reward.rewards import MoverReward  # noqa: E402


def wmt_pairs(data_dir: Path, n: int, seed: int) -> list[tuple[str, str]]:
    """``n`` distinct (candidate, reference) pairs drawn by :func:`harness.wmt_sample`."""
    return [(r["hyp"], r["ref"]) for r in harness.wmt_sample(data_dir, n, seed, distinct=True)]


def run_calls(call, pairs, callers: int) -> float:
    """Seconds for ``callers`` threads to make one ``call(hyp, ref)`` per pair."""
    start = time.perf_counter()
    with ThreadPoolExecutor(callers) as pool:
        list(pool.map(lambda pair: call(*pair), pairs))
    return time.perf_counter() - start


def main(argv=None) -> None:
    parser = harness.wmt_parser(__doc__)
    parser.add_argument("--calls", type=int, default=512)
    parser.add_argument("--callers", type=int, default=16, help="calling threads")
    parser.add_argument("--max-batch-size", type=int, default=256)
    parser.add_argument("--max-wait-ms", type=float, default=5.0)
    parser.add_argument("--repeats", type=int, default=3, help="runs per way (the median is reported)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's own)")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    pairs = wmt_pairs(args.data, args.calls, args.seed)
    reward = MoverReward(Scorer(device=args.device))

    def direct(hyp, ref):
        return float(reward.score([hyp], [ref])[0])

    def all_at_once():
        start = time.perf_counter()
        reward.score([h for h, _ in pairs], [r for _, r in pairs])
        return time.perf_counter() - start

    seconds: dict[str, list[float]] = {"direct": [], "batched": [], "one call": []}
    mean_batch = []
    run_calls(direct, pairs[:args.callers], args.callers)  # warm-up
    with tqdm(total=3 * args.repeats, desc="runs") as progress:
        for _ in range(args.repeats):
            reward.clear_cache()
            seconds["direct"].append(run_calls(direct, pairs, args.callers))
            progress.update()
            reward.clear_cache()
            with BatchedReward(reward, max_batch_size=args.max_batch_size, max_wait_ms=args.max_wait_ms) as batched:
                seconds["batched"].append(run_calls(batched.score_one, pairs, args.callers))
                mean_batch.append(batched.stats()["mean_batch_size"])
            progress.update()
            reward.clear_cache()
            seconds["one call"].append(all_at_once())
            progress.update()

    timing = {k: harness.Timing(v) for k, v in seconds.items()}
    rows = [[k, f"{t.median:.2f}", f"{t.min:.2f}–{max(t.runs):.2f}", f"{args.calls / t.median:.1f}",
             f"{timing['direct'].median / t.median:.2f}x"] for k, t in timing.items()]
    notes = [
        f"{args.calls} calls of one distinct WMT15-16 (translation, reference) pair each, from {args.callers} "
        f"threads; reward `MoverReward(Scorer())` ({reward.signature}), reference cache cleared before each run.",
        f"direct: each thread calls `reward.score([hyp], [ref])`; batched: `BatchedReward(reward, "
        f"max_batch_size={args.max_batch_size}, max_wait_ms={args.max_wait_ms:g}).score_one(hyp, ref)` "
        f"(mean {statistics.mean(mean_batch):.1f} pairs per batch); one call: `reward.score` on all pairs at once.",
        f"Median of {args.repeats} runs after a warm-up, the three ways interleaved; device {args.device}."]
    harness.publish(args.out, "bench_batching",
                    "Single-sample reward calls from many threads, with and without the micro-batcher",
                    {"seconds": seconds, "mean_batch_size": mean_batch, "signature": reward.signature,
                     "calls": args.calls, "callers": args.callers},
                    {"ways": harness.table(["way", "seconds (median)", "min–max", "calls/s", "speed-up vs direct"], rows)},
                    ["\n".join(f"- {n}" for n in notes), {"table": "ways"}],
                    data=harness.data_provenance(args.data, args.calls, args.seed))

if __name__ == "__main__":
    main()
