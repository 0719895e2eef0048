"""Evaluation semantics on real data: batch-independent ``Scorer.score``, P/R/F1 cost, rescaling.

On ``--pairs`` WMT15-16 pairs (shuffled with seed 0), the default encoder with ``centering="batch"``:

- batch-size independence: ``score`` at several ``batch_size`` against ``forward`` on the whole list
  (max abs difference; float32 rounding expected);
- cost: the encoding pass alone (every distinct text once, length-sorted batches of 64), ``score``
  (recall) and ``score(return_all=True)`` (P, R, F1), each the median of ``--repeats`` runs, in wall
  seconds and in this process's CPU seconds (less sensitive to other processes on a shared machine);
- rescaling: Pearson r with the human scores before and after ``fit_baseline`` on the references
  (identical up to float rounding: a linear map), and the baselines.

Command (from the repository root)::

    python bench/bench_evaluation.py --data ../shared/data/wmt15-16 --out bench/results/ --pairs 500

Prints the table and writes ``bench_evaluation.md`` into ``--out``.
"""
from __future__ import annotations

import os
import random
import statistics
import time

import torch

from torchmover import Scorer
from torchmover.evaluation.data import read_tsv_dir
from torchmover.scorer.corpus import embed_distinct
from torchmover.scorer.inputs import distinct_texts

from bench_common import pearson, wmt_parser


def median_seconds(fn, repeats: int) -> tuple[float, float]:
    """Median wall and process-CPU seconds of ``fn()``."""
    wall, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return statistics.median(wall), statistics.median(cpu)




def main() -> None:
    parser = wmt_parser(__doc__)
    parser.add_argument("--pairs", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = read_tsv_dir(args.data)
    random.Random(0).shuffle(rows)
    rows = rows[:args.pairs]
    hyps, refs = [r.hyp for r in rows], [r.ref for r in rows]
    human = torch.tensor([r.score for r in rows])
    scorer = Scorer(centering="batch")

    with torch.no_grad():
        whole = scorer(hyps, refs)
    diffs = {bs: float((scorer.score(hyps, refs, batch_size=bs, progress=False) - whole).abs().max())
             for bs in (8, 32, 128)}

    encode = median_seconds(lambda: embed_distinct(scorer, distinct_texts(hyps, [[r] for r in refs]), 64), args.repeats)
    recall = median_seconds(lambda: scorer.score(hyps, refs, progress=False), args.repeats)
    prf = median_seconds(lambda: scorer.score(hyps, refs, progress=False, return_all=True), args.repeats)

    raw = scorer.score(hyps, refs, progress=False, return_all=True)
    rescaled_scorer = Scorer(centering="batch", rescale=True).fit_baseline(refs, n_pairs=1000, seed=0, progress=False)
    rescaled = rescaled_scorer.score(hyps, refs, progress=False, return_all=True)

    lines = [
        f"# bench_evaluation: {args.pairs} WMT15-16 pairs, {scorer.config.model}, centering=batch, "
        f"{args.threads} threads, median of {args.repeats}",
        "",
        f"load average (1 min) at the end: {os.getloadavg()[0]:.2f}",
        "",
        "| batch_size | max abs diff of score vs forward on the whole list |",
        "|---|---|",
        *[f"| {bs} | {d:.2e} |" for bs, d in diffs.items()],
        "",
        "| step | wall s | CPU s | CPU vs encoding |",
        "|---|---|---|---|",
        *[f"| {step} | {wall:.2f} | {cpu:.2f} | {cpu / encode[1]:.2f}x |" for step, (wall, cpu) in
          (("encoding pass alone", encode), ("score (recall)", recall), ("score(return_all=True)", prf))],
        "",
        "| direction | baseline b | Pearson r raw | Pearson r rescaled |",
        "|---|---|---|---|",
        *[f"| {name} | {b:.6f} | {pearson(x, human):.6f} | {pearson(y, human):.6f} |"
          for name, b, x, y in zip(raw._fields, rescaled_scorer.baseline, raw, rescaled)],
        "",
        f"signature: {rescaled_scorer.signature}",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_evaluation.md").write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
