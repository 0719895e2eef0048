"""Scoring corpora at scale: peak memory against bert_score, the metric part against an earlier tree,
memory flat in the corpus size, the speed of one process against two, and repeated calls under two
settings of the C library's allocator.

Five parts (``--part``), each writing ``bench_corpus_<part>.md`` and ``.json`` into ``--out``:

- ``memory``: the growth of the resident set during one ``Scorer.score`` call on the same ``--pairs``
  WMT15-16 pairs (seeded sample, as ``bench_peers.py``) with the same encoder (the default model, layer
  4): torchmover (this tree, and the tree at ``--before`` if given, e.g. an export of an earlier commit)
  with its default centering (``none`` for this model) and with ``batch`` centering, against
  ``bert_score.BERTScorer(...).score`` (F1, no idf). Each run in its own subprocess, after the model is
  loaded and a 16-pair warm-up; the peak is the kernel's high-water mark (``VmHWM``) reset just before
  the call, minus the resident set then. Runs round-robin for ``--rounds``: the median growth, the best
  time.
- ``flat``: ``torchmover score --hyps H --refs R --output O`` (the streaming job, ``batch`` centering:
  two passes and 8 bytes per distinct text to count each once) on synthetic corpora of ``--sizes``
  pairs, each in a subprocess whose peak resident set (``ru_maxrss``) is reported. The encoder is a
  randomly initialised small BERT (1 layer, 32 wide) with the default model's tokenizer, so that a
  million pairs take minutes on a CPU: memory is the pipeline's (chunks, arena, bookkeeping), whatever
  the encoder's size adds once. Sentences of 5-50 words drawn (seeded) from the words of the WMT
  references.
- ``metric``: the metric part of a ``Scorer.score`` call on the same ``--pairs`` pairs (default scorer,
  ``--centering`` if given), this tree against the tree at ``--before`` (required): the encoder's
  outputs (and the tokenizer's) recorded in a first call, then replayed, each replay a fresh copy of
  the recorded tensors (new memory, as a real encoder's output is), so that everything but the encoder
  is timed; the calling thread's CPU time, one torch thread, the median of ``--calls`` calls per
  process; the two trees in turn, a process each, for ``--rounds`` rounds; each round's ratio.
- ``sharding``: the 5,344 WMT15-16 pairs scored by ``score_files`` with the default scorer, in one
  process and in two (``torchrun --nproc-per-node 2``, gloo), one thread each; the time of the scoring
  alone (after the model is loaded and the process group joined), the speed-up against the ideal 2x,
  and the largest difference between the two outputs.
- ``allocator``: ``--calls`` ``Scorer.score`` calls in a row on the same ``--pairs`` pairs (default scorer,
  ``--threads`` torch threads, after the model is loaded and a warm-up call), as a training loop or a
  service makes them, in a process with glibc's default allocator settings and in one with
  ``MALLOC_MMAP_THRESHOLD_`` and ``MALLOC_TRIM_THRESHOLD_`` raised to 4 GiB (freed memory is kept for
  the next allocation instead of being given back to the kernel at once), in turn, for ``--rounds``
  rounds: each call's wall and process CPU time, its minor page faults (first touches of memory newly
  mapped, which the kernel zeroes), and the process's peak resident set; each round's ratio of the
  median call times.

Commands (from the repository root; ``--before``: ``git archive <commit> | tar -x -C /tmp/before``)::

    python bench/bench_corpus.py --part memory --before /tmp/before --rounds 3
    python bench/bench_corpus.py --part flat --sizes 10000,100000,1000000
    python bench/bench_corpus.py --part sharding --rounds 2
    python bench/bench_corpus.py --part metric --before /tmp/before --rounds 10
    python bench/bench_corpus.py --part allocator --rounds 5
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import harness
from bench_common import faults_mib
from harness import REPO, wmt_parser

BENCH = Path(__file__).resolve().parent


def vm_hwm_mb() -> float:
    """The kernel's high-water mark of this process's resident set (``VmHWM``), in MiB."""
    return int(re.search(r"VmHWM:\s+(\d+)", Path("/proc/self/status").read_text()).group(1)) / 1024


def vm_rss_mb() -> float:
    return int(re.search(r"VmRSS:\s+(\d+)", Path("/proc/self/status").read_text()).group(1)) / 1024


def reset_hwm() -> None:
    """Reset ``VmHWM`` to the current resident set (Linux: ``5`` into ``/proc/self/clear_refs``)."""
    Path("/proc/self/clear_refs").write_text("5")


# --- memory ---------------------------------------------------------------------------------------

MEMORY_SYSTEMS = {  # name -> (system, centering, uses --before)
    "torchmover": ("torchmover", None, False),
    "torchmover (before)": ("torchmover", None, True),
    "torchmover, batch centering": ("torchmover", "batch", False),
    "torchmover, batch centering (before)": ("torchmover", "batch", True),
    "bert_score": ("bert_score", None, False),
}


def memory_worker(job: dict) -> dict:
    """One call on the job's pairs (module docs): its time and the growth of the resident set."""
    import torch

    torch.set_num_threads(job["threads"])
    hyps, refs = [p["hyp"] for p in job["pairs"]], [p["ref"] for p in job["pairs"]]
    if job["system"] == "bert_score":
        import bert_score
        from bench_common import model_dir

        scorer = bert_score.BERTScorer(model_type=model_dir(), num_layers=job["layer"], batch_size=64, device="cpu",
                                       idf=False, use_fast_tokenizer=True)
        scorer.score(hyps[:16], refs[:16])

        def run():
            return scorer.score(hyps, refs, batch_size=64)[2]
        signature = scorer.hash
    else:
        from torchmover import Scorer

        scorer = Scorer(device="cpu", **({"centering": job["centering"]} if job["centering"] else {}))
        scorer.score(hyps[:16], refs[:16], progress=False)

        def run():
            return scorer.score(hyps, refs, batch_size=64, progress=False)
        signature = scorer.signature
    tokens = {"padded_tokens": 0, "real_tokens": 0}  # what the encoder runs over, and the texts' own

    def count(module, args, kwargs, output):
        mask = kwargs.get("attention_mask", args[1] if len(args) > 1 else None)
        tokens["padded_tokens"] += mask.numel()
        tokens["real_tokens"] += int(mask.sum())
    model = scorer._model if job["system"] == "bert_score" else scorer.encoder.model
    rss = vm_rss_mb()
    reset_hwm()
    started = time.perf_counter()
    with model.register_forward_hook(count, with_kwargs=True):
        scores = run()
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "peak_growth_mb": vm_hwm_mb() - rss, "rss_before_mb": rss, **tokens,
            "signature": signature, "scores": [float(s) for s in scores]}


def run_memory(args) -> tuple[list[str], dict, dict]:
    pairs = harness.wmt_sample(args.data, args.pairs, args.seed)
    systems = [name for name, (_, _, before) in MEMORY_SYSTEMS.items() if args.before or not before]
    runs: dict[str, list[dict]] = {name: [] for name in systems}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            for name in systems:
                system, centering, before = MEMORY_SYSTEMS[name]
                job = {"system": system, "centering": centering, "pairs": pairs, "layer": 4, "threads": args.threads}
                path = Path(tmp) / "job.json"
                path.write_text(json.dumps(job))
                pythonpath = [str(args.before) if before else str(REPO), str(BENCH)]
                runs[name].append(spawn("memory", path, pythonpath))
                print(f"{name}: {runs[name][-1]['peak_growth_mb']:.0f} MiB, {runs[name][-1]['seconds']:.1f} s", flush=True)
    same = {}
    for name in systems:  # this tree and --before score alike (the largest difference of a score)
        if name.endswith("(before)"):
            now = runs[name.removesuffix(" (before)")][0]["scores"]
            same[name.removesuffix(" (before)")] = max(abs(a - b) for a, b in zip(now, runs[name][0]["scores"]))
    for name in systems:
        for r in runs[name]:
            r.pop("scores")
    bert = statistics.median(r["peak_growth_mb"] for r in runs["bert_score"])
    cells = []
    for name in systems:
        growth = [r["peak_growth_mb"] for r in runs[name]]
        best = min(r["seconds"] for r in runs[name])
        padding = runs[name][0]["padded_tokens"] / max(runs[name][0]["real_tokens"], 1)
        cells.append([name, f"{best:.2f}", f"{args.pairs / best:.0f}", f"{statistics.median(growth):.0f}",
                      f"{statistics.median(growth) / bert:.2f}x", ", ".join(f"{g:.0f}" for g in growth),
                      f"{padding:.3f}"])
    rows = harness.table(["system", "time: s (best)", "pairs/s", "peak growth during the call: MiB (median)",
                          "growth vs bert_score", "growth of each round: MiB",
                          "tokens the encoder runs over / the texts' own"], cells)
    notes = [f"{args.pairs} WMT15-16 pairs (seeded sample, seed {args.seed}); the default model "
             "(sentence-transformers/all-MiniLM-L6-v2, offline package) at layer 4 for every system; batch size 64.",
             f"{args.threads} torch thread(s) per process; {args.rounds} round(s), round-robin, each run in its own "
             "subprocess. Peak growth: the resident set's high-water mark during the call (VmHWM, reset just before "
             "it) minus the resident set before it.",
             "`(before)`: the same runs with the torchmover of `--before` "
             f"({args.before_label or args.before}) first on the path; the largest difference of a score between the "
             f"two trees: {', '.join(f'{k}: {v:.1e}' for k, v in same.items())}." if args.before else ""]
    return [n for n in notes if n], rows, runs


DOCS_LABELS = {"torchmover": "torchmover (default: no centering)", "torchmover, batch centering":
               "torchmover, `batch` centering", "bert_score": "bert_score F1"}


def docs_memory_table(runs: dict[str, list[dict]], pairs: int) -> dict:
    """The scale guide's table of the ``memory`` part, from its runs: each system of this tree (not the
    ``--before`` tree's), its best time and pairs/s, and its median and per-round growth."""
    rows = []
    for name, label in DOCS_LABELS.items():
        growth = [r["peak_growth_mb"] for r in runs[name]]
        best = min(r["seconds"] for r in runs[name])
        rows.append([label, f"{best:.2f}", f"{pairs / best:.0f}", f"{statistics.median(growth):.0f}",
                     ", ".join(f"{g:.0f}" for g in growth)])
    return harness.table(["system", "time s (best)", "pairs/s", "peak growth during the call MiB (median)",
                          "growth of each round MiB"], rows, "-rrrr")


# --- metric ---------------------------------------------------------------------------------------

def metric_worker(job: dict) -> dict:
    """The metric part of one call (module docs): the median of the job's calls, and each call's time."""
    import torch
    from bench_common import Recordings, install_encoder
    from torchmover import Scorer

    torch.set_num_threads(1)
    hyps, refs = [p["hyp"] for p in job["pairs"]], [p["ref"] for p in job["pairs"]]
    scorer = Scorer(device="cpu", **({"centering": job["centering"]} if job["centering"] else {}))
    recordings = Recordings(fresh=True)
    install_encoder(scorer.encoder, recordings.wrap)
    scores = scorer.score(hyps, refs, batch_size=64, progress=False)  # the recording call
    recordings.replay()
    calls = []
    for _ in range(job["calls"] + 1):  # a warm-up call first
        started = time.thread_time()
        scorer.score(hyps, refs, batch_size=64, progress=False)
        calls.append(time.thread_time() - started)
    return {"median_s": statistics.median(calls[1:]), "calls_s": calls[1:], "scores": scores.tolist()}


def run_metric(args) -> tuple[list[str], dict, dict]:
    if not args.before:
        raise SystemExit("--part metric compares two trees: give --before")
    pairs = harness.wmt_sample(args.data, args.pairs, args.seed)
    runs: dict[str, list[dict]] = {"this tree": [], "before": []}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "job.json"
        path.write_text(json.dumps({"pairs": pairs, "centering": args.centering, "calls": args.calls}))
        for _ in range(args.rounds):
            for name, tree in (("this tree", REPO), ("before", args.before)):
                runs[name].append(spawn("metric", path, [str(tree), str(BENCH)]))
            print(f"metric part: {runs['this tree'][-1]['median_s'] * 1e3:.1f} ms, before "
                  f"{runs['before'][-1]['median_s'] * 1e3:.1f} ms", flush=True)
    ratios = [now["median_s"] / then["median_s"] for now, then in zip(runs["this tree"], runs["before"])]
    rows = [[k + 1, f"{now['median_s'] * 1e3:.1f}", f"{then['median_s'] * 1e3:.1f}", f"{ratio:.2f}"]
            for k, (now, then, ratio) in enumerate(zip(runs["this tree"], runs["before"], ratios))]
    difference = max(abs(a - b) for a, b in zip(runs["this tree"][0]["scores"], runs["before"][0]["scores"]))
    notes = [f"{args.pairs} WMT15-16 pairs, the default scorer"
             + (f" with `{args.centering}` centering" if args.centering else "") + "; metric part of "
             "`Scorer.score` on replayed encoder outputs, each replay a fresh copy; the calling thread's CPU time, "
             f"one torch thread, median of {args.calls} calls per process (after a warm-up call); the two trees in "
             f"turn, a process each, {args.rounds} round(s).",
             f"`before`: the torchmover of `--before` ({args.before_label or args.before}). This tree / before: median "
             f"ratio {statistics.median(ratios):.2f} (range {min(ratios):.2f}-{max(ratios):.2f}), lower in "
             f"{sum(r < 1 for r in ratios)} of {len(ratios)} rounds; the largest difference of a score between the "
             f"two trees: {difference:.1e}."]
    table = harness.table(["round", "this tree: ms", "before: ms", "this tree / before"], rows, "rrrr")
    return notes, table, {"runs": runs, "ratios": ratios, "max_difference": difference}


# --- allocator ------------------------------------------------------------------------------------

KEEP_FREED_MEMORY = {"MALLOC_MMAP_THRESHOLD_": str(4 << 30), "MALLOC_TRIM_THRESHOLD_": str(4 << 30)}


def allocator_worker(job: dict) -> dict:
    """The job's calls in a row (module docs): each call's wall and CPU time and minor page faults."""
    import torch
    from bench_common import minor_faults, peak_rss_mb
    from torchmover import Scorer

    torch.set_num_threads(job["threads"])
    hyps, refs = [p["hyp"] for p in job["pairs"]], [p["ref"] for p in job["pairs"]]
    scorer = Scorer(device="cpu")
    calls = []
    for _ in range(job["calls"] + 1):  # a warm-up call first
        faults, wall, cpu = minor_faults(), time.perf_counter(), time.process_time()
        scores = scorer.score(hyps, refs, batch_size=64, progress=False)
        calls.append({"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu,
                      "minor_faults": minor_faults() - faults})
    return {"calls": calls[1:], "peak_rss_mb": peak_rss_mb(), "scores": scores.tolist(),
            "environment": {k: os.environ[k] for k in KEEP_FREED_MEMORY if k in os.environ}}


def run_allocator(args) -> tuple[list[str], dict, dict]:
    pairs = harness.wmt_sample(args.data, args.pairs, args.seed)
    settings = {"glibc defaults": {}, "freed memory kept": KEEP_FREED_MEMORY}
    runs: dict[str, list[dict]] = {name: [] for name in settings}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "job.json"
        path.write_text(json.dumps({"pairs": pairs, "calls": args.calls, "threads": args.threads}))
        for _ in range(args.rounds):
            for name, env in settings.items():
                runs[name].append(spawn("allocator", path, [str(REPO), str(BENCH)], env=env))
                if runs[name][-1]["environment"] != env:
                    raise RuntimeError(f"the {name!r} process ran with {runs[name][-1]['environment']}, not {env}")
            print("allocator: " + ", ".join(
                f"{name} {statistics.median(c['wall_s'] for c in r[-1]['calls']):.2f} s a call"
                for name, r in runs.items()), flush=True)

    def per_round(name: str, key: str) -> list[float]:  # each round's median call
        return [statistics.median(c[key] for c in run["calls"]) for run in runs[name]]
    ratios = {key: [a / b for a, b in zip(per_round("glibc defaults", key), per_round("freed memory kept", key))]
              for key in ("wall_s", "cpu_s")}
    rows = [[name, " ".join(f"{k}={v}" for k, v in env.items()) or "–",
             f"{statistics.median(per_round(name, 'wall_s')):.2f}", f"{statistics.median(per_round(name, 'cpu_s')):.2f}",
             f"{faults_mib(statistics.median(per_round(name, 'minor_faults'))):.0f}",
             f"{statistics.median(r['peak_rss_mb'] for r in runs[name]):.0f}"] for name, env in settings.items()]
    same = max(abs(a - b) for a, b in zip(runs["glibc defaults"][0]["scores"], runs["freed memory kept"][0]["scores"]))
    for name in settings:
        for r in runs[name]:
            r.pop("scores")
    notes = [f"{args.pairs} WMT15-16 pairs (seeded sample, seed {args.seed}), the default scorer, batch size 64, "
             f"{args.threads} torch thread(s); {args.calls} calls in a row per process after a warm-up call; the two "
             f"settings in turn, a process each, {args.rounds} round(s). Times: the median call of a process, then "
             "the median over the rounds.",
             "glibc defaults / freed memory kept, per round: wall "
             + ", ".join(f"{r:.2f}" for r in ratios["wall_s"]) + f" (median {statistics.median(ratios['wall_s']):.2f}); "
             "CPU " + ", ".join(f"{r:.2f}" for r in ratios["cpu_s"])
             + f" (median {statistics.median(ratios['cpu_s']):.2f}); the largest difference of a score: {same:.1e}."]
    table = harness.table(["allocator", "environment", "call: wall s", "call: CPU s",
                           "new memory touched a call: MiB (minor page faults)", "peak resident set: MiB"],
                          rows, "--rrrr")
    return notes, table, {"runs": runs, "ratios": ratios, "max_difference": same}


# --- flat -----------------------------------------------------------------------------------------

def small_model(directory: Path) -> None:
    """A randomly initialised small BERT (1 layer, 32 wide, seed 0) with the default model's
    tokenizer, saved in ``directory``."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel
    from bench_common import model_dir

    tokenizer = AutoTokenizer.from_pretrained(model_dir())
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=512)
    BertModel(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)


def synthetic_corpus(directory: Path, pairs: int, words: list[str], seed: int = 0) -> tuple[Path, Path]:
    """``hyps.txt`` and ``refs.txt`` of ``pairs`` sentences of 5-50 words each, seeded."""
    rng = random.Random(seed)
    paths = directory / "hyps.txt", directory / "refs.txt"
    for path in paths:
        with open(path, "w", encoding="utf-8") as f:
            for _ in range(pairs):
                f.write(" ".join(rng.choices(words, k=rng.randint(5, 50))) + "\n")
    return paths


def run_flat(args) -> tuple[list[str], dict, dict]:
    from torchmover.evaluation.data import read_tsv_dir

    words = sorted({w for row in read_tsv_dir(args.data) for w in row.ref.lower().split() if w.isalpha()})
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        small_model(tmp / "model")
        for size in args.sizes:
            hyps, refs = synthetic_corpus(tmp, size, words)
            output = tmp / "scores.txt"
            command = [sys.executable, "-m", "torchmover", "score", "--model", str(tmp / "model"), "--layer", "1",
                       "--name", "random-bert-32", "--centering", "batch", "--hyps", str(hyps), "--refs", str(refs),
                       "--output", str(output), "--overwrite", "--no-progress", "--chunk-size", str(args.chunk_size)]
            env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS=str(args.threads), TOKENIZERS_PARALLELISM="false")
            started = time.perf_counter()
            process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
            _, status, usage = os.wait4(process.pid, 0)
            seconds = time.perf_counter() - started
            err = process.stderr.read()
            if status != 0:
                raise SystemExit(f"torchmover score failed on {size} pairs:\n{err}")
            rows = sum(1 for _ in open(output, encoding="utf-8"))
            results[size] = {"seconds": seconds, "peak_rss_mb": usage.ru_maxrss / 1024, "rows": rows,
                             "input_mb": (hyps.stat().st_size + refs.stat().st_size) / 2**20}
            print(size, results[size], flush=True)
    rows = harness.table(["pairs", "input: MiB", "peak resident set: MiB", "wall time: s",
                          "pairs/s (both passes, with the start)"],
                         [[f"{size:,}", f"{r['input_mb']:.0f}", f"{r['peak_rss_mb']:.0f}", f"{r['seconds']:.0f}",
                           f"{size / r['seconds']:.0f}"] for size, r in results.items()])
    notes = [f"`torchmover score` on synthetic corpora, `--centering batch` (a first pass over the corpus for the "
             f"mean, then the scoring pass), `--chunk-size {args.chunk_size}`, output to a file; the encoder is a "
             "randomly initialised 1-layer, 32-wide BERT with the default model's tokenizer (module docs).",
             f"Each run in its own process ({args.threads} thread(s)); peak resident set: `ru_maxrss` of that process "
             "(model, libraries and all)."]
    return notes, rows, results


# --- sharding -------------------------------------------------------------------------------------

def sharding_worker(job: dict) -> dict | None:
    """``score_files`` of the job's files with the default scorer, timed (rank 0 returns the time)."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    from torchmover import Scorer
    from torchmover.evaluation.corpus import Column, score_files
    from torchmover.runtime.distributed import destroy_distributed, init_distributed_from_environment, is_rank0

    scorer = Scorer(device="cpu")  # before joining the group, as the command line does
    launched = init_distributed_from_environment("cpu")
    if launched:
        dist.barrier()
    started = time.perf_counter()
    result = score_files(scorer, Column(job["hyps"]), [Column(job["refs"])], job["output"], format="jsonl",
                         progress=False, overwrite=True)
    if launched:
        dist.barrier()
    seconds = time.perf_counter() - started
    out = {"seconds": seconds, "rows": result.rows, "signature": result.signature} if is_rank0() else None
    if launched:
        destroy_distributed()
    return out


def run_sharding(args) -> tuple[list[str], dict, dict]:
    from torchmover.evaluation.data import read_tsv_dir

    records = read_tsv_dir(args.data)
    runs: dict[int, list[dict]] = {1: [], 2: []}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for name, texts in (("hyps.txt", [r.hyp for r in records]), ("refs.txt", [r.ref for r in records])):
            (tmp / name).write_text("".join(t.replace("\n", " ") + "\n" for t in texts), encoding="utf-8")
        outputs = {}
        for _ in range(args.rounds):
            for processes in (1, 2):
                outputs[processes] = tmp / f"scores{processes}.jsonl"
                job = {"hyps": str(tmp / "hyps.txt"), "refs": str(tmp / "refs.txt"), "output": str(outputs[processes])}
                path = tmp / "job.json"
                path.write_text(json.dumps(job))
                launcher = ([] if processes == 1 else
                            ["-m", "torch.distributed.run", "--nproc-per-node", str(processes), "--master-port", "29577"])
                runs[processes].append(spawn("sharding", path, [str(REPO), str(BENCH)], launcher))
                print(processes, runs[processes][-1], flush=True)
        one, two = ([json.loads(line) for line in open(outputs[k])] for k in (1, 2))
        difference = max(abs(a["score"] - b["score"]) for a, b in zip(one, two))
        in_order = [row["line"] for row in two] == list(range(1, len(one) + 1))
    best = {k: min(r["seconds"] for r in v) for k, v in runs.items()}
    n = len(records)
    rows = harness.table(["processes (1 thread each)", "scoring time: s (best)", "pairs/s", "speed-up", "of the ideal"],
                         [[k, f"{best[k]:.1f}", f"{n / best[k]:.1f}", f"{best[1] / best[k]:.2f}x",
                           f"{100 * best[1] / best[k] / k:.0f}%"] for k in (1, 2)])
    notes = [f"{n} WMT15-16 pairs (every row of the 10 files), `score_files` (the streaming job of `torchmover "
             "score`) with the default scorer (all-MiniLM-L6-v2, layer 4, TWMD recall, no centering), output to a "
             "JSON-lines file; two processes under `torchrun --nproc-per-node 2` (gloo), the shares balanced by "
             "token count.",
             f"Times: the scoring alone, after the model is loaded and the process group joined (between two "
             f"barriers); best of {args.rounds} round(s), one and two processes alternating.",
             f"Two processes against one: largest score difference {difference:.2e}; rows in input order: {in_order}."]
    return notes, rows, {"runs": runs, "max_difference": difference, "in_order": in_order}


# --- plumbing -------------------------------------------------------------------------------------

def spawn(part: str, job: Path, pythonpath: list[str], launcher: list[str] | None = None,
          env: dict[str, str] | None = None) -> dict:
    """Run ``--worker part`` on ``job`` in a fresh process (or under a launcher), with ``env`` added to
    its environment; return its result."""
    result = job.with_name("result.json")
    result.unlink(missing_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(pythonpath), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), **(env or {}))
    command = [sys.executable, *(launcher or []), str(Path(__file__).resolve()), "--worker", part, "--job", str(job),
               "--result", str(result)]
    subprocess.run(command, check=True, env=env)
    return json.loads(result.read_text())


def worker(args) -> None:
    job = json.loads(Path(args.job).read_text())
    out = {"memory": memory_worker, "metric": metric_worker, "sharding": sharding_worker,
           "allocator": allocator_worker}[args.worker](job)
    if out is not None:
        Path(args.result).write_text(json.dumps(out))


def main(argv=None) -> None:
    parser = wmt_parser(__doc__)
    parser.add_argument("--part", choices=("memory", "metric", "flat", "sharding", "allocator"))
    parser.add_argument("--pairs", type=int, default=1000, help="memory, metric, allocator: pairs (default: %(default)s)")
    parser.add_argument("--calls", type=int, default=9,
                        help="metric, allocator: timed calls per process (default: %(default)s)")
    parser.add_argument("--centering", help="metric: the scorer's centering (default: the model's)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2,
                        help="memory, flat, allocator: torch threads (default: %(default)s)")
    parser.add_argument("--before", type=Path, help="memory, metric: a tree of torchmover to compare against")
    parser.add_argument("--before-label", help="memory, metric: what --before is (e.g. a commit)")
    parser.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[10000, 100000],
                        help="flat: corpus sizes in pairs, comma-separated")
    parser.add_argument("--chunk-size", type=int, default=8192, help="flat: --chunk-size of torchmover score")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--job", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)
    if not args.part:
        parser.error("--part is required")
    notes, table, data = {"memory": run_memory, "metric": run_metric, "flat": run_flat,
                          "sharding": run_sharding, "allocator": run_allocator}[args.part](args)
    titles = {"memory": "Peak memory of a scoring call against bert_score (CPU)",
              "metric": "The metric part of a scoring call against an earlier tree (CPU)",
              "flat": "Memory of the streaming job against the corpus size (CPU)",
              "sharding": "One process against two (CPU, gloo)",
              "allocator": "Repeated scoring calls under two settings of glibc's allocator (CPU)"}
    tables = {"main": table, **({"docs_memory": docs_memory_table(data, args.pairs)} if args.part == "memory" else {})}
    harness.publish(args.out, f"bench_corpus_{args.part}", titles[args.part], data, tables,
                    ["\n".join(f"- {n}" for n in notes), {"table": "main"}],
                    data=harness.data_provenance(args.data, args.pairs if args.part in ("memory", "metric", "allocator")
                                                 else None,
                                                 args.seed))


if __name__ == "__main__":
    main()
