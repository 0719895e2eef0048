"""Where rewards sit: the distribution of the default reward (MoverReward of the default Scorer) on
WMT15-16 translations against their references, on the same translations against another segment's
reference (an unrelated text), and on the bundled example files.

A reward combined with others (TRL's reward_weights, a format reward, a length penalty) is weighted by
its spread: this prints mean, standard deviation and percentiles, and the standardisation
``(r - mean) / std`` they imply, to bench/results/reward_scale.md.
"""
from __future__ import annotations

import random
import sys
import time

import torch
from tqdm import tqdm

from bench_common import REPO, wmt_parser

sys.path.insert(0, str(REPO))
from torchmover import Scorer  # noqa: E402
from torchmover.evaluation.data import read_tsv_dir  # noqa: E402
from torchmover.reward.rewards import MoverReward  # noqa: E402


def rewards(reward: MoverReward, hyps: list[str], refs: list, batch_size: int, what: str) -> torch.Tensor:
    out = []
    for i in tqdm(range(0, len(hyps), batch_size), desc=what, unit="batch"):
        out.append(reward.score(hyps[i:i + batch_size], refs[i:i + batch_size]))
    return torch.cat(out).double()


def row(name: str, r: torch.Tensor) -> str:
    q = torch.quantile(r, torch.tensor([0.05, 0.5, 0.95], dtype=r.dtype)).tolist()
    return (f"| {name} | {len(r)} | {r.mean():.3f} | {r.std():.3f} | {q[0]:.3f} | {q[1]:.3f} | {q[2]:.3f} "
            f"| {r.min():.3f} | {r.max():.3f} |")


def main() -> None:
    parser = wmt_parser(__doc__)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--pairs", type=int, default=None, help="a seeded random sample of this many pairs (default: all)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    records = read_tsv_dir(args.data)
    if args.pairs is not None:
        records = random.Random(0).sample(records, min(args.pairs, len(records)))
    hyps, refs = [r.hyp for r in records], [r.ref for r in records]
    shuffled = refs[:]
    random.Random(1).shuffle(shuffled)
    reward = MoverReward(Scorer(), cache_size=0)
    matched = rewards(reward, hyps, refs, args.batch_size, "translation vs its reference")
    unrelated = rewards(reward, hyps, shuffled, args.batch_size, "translation vs another reference")
    example = REPO / "recipes" / "data"
    read = lambda name: (example / name).read_text(encoding="utf-8").splitlines()  # noqa: E731
    bundled = rewards(reward, read("example_hyps.txt"),
                      [list(p) for p in zip(read("example_refs.txt"), read("example_refs2.txt"))],
                      args.batch_size, "bundled examples")
    lines = [
        "# Reward scale", "",
        f"`python bench/reward_scale.py --data {args.data} --threads {args.threads}"
        f"{'' if args.pairs is None else f' --pairs {args.pairs}'}` "
        f"({time.perf_counter() - start:.0f} s). Reward: `MoverReward(Scorer())`, {reward.signature}", "",
        "| pairs | n | mean | std | p5 | median | p95 | min | max |", "|---|---|---|---|---|---|---|---|---|",
        row("WMT15-16 translations vs their references", matched),
        row("same translations vs a shuffled (unrelated) reference", unrelated),
        row("bundled examples (recipes/data, 2 references, max)", bundled), "",
        f"Gap between a translation's reward and an unrelated text's: {matched.mean() - unrelated.mean():.3f} "
        f"= {(matched.mean() - unrelated.mean()) / matched.std():.1f} standard deviations of the matched rewards.",
        f"Standardised reward on this data: `(r - {matched.mean():.3f}) / {matched.std():.3f}`.",
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "reward_scale.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
