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
  the cache, where the clouds were stored with their batch's padding; the third one is counted).

Command (from the repository root)::

    python bench/bench_ops.py --data ../shared/data/wmt15-16
"""
from __future__ import annotations

import sys

import torch

from bench_common import REPO, wmt_parser

sys.path.insert(0, str(REPO / "tests"))  # the op recorder is a test tool


def trace(call, scorer) -> "OpTrace":
    from optrace import OpTrace

    with OpTrace() as t:
        handle = scorer.encoder.model.register_forward_pre_hook(lambda *_: t.mark())
        try:
            call()
        finally:
            handle.remove()
    return t


def main() -> None:
    args = wmt_parser(__doc__).parse_args()
    from torchmover import Scorer
    from torchmover.evaluation.data import read_tsv_dir
    from torchmover.reward.rewards import MoverReward

    torch.set_num_threads(1)
    rows = read_tsv_dir(args.data)[:200]
    hyps, refs = [r.hyp for r in rows], [r.ref for r in rows]
    print("| call | torchmover ops | syncs | late host data |\n|---|---:|---:|---:|")

    def report(name, t):
        print(f"| {name} | {len(t.kernel_ops)} | {len(t.syncs)} | {len(t.late_host_data)} |")
        for op in t.syncs + t.late_host_data:
            print(f"|  ↳ {op} | | | |")

    policies = {"default": {}, "idf": {"idf": True}, "stopwords=english": {"stopwords": "english"},
                "punctuation=drop": {"punctuation": "drop"}, "subwords=first": {"subwords": "first"},
                "subwords=mean": {"subwords": "mean"}}
    for name, options in policies.items():
        scorer = Scorer(**options)
        if options.get("idf"):
            scorer.fit_idf(refs)
        with torch.no_grad():
            scorer(hyps[:16], refs[:16])  # warm-up
            report(f"forward, 16 pairs, {name}", trace(lambda: scorer(hyps[:16], refs[:16]), scorer))
    scorer = Scorer()
    distinct = list(dict.fromkeys(refs))
    for n_refs in (4, 16, 64):
        reward = MoverReward(scorer).fit(distinct[:n_refs])
        completions, targets = hyps[:64], [distinct[i % n_refs] for i in range(64)]
        reward(completions, targets)
        reward(completions, targets)
        report(f"reward, 64 completions, {n_refs} cached refs", trace(lambda: reward(completions, targets), scorer))


if __name__ == "__main__":
    main()
