"""Degenerate outputs against a reward: does a policy gain by drifting to them? (``torchmover stress``)

A policy trained on a reward drifts to whatever the reward overrates. For each (hypothesis, reference)
pair this scores the hypothesis and seven variants a policy can produce, then reports per variant the
mean change of the score and how often the variant **wins** (scores strictly more than the original,
by more than ``1e-6``):

===================  ===========================================================================
variant              the hypothesis ...
===================  ===========================================================================
``pad-own``          followed by half as many of its own words again (drawn with replacement)
``pad-unrelated``    followed by as many words of another pair's hypothesis
``twice``            written twice
``shuffled``         with its words in a random order
``truncated``        cut to its first half of words
``doubled``          with each word written twice
``empty``            replaced by the empty text
===================  ===========================================================================

A variant that wins in more than :data:`RARELY` of the pairs is **flagged**, with the scorer setting
that stops it where one exists (:func:`fix_for`). Words are whitespace-separated; draws are seeded per
pair, so a report is reproducible.

Example:
    >>> report = stress_test(lambda hyps, refs: [float(len(h)) for h in hyps],  # longer is better
    ...                      ["a cat sat", "the dog ran"], ["a cat sat", "a dog ran"])
    >>> [(row.variant, row.win_rate) for row in report.rows][:3]
    [('pad-own', 1.0), ('pad-unrelated', 1.0), ('twice', 1.0)]
"""
from __future__ import annotations

import dataclasses
import json
import random
from typing import Callable, Sequence

from ..functional.members import get_member

__all__ = ["VARIANTS", "RARELY", "StressRow", "StressReport", "make_variant", "stress_test", "fix_for"]

VARIANTS = ("pad-own", "pad-unrelated", "twice", "shuffled", "truncated", "doubled", "empty")
# A variant that wins in more than this share of the pairs is flagged.
RARELY = 0.05
WIN_MARGIN = 1e-6


def make_variant(variant: str, hyp: str, other: str, rng: random.Random) -> str:
    """The ``variant`` of hypothesis ``hyp`` (``other``: an unrelated hypothesis, for ``pad-unrelated``)."""
    words = hyp.split()
    n = len(words)
    if variant == "pad-own":
        return " ".join(words + [rng.choice(words) for _ in range(max(1, n // 2))]) if words else hyp
    if variant == "pad-unrelated":
        extra = other.split()[:max(1, n)]
        return " ".join(words + extra)
    if variant == "twice":
        return f"{hyp} {hyp}" if words else hyp
    if variant == "shuffled":
        return " ".join(rng.sample(words, n))
    if variant == "truncated":
        return " ".join(words[:max(1, n // 2)])
    if variant == "doubled":
        return " ".join(w for word in words for w in (word, word))
    if variant == "empty":
        return ""
    raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")


@dataclasses.dataclass(frozen=True)
class StressRow:
    """One variant: ``mean_change`` (mean of variant − original score), ``win_rate`` (share of the pairs
    where the variant scores more), ``flagged`` (``win_rate > RARELY``) and ``fix`` (a setting that stops
    it, or ``None`` where no scorer option does; empty where not flagged)."""

    variant: str
    mean_change: float
    win_rate: float
    flagged: bool
    fix: str | None


@dataclasses.dataclass(frozen=True)
class StressReport:
    """Every variant's row, the number of pairs, the mean original score, the scorer's signature (if known)."""

    rows: list[StressRow]
    n_pairs: int
    mean_score: float
    signature: str | None = None

    def to_table(self) -> str:
        """A Markdown table, one row per variant, then the flags with their fixes."""
        lines = [f"pairs: {self.n_pairs}, mean score of the hypotheses: {self.mean_score:.4f}", "",
                 "| variant | mean change | wins | flagged |", "|---|---:|---:|---|"]
        lines += [f"| {r.variant} | {r.mean_change:+.4f} | {r.win_rate:.1%} | {'yes' if r.flagged else ''} |"
                  for r in self.rows]
        flags = [r for r in self.rows if r.flagged]
        if flags:
            lines.append("")
        for r in flags:
            lines.append(f"{r.variant}: wins in {r.win_rate:.0%} of the pairs; "
                         + (f"fix: {r.fix}" if r.fix else "no scorer option stops it: penalise it in the reward "
                                                         "(e.g. a length or repetition penalty)"))
        if self.signature:
            lines += ["", f"signature: {self.signature}"]
        return "\n".join(lines)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2)


def fix_for(variant: str, config=None) -> str | None:
    """The setting that stops ``variant`` from winning under a :class:`~torchmover.ScorerConfig`
    ``config`` (``None``: a scorer of unknown settings), or ``None`` where no scorer option does.

    Longer outputs (padding) gain under recall, which lets every reference token find a counterpart
    among more hypothesis tokens; precision charges the extra tokens, and ``f1`` weighs both. A
    truncated output gains under precision alone; recall charges what is missing. A member without
    directions (sbert, cka, wmd, moverscore, the sentence movers) takes no ``direction``: nothing to
    suggest."""
    if config is not None and not get_member(config.method).directed:
        return None
    direction = getattr(config, "direction", None)
    if variant in ("pad-own", "pad-unrelated") and direction in (None, "recall"):
        return "direction='f1' (--direction f1): precision charges the added words"
    if variant == "truncated" and direction in (None, "precision"):
        return "direction='f1' (--direction f1): recall charges the missing words"
    return None


def _score_with(score) -> Callable[[list[str], list[str]], list[float]]:
    """A :class:`~torchmover.Scorer` (scored without a graph, :meth:`Scorer.score
    <torchmover.Scorer.score>`) or any ``f(hyps, refs) -> scores`` callable, as a list-of-floats function."""
    if hasattr(score, "score") and hasattr(score, "config"):
        return lambda hyps, refs: score.score(hyps, refs, progress=False).tolist()
    return lambda hyps, refs: [float(s) for s in score(hyps, refs)]


def stress_test(score, hyps: Sequence[str], refs: Sequence[str], *, variants: Sequence[str] = VARIANTS,
                seed: int = 0) -> StressReport:
    """Score ``hyps`` against ``refs`` (one reference each) and every variant of each hypothesis, with
    ``score`` (a :class:`~torchmover.Scorer`, a reward such as :class:`~torchmover.MoverReward`, its
    shaping included, or any ``f(hyps, refs) -> scores``, e.g. ``bert_score``'s F1); see the module docs. All texts go to ``score`` in one call, so a
    batch-centering scorer centers originals and variants on one mean."""
    hyps, refs = list(hyps), list(refs)
    if len(hyps) != len(refs) or not hyps:
        raise ValueError(f"stress_test needs as many references as hypotheses (at least one pair), got "
                         f"{len(hyps)} hypotheses and {len(refs)} references")
    for variant in variants:
        make_variant(variant, "", "", random.Random(0))  # unknown names fail before any scoring
    n = len(hyps)
    texts = list(hyps)
    for k, variant in enumerate(variants):
        rngs = [random.Random(f"{seed}:{variant}:{i}") for i in range(n)]
        texts += [make_variant(variant, hyps[i], hyps[(i + 1 + k) % n] if n > 1 else "", rngs[i]) for i in range(n)]
    scores = _score_with(score)(texts, refs * (1 + len(variants)))
    original = scores[:n]
    config = getattr(score, "config", None) or getattr(getattr(score, "scorer", None), "config", None)  # a reward's
    rows = []
    for k, variant in enumerate(variants):
        changed = scores[n * (k + 1): n * (k + 2)]
        change = sum(v - o for v, o in zip(changed, original)) / n
        wins = sum(v > o + WIN_MARGIN for v, o in zip(changed, original)) / n
        flagged = wins > RARELY
        rows.append(StressRow(variant, change, wins, flagged, fix_for(variant, config) if flagged else ""))
    return StressReport(rows, n, sum(original) / n, getattr(score, "signature", None))
