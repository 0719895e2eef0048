"""Choose the default layer, temperature, direction and centering of an encoder on WMT15-16.

Measures the segment-level agreement (Pearson r and Kendall tau-b, ``torchmover.evaluation.correlation``)
between members of the TWMD family and human direct-assessment scores on WMT15-16 (10 groups:
language pair x year, 5,344 segments), for ``--model`` (default ``sentence-transformers/all-MiniLM-L6-v2``,
loaded offline; or a local directory, e.g. of ``all-mpnet-base-v2``). The default is the
configuration with the best average Pearson r over the 10 groups.

Every configuration is a ``torchmover.Scorer`` on an encoder of ``torchmover.evaluation.sweep.AllLayers``
(the model loaded once; each batch of texts runs through it once, for every layer and special-tokens
policy). Centering modes: ``none``; ``batch``, the paper's per-batch mean: the pairs, sorted by
decreasing ``len(hyp) + len(ref)``, are cut into batches of ``--batch-size`` (32) and the scorer is
called on each batch (``scorer(hyps, refs)`` centers a call's distinct texts on their mean);
``fixed`` (``Scorer.fit_centering`` on every distinct text of the data, hypotheses and references);
``sentence`` (each text minus its own mean). The other modes do not depend on the batch: those
configurations are scored by ``Scorer.score``. IDF weights (``robustness.py``) are fitted on the
distinct references (``Scorer.fit_idf``). Pairs come from ``harness.wmt_sample`` (every row, in the
order of ``--seed``; ``--n`` for a sample).

Sweep (staged, to keep the grid small):
  A. every layer x centering, TWMD (n_iter=1) T=0.1 recall;
  B. layer x T for TWMD (n_iter=1, recall) with the best centering of A, then direction x T at the
     best layer;
  C. per layer: BERTScore (P/R/F), SBERT, CKA, TRWMD (T=0.1, recall); at the best layer: TRWMD
     (T x direction), exact WMD (``method="wmd"``: log-domain Sinkhorn at T = 1e-3 to convergence;
     ``--no-wmd`` skips it), TWMD with n_iter=3 and converged;
  D. every centering at the chosen (layer, T, direction), and at the library's current default.
The chosen configuration is compared by a paired bootstrap of the difference of their average r
(``correlation.paired_bootstrap_difference``) with the best other centering at its layer, temperature
and direction (stage D: what the choice of centering rests on, whatever the library's default is), and
with the current default where that differs from it.

Commands (from the repository root)::

    python bench/studies/select_defaults.py --data ../shared/data/wmt15-16 --out bench/results/
    python bench/studies/select_defaults.py --data ../shared/data/wmt15-16 --model <all-mpnet-base-v2 dir> \\
        --out bench/results/

Writes ``select_defaults.md`` (tables) and ``select_defaults.json`` (every number) into ``--out``, for
another model ``select_defaults_<name>.md`` / ``.json``.
"""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

import torchmover
from torchmover.evaluation.correlation import correlate, paired_bootstrap_difference
from torchmover.evaluation.sweep import AllLayers
from torchmover.text.encoder import DEFAULT_MODEL

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import harness  # noqa: E402

TEMPERATURES = (0.02, 0.05, 0.1, 0.15, 0.2, 0.3)
DIRECTIONS = ("recall", "precision", "f1")
CENTERINGS = ("none", "batch", "fixed", "sentence")


# --- configurations ---------------------------------------------------------------------------------

def config_key(c: dict) -> str:
    parts = [f"L{c['layer']}", c["centering"], c["method"]]
    if c["method"] in ("twmd", "trwmd"):
        parts.append(f"T={c['temperature']:g}")
    if c["method"] in ("twmd", "trwmd", "bertscore"):
        parts.append(c["direction"])
    if c["method"] == "twmd" and c.get("n_iter", 1) != 1:
        parts.append(f"iter={'conv' if c['n_iter'] is None else c['n_iter']}")
    if c.get("special_tokens", "drop") != "drop":
        parts.append(f"special={c['special_tokens']}")
    if c.get("idf"):
        parts.append("idf")
    return "/".join(parts)


def cfg(layer, centering, method, temperature=None, direction=None, n_iter=1, special_tokens="drop",
        idf=False) -> dict:
    """A configuration (``special_tokens``: the encoder's policy; ``idf``: IDF weights from the
    references, as ``Scorer(idf=True).fit_idf(references)``)."""
    return dict(layer=layer, centering=centering, method=method, temperature=temperature,
                direction=direction, n_iter=n_iter, special_tokens=special_tokens, idf=idf)


def paper_batches(hyps: list[str], refs: list[str], batch_size: int) -> list[list[int]]:
    """The TWMD paper's batches: pair positions sorted by decreasing ``len(hyp) + len(ref)`` (in
    characters; ties in input order), cut into batches of ``batch_size``."""
    order = sorted(range(len(hyps)), key=lambda i: -(len(hyps[i]) + len(refs[i])))
    return [order[start:start + batch_size] for start in range(0, len(order), batch_size)]


# --- the sweep --------------------------------------------------------------------------------------

class Sweep:
    """Scores configurations of one model on one list of pairs (``{hyp, ref, score}`` and their
    ``group``, by default ``"<lp> <year>"``), each with a ``torchmover.Scorer`` on ``layers``; memoises
    the scores and correlations by key.

    The texts are batched three ways: by ``fit_centering`` (``fixed``), by the paper's batches
    (``batch``) and by ``Scorer.score`` (the others). The memo of ``layers`` holds one way at a time
    (every layer of every batch: gigabytes on WMT15-16): :meth:`run` fits every scorer first, then
    scores the ``batch`` configurations, then the others, and clears the memo when the way changes, so
    that consecutive stages of ``Scorer.score`` configurations share one encoding."""

    def __init__(self, pairs: list[dict], layers: AllLayers, batch_size: int, device: str = "cpu"):
        self.layers, self.batch_size, self.device = layers, batch_size, device
        self.hyps, self.refs = [p["hyp"] for p in pairs], [p["ref"] for p in pairs]
        self.groups = np.array([p.get("group") or f"{p['lp']} {p['year']}" for p in pairs])
        self.human = np.array([p["score"] for p in pairs], dtype=np.float64)
        self.group_names = sorted(set(self.groups.tolist()))
        self.n_pairs = len(pairs)
        self.texts = list(dict.fromkeys(self.hyps + self.refs))
        self.batches = paper_batches(self.hyps, self.refs, batch_size)
        self.scores: dict[str, np.ndarray] = {}
        self.results: dict[str, dict] = {}
        self._batching = None  # how the texts in the memo of ``layers`` were batched

    def scorer(self, c: dict) -> torchmover.Scorer:
        """The scorer of configuration ``c``, with its IDF (distinct references) and ``fixed`` mean
        (every distinct text) fitted."""
        scorer = torchmover.Scorer(self.layers.encoder(c["layer"], c["special_tokens"]), method=c["method"],
                                   direction=c["direction"] or "recall", temperature=c["temperature"],
                                   n_iter=c["n_iter"], centering=c["centering"], idf=c["idf"], device=self.device)
        if c["idf"]:
            scorer.fit_idf(list(dict.fromkeys(self.refs)))
        if c["centering"] == "fixed":
            self._batch_as("fit_centering")
            scorer.fit_centering(self.texts, self.batch_size, progress=False)
        return scorer

    def _batch_as(self, batching: str) -> None:
        """Clear the memo when the texts are about to be batched another way."""
        if batching != self._batching:
            self.layers.clear()
            self._batching = batching

    def score(self, c: dict, scorer: torchmover.Scorer | None = None) -> np.ndarray:
        """``[n_pairs]`` scores of configuration ``c`` (``batch`` centering: per paper batch), by
        ``scorer`` (default: :meth:`scorer`)."""
        scorer = scorer or self.scorer(c)
        self._batch_as("paper" if c["centering"] == "batch" else "score")
        if c["centering"] != "batch":
            return scorer.score(self.hyps, self.refs, batch_size=self.batch_size, progress=False).double().numpy()
        out = np.zeros(self.n_pairs)
        with torch.no_grad():
            for idx in self.batches:
                out[idx] = scorer([self.hyps[i] for i in idx], [self.refs[i] for i in idx]).double().cpu().numpy()
        return out

    def run(self, configs: list[dict], desc: str) -> None:
        """Score and correlate the configurations not scored yet (the ``batch`` ones first)."""
        todo = {config_key(c): c for c in configs if config_key(c) not in self.scores}
        scorers = {key: self.scorer(c) for key, c in todo.items()}
        for key in tqdm(sorted(todo, key=lambda k: todo[k]["centering"] != "batch"), desc=desc, unit="config"):
            self.scores[key] = self.score(todo[key], scorers[key])
            self.results[key] = {**todo[key], **self.correlate(self.scores[key])}

    def correlate(self, scores: np.ndarray) -> dict:
        """Pearson r and Kendall τ-b per group and their unweighted average (``evaluation.correlate``)."""
        report = correlate(scores, self.human, self.groups, n_boot=0)
        per = {g.name: {"r": g.pearson.value, "tau": g.kendall.value} for g in report.groups}
        return {"avg_r": report.average.pearson.value, "avg_tau": report.average.kendall.value, "per_group": per}

    def best(self, keys) -> str:
        return max(keys, key=lambda k: self.results[k]["avg_r"])

    def bootstrap_diff(self, key_a: str, key_b: str, n_boot: int = 1000, seed: int = 0) -> dict:
        """Paired bootstrap (segments resampled within each group) of avg r(a) − avg r(b)
        (``correlation.paired_bootstrap_difference``)."""
        d = paired_bootstrap_difference(self.scores[key_a], self.scores[key_b], self.human, self.groups,
                                        n_boot=n_boot, seed=seed)
        return {"observed": d.value, "mean": d.mean, "ci95": [d.low, d.high], "p_le_0": d.p_le_0}


# --- report -----------------------------------------------------------------------------------------

def docs_default_table(figures: dict) -> dict:
    """The per-group table of ``docs/results.md`` (``docs_default``): the chosen configuration's
    Pearson r and Kendall τ per group (``cs-en 2015`` shown as ``cs-en 15``) and their average."""
    res = figures["results"][figures["chosen"]]
    groups = list(res["per_group"])
    rows = [[label, *(f"{res['per_group'][g][key]:.3f}" for g in groups), f"**{res[average]:.3f}**"]
            for label, key, average in (("Pearson r", "r", "avg_r"), ("Kendall τ", "tau", "avg_tau"))]
    return harness.table(["", *(f"{g.split()[0]} {g.split()[1][2:]}" for g in groups), "**avg**"], rows)


def docs_choice_table(figures: dict) -> dict:
    """The table of ``docs/results.md`` (``docs_choice``): each setting of the chosen configuration,
    its runners-up (avg r) with the others held at the chosen values, and why.

    - layer: the next two layers by avg r in stage A (TWMD, T = 0.1, recall, the chosen centering);
      why: under how many centerings of stage A the chosen layer is the best;
    - centering: each other centering's best avg r in stage D (at the chosen configuration and at the
      current default's); why: the paired bootstrap of the chosen minus the best other centering at
      the chosen configuration;
    - temperature, direction, iterations: the other values at the chosen configuration; a
      temperature within 0.001 of the chosen one is a near-tie, and each other one's loss is listed.
    """
    results, chosen = figures["results"], figures["results"][figures["chosen"]]
    layer, centering, t, direction = chosen["layer"], chosen["centering"], chosen["temperature"], chosen["direction"]
    current = figures["results"][figures["current_default"]]

    def r(c: dict) -> float | None:
        res = results.get(config_key(c))
        return None if res is None else res["avg_r"]

    def stage_a(c: str) -> dict[int, float]:
        return {res["layer"]: res["avg_r"] for key, res in results.items()
                if key == config_key(cfg(res["layer"], c, "twmd", 0.1, "recall"))}

    layers = stage_a(centering)
    runners = sorted((k for k in layers if k != layer), key=lambda k: -layers[k])[:2]
    losing = {c: max(stage_a(c), key=stage_a(c).get) for c in CENTERINGS if stage_a(c)}
    losing = {c: best for c, best in losing.items() if best != layer}
    why_layer = ("best under every centering" if not losing else f"best under {len(CENTERINGS) - len(losing)} of "
                 f"{len(CENTERINGS)} centerings (" + ", ".join(f"{c}: layer {k}" for c, k in losing.items()) + ")")

    others = {}
    for c in CENTERINGS:
        found = [v for v in (r(cfg(layer, c, "twmd", t, direction)),
                             r(cfg(current["layer"], c, "twmd", current["temperature"], "recall"))) if v is not None]
        if c != centering and found:
            others[c] = max(found)
    boot = figures["bootstrap_chosen_minus_other_centering"]
    why_centering = "" if not boot else (f"{centering} − {results[boot['against']]['centering']} = {boot['mean']:+.4f}, "
                                         f"95% CI [{boot['ci95'][0]:+.4f}, {boot['ci95'][1]:+.4f}]")

    temps = {T: r(cfg(layer, centering, "twmd", T, direction)) for T in TEMPERATURES if T != t}
    temps = {T: v for T, v in temps.items() if v is not None}
    runner_t = max(temps, key=temps.get)
    gap = chosen["avg_r"] - temps[runner_t]
    why_t = "; ".join(([f"near-tie (Δr {gap:.4f})"] if gap < 0.001 else [])
                      + [", ".join(f"{T:g} loses {chosen['avg_r'] - v:.3f}" for T, v in temps.items() if T != runner_t)])

    dirs = {d: r(cfg(layer, centering, "twmd", t, d)) for d in DIRECTIONS if d != direction}
    dirs = {d: v for d, v in sorted(dirs.items(), key=lambda kv: -(kv[1] or -1)) if v is not None}
    iters = {n: r(cfg(layer, centering, "twmd", t, direction, n)) for n in (3, None)}
    iters = {n: v for n, v in iters.items() if v is not None}
    better = [n for n, v in iters.items() if v > chosen["avg_r"]]
    name = lambda n: "converged" if n is None else str(n)  # noqa: E731
    rows = [["layer", str(layer), ", ".join(f"{k} ({layers[k]:.4f})" for k in runners), why_layer],
            ["centering", centering, ", ".join(f"{c} {v:.4f}" for c, v in sorted(others.items(), key=lambda kv: -kv[1])),
             why_centering],
            ["temperature", f"{t:.2f}", f"{runner_t:g} ({temps[runner_t]:.4f})", why_t],
            ["direction", direction, ", ".join(f"{d} ({v:.4f})" for d, v in dirs.items()), ""],
            ["iterations", "1", ", ".join(f"{name(n)} ({v:.4f})" for n, v in iters.items()),
             "the published default holds" if not better else "more iterations score higher: "
             + ", ".join(name(n) for n in better)]]
    return harness.table(["setting", "chosen", "runner-up (avg r)", "why"], rows)


def fmt(v: float) -> str:
    return f"{v:.4f}" if not math.isnan(v) else "nan"


def grid_table(sweep: Sweep, rows, cols, key_of, row_label: str, col_label) -> list[str]:
    """Markdown table of ``avg r / avg tau``; the best cell (by r) in bold."""
    keys = [key_of(rv, cv) for rv in rows for cv in cols]
    best = sweep.best([k for k in keys if k in sweep.results])
    lines = [f"| {row_label} | " + " | ".join(col_label(c) for c in cols) + " |",
             "|---|" + "---|" * len(cols)]
    for rv in rows:
        cells = []
        for cv in cols:
            k = key_of(rv, cv)
            if k not in sweep.results:
                cells.append("–")
                continue
            res = sweep.results[k]
            cell = f"{res['avg_r']:.4f} / {res['avg_tau']:.4f}"
            cells.append(f"**{cell}**" if k == best else cell)
        lines.append(f"| {rv} | " + " | ".join(cells) + " |")
    return lines


def ranked_table(sweep: Sweep, keys, ref_key: str | None = None) -> list[str]:
    keys = sorted(keys, key=lambda k: -sweep.results[k]["avg_r"])
    top = sweep.results[keys[0]]["avg_r"]
    lines = ["| configuration | avg r | avg τ | Δr to best |", "|---|---|---|---|"]
    for k in keys:
        res = sweep.results[k]
        name = f"**{k}**" if k == ref_key else k
        lines.append(f"| {name} | {res['avg_r']:.4f} | {res['avg_tau']:.4f} | {res['avg_r'] - top:+.4f} |")
    return lines


def main(argv=None) -> None:
    parser = harness.wmt_parser(__doc__)
    parser.add_argument("--model", default=DEFAULT_MODEL, help="encoder (default: %(default)s)")
    parser.add_argument("--n", type=int, help="pairs of harness.wmt_sample (default: every row)")
    parser.add_argument("--batch-size", type=int, default=32, help="pairs per scoring/centering batch")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default: %(default)s)")
    parser.add_argument("--no-wmd", action="store_true", help="skip exact WMD (slow: seconds per batch)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    t_start = time.perf_counter()
    timings = {}

    pairs = harness.wmt_sample(args.data, args.n, args.seed)
    library = torchmover.Scorer(args.model, device="cpu").config  # the library's defaults for the model now
    current_default = dict(layer=library.layer, centering=library.centering, method=library.method,
                           temperature=library.temperature, direction=library.direction, n_iter=library.n_iter)
    name = library.model
    report_name = "select_defaults" + harness.model_suffix(name)
    all_layers = AllLayers(args.model)
    sweep = Sweep(pairs, all_layers, args.batch_size)
    layers = range(1, all_layers.n_layers + 1)
    print(f"{sweep.n_pairs} pairs, {len(sweep.texts)} distinct texts, {len(sweep.group_names)} groups")

    # A. layer x centering, TWMD T=0.1 recall
    t0 = time.perf_counter()
    stage_a = [cfg(l, c, "twmd", 0.1, "recall") for l in layers for c in CENTERINGS]
    sweep.run(stage_a + [cfg(**current_default)], "A: layer x centering")
    best_a = sweep.results[sweep.best([config_key(c) for c in stage_a])]
    centering = best_a["centering"]

    # B. layer x T (recall), then direction x T at the best layer; TWMD n_iter=1, best centering of A
    stage_b = [cfg(l, centering, "twmd", t, "recall") for l in layers for t in TEMPERATURES]
    sweep.run(stage_b, "B: layer x T")
    layer = sweep.results[sweep.best([config_key(c) for c in stage_b])]["layer"]
    stage_b2 = [cfg(layer, centering, "twmd", t, d) for t in TEMPERATURES for d in DIRECTIONS]
    sweep.run(stage_b2, "B: direction x T")
    best_b = sweep.results[sweep.best([config_key(c) for c in stage_b + stage_b2])]
    layer = best_b["layer"]

    # C. other members: per layer (cheap ones) and at the best layer (all)
    stage_c = [cfg(l, centering, "bertscore", direction=d) for l in layers for d in DIRECTIONS]
    stage_c += [cfg(l, centering, m) for l in layers for m in ("sbert", "cka")]
    stage_c += [cfg(l, centering, "trwmd", 0.1, "recall") for l in layers]
    stage_c += [cfg(layer, centering, "trwmd", t, d) for t in TEMPERATURES for d in DIRECTIONS]
    sweep.run(stage_c, "C: other members per layer")
    t_best, d_best = best_b["temperature"], best_b["direction"]
    stage_c2 = [cfg(layer, centering, "twmd", t_best, d_best, n) for n in (3, None)]
    stage_c2 += [cfg(layer, centering, "twmd", 0.1, "recall", n) for n in (3, None)]
    sweep.run(stage_c2, "C: TWMD iterations")
    if not args.no_wmd:
        sweep.run([cfg(layer, centering, "wmd")], "C: exact WMD")

    # D. every centering at the chosen TWMD configuration (and at the current default's layer/T)
    stage_d = [cfg(layer, c, "twmd", t_best, d_best) for c in CENTERINGS]
    stage_d += [cfg(current_default["layer"], c, "twmd", current_default["temperature"], "recall") for c in CENTERINGS]
    sweep.run(stage_d, "D: centering at the chosen config")
    timings["sweep_s"] = time.perf_counter() - t0

    twmd_keys = [k for k, v in sweep.results.items() if v["method"] == "twmd"]
    chosen_key = sweep.best([k for k in twmd_keys if sweep.results[k]["n_iter"] == 1])
    chosen = sweep.results[chosen_key]
    current_key = config_key(cfg(**current_default))
    current = sweep.results[current_key]
    overall_key = sweep.best(list(sweep.results))
    near = [k for k in twmd_keys if sweep.results[k]["n_iter"] == 1
            and chosen["avg_r"] - sweep.results[k]["avg_r"] <= 0.005]
    boot = sweep.bootstrap_diff(chosen_key, current_key) if chosen_key != current_key else None
    other_centerings = [key for key in (config_key(cfg(chosen["layer"], c, "twmd", chosen["temperature"], chosen["direction"]))
                                        for c in CENTERINGS if c != chosen["centering"]) if key in sweep.results]
    runner_up = sweep.best(other_centerings) if other_centerings else None
    centering_boot = None if runner_up is None else {"against": runner_up, **sweep.bootstrap_diff(chosen_key, runner_up)}

    timings["total_s"] = time.perf_counter() - t_start

    # --- write --------------------------------------------------------------------------------------
    env = {"threads": args.threads, "batch_size": args.batch_size}
    figures = {"model": name, "n_pairs": sweep.n_pairs, "n_texts": len(sweep.texts), "env": env,
               "timings": timings, "chosen": chosen_key, "current_default": current_key,
               "best_overall": overall_key, "near_ties_0.005": near, "bootstrap_chosen_minus_current": boot,
               "bootstrap_chosen_minus_other_centering": centering_boot,
               "results": sweep.results}

    pct = lambda v: f"{v:.4f}"  # noqa: E731
    title = f"Default layer / temperature / direction / centering for `{name}` on WMT15–16"
    L = [f"{sweep.n_pairs} pairs, {len(sweep.texts)} distinct texts, {len(sweep.group_names)} groups (language pair × year). "
         f"Cells are the average over the groups of Pearson r / Kendall τ-b against the human DA score. "
         f"Each configuration is a `torchmover.Scorer`; `batch` centering per batch of {args.batch_size} pairs, sorted "
         f"by length (module docs). "
         f"torch {torch.__version__}, {args.threads} thread(s); wall time {timings['total_s'] / 60:.1f} min.", "",
         "## Choice", "",
         f"- **Chosen default (best average Pearson r among one-iteration TWMD): `{chosen_key}`** — "
         f"avg r = {pct(chosen['avg_r'])}, avg τ = {pct(chosen['avg_tau'])}.",
         f"- Current library default `{current_key}`: avg r = {pct(current['avg_r'])}, avg τ = {pct(current['avg_tau'])} "
         f"(Δr = {current['avg_r'] - chosen['avg_r']:+.4f}).",
         f"- Best of every configuration scored: `{overall_key}` — avg r = {pct(sweep.results[overall_key]['avg_r'])}, "
         f"avg τ = {pct(sweep.results[overall_key]['avg_tau'])}.",
         f"- One-iteration TWMD configurations within 0.005 of the best avg r ({len(near)}): "
         + ", ".join(f"`{k}` ({sweep.results[k]['avg_r']:.4f})" for k in sorted(near, key=lambda k: -sweep.results[k]["avg_r"])) + "."]
    for against, b in ((f"`{runner_up}`, the best other centering", centering_boot), ("the current default", boot)):
        if b:
            L.append(f"- Paired bootstrap (1000 resamples of segments within each group) of avg r(chosen) − avg r "
                     f"of {against}: {b['mean']:+.4f}, 95% CI [{b['ci95'][0]:+.4f}, {b['ci95'][1]:+.4f}], "
                     f"P(diff ≤ 0) = {b['p_le_0']:.3f}.")
    L += ["", "## A. Layer × centering (TWMD, n_iter=1, T=0.1, recall)", ""]
    L += grid_table(sweep, layers, CENTERINGS, lambda l, c: config_key(cfg(l, c, "twmd", 0.1, "recall")), "layer", str)
    L += ["", f"## B. Layer × temperature (TWMD, n_iter=1, recall, centering={centering})", ""]
    L += grid_table(sweep, layers, TEMPERATURES, lambda l, t: config_key(cfg(l, centering, "twmd", t, "recall")),
                    "layer", lambda t: f"T={t:g}")
    L += ["", f"## B'. Direction × temperature at layer {layer} (TWMD, n_iter=1, centering={centering})", ""]
    L += grid_table(sweep, DIRECTIONS, TEMPERATURES, lambda d, t: config_key(cfg(layer, centering, "twmd", t, d)),
                    "direction", lambda t: f"T={t:g}")
    L += ["", f"## C. TRWMD: direction × temperature at layer {layer} (centering={centering})", ""]
    L += grid_table(sweep, DIRECTIONS, TEMPERATURES, lambda d, t: config_key(cfg(layer, centering, "trwmd", t, d)),
                    "direction", lambda t: f"T={t:g}")
    L += ["", f"## C. Best configuration scored of each member per layer (centering={centering}; avg r / avg τ; "
          f"TWMD: T grid × recall, plus directions at layer {layer}; TRWMD: T=0.1 recall, plus the grid at layer {layer})", ""]
    members = ["twmd", "trwmd", "bertscore", "sbert", "cka"] + ([] if args.no_wmd else ["wmd"])
    L += ["| layer | " + " | ".join(members) + " |", "|---|" + "---|" * len(members)]
    for l in layers:
        cells = []
        for m in members:
            ks = [k for k, v in sweep.results.items() if v["method"] == m and v["layer"] == l
                  and v["centering"] == centering and v["n_iter"] == 1]
            if not ks:
                cells.append("–")
                continue
            k = sweep.best(ks)
            v = sweep.results[k]
            extra = "/".join(str(x) for x in (v["temperature"] and f"T={v['temperature']:g}", v["direction"]) if x)
            cells.append(f"{v['avg_r']:.4f} / {v['avg_tau']:.4f}" + (f" ({extra})" if extra else ""))
        L.append(f"| {l} | " + " | ".join(cells) + " |")
    L += ["", f"## C. Every member at layer {layer} (centering={centering}), ranked", ""]
    L += ranked_table(sweep, [k for k, v in sweep.results.items() if v["layer"] == layer and v["centering"] == centering],
                      chosen_key)
    L += ["", "## D. Centering at the chosen configuration and at the current default", ""]
    L += ranked_table(sweep, list(dict.fromkeys(config_key(c) for c in stage_d)), chosen_key)  # once each
    L += ["", f"## Per language pair: chosen `{chosen_key}`, current default `{current_key}`", ""]
    head = "| group | chosen r | chosen τ | current r | current τ |"
    L += [head, "|" + "---|" * (head.count("|") - 1)]
    for g in sweep.group_names:
        cells = [chosen["per_group"][g]["r"], chosen["per_group"][g]["tau"],
                 current["per_group"][g]["r"], current["per_group"][g]["tau"]]
        L.append(f"| {g} | " + " | ".join(fmt(v) for v in cells) + " |")
    avg = [chosen["avg_r"], chosen["avg_tau"], current["avg_r"], current["avg_tau"]]
    L.append("| **average** | " + " | ".join(f"**{v:.4f}**" for v in avg) + " |")
    L += ["", "## Timings", "", "| step | seconds |", "|---|---|"]
    L += [f"| {k} | {v:.1f} |" for k, v in timings.items()]
    tables = {"docs_choice": docs_choice_table(figures), "docs_default": docs_default_table(figures)}
    harness.publish(args.out, report_name, title, figures, tables,
                    body=["\n".join(L), "## The tables of the documentation", {"table": "docs_choice"},
                          {"table": "docs_default"}],
                    data=harness.data_provenance(args.data, args.n, args.seed))


if __name__ == "__main__":
    main()
