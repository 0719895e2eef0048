"""Choose the fine-tuning recipe's defaults by a paired comparison per seed.

Coordinate ascent from the incumbent (the defaults before the choice), one factor per stage; every
candidate is ``recipes/finetune_wmt.py`` trained on WMT15 minus a 10% dev split and tested on WMT16,
with the same seeds for every candidate (a seed fixes its dev split, data order and dropout). The test
year never chooses: a candidate's figure for a seed is its dev Pearson r (of the epoch the recipe keeps).

**The rule** (:func:`paired_decision`). Seed-to-seed dev r varies far more (about 0.05) than the
candidates differ, but it varies alike for every candidate of a seed, so candidates are compared seed
by seed: for a challenger, ``d_s = dev_r(challenger, s) - dev_r(incumbent, s)``, ``mean(d)`` against
its standard error ``SE = sd(d) / sqrt(n)``, ``t = mean(d) / SE`` with ``n - 1`` degrees of freedom.
The stage's challenger with the largest ``mean(d)`` replaces the incumbent only if its one-sided
p-value is below ``--alpha / k`` (Bonferroni over the stage's ``k`` challengers). Each stage reports,
per challenger, ``mean(d)``, ``SE``, ``t``, ``p`` and the smallest gain this many seeds could detect
(``t_crit * SE``).

Every seed of every candidate runs in its own process (``--jobs`` at once; on one GPU they share it),
in ``OUT/runs/<candidate>/seed-S``; the recipe's ``--seeds`` then assembles each candidate's seed
table and its ``final/`` (the best-dev seed). Finished runs are read, not rerun, so an interrupted
choice resumes where it stopped. Publishes ``finetune_defaults_runs`` (every stage, every candidate's
per-seed dev r, the paired figures, the adoption, and the chosen defaults against the incumbent's)
into ``--report`` (default: ``OUT``).

``--redecide RUNS.json`` applies the rule to the stored stages of an earlier choice (no training) and
publishes ``finetune_defaults_paired``.

Commands (from the repository root)::

    python bench/studies/choose_finetune_defaults.py --data ../shared/data/wmt15-16 --out runs/defaults \\
        [--device cuda --jobs 12]
    python bench/studies/choose_finetune_defaults.py --redecide bench/results/finetune_defaults_runs.json
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import math
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "finetune_wmt.py"
sys.path.insert(0, str(REPO / "bench"))
import harness  # noqa: E402

INCUMBENT = {"layer": 6, "centering": "batch", "temperature": 0.15, "lr": 2e-4, "loss": "mse+pearson", "epochs": 1}
STAGES = (
    ("layer x centering while training", [{"layer": layer, "centering": c} for layer in (4, 6) for c in ("batch", "none")]),
    ("temperature", [{"temperature": t} for t in (0.10, 0.15)]),
    ("learning rate", [{"lr": lr} for lr in (1e-4, 2e-4, 4e-4)]),
    ("loss", [{"loss": loss} for loss in ("mse", "mse+pearson", "mse+rank")]),
    ("epochs", [{"epochs": e} for e in (1, 2)]),
)


def name_of(options: dict) -> str:
    """A candidate's directory name: its options in a fixed order."""
    return "_".join(f"{key}-{options[key]:g}" if isinstance(options[key], float) else f"{key}-{options[key]}"
                    for key in INCUMBENT).replace("+", "")


# --- the rule -------------------------------------------------------------------------------------

def paired(incumbent: list[float], challenger: list[float], alpha: float) -> dict:
    """The paired comparison of one challenger with the incumbent, seed by seed (same seeds, same
    order): the differences ``d``, their mean, ``SE = sd(d) / sqrt(n)``, ``t = mean / SE``, the one-sided
    p-value of ``mean > 0`` (Student's t, ``n - 1`` degrees of freedom), the critical ``t`` at ``alpha``
    and the smallest mean gain these seeds could detect, ``t_crit * SE``."""
    from scipy import stats

    if len(incumbent) != len(challenger) or len(incumbent) < 2:
        raise ValueError(f"a paired comparison needs the same seeds, at least 2: {len(incumbent)} and {len(challenger)}")
    d = [c - i for c, i in zip(challenger, incumbent)]
    n, mean = len(d), statistics.fmean(d)
    se = statistics.stdev(d) / math.sqrt(n)
    t = mean / se if se > 0 else math.copysign(math.inf, mean) if mean else 0.0
    t_crit = float(stats.t.ppf(1 - alpha, n - 1))
    return {"d": d, "mean": mean, "se": se, "t": t, "p": float(stats.t.sf(t, n - 1)), "t_crit": t_crit,
            "detectable": t_crit * se, "alpha": alpha}


def paired_decision(incumbent: list[float], challengers: dict[str, list[float]], alpha: float = 0.05) -> dict:
    """Whether the stage's best challenger (largest mean paired difference) replaces the incumbent:
    only if its one-sided p-value is below ``alpha / k`` for the stage's ``k`` challengers
    (Bonferroni). Returns every challenger's :func:`paired` figures, the best one and the adoption."""
    if not challengers:
        raise ValueError("a stage needs at least one challenger")
    level = alpha / len(challengers)
    figures = {name: paired(incumbent, runs, level) for name, runs in challengers.items()}
    best = max(figures, key=lambda name: figures[name]["mean"])
    return {"challengers": figures, "best": best, "alpha": alpha, "level": level,
            "adopted": figures[best]["mean"] > 0 and figures[best]["p"] < level}


# --- running the candidates -----------------------------------------------------------------------

def recipe_args(options: dict, data: Path, args: argparse.Namespace) -> list[str]:
    flags = [f"--{key}={value}" for key, value in options.items()]
    return [sys.executable, str(RECIPE), "--train", *map(str, sorted(data.glob("wmt15.*.tsv"))),
            "--test", *map(str, sorted(data.glob("wmt16.*.tsv"))), "--dev-fraction", "0.1", *flags,
            "--threads", str(args.threads), "--n-boot", str(args.n_boot), "--no-plot", "--no-progress",
            *(["--device", args.device] if args.device else []), *(["--max-train-pairs", str(args.max_train_pairs)]
                                                                  if args.max_train_pairs else [])]


def run(command: list[str], log: Path) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w", encoding="utf-8") as out:
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}); its output: {log}")


def evaluate(candidates: list[dict], args: argparse.Namespace) -> dict[str, dict]:
    """Run every seed of every candidate not run yet (``--jobs`` at once), then each candidate's seed
    table; returns ``{name: seeds.json}``."""
    runs = args.out / "runs"
    todo = [(c, s) for c in candidates for s in args.seeds
            if not (runs / name_of(c) / f"seed-{s}" / "result.json").is_file()]
    with ThreadPoolExecutor(args.jobs) as pool:
        list(pool.map(lambda job: run(recipe_args(job[0], args.data, args) + [
            "--seed", str(job[1]), "--output", str(runs / name_of(job[0]) / f"seed-{job[1]}"), "--overwrite"],
            runs / name_of(job[0]) / f"seed-{job[1]}.log"), todo))
    tables = {}
    for c in candidates:  # reads the finished seeds: writes seeds.json / seeds.md and final/, once
        out = runs / name_of(c)
        if assembled_seeds(out) != list(args.seeds):  # an incumbent carried over keeps its table
            run(recipe_args(c, args.data, args) + ["--seeds", ",".join(map(str, args.seeds)), "--output", str(out)],
                out / "seeds.log")
        tables[name_of(c)] = json.loads((out / "seeds.json").read_text(encoding="utf-8"))
    return tables


def assembled_seeds(out: Path) -> list[int] | None:
    """The seeds of ``out``'s seed table, or None before it is written."""
    table = out / "seeds.json"
    return [row["seed"] for row in json.loads(table.read_text(encoding="utf-8"))["seeds"]] if table.is_file() else None


def decide_stage(title: str, incumbent: dict, candidates: list[dict], alpha: float) -> dict:
    """A stage's record: its candidates (options, per-seed dev r, mean, test r after) and the
    :func:`paired_decision` of its challengers against ``incumbent``."""
    by_name = {name_of(c["options"]): c for c in candidates}
    decision = paired_decision(by_name[name_of(incumbent)]["dev_r"],
                               {name: c["dev_r"] for name, c in by_name.items() if name != name_of(incumbent)}, alpha)
    return {"stage": title, "incumbent": dict(incumbent), "candidates": candidates, "decision": decision,
            "best_challenger": by_name[decision["best"]]["options"], "adopted": decision["adopted"]}


def choose(args: argparse.Namespace) -> dict:
    incumbent, stages = dict(INCUMBENT), []
    for title, variations in STAGES:
        started = time.perf_counter()
        candidates = [{**incumbent, **v} for v in variations]
        if incumbent not in candidates:
            candidates.insert(0, dict(incumbent))
        tables = evaluate(candidates, args)
        stage = decide_stage(title, incumbent, [
            {"options": c, "dev_r": [row["dev_r"] for row in tables[name_of(c)]["seeds"]],
             "mean_dev_r": tables[name_of(c)]["stats"]["dev_r"]["mean"],
             "test_r_after": tables[name_of(c)]["stats"]["r_after"]["mean"]} for c in candidates], args.alpha)
        stage["seconds"] = time.perf_counter() - started
        stages.append(stage)
        if stage["adopted"]:
            incumbent = stage["best_challenger"]
        print(f"{title}: {'adopted ' + name_of(incumbent) if stage['adopted'] else 'kept ' + name_of(incumbent)}",
              flush=True)
    runs = args.out / "runs"
    final = {name: json.loads((runs / name / "seeds.json").read_text(encoding="utf-8"))
             for name in dict.fromkeys((name_of(INCUMBENT), name_of(incumbent)))}
    return {"incumbent": INCUMBENT, "chosen": incumbent, "alpha": args.alpha, "seeds": args.seeds, "stages": stages,
            "final": final, "device": args.device or "default"}


def redecide(stored: dict, alpha: float) -> dict:
    """The paired rule applied to the stages of a stored choice (``finetune_defaults_runs.json``'s
    figures). A stage that the rule would have ended with another incumbent leaves the later stages
    undecided: they ran around the old one."""
    incumbent, stages = dict(stored["incumbent"]), []
    for old in stored["stages"]:
        if old["incumbent"] != incumbent:
            break
        stage = decide_stage(old["stage"], incumbent, old["candidates"], alpha)
        stage["adopted_by_the_old_rule"] = old["adopted"]
        stages.append(stage)
        if stage["adopted"]:
            incumbent = stage["best_challenger"]
    return {"incumbent": stored["incumbent"], "chosen": incumbent, "alpha": alpha, "seeds": stored["seeds"],
            "stages": stages, "complete": len(stages) == len(stored["stages"]),
            "changed": incumbent != stored["chosen"]}


# --- reports --------------------------------------------------------------------------------------

def stage_table(stage: dict) -> dict:
    rows = []
    for c in stage["candidates"]:
        name = name_of(c["options"])
        f = stage["decision"]["challengers"].get(name)
        paired_cells = (["–"] * 5 if f is None else
                        [f"{f['mean']:+.4f}", f"{f['se']:.4f}", f"{f['t']:+.2f}", f"{f['p']:.3f}", f"{f['detectable']:.4f}"])
        mark = " (incumbent)" if f is None else ""
        rows.append([f"`{name}`{mark}", ", ".join(f"{r:.3f}" for r in c["dev_r"]), f"{c['mean_dev_r']:.4f}", *paired_cells,
                     f"{c['test_r_after']:.4f}"])
    return harness.table(["candidate", "dev r per seed", "mean dev r", "mean paired Δ", "SE", "t", "p (one-sided)",
                          "detectable Δ", "WMT16 r after (mean)"], rows, align="--rrrrrrr")


def stage_verdict(stage: dict) -> str:
    d = stage["decision"]
    best = d["challengers"][d["best"]]
    return (f"Best challenger `{d['best']}`: mean paired Δ {best['mean']:+.4f} ± {best['se']:.4f} (SE), "
            f"t = {best['t']:+.2f}, p = {best['p']:.3f} against the level {d['level']:.4f} "
            f"(α = {d['alpha']} / {len(d['challengers'])} challengers). "
            + ("**Adopted.**" if stage["adopted"] else "Kept the incumbent."))


def summary_table(result: dict) -> dict:
    """One row per stage: its best challenger's paired figures and the decision."""
    rows = []
    for stage in result["stages"]:
        d = stage["decision"]
        f = d["challengers"][d["best"]]
        changed = {k: v for k, v in stage["best_challenger"].items() if stage["incumbent"][k] != v}
        rows.append([stage["stage"], ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}"
                                               for k, v in changed.items()),
                     f"{f['mean']:+.4f}", f"{f['se']:.4f}", f"{f['t']:+.2f}", f"{f['t_crit']:.2f}",
                     f"{f['detectable']:.4f}", "adopted" if stage["adopted"] else "kept the incumbent"])
    return harness.table(["stage", "best challenger", "mean paired Δ dev r", "SE", "t", "t needed",
                          "smallest detectable Δ", "decision"], rows, align="--rrrrr-")


def seeds_table(seeds: dict) -> dict:
    """The documentation's table of one candidate's seeds (``docs_seeds``), from the recipe's
    ``seeds.json``: per seed and mean ± sd, dev r, WMT16 r and τ before and after, and the gains."""
    columns = (("dev_r", "dev r", ".3f"), ("r_before", "r before", ".3f"), ("r_after", "r after", ".3f"),
               ("delta_r", "Δr", "+.3f"), ("tau_before", "τ before", ".3f"), ("tau_after", "τ after", ".3f"),
               ("delta_tau", "Δτ", "+.3f"))
    rows = [[str(row["seed"]), *(format(row[key], fmt) for key, _, fmt in columns)] for row in seeds["seeds"]]
    stats = seeds["stats"]
    mean = [f"{format(stats[key]['mean'], fmt)} ± {stats[key]['sd']:.3f}" for key, _, fmt in columns]
    mean[2] = f"**{mean[2]}**"  # r after: the figure the defaults are read by
    rows.append([f"**mean ± sd** (n={len(seeds['seeds'])})", *mean])
    return harness.table(["seed", *(name for _, name, _ in columns)], rows, "r" * (len(columns) + 1))


MEMBERS = {"twmd": "TWMD (recall, T = 0.15)", "bertscore_f1": "BERTScore F1", "trwmd": "TRWMD (recall, T = 0.15)",
           "sbert": "SBERT mean pooling"}


def members_table(figures: dict) -> dict:
    """The documentation's table of the members fine-tuned under the defaults (``docs_members``), from
    each member's ``seeds.json`` (``finetune_members_wmt15_to_16``'s figures): mean ± sd over the seeds,
    gains in Pearson / Kendall points; the best member of each column after fine-tuning in bold."""
    stats = {name: figures[name]["stats"] for name in MEMBERS}
    best = {key: max(stats, key=lambda name: stats[name][key]["mean"])
            for key in ("r_after", "delta_r", "tau_after", "delta_tau")}
    bold = lambda text, name, key: f"**{text}**" if best[key] == name else text  # noqa: E731
    rows = []
    for name, label in MEMBERS.items():
        f = stats[name]
        spread = lambda key, scale=1, fmt=".3f": f"{format(scale * f[key]['mean'], fmt)} ± {scale * f[key]['sd']:.{fmt[-2]}f}"  # noqa: E731
        rows.append([label, spread("dev_r"), f"{f['r_before']['mean']:.3f}", bold(spread("r_after"), name, "r_after"),
                     bold(spread("delta_r", 100, "+.1f"), name, "delta_r")
                     + f" ({100 * f['delta_r']['min']:+.1f} … {100 * f['delta_r']['max']:+.1f})",
                     bold(spread("tau_after"), name, "tau_after"), bold(spread("delta_tau", 100, "+.1f"), name, "delta_tau")])
    return harness.table(["member (top layer, 1 epoch, lr 2e-4; 3 seeds, mean ± sd)", "dev r after", "r before",
                          "r after", "Δr, points (range)", "τ after", "Δτ, points"], rows, "-rrrrrr")


def publish_stages(out: Path, name: str, title: str, result: dict, intro: list[str]) -> Path:
    tables, body = {"summary": summary_table(result)}, [*intro, {"table": "summary"}]
    for k, stage in enumerate(result["stages"], 1):
        tables[f"stage{k}"] = stage_table(stage)
        body += [f"## {stage['stage']}", {"table": f"stage{k}"}, stage_verdict(stage)]
    if "final" in result:  # a choice that ran: the chosen defaults' seeds, as the documentation shows them
        tables["docs_seeds"] = seeds_table(result["final"][name_of(result["chosen"])])
        body += ["## The table of the documentation", {"table": "docs_seeds"}]
    return harness.publish(out, name, title, result, tables, body)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=harness.DEFAULT_DATA, help="the WMT15-16 TSV directory")
    parser.add_argument("--out", type=Path, help="runs go here (resumable)")
    parser.add_argument("--report", type=Path, help="where the result is published (default: --out; "
                        "with --redecide: bench/results)")
    parser.add_argument("--redecide", type=Path, metavar="RUNS_JSON", help="apply the rule to a stored choice's runs")
    parser.add_argument("--device", help="the recipe's --device (default: its own rule)")
    parser.add_argument("--jobs", type=int, default=1, help="recipe processes at once (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads per process (default: %(default)s)")
    parser.add_argument("--n-boot", type=int, default=1000, help="bootstrap resamples of each test report")
    parser.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1, 2],
                        help="comma-separated seeds of every candidate (default: 0,1,2)")
    parser.add_argument("--alpha", type=float, default=0.05, help="one-sided level of a stage, split over its challengers")
    parser.add_argument("--max-train-pairs", type=int, default=0, help="a smoke test's training subset (0: all)")
    args = parser.parse_args(argv)
    if not 0 < args.alpha < 1:
        parser.error(f"--alpha must be in (0, 1), got {args.alpha}")
    if args.redecide:
        stored = harness.load(args.redecide)
        result = redecide(stored["figures"], args.alpha)
        verdict = ("The defaults change to `" + name_of(result["chosen"]) + "`." if result["changed"]
                   else "The defaults do not change.") + ("" if result["complete"] else
                                                            " Later stages ran around the old incumbent: rerun them.")
        publish_stages(args.report or REPO / "bench" / "results", "finetune_defaults_paired",
                       "The fine-tuning defaults re-decided by the paired rule, on the stored runs", result,
                       [f"The stages of `{args.redecide.name}` (its runs: {stored['provenance']['command']}), "
                        "re-decided without training by the paired rule of `bench/studies/choose_finetune_defaults.py`: "
                        "per seed, challenger minus incumbent dev r; the best challenger adopted only if "
                        "its mean paired Δ is significant at α / k (one-sided t, n − 1 degrees of freedom). "
                        "*detectable Δ* = t_crit · SE, the smallest mean gain these seeds could have shown. " + verdict])
        return
    if args.out is None:
        parser.error("--out is required to run the choice")
    result = choose(args)
    publish_stages(args.report or args.out, "finetune_defaults_runs",
                   "The fine-tuning recipe's defaults, chosen by a paired comparison per seed", result,
                   [f"Device: {result['device']}. Seeds {', '.join(map(str, result['seeds']))}; "
                    f"α = {result['alpha']} per stage. Chosen: `{name_of(result['chosen'])}`."])


if __name__ == "__main__":
    main()
