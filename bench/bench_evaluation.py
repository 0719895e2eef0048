"""Evaluation semantics on real data: batch-independent ``Scorer.score``, P/R/F1 cost, rescaling.

On ``--pairs`` WMT15-16 pairs (``harness.wmt_sample``, ``--seed``), the default encoder with ``centering="batch"``:

- batch-size independence: ``score`` at several ``batch_size`` against ``forward`` on the whole list
  (max abs difference; float32 rounding expected);
- cost: the encoding pass alone (every distinct text once, length-sorted batches of 64), ``score``
  (recall) and ``score(return_all=True)`` (P, R, F1), each the median of ``--repeats`` runs, in wall
  seconds and in this process's CPU seconds (less sensitive to other processes on a shared machine);
- rescaling: Pearson r with the human scores before and after ``fit_baseline`` on the references
  (identical up to float rounding: a linear map), and the baselines.

Command (from the repository root)::

    python bench/bench_evaluation.py --data ../shared/data/wmt15-16 --out bench/results/ --pairs 500

Publishes ``bench_evaluation`` (``.json`` and ``.md``) into ``--out``.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

from torchmover import Scorer
from torchmover.evaluation.correlation import correlate
from torchmover.scorer.corpus import embed_distinct
from torchmover.scorer.inputs import distinct_texts

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402


def main(argv=None) -> None:
    parser = harness.wmt_parser(__doc__)
    parser.add_argument("--pairs", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", help="encoder (default: the library's)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = harness.wmt_sample(args.data, args.pairs, args.seed)
    hyps, refs = [r["hyp"] for r in rows], [r["ref"] for r in rows]
    human = np.array([r["score"] for r in rows])
    model = {"model": args.model} if args.model else {}
    scorer = Scorer(**model, centering="batch")

    with torch.no_grad():
        whole = scorer(hyps, refs)
    diffs = {bs: float((scorer.score(hyps, refs, batch_size=bs, progress=False) - whole).abs().max())
             for bs in (8, 32, 128)}

    timings = {
        "encoding pass alone": harness.time_call(
            lambda: embed_distinct(scorer, distinct_texts(hyps, [[r] for r in refs]), 64), args.repeats, warmup=0),
        "score (recall)": harness.time_call(lambda: scorer.score(hyps, refs, progress=False), args.repeats, warmup=0),
        "score(return_all=True)": harness.time_call(
            lambda: scorer.score(hyps, refs, progress=False, return_all=True), args.repeats, warmup=0)}
    encode_cpu = timings["encoding pass alone"].cpu_median

    raw = scorer.score(hyps, refs, progress=False, return_all=True)
    rescaled_scorer = Scorer(**model, centering="batch", rescale=True).fit_baseline(refs, n_pairs=1000, seed=0,
                                                                                    progress=False)
    rescaled = rescaled_scorer.score(hyps, refs, progress=False, return_all=True)
    pearson = lambda x: correlate(x, human, n_boot=0).average.pearson.value  # noqa: E731
    r = {name: (float(b), pearson(x), pearson(y)) for name, b, x, y in zip(raw._fields, rescaled_scorer.baseline, raw, rescaled)}
    tables = {
        "batch_sizes": harness.table(["batch_size", "max abs diff of score vs forward on the whole list"],
                                     [[bs, f"{d:.2e}"] for bs, d in diffs.items()]),
        "cost": harness.table(["step", "wall s", "CPU s", "CPU vs encoding"],
                              [[step, f"{t.median:.2f}", f"{t.cpu_median:.2f}", f"{t.cpu_median / encode_cpu:.2f}x"]
                               for step, t in timings.items()]),
        "rescaling": harness.table(["direction", "baseline b", "Pearson r raw", "Pearson r rescaled"],
                                   [[name, f"{b:.6f}", f"{x:.6f}", f"{y:.6f}"] for name, (b, x, y) in r.items()])}
    harness.publish(args.out, "bench_evaluation",
                    f"Evaluation semantics: {args.pairs} WMT15-16 pairs, {scorer.config.model}, centering=batch",
                    {"max_abs_diff_by_batch_size": diffs, "timings": {k: t.figures() for k, t in timings.items()},
                     "rescaling": r, "signature": rescaled_scorer.signature},
                    tables, [f"{args.threads} torch threads; medians of {args.repeats} runs.", *(
                        {"table": k} for k in tables), f"Signature: `{rescaled_scorer.signature}`"],
                    data=harness.data_provenance(args.data, args.pairs, args.seed))

if __name__ == "__main__":
    main()
