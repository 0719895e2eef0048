"""Start-up time and memory of one process's reward: what each verl reward-loop worker (and each
OpenRLHF rollout actor loading the reward file) pays.

verl starts ``reward.num_workers`` reward-loop workers (default 8), each a process that loads
``compute_score`` and so builds its own scorer; OpenRLHF loads the reward file in every rollout actor.
This script measures one such process, in fresh processes (median of ``--repeats``): the resident
memory (RSS) once torch is imported (every worker has it: verl imports torch), after importing the
adapter, after building the reward (loading the encoder, fitting on ``--references`` WMT15-16
references, as ``TORCHMOVER_FIT_REFERENCES`` does: which encodes them only where the scorer's options
need a corpus statistic, e.g. ``--options '{"centering": "batch"}'``), and at the peak of ``--calls`` single-sample
``compute_score`` calls from 16 threads (the reward loop's thread pool, one distinct WMT pair each);
and the time of each step. The default model, on the CPU, ``--threads`` torch threads. Publishes
``bench_reward_worker`` (``bench_reward_worker_options`` with ``--options``) to ``--out``.

    python bench/bench_reward_worker.py --threads 1
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
from bench_common import peak_rss_mb, rss_mb  # noqa: E402
from harness import REPO  # noqa: E402


def child(threads: int, pairs_path: str) -> None:
    """One worker's life, measured; prints a JSON line."""
    out = {}
    start = time.perf_counter()
    import torch

    if threads:
        torch.set_num_threads(threads)
    out["rss_torch"] = rss_mb()
    t = time.perf_counter()
    import torchmover.integrations.verl as adapter

    out["import_s"], out["rss_import"] = time.perf_counter() - t, rss_mb()
    t = time.perf_counter()
    compute_score = adapter.compute_score  # what verl's worker does at its start: builds the reward
    out["build_s"], out["rss_built"] = time.perf_counter() - t, rss_mb()
    pairs = json.loads(Path(pairs_path).read_text())
    t = time.perf_counter()
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda p: compute_score(data_source="wmt", solution_str=p["hyp"], ground_truth=p["ref"],
                                              extra_info={}), pairs))
    out["calls_s"], out["rss_peak"] = time.perf_counter() - t, peak_rss_mb()
    out["total_s"] = time.perf_counter() - start
    print(json.dumps(out))


def main(argv=None) -> None:
    parser = harness.wmt_parser(__doc__)
    parser.add_argument("--references", type=int, default=1000, help="references fitted at start (default: 1000)")
    parser.add_argument("--calls", type=int, default=256, help="single-sample calls after start (default: 256)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    parser.add_argument("--options", default="{}", help="TORCHMOVER_OPTIONS, a JSON object (default: {})")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", help="internal: measure one worker on this pairs file")
    args = parser.parse_args(argv)
    if args.child:
        return child(args.threads, args.child)
    rows = harness.wmt_sample(args.data, args.references + args.calls, args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        fit, pairs = Path(tmp) / "references.txt", Path(tmp) / "pairs.json"
        fit.write_text("\n".join(r["ref"] for r in rows[:args.references]) + "\n", encoding="utf-8")
        pairs.write_text(json.dumps(rows[args.references:]), encoding="utf-8")
        env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHMOVER_")}
        env.update(TORCHMOVER_FIT_REFERENCES=str(fit), TORCHMOVER_OPTIONS=args.options, PYTHONPATH=str(REPO),
                   HF_HUB_OFFLINE="1")
        runs = [json.loads(subprocess.run(
            [sys.executable, __file__, "--child", str(pairs), "--threads", str(args.threads)], env=env,
            capture_output=True, text=True, check=True).stdout.splitlines()[-1]) for _ in range(args.repeats)]
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    table = harness.table(["step", "time (s)", "RSS after (MiB)", "torchmover's share (MiB)"], [
        ["python + torch imported", "—", f"{med['rss_torch']:.0f}", "—"],
        ["import torchmover.integrations.verl", f"{med['import_s']:.2f}", f"{med['rss_import']:.0f}",
         f"{med['rss_import'] - med['rss_torch']:.0f}"],
        [f"build: encoder loaded, TORCHMOVER_FIT_REFERENCES of {args.references} lines", f"{med['build_s']:.2f}",
         f"{med['rss_built']:.0f}", f"{med['rss_built'] - med['rss_torch']:.0f}"],
        [f"{args.calls} compute_score calls from 16 threads (peak)", f"{med['calls_s']:.2f}", f"{med['rss_peak']:.0f}",
         f"{med['rss_peak'] - med['rss_torch']:.0f}"]])
    notes = [f"Default model on the CPU, TORCHMOVER_OPTIONS={args.options}, torch threads: "
             f"{args.threads or 'torch default'}; median of "
             f"{args.repeats} fresh processes; whole process {med['total_s']:.1f} s.",
             "verl starts reward.num_workers (default 8) such processes: multiply the share by it."]
    harness.publish(args.out, "bench_reward_worker" if args.options == "{}" else "bench_reward_worker_options",
                    "One reward worker's start-up and memory", {"runs": runs, "median": med},
                    {"steps": table}, ["\n".join(f"- {n}" for n in notes), {"table": "steps"}],
                    data=harness.data_provenance(args.data, args.references + args.calls, args.seed))

if __name__ == "__main__":
    main()
