"""The encoder's forward passes by length group: what a pass costs, and what grouping saves a reward call.

A call's texts are padded to the longest of their pass. ``Encoder.pass_cost`` (``torchmover.text.length_groups``)
cuts them into passes of similar length where that saves more padded tokens than the passes cost.
On the default model, on ``--device``:

(a) **what one pass costs, in tokens**: the encoder's forward (``Encoder.forward``, tokenization
    included) on batches of ``n`` texts of ``L`` tokens each, for every ``n`` of 1, 4, 16, 64 and
    ``L`` of 8, 32, 64: a least-squares line ``time = overhead + per_token · n · L`` through the
    medians, and ``overhead / per_token``: the padded tokens that cost as much as one more pass (the
    value ``pass_cost="auto"`` should have on this device, :data:`torchmover.text.length_groups.AUTO_PASS_COST`).
(b) **reward calls** (``MoverReward``, references cached, centering fitted on them, as
    ``bench/bench_gpu.py``: 8 completions per prompt, WMT15-16 hypotheses of its seeded sample of
    ``--pairs``) of ``--completions`` (64 and 512), with ``pass_cost`` ``None`` (one pass), ``"auto"``,
    0, 32, 512 and 8192, in turn, round after round: median wall time per call (the device synchronised), the passes and the padded
    tokens the encoder ran, and the largest score difference from one pass.
(c) **fine-tuning steps**: ``Scorer.forward`` and the backward pass of a squared loss on micro-batches
    of 16 pairs (``recipes/finetune_wmt.py``'s default; batch centering, train mode), ``--steps`` of
    them, with ``pass_cost`` ``None`` and ``"auto"`` in turn: median wall time per step, passes per step.

Command (from the repository root)::

    python bench/bench_passes.py [--device cpu|cuda] [--rounds 5] [--threads N] [--completions 64,512] [--steps 10]

Publishes ``bench_passes_<device type>``.
"""
from __future__ import annotations

import statistics
import time

import numpy as np

import harness
from bench_common import PassLog, default_layer, model_dir, reward_bench_parser, synchronizer

PASS_COSTS = (None, "auto", 0, 32, 512, 8192)
STEP_PAIRS = 16  # recipes/finetune_wmt.py's default micro-batch
BATCHES = [(n, length) for n in (1, 4, 16, 64) for length in (8, 32, 64)]


def pass_cost(encoder, device, rounds: int) -> dict:
    """(a): per ``(n, L)`` the median time of a forward, and the fitted overhead, time per token and
    their ratio."""
    import torch

    sync = synchronizer(device)
    word = encoder.tokenizer.tokenize("cat")
    assert len(word) == 1, "the probe word must be one token"
    before, after = encoder.special_ends or (1, 1)
    texts = {(n, length): [" ".join(["cat"] * (length - before - after))] * n for n, length in BATCHES}
    times = {key: [] for key in texts}
    saved, encoder.pass_cost = encoder.pass_cost, None  # every batch is one pass (its texts are equal anyway)
    try:
        with torch.no_grad():
            for batch in texts.values():  # warm-up
                encoder(batch)
            for _ in range(rounds):
                for key, batch in texts.items():
                    times[key].append(harness.time_call(lambda: encoder(batch), 1, 0, sync).runs[0])
    finally:
        encoder.pass_cost = saved
    medians = {key: statistics.median(t) for key, t in times.items()}
    tokens = np.array([n * length for n, length in medians], dtype=float)
    seconds = np.array(list(medians.values()))
    per_token, overhead = np.polyfit(tokens, seconds, 1)
    return {"batches": [{"texts": n, "tokens_each": length, "median_s": medians[n, length]} for n, length in BATCHES],
            "overhead_s": float(overhead), "per_token_s": float(per_token),
            "pass_cost_tokens": float(overhead / per_token)}


def reward_calls(pairs, device, rounds: int, completions_list: list[int]) -> list[dict]:
    """(b): a row per (completions, pass_cost)."""
    import torch

    from bench_gpu import COMPLETIONS_PER_PROMPT, reward_call

    sync = synchronizer(device)
    rows = []
    for completions in completions_list:
        reward, hyps, refs = reward_call(model_dir(), default_layer(), pairs, device,
                                         completions // COMPLETIONS_PER_PROMPT)
        encoder = reward.scorer.encoder
        times, scores, shapes = {c: [] for c in PASS_COSTS}, {}, {}
        with torch.no_grad():
            for round_ in range(rounds + 1):  # a warm-up round, then the timed ones
                for cost in PASS_COSTS:
                    encoder.pass_cost = cost
                    run = harness.time_call(lambda: reward(hyps, refs), 1, 0, sync).runs[0]
                    if round_:
                        times[cost].append(run)
                    else:
                        with PassLog(encoder.model) as log:
                            scores[cost] = reward(hyps, refs).float().cpu()
                        shapes[cost] = log.tokens()
        for cost in PASS_COSTS:
            passes, padded, real = shapes[cost]
            rows.append({"completions": completions, "pass_cost": cost, "call_s": statistics.median(times[cost]),
                         "rounds_s": times[cost], "passes": passes, "padded_tokens": padded, "real_tokens": real,
                         "max_diff": float((scores[cost] - scores[None]).abs().max())})
    return rows


def training_steps(pairs, device, rounds: int, steps: int) -> list[dict]:
    """(c): a row per pass_cost."""
    from torchmover import Scorer

    scorer = Scorer(model_dir(), layer=default_layer(), centering="batch", device=device).train()
    batches = [pairs[i:i + STEP_PAIRS] for i in range(0, steps * STEP_PAIRS, STEP_PAIRS)]

    def run():
        for batch in batches:
            scorer.zero_grad()
            scorer([p["hyp"] for p in batch], [p["ref"] for p in batch]).pow(2).mean().backward()

    costs = (None, "auto")
    times, per_step = {c: [] for c in costs}, {}
    for round_ in range(rounds + 1):  # a warm-up round, then the timed ones
        for cost in costs:
            scorer.encoder.pass_cost = cost
            with PassLog(scorer.encoder.model) as log:
                seconds = harness.time_call(run, 1, 0, synchronizer(device)).runs[0]
            per_step[cost] = len(log.masks) / len(batches)
            if round_:
                times[cost].append(seconds / len(batches))
    return [{"pass_cost": c, "step_s": statistics.median(times[c]), "rounds_s": times[c], "passes": per_step[c]}
            for c in costs]


def tables(figures: dict) -> dict:
    cost = figures["pass_cost"]
    one_pass = {r["completions"]: r["call_s"] for r in figures["reward"] if r["pass_cost"] is None}
    step = {r["pass_cost"]: r["step_s"] for r in figures["training"]}
    return {
        "training": harness.table(
            ["pass_cost", "passes a step", "step ms", "speed-up"],
            [[{None: "None (one pass)", "auto": f"auto ({figures['auto_pass_cost']})"}[r["pass_cost"]],
              f"{r['passes']:.1f}", f"{1000 * r['step_s']:.0f}", f"{step[None] / r['step_s']:.2f}x"]
             for r in figures["training"]], "-rrr"),
        "pass_cost": harness.table(
            ["one pass's overhead, ms", "per token, µs", "pass cost, tokens"],
            [[f"{1000 * cost['overhead_s']:.2f}", f"{1e6 * cost['per_token_s']:.2f}",
              f"{cost['pass_cost_tokens']:.0f}"]], "rrr"),
        "batches": harness.table(
            ["texts", "tokens each", "ms (median)"],
            [[b["texts"], b["tokens_each"], f"{1000 * b['median_s']:.2f}"] for b in cost["batches"]], "rrr"),
        "reward": harness.table(
            ["completions", "pass_cost", "passes", "padded tokens (texts' own)", "call ms", "speed-up",
             "max \\|Δ score\\|"],
            [[r["completions"], {None: "None (one pass)", "auto": f"auto ({figures['auto_pass_cost']})"}.get(
                r["pass_cost"], r["pass_cost"]), r["passes"], f"{r['padded_tokens']:,} ({r['real_tokens']:,})",
              f"{1000 * r['call_s']:.1f}", f"{one_pass[r['completions']] / r['call_s']:.2f}x",
              "0" if r["max_diff"] == 0 else f"{r['max_diff']:.1e}"] for r in figures["reward"]], "r-rrrrr"),
    }


def main(argv=None) -> int:
    parser = reward_bench_parser(__doc__)
    parser.add_argument("--steps", type=int, default=10, help="fine-tuning steps per round (default: %(default)s)")
    args = parser.parse_args(argv)

    import torch

    from torchmover import Encoder
    from torchmover.text.length_groups import resolve_pass_cost

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"bench_passes: --device {args.device}, but this machine has no CUDA device "
                         f"(torch {torch.__version__}): nothing measured")
    started = time.perf_counter()
    completions = [int(c) for c in args.completions.split(",")]
    pairs = harness.wmt_sample(args.data, args.pairs, args.seed)
    encoder = Encoder.from_pretrained(model_dir(), layer=default_layer()).to(device)
    figures = {"pass_cost": pass_cost(encoder, device, args.rounds), "reward": reward_calls(pairs, device, args.rounds, completions),
               "training": training_steps(pairs, device, args.rounds, args.steps),
               "auto_pass_cost": resolve_pass_cost("auto", device.type), "rounds": args.rounds}
    body = [f"Default model, layer {default_layer()}, on {harness.device_info().get('gpu', {}).get('name', 'the CPU')}"
            f" ({device.type}); {args.rounds} rounds; wall {time.perf_counter() - started:.0f} s.",
            "(a) What a forward pass costs: `Encoder.forward` on n equal texts of L tokens each, the median of "
            "the rounds; a least-squares line `time = overhead + per_token · n · L` through them, and its "
            "overhead in tokens (`pass_cost`'s unit):", {"table": "pass_cost"}, {"table": "batches"},
            "(b) Reward calls (`MoverReward`, references cached; 8 completions per prompt), median wall time "
            "per call, the device synchronised; `pass_cost` in turn, round after round:", {"table": "reward"},
            f"(c) Fine-tuning steps: `Scorer.forward` and backward of a squared loss on {STEP_PAIRS} pairs a step "
            f"(batch centering, train mode), {args.steps} steps a round, median per step:", {"table": "training"}]
    harness.publish(args.out, f"bench_passes_{device.type}", f"Forward passes by length group ({device.type})",
                    figures, tables(figures), body, data=harness.data_provenance(args.data, len(pairs), args.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
