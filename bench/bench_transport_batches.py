"""A reward call's transport in batches by length: what cutting its pairs saves, and what a batch costs.

A reward call moves each completion onto its reference and onto itself (its self-term): transport
problems of ``[pairs, L1, L2]`` cells, every one padded to the batch's longest texts. Where the device
has a batch cost (``torchmover.scorer.plan.TRANSPORT_BATCH_COST``, in cells) the call's distinct
completions are cut into batches of similar length (``plan.transport_groups``), each moved on its
own; elsewhere the call is one batch.

Reward calls (``MoverReward``, references cached, centering fitted on them, as ``bench/bench_gpu.py``:
8 completions per prompt, WMT15-16 hypotheses of its seeded sample of ``--pairs``, the default model
at layer 4) of ``--completions`` (64 and 512), with the device's batch cost set to ``None`` (one
batch) and to each of ``--costs`` in turn, round after round: per setting the median wall time of a
call (the device synchronised at its end), the median time of its transport (``Scorer.score_pairs``:
the completions' clouds and every transport problem; timed in a second call of the round, the device
synchronised at the transport's start and end), the batches, the cells of its transport problems
(their padded ``[B, L1, L2]``, and in brackets the cells of the texts' own tokens), and the largest
score difference from one batch.

Command (from the repository root)::

    python bench/bench_transport_batches.py [--device cpu|cuda] [--rounds 5] [--threads N]
        [--completions 64,512] [--costs 1024,4096,16384,65536]

Publishes ``bench_transport_batches_<device type>``.
"""
from __future__ import annotations

import statistics
import time

import harness
from bench_common import (Timed, cuda_missing, default_layer, install_function, model_dir, reward_bench_parser,
                          synchronizer, transport_batch_cost)


class Cells:
    """The transport problems of the calls made while it is installed (``family._cross`` wrapped by
    :func:`~bench_common.install_function`): their count, padded cells ``B · L1 · L2`` and the cells
    of their real rows and columns (read from the masks: a device read, so only in an untimed call)."""

    def __init__(self):
        self.problems, self.padded, self.real = 0, 0, 0

    def wrap(self, cross):
        def counted(term, x, y):
            self.problems += 1
            self.padded += x.mask.shape[0] * x.mask.shape[1] * y.mask.shape[1]
            self.real += int((x.mask.sum(-1) * y.mask.sum(-1)).sum())
            return cross(term, x, y)
        return counted

    def __enter__(self) -> "Cells":
        import torchmover.functional.family as family

        self.restore = install_function(family, "_cross", self.wrap)
        return self

    def __exit__(self, *exc) -> None:
        self.restore()


def reward_calls(pairs, device, rounds: int, completions_list: list[int], costs: list[int | None]) -> list[dict]:
    """A row per (completions, batch cost)."""
    import torch

    from bench_gpu import COMPLETIONS_PER_PROMPT, reward_call

    sync = synchronizer(device)
    rows = []
    for completions in completions_list:
        reward, hyps, refs = reward_call(model_dir(), default_layer(), pairs, device,
                                         completions // COMPLETIONS_PER_PROMPT)
        scorer = reward.scorer
        calls, transport = {c: [] for c in costs}, {c: [] for c in costs}
        scores, shapes = {}, {}
        with torch.no_grad():
            reward(hyps, refs)  # the references' clouds and self-terms cached
            for round_ in range(rounds + 1):  # a warm-up round, then the timed ones
                for cost in costs:
                    with transport_batch_cost(device.type, cost):
                        if not round_:
                            with Cells() as cells:
                                scores[cost] = reward(hyps, refs).float().cpu()
                            shapes[cost] = (cells.problems, cells.padded, cells.real)
                            continue
                        calls[cost].append(harness.time_call(lambda: reward(hyps, refs), 1, 0, sync).runs[0])
                        timed = scorer.score_pairs = Timed(type(scorer).score_pairs.__get__(scorer), sync=sync)
                        try:
                            reward(hyps, refs)
                        finally:
                            del scorer.score_pairs
                        transport[cost].append(timed.seconds)
        for cost in costs:
            problems, padded, real = shapes[cost]
            rows.append({"completions": completions, "cost": cost, "call_s": statistics.median(calls[cost]),
                         "rounds_s": calls[cost], "transport_s": statistics.median(transport[cost]),
                         "problems": problems, "padded_cells": padded, "real_cells": real,
                         "max_diff": float((scores[cost] - scores[None]).abs().max())})
    return rows


def tables(figures: dict) -> dict:
    one_batch = {r["completions"]: r for r in figures["reward"] if r["cost"] is None}
    default = figures["default_cost"]
    return {"reward": harness.table(
        ["completions", "batch cost, cells", "transport problems", "cells (texts' own)", "transport ms",
         "call ms", "speed-up", "max \\|Δ score\\|"],
        [[r["completions"], "None (one batch)" if r["cost"] is None else
          f"{r['cost']:,}" + (" (default)" if r["cost"] == default else ""), r["problems"],
          f"{r['padded_cells']:,} ({r['real_cells']:,})", f"{1000 * r['transport_s']:.1f}",
          f"{1000 * r['call_s']:.1f}", f"{one_batch[r['completions']]['call_s'] / r['call_s']:.2f}x",
          "0" if r["max_diff"] == 0 else f"{r['max_diff']:.1e}"] for r in figures["reward"]], "r-rrrrrr")}


def main(argv=None) -> int:
    parser = reward_bench_parser(__doc__)
    parser.add_argument("--costs", default="1024,4096,16384,65536", help="batch costs in cells, besides None")
    args = parser.parse_args(argv)

    import torch

    import torchmover.scorer.plan as plan

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if cuda_missing("bench_transport_batches", device, "for the same calls on the CPU"):
        return 0
    started = time.perf_counter()
    costs = [None] + [int(c) for c in args.costs.split(",")]
    pairs = harness.wmt_sample(args.data, args.pairs, args.seed)
    figures = {"default_cost": plan.TRANSPORT_BATCH_COST.get(device.type), "rounds": args.rounds,
               "threads": torch.get_num_threads(),
               "reward": reward_calls(pairs, device, args.rounds, [int(c) for c in args.completions.split(",")], costs)}
    body = [f"Default model, layer {default_layer()}, on {harness.device_info().get('gpu', {}).get('name', 'the CPU')}"
            f" ({device.type}, {torch.get_num_threads()} torch threads); {args.rounds} rounds; wall "
            f"{time.perf_counter() - started:.0f} s. The device's default batch cost: "
            f"{figures['default_cost'] if figures['default_cost'] is not None else 'none (one batch)'}.",
            "Reward calls (`MoverReward`, references cached; 8 completions per prompt), the batch cost in turn, "
            "round after round: the median wall time per call and of its transport (`Scorer.score_pairs`), "
            "the transport problems (a cross term and a completions' self-term per batch) and their cells, "
            "padded and the texts' own:", {"table": "reward"}]
    harness.publish(args.out, f"bench_transport_batches_{device.type}",
                    f"The reward call's transport in batches by length ({device.type})",
                    figures, tables(figures), body, data=harness.data_provenance(args.data, len(pairs), args.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
