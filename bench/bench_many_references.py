"""Peak memory of one call of 1 hypothesis x N references (default model, CPU), in-process: the
resident set's growth during a ``Scorer`` forward (no graph) or a ``MoverReward`` call.

    python bench/bench_many_references.py forward 2000
    PYTHONPATH=/path/to/old/checkout python bench/bench_many_references.py forward 2000   # before/after
"""
import argparse
import random
import resource
import time

import torch

from torchmover import MoverReward, Scorer

WORDS = ("the a cat dog sat on mat house red blue green big small quick brown fox jumps over lazy day night sun "
         "moon tree car road city man woman child eats food water good bad new old").split()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("call", choices=["forward", "reward"])
    parser.add_argument("n", type=int, help="references of the one hypothesis")
    args = parser.parse_args()
    random.seed(0)
    refs = [" ".join(random.choice(WORDS) for _ in range(random.randint(8, 24))) for _ in range(args.n)]
    scorer = Scorer(device="cpu")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.time()
    with torch.no_grad():
        hyp = ["the cat sat on the mat"]
        out = scorer(hyp, [refs]) if args.call == "forward" else MoverReward(scorer)(hyp, [refs])
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"{args.call} 1x{args.n}: score {out.item():.6f}, peak RSS {peak / 1024:.0f} MiB "
          f"(+{(peak - before) / 1024:.0f} MiB during the call), {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
