"""Where rewards sit: the distribution of the default reward (MoverReward of the default Scorer) on
WMT15-16 translations against their references, on the same translations against another segment's
reference (an unrelated text), and on the bundled example files.

A reward combined with others (TRL's reward_weights, a format reward, a length penalty) is weighted by
its spread: this publishes mean, standard deviation and percentiles, and the standardisation
``(r - mean) / std`` they imply, as ``reward_scale`` into ``--out``.

    python bench/studies/reward_scale.py --threads 2 --pairs 1000
"""
from __future__ import annotations

import random
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import harness  # noqa: E402
from harness import REPO  # noqa: E402

from torchmover import Scorer  # noqa: E402
from torchmover.reward.rewards import MoverReward  # noqa: E402


def rewards(reward: MoverReward, hyps: list[str], refs: list, batch_size: int, what: str) -> torch.Tensor:
    out = []
    for i in tqdm(range(0, len(hyps), batch_size), desc=what, unit="batch"):
        out.append(reward.score(hyps[i:i + batch_size], refs[i:i + batch_size]))
    return torch.cat(out).double()


def summary(r: torch.Tensor) -> dict:
    q = torch.quantile(r, torch.tensor([0.05, 0.5, 0.95], dtype=r.dtype)).tolist()
    return {"n": len(r), "mean": r.mean().item(), "std": r.std().item(), "p5": q[0], "median": q[1], "p95": q[2],
            "min": r.min().item(), "max": r.max().item()}


def main(argv=None) -> None:
    parser = harness.wmt_parser(__doc__)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--pairs", type=int, default=None, help="a seeded random sample of this many pairs (default: all)")
    parser.add_argument("--model", help="encoder (default: the library's)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    records = harness.wmt_sample(args.data, args.pairs, args.seed)
    hyps, refs = [r["hyp"] for r in records], [r["ref"] for r in records]
    shuffled = refs[:]
    random.Random(args.seed + 1).shuffle(shuffled)
    reward = MoverReward(Scorer(**({"model": args.model} if args.model else {})), cache_size=0)
    if reward.scorer.config.centering == "batch":  # a model without recorded defaults: center on the references
        reward.fit(refs)
    matched = rewards(reward, hyps, refs, args.batch_size, "translation vs its reference")
    unrelated = rewards(reward, hyps, shuffled, args.batch_size, "translation vs another reference")
    example = REPO / "recipes" / "data"
    read = lambda name: (example / name).read_text(encoding="utf-8").splitlines()  # noqa: E731
    bundled = rewards(reward, read("example_hyps.txt"),
                      [list(p) for p in zip(read("example_refs.txt"), read("example_refs2.txt"))],
                      args.batch_size, "bundled examples")
    figures = {"WMT15-16 translations vs their references": summary(matched),
               "same translations vs a shuffled (unrelated) reference": summary(unrelated),
               "bundled examples (recipes/data, 2 references, max)": summary(bundled),
               "signature": reward.signature, "seconds": time.perf_counter() - start}
    keys = ("n", "mean", "std", "p5", "median", "p95", "min", "max")
    table = harness.table(["pairs", *keys], [[name, *(f[k] if k == "n" else f"{f[k]:.3f}" for k in keys)]
                                             for name, f in figures.items() if isinstance(f, dict)])
    harness.publish(args.out, "reward_scale", "Reward scale", figures, {"rewards": table}, [
        f"Reward: `MoverReward(Scorer())`, `{reward.signature}`; {figures['seconds']:.0f} s.", {"table": "rewards"},
        f"Gap between a translation's reward and an unrelated text's: {matched.mean() - unrelated.mean():.3f} "
        f"= {(matched.mean() - unrelated.mean()) / matched.std():.1f} standard deviations of the matched rewards.",
        f"Standardised reward on this data: `(r - {matched.mean():.3f}) / {matched.std():.3f}`."],
        data=harness.data_provenance(args.data, args.pairs, args.seed))

if __name__ == "__main__":
    main()
