"""Scores of a fixed set of pairs under every member, direction, preset and reward path, for checking
that a change which should not move any score moves none.

``--write FILE`` records the scores (JSON); ``--check FILE`` scores again and compares with a recorded
file: the largest absolute difference per configuration, and exit status 1 if any exceeds
``--tolerance`` (default 1e-7). The pairs are the first ``--pairs`` rows (default 24) of the WMT15-16
files plus degenerate texts (empty, whitespace, punctuation, one word); the default model throughout
(``--model``/``--layer`` another one, with the default model's centering, none, where a configuration
names none; the presets keep their options but run on it). Configurations:

- every member x direction, through ``Scorer.score`` (batched, arena), ``Scorer.forward`` and
  ``return_all``;
- token policies (IDF, stopwords, punctuation, subwords, n-grams), centerings and scopes, several
  references (``max`` / ``mean``), rescaling;
- every preset;
- the rewards: ``MoverReward`` uncached, then cached (the same call again), with several references and
  reversed, the self-critical and group rewards, and the micro-batcher.

    python bench/score_snapshot.py --write before.json      # on the old code
    python bench/score_snapshot.py --check before.json      # on the new code
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
DEGENERATE = ["", "   ", "!!!", "cat", "the the the the"]


def read_pairs(data: Path, n: int) -> tuple[list[str], list[str]]:
    """The first ``n`` rows of the WMT15-16 files (sorted), then the degenerate texts paired with
    the first references."""
    rows = []
    for path in sorted(data.glob("*.tsv")):
        with path.open(encoding="utf-8", newline="") as f:
            rows += list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[:n // 6 + 1]
    rows = rows[:n]
    hyps = [r["hyp"] for r in rows] + DEGENERATE
    refs = [r["ref"] for r in rows] + [r["ref"] for r in rows[:len(DEGENERATE)]]
    return hyps, refs


def scorer_configs() -> dict[str, dict]:
    """Name -> Scorer options."""
    from torchmover import PRESETS

    configs = {}
    for method, directions in {"twmd": ("recall", "precision", "f1"), "trwmd": ("recall", "precision", "f1"),
                               "bertscore": ("recall", "precision", "f1"), "wmd": ("recall",),
                               "moverscore": ("recall",), "sbert": ("recall",), "cka": ("recall",),
                               "sms": ("recall",), "s+wms": ("recall",), "wms": ("recall",)}.items():
        for direction in directions:
            configs[f"{method}-{direction}"] = dict(method=method, direction=direction)
    configs.update({
        "twmd-converged": dict(n_iter=None), "twmd-T0.02-iter5": dict(temperature=0.02, n_iter=5),
        "twmd-idf": dict(idf=True), "twmd-stopwords": dict(stopwords="english"),
        "twmd-punct-drop": dict(punctuation="drop"), "twmd-punct-ascii": dict(punctuation="ascii"),
        "twmd-subwords-first": dict(subwords="first"), "twmd-subwords-mean": dict(subwords="mean"),
        "twmd-ngram2": dict(ngram=2), "twmd-keep-special": dict(special_tokens="keep"),
        "twmd-cls": dict(special_tokens="cls"), "trwmd-target": dict(method="trwmd", special_tokens="target"),
        "bertscore-target-idf": dict(method="bertscore", special_tokens="target", idf=True),
        "twmd-batch": dict(centering="batch"), "twmd-batch-separate": dict(centering="batch", center_scope="separate"),
        "twmd-fixed": dict(centering="fixed"), "twmd-sentence": dict(centering="sentence"),
        "twmd-dimension": dict(centering="dimension"), "cka-batch": dict(method="cka", centering="batch"),
        "twmd-rescale": dict(rescale=True), "sms-tempered": dict(method="sms", temperature=0.1),
    })
    for name, options in PRESETS.items():
        configs[f"preset-{name}"] = {k: v for k, v in options.items() if k not in ("model", "layer")}
    return configs


def fitted(scorer, hyps: list[str], refs: list[str]):
    """The scorer with the corpus statistics its options ask for, fitted on the pairs' texts."""
    c = scorer.config
    if c.idf:
        scorer.fit_idf(refs, hyps)
    if c.centering in ("fixed", "running"):
        scorer.fit_centering(refs, progress=False)
    if c.rescale:
        scorer.fit_baseline(refs, n_pairs=64, progress=False)
    return scorer


def scorer_scores(hyps: list[str], refs: list[str], encoder: dict) -> dict[str, list[float]]:
    from tqdm.auto import tqdm

    from torchmover import Scorer

    out = {}
    multi = [[r, refs[(i + 1) % len(refs)]] for i, r in enumerate(refs)]
    for name, options in tqdm(scorer_configs().items(), desc="scorers"):
        scorer = fitted(Scorer(**{**encoder, **options}), hyps, refs)
        out[f"{name}/score"] = scorer.score(hyps, refs, batch_size=8, progress=False).tolist()
        with torch.no_grad():
            out[f"{name}/forward"] = scorer(hyps, refs).tolist()
        for k, values in enumerate(scorer.score(hyps, refs, batch_size=8, progress=False, return_all=True)):
            out[f"{name}/all{k}"] = values.tolist()
        if name in ("twmd-recall", "bertscore-f1", "twmd-batch"):
            out[f"{name}/multi-max"] = scorer.score(hyps, multi, progress=False).tolist()
            out[f"{name}/multi-mean"] = fitted(Scorer(**{**encoder, **options}, multi_ref="mean"), hyps, refs).score(
                hyps, multi, progress=False).tolist()
    return out


def reward_scores(hyps: list[str], refs: list[str], encoder: dict) -> dict[str, list[float]]:
    from torchmover import BatchedReward, GroupReward, MoverReward, Scorer, SelfCriticalReward

    out = {}
    multi = [[r, refs[(i + 1) % len(refs)]] for i, r in enumerate(refs)]
    for name, options in {"twmd": {}, "trwmd": dict(method="trwmd"), "bertscore": dict(method="bertscore"),
                          "twmd-batch-fit": dict(centering="batch"), "sms": dict(method="sms"),
                          "twmd-idf": dict(idf=True), "twmd-f1": dict(direction="f1")}.items():
        scorer = fitted(Scorer(**{**encoder, **options}), hyps, refs)
        reward = MoverReward(scorer)
        if scorer.config.centering == "batch":
            reward.fit(refs)
        out[f"reward-{name}/uncached"] = reward(hyps, refs).tolist()
        out[f"reward-{name}/cached"] = reward(hyps, refs).tolist()
        out[f"reward-{name}/multi"] = reward(hyps, multi).tolist()
        out[f"reward-{name}/reversed"] = reward(hyps[::-1], refs[::-1]).tolist()
        uncached = MoverReward(scorer, cache_size=0)
        if scorer.config.centering == "batch":
            uncached.fit(refs)
        out[f"reward-{name}/cache-off"] = uncached(hyps, refs).tolist()
    scorer = Scorer(**encoder)
    critical = SelfCriticalReward(scorer)(hyps, hyps[::-1], refs)
    out["self-critical/advantage"] = critical.advantage.tolist()
    group = GroupReward(scorer, baseline="leave_one_out")([hyps[i:i + 4] for i in range(0, 24, 4)], refs[:6])
    out["group/advantages"] = group.advantages.flatten().tolist()
    with BatchedReward(MoverReward(scorer), max_wait_ms=1) as batched:
        out["batched/score_one"] = [batched.score_one(h, r) for h, r in zip(hyps, refs)]
    return out


def snapshot(data: Path, n: int, model: str | None = None, layer: int | None = None) -> dict[str, list[float]]:
    """Every configuration's scores of the pairs of :func:`read_pairs` (``model`` and ``layer``: the
    encoder of every scorer, default: the default model at its layer; another model is given the
    default model's centering, none, where a configuration names none)."""
    hyps, refs = read_pairs(data, n)
    encoder = {} if model is None else {"model": model, "centering": "none"}
    encoder.update({} if layer is None else {"layer": layer})
    return {**scorer_scores(hyps, refs, encoder), **reward_scores(hyps, refs, encoder)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data" / "wmt15-16")
    parser.add_argument("--pairs", type=int, default=24)
    parser.add_argument("--tolerance", type=float, default=1e-7)
    parser.add_argument("--model", help="the encoder of every scorer (default: the default model)")
    parser.add_argument("--layer", type=int, help="its layer (default: the model's recorded layer)")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", type=Path, help="record the scores here")
    mode.add_argument("--check", type=Path, help="compare with the scores recorded here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # one thread: reductions in one order, before and after
    scores = snapshot(args.data, args.pairs, args.model, args.layer)
    if args.write:
        args.write.write_text(json.dumps(scores) + "\n", encoding="utf-8")
        print(f"{len(scores)} configurations, {sum(map(len, scores.values()))} scores -> {args.write}")
        return 0
    recorded = json.loads(args.check.read_text(encoding="utf-8"))
    missing = sorted(set(recorded) ^ set(scores))
    worst = {name: max((abs(a - b) for a, b in zip(values, recorded[name])), default=0.0)
             for name, values in scores.items() if name in recorded and len(values) == len(recorded[name])}
    lengths = sorted(name for name in scores if name in recorded and len(scores[name]) != len(recorded[name]))
    failed = {name: d for name, d in worst.items() if not d <= args.tolerance}
    print(f"{len(worst)} configurations compared; largest difference {max(worst.values(), default=0):.3g}; "
          f"bit-identical: {sum(d == 0 for d in worst.values())}")
    for name, d in sorted(failed.items(), key=lambda kv: -kv[1]):
        print(f"  {name}: {d:.3g} > {args.tolerance:g}")
    for name in missing + lengths:
        print(f"  {name}: not in both, or of another length")
    return 1 if failed or missing or lengths else 0


if __name__ == "__main__":
    sys.exit(main())
