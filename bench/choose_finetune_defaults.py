"""Choose the fine-tuning recipe's defaults by the rule of ``bench/results/finetune_defaults.md``.

Coordinate ascent from the incumbent (the defaults before the choice), one factor per stage; every
candidate is ``recipes/finetune_wmt.py`` trained on WMT15 minus a 10% dev split and tested on WMT16,
with three seeds (each its own dev split, data order and dropout). A candidate's score is its mean
dev Pearson r over the seeds (the dev r of the epoch the recipe keeps); the test year never chooses.
In each stage the best candidate replaces the incumbent only if its mean is at least ``--margin``
(0.003) above the incumbent's.

Every seed of every candidate runs in its own process (``--jobs`` at once; on one GPU they share it),
in ``OUT/runs/<candidate>/seed-S``; the recipe's ``--seeds`` then assembles each candidate's seed
table and its ``final/`` (the best-dev seed). Finished runs are read, not rerun, so an interrupted
choice resumes where it stopped. Writes ``OUT/finetune_defaults_runs.md`` and ``.json``: every stage,
every candidate's per-seed dev r, the adoption, and the chosen defaults against the incumbent's
(dev r, WMT16 r before and after, the gain, Kendall τ; mean ± sd over the seeds).

Command (from the repository root)::

    python bench/choose_finetune_defaults.py --data ../shared/data/wmt15-16 --out runs/defaults \\
        [--device cuda --jobs 12]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "finetune_wmt.py"

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


def mean_dev(table: dict) -> float:
    return table["stats"]["dev_r"]["mean"]


def choose(args: argparse.Namespace) -> dict:
    incumbent, stages = dict(INCUMBENT), []
    for title, variations in STAGES:
        started = time.perf_counter()
        candidates = [{**incumbent, **v} for v in variations]
        if incumbent not in candidates:
            candidates.insert(0, dict(incumbent))
        tables = evaluate(candidates, args)
        scores = {name_of(c): mean_dev(tables[name_of(c)]) for c in candidates}
        best = max((c for c in candidates if c != incumbent), key=lambda c: scores[name_of(c)])
        adopted = scores[name_of(best)] >= scores[name_of(incumbent)] + args.margin
        stages.append({"stage": title, "incumbent": dict(incumbent), "best_challenger": best, "adopted": adopted,
                       "seconds": time.perf_counter() - started,
                       "candidates": [{"options": c, "mean_dev_r": scores[name_of(c)],
                                       "dev_r": [row["dev_r"] for row in tables[name_of(c)]["seeds"]],
                                       "test_r_after": tables[name_of(c)]["stats"]["r_after"]["mean"]}
                                      for c in candidates]})
        if adopted:
            incumbent = best
        report(args, {"incumbent": INCUMBENT, "chosen": None, "margin": args.margin, "seeds": args.seeds,
                      "stages": stages, "final": None, "device": args.device or "default", "command": " ".join(sys.argv)})
        print(f"{title}: {'adopted ' + name_of(best) if adopted else 'kept ' + name_of(incumbent)}", flush=True)
    runs = args.out / "runs"
    final = {name: json.loads((runs / name / "seeds.json").read_text(encoding="utf-8"))
             for name in dict.fromkeys((name_of(INCUMBENT), name_of(incumbent)))}
    result = {"incumbent": INCUMBENT, "chosen": incumbent, "margin": args.margin, "seeds": args.seeds, "stages": stages,
              "final": final, "device": args.device or "default", "command": " ".join(sys.argv)}
    report(args, result)
    return result


def report(args: argparse.Namespace, result: dict) -> None:
    """The report so far (after each stage), written atomically."""
    args.out.mkdir(parents=True, exist_ok=True)
    for name, text in (("finetune_defaults_runs.json", json.dumps(result, indent=1) + "\n"),
                       ("finetune_defaults_runs.md", markdown(result))):
        (args.out / (name + ".tmp")).write_text(text, encoding="utf-8")
        (args.out / (name + ".tmp")).replace(args.out / name)


def markdown(result: dict) -> str:
    lines = ["# The fine-tuning recipe's defaults, chosen by the rule of `finetune_defaults.md`", "",
             f"`python {' '.join(Path(a).name if a.endswith('.py') else a for a in result['command'].split())}`", "",
             f"Device: {result['device']}. Seeds {', '.join(map(str, result['seeds']))}; adoption margin "
             f"{result['margin']} mean dev r.", ""]
    for stage in result["stages"]:
        lines += [f"## {stage['stage']} ({stage['seconds']:.0f} s)", "",
                  "| candidate | dev r per seed | mean dev r | WMT16 r after (mean) |", "|---|---|---:|---:|"]
        for c in stage["candidates"]:
            mark = " (incumbent)" if c["options"] == stage["incumbent"] else ""
            lines.append(f"| `{name_of(c['options'])}`{mark} | {', '.join(f'{r:.3f}' for r in c['dev_r'])} | "
                         f"{c['mean_dev_r']:.4f} | {c['test_r_after']:.4f} |")
        lines += ["", f"{'Adopted' if stage['adopted'] else 'Kept the incumbent; best challenger'}: "
                      f"`{name_of(stage['best_challenger'])}`.", ""]
    if result["final"] is None:
        return "\n".join(lines) + "\n(stages still to run)\n"
    lines += ["## Chosen against the defaults before", "",
              "| defaults | dev r | WMT16 r before | WMT16 r after | gain Δr | τ after |", "|---|---:|---:|---:|---:|---:|"]
    for label, name in (("before", name_of(result["incumbent"])), ("chosen", name_of(result["chosen"]))):
        s = result["final"][name]["stats"]
        cell = lambda key, fmt="{:.3f}": f"{fmt.format(s[key]['mean'])} ± {s[key]['sd']:.3f}"  # noqa: E731
        lines.append(f"| {label}: `{name}` | {cell('dev_r')} | {cell('r_before')} | {cell('r_after')} | "
                     f"{cell('delta_r', '{:+.3f}')} | {cell('tau_after')} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="the WMT15-16 TSV directory")
    parser.add_argument("--out", type=Path, required=True, help="runs and the report go here (resumable)")
    parser.add_argument("--device", help="the recipe's --device (default: its own rule)")
    parser.add_argument("--jobs", type=int, default=1, help="recipe processes at once (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads per process (default: %(default)s)")
    parser.add_argument("--n-boot", type=int, default=1000, help="bootstrap resamples of each test report")
    parser.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1, 2],
                        help="comma-separated seeds of every candidate (default: 0,1,2)")
    parser.add_argument("--margin", type=float, default=0.003, help="mean dev r a challenger must gain")
    parser.add_argument("--max-train-pairs", type=int, default=0, help="a smoke test's training subset (0: all)")
    args = parser.parse_args()
    print(markdown(choose(args)))


if __name__ == "__main__":
    main()
