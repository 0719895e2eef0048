"""Which choices make TWMD robust beyond WMT: chosen on WMT15-16, checked on held-out sentence similarity.

The question: on a benchmark of another kind, sentence similarity (the SemEval STS12-16
English test sets), the WMT-chosen default trails bert_score's F1, and torchmover's own ``bertscore``
member beats it. bert_score keeps [CLS]/[SEP] as zero-mass matching targets; TWMD drops them. This
script finds, **on WMT15-16 only**, the best settings of each variant of the choices in question, then
scores the chosen configurations once on STS, which never chooses anything:

- TWMD with each special-tokens policy (``drop``: [CLS]/[SEP] removed, the default; ``cls``: [CLS]
  kept, the TWMD authors' code; ``keep``: both kept as tokens with mass — a transport plan with exact
  marginals sends nothing to a zero-mass target, so ``keep`` is TWMD's analogue of bert_score's
  targets), with and without IDF weights (fitted on the distinct references), in the directions
  recall and f1: for each, the best layer at T = 0.10, then the best T of {0.05, 0.10, 0.15, 0.20}
  at that layer;
- BERTScore F1 as bert_score computes it (``special_tokens="target"``; with and without IDF) and
  torchmover's ``bertscore`` member with special tokens dropped: each at its best layer;
- TRWMD f1 (T = 0.15) with special tokens dropped or as targets: each at its best layer.

Every configuration keeps the model's default centering (``MODEL_DEFAULTS``, else ``batch``, per batch
of 32 pairs as the paper centers). Scores come from ``select_defaults.py``'s sweep: a
``torchmover.Scorer`` per configuration, on encoders of ``torchmover.evaluation.sweep.AllLayers`` (the
model loaded once, run once per batch of texts for every layer and special-tokens policy), IDF fitted
on each data set's distinct references. WMT15-16 is every row of ``harness.wmt_sample``.

STS is read by path (``--sts``, e.g. the TWMD authors' ``dataset/STS``: ``STS1x-en-test/STS.input.
<subset>.txt`` and ``STS.gs.<subset>.txt``; pairs without a gold score dropped) and never copied. Its
score is the TWMD authors' protocol (``run_STS.py``): Pearson r per subset, averaged per year weighted
by the subsets' sizes, then over the five years; the first sentence is the hypothesis, the second the
reference. WMT15-16 is the average Pearson r over its 10 language-pair × year groups.

Without ``--sts`` only the selection on WMT15-16 runs (e.g. to choose bert_score's layer for
``bench/studies/base_encoder.py``). Command (from the repository root)::

    python bench/studies/robustness.py --data ../shared/data/wmt15-16 --sts ../authors-code/dataset/STS \\
        [--model <local dir>] --out bench/results/

Writes ``robustness[_<name>].md`` and ``.json`` into ``--out``.
"""
from __future__ import annotations

import io
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import harness  # noqa: E402
from harness import wmt_parser  # noqa: E402
from select_defaults import Sweep, cfg, config_key  # noqa: E402

STS_SUBSETS = {  # the TWMD authors' run_STS.py (STS13's SMT input is not distributed)
    12: ["MSRpar", "MSRvid", "SMTeuroparl", "surprise.OnWN", "surprise.SMTnews"],
    13: ["FNWN", "headlines", "OnWN"],
    14: ["deft-forum", "deft-news", "headlines", "images", "OnWN", "tweet-news"],
    15: ["answers-forums", "answers-students", "belief", "headlines", "images"],
    16: ["answer-answer", "headlines", "plagiarism", "postediting", "question-question"],
}
TEMPERATURES = (0.05, 0.10, 0.15, 0.20)
POLICIES = ("drop", "cls", "keep")


# --- data -----------------------------------------------------------------------------------------

def read_sts(root: Path) -> list[dict]:
    """Rows ``{group, year, hyp, ref, score}`` of every STS subset with a gold score."""
    rows = []
    for year, subsets in STS_SUBSETS.items():
        for subset in subsets:
            folder = root / f"STS{year}-en-test"
            pairs = io.open(folder / f"STS.input.{subset}.txt", encoding="utf8").read().splitlines()
            gold = io.open(folder / f"STS.gs.{subset}.txt", encoding="utf8").read().splitlines()
            if len(pairs) != len(gold):
                raise SystemExit(f"{folder}: {subset} has {len(pairs)} pairs and {len(gold)} gold lines")
            for line, score in zip(pairs, gold):
                if score.strip():
                    first, second = line.split("\t")[:2]
                    rows.append({"group": f"STS{year} {subset}", "year": year, "hyp": first, "ref": second,
                                 "score": float(score)})
    return rows


def avg_r(sweep: Sweep, c: dict) -> float:
    return sweep.results[config_key(c)]["avg_r"]


def group_sizes(sweep: Sweep) -> dict[str, int]:
    return {g: int((sweep.groups == g).sum()) for g in sweep.group_names}


def sts_average(result: dict, sizes: dict[str, int]) -> tuple[float, dict[int, float]]:
    """The authors' STS average: per year the size-weighted mean Pearson r of its subsets, then the
    mean over the years; and the per-year values."""
    years = {}
    for year in STS_SUBSETS:
        groups = [g for g in sizes if g.startswith(f"STS{year} ")]
        years[year] = float(np.average([result["per_group"][g]["r"] for g in groups],
                                       weights=[sizes[g] for g in groups]))
    return float(np.mean(list(years.values()))), years


# --- selection on WMT ------------------------------------------------------------------------------

def best(wmt: Sweep, configs: list[dict]) -> dict:
    return max(configs, key=lambda c: avg_r(wmt, c))


def select_on_wmt(wmt: Sweep, n_layers: int, centering: str) -> dict[str, dict]:
    """Each variant's configuration of best WMT15-16 average r (module docs)."""
    layers = range(1, n_layers + 1)
    chosen = {}
    twmd = {(p, idf, d): [cfg(l, centering, "twmd", 0.10, d, special_tokens=p, idf=idf) for l in layers]
            for p in POLICIES for idf in (False, True) for d in ("recall", "f1")}
    wmt.run([c for cs in twmd.values() for c in cs], "WMT: TWMD variants x layer")
    for (p, idf, d), configs in twmd.items():
        layer = best(wmt, configs)["layer"]
        at_layer = [cfg(layer, centering, "twmd", t, d, special_tokens=p, idf=idf) for t in TEMPERATURES]
        wmt.run(at_layer, f"WMT: T at layer {layer}")
        chosen[f"twmd/{d}/special={p}" + ("/idf" if idf else "")] = best(wmt, at_layer)
    others = {
        "bert_score F1 (special=target)": [cfg(l, centering, "bertscore", direction="f1", special_tokens="target")
                                           for l in layers],
        "bert_score F1 (special=target)/idf": [cfg(l, centering, "bertscore", direction="f1",
                                                   special_tokens="target", idf=True) for l in layers],
        "bertscore member F1 (special=drop)": [cfg(l, centering, "bertscore", direction="f1") for l in layers],
        "trwmd/f1/special=drop": [cfg(l, centering, "trwmd", 0.15, "f1") for l in layers],
        "trwmd/f1/special=target": [cfg(l, centering, "trwmd", 0.15, "f1", special_tokens="target") for l in layers],
    }
    wmt.run([c for cs in others.values() for c in cs], "WMT: other members x layer")
    chosen.update({name: best(wmt, configs) for name, configs in others.items()})
    return chosen


# --- report ---------------------------------------------------------------------------------------

def run(args) -> dict:
    import torchmover
    from torchmover.evaluation.sweep import AllLayers
    from torchmover.scorer.config import DEFAULT_CENTERING, MODEL_DEFAULTS

    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    library = torchmover.Scorer(args.model, device="cpu").config
    name = library.model
    default = cfg(library.layer, library.centering, library.method, library.temperature, library.direction)
    centering = MODEL_DEFAULTS.get(name, {}).get("centering", DEFAULT_CENTERING)
    layers = AllLayers(args.model)
    wmt = Sweep(harness.wmt_sample(args.data, None, args.seed), layers, args.batch_size)
    wmt.run([default], "WMT: the library default")
    chosen = {"library default": default, **select_on_wmt(wmt, layers.n_layers, centering)}
    rows = {label: {"config": config_key(c), "wmt_r": avg_r(wmt, c), "sts_r": None, "sts_years": None}
            for label, c in chosen.items()}
    sts = None
    if args.sts is not None:
        sts = Sweep(read_sts(args.sts), layers, args.batch_size)
        sts.run(list(chosen.values()), "STS (held out)")
        for label, c in chosen.items():
            rows[label]["sts_r"], rows[label]["sts_years"] = sts_average(sts.results[config_key(c)], group_sizes(sts))
    return {"model": name, "centering": centering, "rows": rows, "n_wmt": wmt.n_pairs,
            "n_sts": sts and sts.n_pairs, "threads": args.threads, "torch": torch.__version__,
            "wall_s": time.perf_counter() - t0, "wmt_results": wmt.results}


DOCS_ROWS = {  # the variants of the table of docs/results.md, and how it names them
    "library default": "library default: `twmd`, recall, layer 4, T = 0.1",
    "twmd/recall/special=keep": '`twmd`, [CLS]/[SEP] kept as tokens (`special_tokens="keep"`)',
    "twmd/f1/special=drop": "`twmd`, f1, T = 0.15",
    "twmd/f1/special=drop/idf": "`twmd`, f1, T = 0.15, IDF",
    "bert_score F1 (special=target)": "bert_score F1 (its rule: special tokens as zero-mass targets)",
    "bert_score F1 (special=target)/idf": "bert_score F1, IDF",
    "bertscore member F1 (special=drop)": "the `bertscore` member, special tokens dropped",
    "trwmd/f1/special=target": "`trwmd`, f1, T = 0.15, special tokens as targets",
}


def docs_table(res: dict) -> dict:
    """The table of ``docs/results.md`` (``docs_variants``, with STS): WMT15-16 and STS12-16 r of the
    variants it shows, the library default's WMT r and the best STS r in bold."""
    rows = {key: res["rows"][key] for key in DOCS_ROWS}
    best_sts = max(row["sts_r"] for row in rows.values())
    bold = lambda text, yes: f"**{text}**" if yes else text  # noqa: E731
    return harness.table(["variant (chosen on WMT15–16)", "WMT15–16 r", "STS12–16 r"], [
        [DOCS_ROWS[key], bold(f"{row['wmt_r']:.4f}", key == "library default"),
         bold(f"{row['sts_r']:.4f}", row["sts_r"] == best_sts)] for key, row in rows.items()], "-rr")


GUIDE_ROWS = {  # the variants of the evaluation guide's table, and how it names them
    "library default": "**default**: `twmd`, recall, T = 0.1, no IDF, special tokens dropped",
    "twmd/f1/special=drop/idf": "`twmd`, f1, T = 0.15, IDF (`idf=True`, fitted on the references)",
    "twmd/recall/special=drop/idf": "`twmd`, recall, T = 0.15, IDF",
    "bert_score F1 (special=target)/idf": "`bertscore` preset (bert_score's rule: [CLS]/[SEP] as zero-mass targets), IDF",
    "bert_score F1 (special=target)": "`bertscore` preset, no IDF",
    "trwmd/f1/special=target": "`trwmd`, f1, T = 0.15, special tokens as targets",
}


def guide_table(res: dict) -> dict:
    """The table of the evaluation guide (``docs_guide``): WMT15-16 r, STS12-16 r and their mean of
    the variants it shows, the library default's WMT r and each other column's best in bold."""
    rows = {key: res["rows"][key] for key in GUIDE_ROWS}
    means = {key: (row["wmt_r"] + row["sts_r"]) / 2 for key, row in rows.items()}
    best_sts, best_mean = max(row["sts_r"] for row in rows.values()), max(means.values())
    bold = lambda text, yes: f"**{text}**" if yes else text  # noqa: E731
    return harness.table(["configuration", "WMT15–16 r", "STS12–16 r", "mean of the two"], [
        [GUIDE_ROWS[key], bold(f"{row['wmt_r']:.3f}", key == "library default"),
         bold(f"{row['sts_r']:.3f}", row["sts_r"] == best_sts), bold(f"{means[key]:.3f}", means[key] == best_mean)]
        for key, row in rows.items()], "-rrr")


def title(res: dict) -> str:
    return f"Robustness beyond WMT: `{res['model']}`, chosen on WMT15-16" + (
        ", checked on STS12-16" if res["n_sts"] is not None else "")


def report(res: dict) -> str:
    """The report's body (Markdown)."""
    sts = res["n_sts"] is not None
    lines = [f"- WMT15-16: {res['n_wmt']} pairs, average Pearson r over the 10 language-pair × year groups; every "
             "configuration below except the library default was chosen there (best layer, then best T)."]
    if sts:
        lines.append(f"- STS12-16 (held out, never chooses): {res['n_sts']} pairs with a gold score; Pearson r per "
                     "subset, size-weighted per year, averaged over the five years (the TWMD authors' `run_STS.py`).")
    else:
        lines.append("- STS not given (`--sts`): the selection on WMT15-16 alone.")
    lines += [f"- Centering: the model's default, `{res['centering']}`, throughout. torch {res['torch']}, "
              f"{res['threads']} thread(s); wall time {res['wall_s'] / 60:.0f} min.", ""]
    if sts:
        lines += ["| variant | configuration (chosen on WMT) | WMT15-16 r | STS12-16 r | STS12 | STS13 | STS14 | STS15 | STS16 |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for label, row in sorted(res["rows"].items(), key=lambda kv: -kv[1]["sts_r"]):
            years = " | ".join(f"{row['sts_years'][y]:.3f}" for y in STS_SUBSETS)
            lines.append(f"| {label} | `{row['config']}` | {row['wmt_r']:.4f} | **{row['sts_r']:.4f}** | {years} |")
    else:
        lines += ["| variant | configuration (chosen on WMT) | WMT15-16 r |", "|---|---|---|"]
        for label, row in sorted(res["rows"].items(), key=lambda kv: -kv[1]["wmt_r"]):
            lines.append(f"| {label} | `{row['config']}` | **{row['wmt_r']:.4f}** |")
    return "\n".join(lines + [""])


def main(argv=None) -> None:
    parser = wmt_parser(__doc__)
    parser.add_argument("--sts", type=Path, help="the STS12-16 English test sets (STS1x-en-test/); "
                                                 "without it, the WMT15-16 selection alone")
    parser.add_argument("--model", default="sentence-transformers/all-MiniLM-L6-v2", help="encoder (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=32, help="pairs per scoring/centering batch")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default: %(default)s)")
    args = parser.parse_args(argv)
    res = run(args)
    sts = res["n_sts"] is not None
    harness.publish(args.out, "robustness" + harness.model_suffix(res["model"]), title(res), res,
                    {"docs_variants": docs_table(res), "docs_guide": guide_table(res)} if sts else {},
                    [report(res), *(["## The table of the documentation", {"table": "docs_variants"}] if sts else [])],
                    data=harness.data_provenance(args.data, sts=str(args.sts) if args.sts else None))


if __name__ == "__main__":
    main()
