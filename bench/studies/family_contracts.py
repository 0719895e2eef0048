"""The family's contracts, checked from outside on WMT pairs with the default model: F1 between P and R
for one-word hypotheses under batch centering, empty texts scoring exactly 0 under every special-token
policy (scorer and rewards), converged members independent of their batch-mates, and token weights
that are not masses refused.

The one-word hypotheses ("banana", "yes", ...) against real references are where ``2PR / (P + R)``
left ``[P, R]`` (P and R of opposite signs); the batch-mate check scores ``--alone`` pairs one at a
time and inside one batch of ``--batch`` pairs. Publishes ``family_contracts`` into ``--out``.

    python bench/studies/family_contracts.py --refs 100 --batch 64 --alone 8
"""
from __future__ import annotations

import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import harness  # noqa: E402

import torchmover as tm  # noqa: E402

ONE_WORD = ("banana", "yes", "run", "fast", "the", "and", "blue", "tomorrow")
F1_MEMBERS = ("trwmd", "twmd", "bertscore")
EMPTY_MEMBERS = ("twmd", "bertscore", "sbert")
POLICIES = ("drop", "cls", "keep")
CONVERGED = ("wmd", "moverscore", "sms", "s+wms", "wms")


def f1_outside(refs: list[str]) -> dict:
    """Per member: how far F1 lies outside ``[min(P, R), max(P, R)]`` and its largest value, over
    every one-word hypothesis against every reference (batch centering, as the issue measured)."""
    out = {}
    for method in F1_MEMBERS:
        scorer = tm.Scorer(method=method, centering="batch", direction="f1", device="cpu")
        outside, largest = 0.0, -1.0
        for word in ONE_WORD:
            P, R, F = scorer([word] * len(refs), refs, return_all=True)
            lo, hi = torch.minimum(P, R), torch.maximum(P, R)
            outside = max(outside, ((lo - F).clamp_min(0) + (F - hi).clamp_min(0)).max().item())
            largest = max(largest, F.max().item())
        out[method] = {"f1_outside_p_r": outside, "largest_f1": largest}
    return out


def empty_scores(refs: list[str]) -> dict:
    """Per special-token policy: the largest |score| of an empty and a whitespace hypothesis through
    the scorer and ``MoverReward`` (each member), and a self-critical reward's."""
    out = {}
    for special in POLICIES:
        largest = 0.0
        for method in EMPTY_MEMBERS:
            scorer = tm.Scorer(method=method, special_tokens=special, device="cpu")
            for values in (scorer(["", "   "], refs[:2]), tm.MoverReward(scorer)(["", "   "], refs[:2])):
                largest = max(largest, values.abs().max().item())
        critical = tm.SelfCriticalReward(tm.Scorer(special_tokens=special, device="cpu"))(["", "  "], ["", ""], refs[:2])
        largest = max(largest, critical.sampled.abs().max().item(), critical.greedy.abs().max().item())
        out[special] = largest
    return out


def batch_mates(hyps: list[str], refs: list[str], alone: int) -> dict:
    """Per converged member: the largest |score alone − score in one batch of all the pairs| over the
    first ``alone`` pairs, and how many non-convergence warnings the calls raised."""
    out = {}
    for method in CONVERGED:
        scorer = tm.Scorer(method=method, device="cpu")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            together = scorer.score(hyps, refs, batch_size=len(hyps), progress=False)
            single = torch.stack([scorer.score([h], [r], batch_size=1, progress=False)[0]
                                  for h, r in zip(hyps[:alone], refs[:alone])])
        out[method] = {"difference": (single - together[:alone]).abs().max().item(),
                       "non_convergence_warnings": sum("max_iter" in str(w.message) for w in caught)}
    return out


def refused_weights() -> dict:
    """For a NaN, an infinite and a negative token weight: the error ``tempered_wmd`` raises."""
    out = {}
    x = torch.randn(1, 3, 8)
    for name, bad in (("nan", float("nan")), ("inf", float("inf")), ("negative", -1.0)):
        weights = torch.ones(1, 3)
        weights[0, 1] = bad
        try:
            tm.functional.tempered_wmd(x, x, hyp_weights=weights)
            out[name] = "not refused"
        except ValueError as e:
            out[name] = f"ValueError: {e}"
    return out


def main(argv=None) -> None:
    parser = harness.wmt_parser(__doc__)
    parser.add_argument("--refs", type=int, default=100, help="references for the F1 and emptiness checks (default: %(default)s)")
    parser.add_argument("--batch", type=int, default=64, help="pairs of the one batch (default: %(default)s)")
    parser.add_argument("--alone", type=int, default=8, help="pairs also scored alone (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    records = harness.wmt_sample(args.data, max(args.refs, args.batch), args.seed)
    refs, hyps = [r["ref"] for r in records], [r["hyp"] for r in records]
    figures = {"f1": f1_outside(refs[:args.refs]), "empty": empty_scores(refs),
               "batch_mates": batch_mates(hyps[:args.batch], refs[:args.batch], args.alone),
               "weights": refused_weights()}
    tables = {
        "f1": harness.table(["member", "F1 outside [P, R] at most", "largest F1"],
                            [[m, f"{f['f1_outside_p_r']:.1e}", f"{f['largest_f1']:.3f}"] for m, f in figures["f1"].items()]),
        "empty": harness.table(["special tokens", "largest absolute score of an empty text"],
                               [[p, f"{v:g}"] for p, v in figures["empty"].items()]),
        "batch_mates": harness.table(["member", f"largest difference, alone vs in a batch of {args.batch}",
                                      "non-convergence warnings"],
                                     [[m, f"{f['difference']:.1e}", f["non_convergence_warnings"]]
                                      for m, f in figures["batch_mates"].items()]),
    }
    harness.publish(args.out, "family_contracts", "The family's contracts, checked from outside", figures, tables, [
        f"F1 of {len(ONE_WORD)} one-word hypotheses against {args.refs} references each, batch centering:",
        {"table": "f1"},
        f"Empty and whitespace hypotheses ({', '.join(EMPTY_MEMBERS)}; the scorer, `MoverReward`, a self-critical reward):",
        {"table": "empty"},
        "Converged members, each pair alone against inside one batch:", {"table": "batch_mates"},
        "Token weights that are not masses: " + "; ".join(f"{k}: {v}" for k, v in figures["weights"].items()) + "."],
        data=harness.data_provenance(args.data, max(args.refs, args.batch), args.seed))


if __name__ == "__main__":
    main()
