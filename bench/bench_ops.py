"""Aten ops that torchmover issues per call, and how many of them would synchronise host and device.

Every op is recorded by ``OpTrace`` (``tests/optrace.py``, a ``TorchDispatchMode``; ops issued by
the tokenizer and inside the encoder are not counted: they are not torchmover's). On CUDA each op is
at least one kernel launch, so the count is the launch overhead of a call; "syncs" are the ops that
make the host wait for the GPU (scalar reads, data-dependent shapes); "late host data" the tensors
built from Python data after the encoder started (on a GPU, a blocking host-to-device copy that waits
for the whole encoder).

Calls, all with the default model (``sentence-transformers/all-MiniLM-L6-v2``, layer 4), TWMD, one
iteration, on WMT15-16 pairs:

- ``forward``: ``Scorer(...)(hyps, refs)`` on 16 pairs, for the default token policy and for IDF,
  English stopwords, ``punctuation="drop"``, ``subwords="first"`` and ``subwords="mean"``;
- ``reward``: ``MoverReward(Scorer()).fit(refs)`` then a call of 64 completions against 4, 16 or 64
  distinct references, all cached (a first call keeps the references' clouds, a second one may compact
  the cache, where the clouds were stored with their batch's padding; the third one is counted), its
  transport in one batch, as on a GPU (on the CPU a reward call moves its pairs in batches by length,
  ``torchmover.scorer.plan.TRANSPORT_BATCH_COST``: more ops, each on fewer padded cells);
- ``score``: ``Scorer(...).score(hyps, refs)`` on every drawn pair, without centering (the default) and
  with ``batch`` centering.

Command (from the repository root)::

    python bench/bench_ops.py --data ../shared/data/wmt15-16

Publishes ``bench_ops`` (``.json`` and ``.md``) into ``--out``.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
from bench_common import transport_batch_cost  # noqa: E402

sys.path.insert(0, str(harness.REPO / "tests"))  # the op recorder is a test tool


def trace(call, scorer):
    from optrace import OpTrace

    with OpTrace() as t:
        handle = scorer.encoder.model.register_forward_pre_hook(lambda *_: t.mark())
        try:
            call()
        finally:
            handle.remove()
    return t


def main(argv=None) -> None:
    parser = harness.wmt_parser(__doc__)
    parser.add_argument("--model", help="encoder (default: the library's)")
    parser.add_argument("--pairs", type=int, default=200, help="WMT pairs drawn (default: %(default)s)")
    args = parser.parse_args(argv)
    from torchmover import Scorer
    from torchmover.reward.rewards import MoverReward

    torch.set_num_threads(1)
    rows = harness.wmt_sample(args.data, args.pairs, args.seed)
    hyps, refs = [r["hyp"] for r in rows], [r["ref"] for r in rows]
    model = {"model": args.model} if args.model else {}
    table, figures = [], {}

    def report(name, t):
        figures[name] = {"ops": len(t.kernel_ops), "syncs": [str(op) for op in t.syncs],
                         "late_host_data": [str(op) for op in t.late_host_data]}
        table.append([name, len(t.kernel_ops), len(t.syncs), len(t.late_host_data)])
        table.extend([f" ↳ {op}", "", "", ""] for op in t.syncs + t.late_host_data)

    policies = {"default": {}, "idf": {"idf": True}, "stopwords=english": {"stopwords": "english"},
                "punctuation=drop": {"punctuation": "drop"}, "subwords=first": {"subwords": "first"},
                "subwords=mean": {"subwords": "mean"}}
    for name, options in policies.items():
        scorer = Scorer(**model, **options)
        if options.get("idf"):
            scorer.fit_idf(refs)
        with torch.no_grad():
            scorer(hyps[:16], refs[:16])  # warm-up
            report(f"forward, 16 pairs, {name}", trace(lambda: scorer(hyps[:16], refs[:16]), scorer))
    for name, options in {"default": {}, "batch centering": {"centering": "batch"}}.items():
        scorer = Scorer(**model, **options)
        scorer.score(hyps[:16], refs[:16], progress=False)  # warm-up
        report(f"score, {len(hyps)} pairs, {name}", trace(lambda: scorer.score(hyps, refs, progress=False), scorer))
    scorer = Scorer(**model)
    distinct = list(dict.fromkeys(refs))
    with transport_batch_cost("cpu", None):  # one transport batch, as on a GPU
        for n_refs in (n for n in (4, 16, 64) if n <= len(distinct)):
            reward = MoverReward(scorer).fit(distinct[:n_refs])
            completions = hyps[:64]
            targets = [distinct[i % n_refs] for i in range(len(completions))]
            reward(completions, targets)
            reward(completions, targets)
            report(f"reward, 64 completions, {n_refs} cached refs",
                   trace(lambda: reward(completions, targets), scorer))
    harness.publish(args.out, "bench_ops", "Aten ops per call, and which would synchronise", figures,
                    {"ops": harness.table(["call", "torchmover ops", "syncs", "late host data"], table, "-rrr")},
                    data=harness.data_provenance(args.data, args.pairs, args.seed))

if __name__ == "__main__":
    main()
