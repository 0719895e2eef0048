"""What was matched: the token × token plan of one (hypothesis, reference) pair, and each token's share
of the score (``torchmover show``).

For a pair scored by a token-level member, the cross term is a sum over token pairs,
``C = Σ_ij K_ij`` with ``K_ij = π_ij S_ij`` for the transport members (``π`` the plan, ``S`` the cosine
similarities of the centered token vectors), so each token's **contribution** to the score is its row
(reference token ``i``) or column (hypothesis token ``j``) sum of ``K / sqrt(C(ref, ref) C(hyp, hyp))``:
the reference tokens' contributions add up to the score (the hypothesis tokens' too, for one direction).

- ``twmd``, ``wmd``: the Sinkhorn plan (:func:`~torchmover.functional.tempered_wmd` /
  :func:`~torchmover.functional.wmd` with ``return_plan=True``); drawn: the plan.
- ``moverscore``: the exact plan, ``K = π ∘ (1 − ‖x_i − y_j‖)`` (it sums to the score, ``1 − Σ π d``);
  drawn: the plan.
- ``trwmd``: recall ``π_ij = a_i softmax_j(S_ij / T)``, precision ``b_j softmax_i(S_ij / T)``; drawn: the
  plan.
- ``bertscore``: greedy, recall ``π_ij = a_i 1[j = argmax S_i·]``, precision ``b_j 1[i = argmax S_·j]``;
  drawn: the similarities, each reference token's match circled.
- ``sbert``: ``π = a bᵀ``; drawn: the plan. ``cka``: ``π = a bᵀ``, ``K = π ∘ S²``; drawn: the similarities.

With ``direction="f1"`` the recall plan is drawn, the reference tokens' margin holds their recall
contributions (summing to R) and the hypothesis tokens' margin their precision contributions
(summing to P); the score is ``2PR / (P + R)``.

Example:
    >>> import torchmover as tm
    >>> match = token_match(tm.Scorer(device="cpu"), "the cat sat on the mat", "a cat sat on a mat")
    >>> match.hyp_tokens[:3], match.ref_tokens[:3]
    (['the', 'cat', 'sat'], ['a', 'cat', 'sat'])
    >>> round(match.score, 4), round(sum(match.ref_contributions), 4)  # the rows add up to the score
    (0.9117, 0.9117)
"""
from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path
from typing import cast

import torch
from torch import Tensor

from .. import functional as F
from ..functional.family import FamilyScore
from ..functional.members import get_member
from ..runtime.checkpoint import atomic_savefig
from ..text.weights import keep_mask

__all__ = ["TokenMatch", "token_match", "plan_terms", "draw_token_match", "show"]

# The members whose drawing is the similarity matrix rather than a plan.
SIMILARITY_DRAWN = ("bertscore", "cka")


@dataclasses.dataclass(frozen=True)
class TokenMatch:
    """One pair's token match (:func:`token_match`).

    Attributes:
        hyp_tokens, ref_tokens: the tokens that carry mass (those the scorer moves), as the tokenizer
            writes them (word-piece markers such as ``##`` kept, ``Ġ`` / ``▁`` removed).
        matrix: ``[len(ref_tokens), len(hyp_tokens)]`` what is drawn: the plan ``π`` (a reference
            token's row sums to its mass under recall), or the similarities ``S`` (``matrix_kind``).
        matrix_kind: ``"plan"`` or ``"similarity"``.
        ref_contributions, hyp_contributions: each token's share of the score (see the module docs).
        score: the scorer's score of the pair (its direction; rescaled if the scorer rescales);
            ``raw_score``: the un-rescaled score the contributions add up to.
        method, direction, signature: the scorer's.
    """

    hyp_tokens: list[str]
    ref_tokens: list[str]
    matrix: list[list[float]]
    matrix_kind: str
    ref_contributions: list[float]
    hyp_contributions: list[float]
    score: float
    raw_score: float
    method: str
    direction: str
    signature: str


def plan_terms(method: str, direction: str, x: Tensor, y: Tensor, a: Tensor, b: Tensor, *,
               temperature: float | None = None, n_iter: int | None = 1) -> tuple[Tensor, Tensor]:
    """The plan ``π`` ``[L1, L2]`` of reference tokens ``x`` ``[L1, D]`` (masses ``a`` ``[L1]``) moved
    onto hypothesis tokens ``y`` ``[L2, D]`` (masses ``b``), unit vectors, and the terms ``K`` with
    ``C = Σ K`` (the module's table). ``direction`` is ``recall`` or ``precision``.

    This is the one place that asks the transport solvers for a plan, through the public functional
    API (``return_plan=True``)."""
    s = x @ y.T  # [L1, L2] cosine similarities
    if method in ("twmd", "wmd", "moverscore"):
        solve = {"twmd": lambda: F.tempered_wmd(y[None], x[None], hyp_weights=b[None], ref_weights=a[None],
                                                temperature=cast(float, temperature),  # twmd: given one
                                                n_iter=n_iter, direction=direction,
                                                normalize=False, return_plan=True),
                 "wmd": lambda: F.wmd(y[None], x[None], hyp_weights=b[None], ref_weights=a[None], normalize=False,
                                      return_plan=True),
                 "moverscore": lambda: F.moverscore(y[None], x[None], hyp_weights=b[None], ref_weights=a[None],
                                                    return_plan=True)}[method]
        plan = cast(FamilyScore, solve()).plan.plan[0]  # return_plan=True: a FamilyScore
        gain = 1 - torch.cdist(x, y) if method == "moverscore" else s
        return plan, plan * gain
    if method == "trwmd":  # a tuned member: given its temperature
        t = cast(float, temperature)
        plan = (a[:, None] * torch.softmax(s / t, dim=1) if direction == "recall"
                else b[None, :] * torch.softmax(s / t, dim=0))
    elif method == "bertscore":
        plan = (a[:, None] * torch.nn.functional.one_hot(s.argmax(1), s.shape[1]) if direction == "recall"
                else b[None, :] * torch.nn.functional.one_hot(s.argmax(0), s.shape[0]).T)
    elif method in ("sbert", "cka"):
        plan = a[:, None] * b[None, :]
        return plan, plan * (s * s if method == "cka" else s)
    else:
        raise ValueError(f"method={method!r} has no token x token plan to show (the sentence movers move sentences)")
    return plan, plan * s


def token_match(scorer, hyp: str, ref: str) -> TokenMatch:
    """The token match of one pair under ``scorer``'s own choices (token policy, centering, member,
    direction): its plan or similarities and each token's contribution (module docs). Needs a
    token-level member with unigram units; a text without a token of positive mass has nothing to draw."""
    c = scorer.config
    if get_member(c.method).documents or c.ngram > 1:
        raise ValueError(f"show draws tokens: method={c.method!r} with ngram={c.ngram} moves "
                         f"{'sentences' if get_member(c.method).documents else 'n-grams'}")
    for name, text in (("hypothesis", hyp), ("reference", ref)):
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"the {name} is empty: it scores 0 and has no token to draw")
    with torch.no_grad():
        score = float(scorer([hyp], [ref])[0])
        units = scorer.embed([hyp, ref])
        if c.center_scope == "joint":
            centered = scorer.center(units)
            hyp_units, ref_units = centered.select(slice(0, 1)), centered.select(slice(1, 2))
        else:
            hyp_units, ref_units = (scorer.center(units.select(slice(k, k + 1))) for k in (0, 1))
        hyp_cloud, ref_cloud = scorer.token_clouds(hyp_units, "hyp"), scorer.token_clouds(ref_units, "ref")
        hyp_labels, ref_labels = unit_labels(scorer, [hyp, ref], units.mask)
        # the tokens the member sees: those of positive mass, and zero-mass matching targets
        hyp_keep, ref_keep = hyp_cloud.mask[0], ref_cloud.mask[0]
        y, b = hyp_cloud.vectors[0][hyp_keep], hyp_cloud.mass[0][hyp_keep]
        x, a = ref_cloud.vectors[0][ref_keep], ref_cloud.mass[0][ref_keep]
        if not len(y) or not len(x):
            raise ValueError("a text keeps no token of positive mass under this token policy: it scores 0")
        kw = dict(temperature=c.temperature, n_iter=c.n_iter)

        def terms(direction):
            plan, k = plan_terms(c.method, direction, x, y, a, b, **kw)
            norm = 1.0
            if get_member(c.method).normalized:
                norm = (plan_terms(c.method, direction, x, x, a, a, **kw)[1].sum()
                        * plan_terms(c.method, direction, y, y, b, b, **kw)[1].sum()).clamp_min(1e-30).sqrt()
            return plan, k / norm

        directed = get_member(c.method).directed
        if directed and c.direction == "f1":
            plan, recall = terms("recall")
            precision = terms("precision")[1]
            r, p = recall.sum(), precision.sum()
            raw = float(2 * r * p / (r + p)) if r + p else 0.0
            ref_contrib, hyp_contrib = recall.sum(1), precision.sum(0)
        else:
            plan, k = terms(c.direction if directed else "recall")
            raw = float(k.sum())
            ref_contrib, hyp_contrib = k.sum(1), k.sum(0)
        matrix = (x @ y.T) if c.method in SIMILARITY_DRAWN else plan
    return TokenMatch(
        hyp_tokens=[t for t, keep in zip(hyp_labels, hyp_keep[units.mask[0]].tolist()) if keep],
        ref_tokens=[t for t, keep in zip(ref_labels, ref_keep[units.mask[1]].tolist()) if keep],
        matrix=matrix.double().tolist(), matrix_kind="similarity" if c.method in SIMILARITY_DRAWN else "plan",
        ref_contributions=ref_contrib.double().tolist(), hyp_contributions=hyp_contrib.double().tolist(),
        score=score, raw_score=raw, method=c.method, direction=c.direction if directed else "-",
        signature=scorer.signature)


def unit_labels(scorer, texts: list[str], units_mask: Tensor) -> list[list[str]]:
    """Per text, the label of each unit the scorer's :meth:`~torchmover.Scorer.embed` keeps (in order):
    its token, or with ``subwords="mean"`` its word's pieces joined."""
    c, tokenizer = scorer.config, scorer.encoder.tokenizer

    def policy(mask, input_ids, word_ids):  # the scorer's token policy, as its embed applies it
        return keep_mask(mask, input_ids, word_ids, tokenizer, subwords=c.subwords, stopwords=c.stopwords,
                         punctuation=c.punctuation)
    tokens = scorer.encoder(texts, token_policy=None if c.token_policy_is_identity else policy, with_word_ids=True)
    labels = []
    for row in range(len(texts)):
        kept = tokens.mask[row].cpu()
        pieces = [clean_token(t) for t in tokenizer.convert_ids_to_tokens(tokens.input_ids[row].cpu()[kept].tolist())]
        if c.subwords == "mean":
            words: dict[int, list[str]] = {}
            for piece, word in zip(pieces, tokens.word_ids[row].cpu()[kept].tolist()):
                words.setdefault(word, []).append(piece)
            pieces = ["".join(p.removeprefix("##") for p in words[w]) for w in sorted(words)]
        assert len(pieces) == int(units_mask[row].sum()), "labels and units disagree"
        labels.append(pieces)
    return labels


def clean_token(token: str) -> str:
    """A tokenizer's token for display: the word-start markers of byte-level BPE (``Ġ``) and
    SentencePiece (``▁``) removed; word-piece continuations (``##``) kept."""
    return token.replace("Ġ", "").replace("▁", "") or token


PICTURE_SUFFIXES = (".png", ".svg", ".pdf")  # the formats a token match is drawn in, by the path's suffix


def picture_path(path: str | Path) -> Path:
    """``path`` as a ``Path``; a ``ValueError`` naming it unless its suffix is one of
    :data:`PICTURE_SUFFIXES` (matplotlib would write another suffix's format, or add ``.png`` to a
    path without one and leave ``path`` unwritten)."""
    path = Path(path)
    if path.suffix.lower() not in PICTURE_SUFFIXES:
        raise ValueError(f"path must end in .png, .svg or .pdf, got {str(path)!r}")
    return path


def draw_token_match(match: TokenMatch, path: str | Path) -> Path:
    """Draw ``match`` as a heatmap (reference tokens down, hypothesis tokens across) with each token's
    contribution as bars in the margins and the score with its signature in the title; write it to
    ``path`` (the format from its suffix: ``.png``, ``.svg``, ``.pdf``). Needs matplotlib
    (``pip install "torchmover[plot]"``)."""
    path = picture_path(path)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError('drawing a token match needs matplotlib: pip install "torchmover[plot]"') from None
    import numpy as np

    m = np.array(match.matrix)
    n_ref, n_hyp = m.shape
    width, height = 2.6 + 0.42 * n_hyp, 2.6 + 0.36 * n_ref
    fig = plt.figure(figsize=(max(width, 6.5), max(height, 4.5)), layout="constrained")
    grid = fig.add_gridspec(2, 3, width_ratios=[n_hyp, 0.28 * n_hyp + 1.2, 0.25], height_ratios=[n_ref, 0.22 * n_ref + 1.2])
    heat = fig.add_subplot(grid[0, 0])
    rows = fig.add_subplot(grid[0, 1], sharey=heat)
    cols = fig.add_subplot(grid[1, 0], sharex=heat)
    bar_axes = fig.add_subplot(grid[0, 2])

    cmap = "viridis" if match.matrix_kind == "plan" else "RdBu_r"
    limits = dict(vmin=0, vmax=m.max()) if match.matrix_kind == "plan" else dict(vmin=-1, vmax=1)
    image = heat.imshow(m, cmap=cmap, aspect="auto", **limits)
    heat.set_xticks(range(n_hyp), match.hyp_tokens, rotation=60, ha="left", rotation_mode="anchor")
    heat.xaxis.tick_top()
    heat.set_yticks(range(n_ref), match.ref_tokens)
    heat.set_xlabel("hypothesis tokens")
    heat.xaxis.set_label_position("top")
    heat.set_ylabel("reference tokens")
    if match.method == "bertscore":  # the greedy matches: each reference token's best hypothesis token
        heat.scatter(m.argmax(1), range(n_ref), marker="o", s=18, facecolors="none", edgecolors="black")
    fig.colorbar(image, cax=bar_axes, label="plan π (mass)" if match.matrix_kind == "plan" else "cosine similarity")

    total = "sum" if match.direction != "f1" else "sum = R"
    rows.bar_label(rows.barh(range(n_ref), match.ref_contributions, color="tab:orange"), fmt="%.3f", fontsize=6,
                   padding=2)
    rows.margins(x=0.3)
    rows.set_title(f"contribution ({total} {sum(match.ref_contributions):.3f})", fontsize=8)
    rows.tick_params(axis="y", left=False, labelleft=False)
    rows.tick_params(axis="x", labelsize=7)
    rows.axvline(0, color="grey", lw=0.5)
    cols.bar_label(cols.bar(range(n_hyp), match.hyp_contributions, color="tab:orange"), fmt="%.3f", fontsize=6,
                   padding=2)
    cols.margins(y=0.3)
    cols.set_ylabel(f"contribution\n({'sum = P' if match.direction == 'f1' else 'sum'} "
                    f"{sum(match.hyp_contributions):.3f})", fontsize=8)
    cols.tick_params(axis="x", bottom=False, labelbottom=False)
    cols.tick_params(axis="y", labelsize=7)
    cols.axhline(0, color="grey", lw=0.5)
    cols.invert_yaxis()

    direction = "" if match.direction == "-" else f" {match.direction}"
    rescaled = "" if abs(match.score - match.raw_score) < 5e-7 else f" (rescaled; {match.raw_score:.4f} before)"
    signature = "\n".join(textwrap.wrap(match.signature.replace("|", " | "), 110))
    fig.suptitle(f"{match.method}{direction} = {match.score:.4f}{rescaled}", fontsize=12, fontweight="bold")
    fig.supxlabel(signature, fontsize=6, family="monospace")
    atomic_savefig(fig, path, dpi=110)
    plt.close(fig)
    return path


def show(scorer, hyp: str, ref: str, path: str | Path) -> TokenMatch:
    """:func:`token_match` of the pair, drawn to ``path`` (:func:`draw_token_match`; a path of another
    suffix is a ``ValueError`` before the pair is scored)."""
    picture_path(path)
    match = token_match(scorer, hyp, ref)
    draw_token_match(match, path)
    return match
