"""Peak memory of one call of 1 hypothesis x N references (default model, CPU), in-process: the
resident set's growth during a ``Scorer`` forward (no graph) or a ``MoverReward`` call.

    python bench/bench_many_references.py forward 2000
    PYTHONPATH=/path/to/old/checkout python bench/bench_many_references.py forward 2000   # before/after

One call per process (the peak resident set is the process's). With ``--out DIR`` the figures are also
published there through the harness (``bench_many_references_<call>_<n>``).
"""
import argparse
import random
import resource
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

from torchmover import MoverReward, Scorer  # noqa: E402

WORDS = ("the a cat dog sat on mat house red blue green big small quick brown fox jumps over lazy day night sun "
         "moon tree car road city man woman child eats food water good bad new old").split()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("call", choices=["forward", "reward"])
    parser.add_argument("n", type=int, help="references of the one hypothesis")
    parser.add_argument("--out", type=Path, help="publish the figures here too (default: print only)")
    args = parser.parse_args(argv)
    random.seed(0)
    refs = [" ".join(random.choice(WORDS) for _ in range(random.randint(8, 24))) for _ in range(args.n)]
    scorer = Scorer(device="cpu")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.time()
    with torch.no_grad():
        hyp = ["the cat sat on the mat"]
        out = scorer(hyp, [refs]) if args.call == "forward" else MoverReward(scorer)(hyp, [refs])
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    figures = {"call": args.call, "references": args.n, "score": out.item(), "peak_rss_mib": peak / 1024,
               "growth_mib": (peak - before) / 1024, "seconds": time.time() - started}
    print(f"{args.call} 1x{args.n}: score {figures['score']:.6f}, peak RSS {figures['peak_rss_mib']:.0f} MiB "
          f"(+{figures['growth_mib']:.0f} MiB during the call), {figures['seconds']:.0f} s")
    if args.out is not None:
        harness.publish(args.out, f"bench_many_references_{args.call}_{args.n}",
                        f"Memory of one hypothesis with {args.n:,} references ({args.call})", figures)


if __name__ == "__main__":
    main()
