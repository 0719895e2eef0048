"""Self-critical training (mixed γ·L_RL + (1−γ)·L_MLE) against MLE alone on the recipe's toy task, over seeds.

For each of ``--seeds`` this runs, in a process of its own, the recipe's toy comparison::

    python recipes/self_critical_summarization.py --model tiny --output-dir <runs>/seed<S> \\
        --compare-mle --max-target-length 24 --threads 1 --quiet --seed <S> [--recipe-options ...]

(15 warm-start epochs of MLE at lr 1e-3, then 3 epochs = 120 steps of each run from the warm start at
lr 1e-4, γ = 0.9, batch 16: the recipe's defaults), then reads each run's ``summary.json`` and
``log.jsonl``: the held-out documents' mean sampled and greedy reward at the start and end of each run
(40 documents × 4 samples, fixed sampling seed), the training documents' sampled reward, and the mixed
run's mean advantage ``r(ŷ) − r(ỹ)`` over its first and last logged steps. On the final models of each
phase (``warmstart``, ``mle``, ``mixed``) it samples ``--samples`` summaries of each of the 40 held-out
documents and counts those that name the document's person and city
(``self_critical_names.name_and_city_rates``). Publishes ``self_critical_toy`` into ``--out``, with
the first seed's ``reward_curves.png`` as ``self_critical_toy.png``. Command (from the repository root;
about 90 s of one CPU core per seed)::

    python bench/studies/self_critical_toy.py --runs runs/toy_scst --out bench/results

A seed whose directory already holds a finished run (its ``summary.json``) is read, not rerun; pass
``--overwrite`` to run every seed again.
"""
from __future__ import annotations

import argparse
import json
import shlex
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "bench"), str(REPO / "bench" / "studies")]

import harness  # noqa: E402
from self_critical_names import PHASES, name_and_city_rates, recipe  # noqa: E402

RECIPE = REPO / "recipes" / "self_critical_summarization.py"
RECIPE_OPTIONS = ("--model", "tiny", "--compare-mle", "--max-target-length", "24", "--threads", "1", "--quiet")
RUNS = ("mle", "mixed")
SETTINGS = ("warmup_epochs", "warmup_lr", "epochs", "lr", "gamma", "logprob", "batch_size", "eval_examples",
            "eval_samples", "eval_every", "log_every")  # of the recipe's options, those the report states


# --- running and reading the recipe -------------------------------------------------------------------

def run_seed(run_dir: Path, seed: int, extra: list[str], overwrite: bool) -> None:
    """The recipe's toy comparison with ``--seed seed`` in ``run_dir`` (unless it finished there before)."""
    if (run_dir / "summary.json").is_file() and not overwrite:
        print(f"{run_dir}: a finished run, read as it is", flush=True)
        return
    command = [sys.executable, str(RECIPE), *RECIPE_OPTIONS, "--output-dir", str(run_dir), "--seed", str(seed),
               *extra, *(["--overwrite"] if overwrite else [])]
    print("running", shlex.join(command), flush=True)
    subprocess.run(command, check=True, cwd=REPO)


def read_events(path: Path, kind: str) -> list[dict]:
    events = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [e for e in events if e["event"] == kind]


def seed_figures(run_dir: Path, samples: int) -> dict:
    """One seed's figures: its wall time and reward signature, each run's evaluations (held-out
    ``eval`` and ``train`` documents, sampled and greedy reward per evaluated step) and mean advantage
    of its first and last logged steps, and each phase's name and city rates."""
    summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    runs = {}
    for name in RUNS:
        log = run_dir / name / "log.jsonl"
        evals = {split: [{k: e[k] for k in ("step", "reward_sampled", "reward_greedy")}
                         for e in read_events(log, "eval") if e["split"] == split] for split in ("eval", "train")}
        advantage = [e["advantage"] for e in read_events(log, "step") if "advantage" in e]
        runs[name] = {"gamma": summary["runs"][name]["gamma"], "steps": summary["runs"][name]["steps"], **evals,
                      "advantage_first": advantage[0] if advantage else None,
                      "advantage_last": advantage[-1] if advantage else None}
    config = read_events(run_dir / "mixed" / "log.jsonl", "config")[-1]["args"]
    held_out = recipe.make_toy_dataset()[-40:]
    names = {phase: name_and_city_rates(run_dir, phase, held_out, samples) for phase in PHASES}
    return {"wall_seconds": summary["wall_seconds"], "reward": summary["reward"],
            "config": {k: config[k] for k in SETTINGS}, "runs": runs, "names": names}


# --- the report ---------------------------------------------------------------------------------------

def signed(x: float) -> str:
    return f"{x:+.3f}".replace("-", "−")


def plain(x: float) -> str:
    return f"{x:.3f}".replace("-", "−")


def end_minus_start(run: dict, split: str = "eval", key: str = "reward_sampled") -> float:
    return run[split][-1][key] - run[split][0][key]


def reward_table(seeds: dict) -> dict:
    """Per seed: the held-out sampled reward after the warm start, at the end of each run (and its
    gain), the mixed run's lead; then the means and how many seeds the mixed run led in."""
    rows, gains = [], {"mle": [], "mixed": [], "lead": [], "start": []}
    for seed, f in seeds.items():
        mle, mixed = f["runs"]["mle"], f["runs"]["mixed"]
        start = mixed["eval"][0]["reward_sampled"]
        lead = mixed["eval"][-1]["reward_sampled"] - mle["eval"][-1]["reward_sampled"]
        for key, value in (("mle", end_minus_start(mle)), ("mixed", end_minus_start(mixed)), ("lead", lead),
                           ("start", start)):
            gains[key].append(value)
        rows.append([seed, f"{start:.4f}", f"{mle['eval'][-1]['reward_sampled']:.4f} ({signed(end_minus_start(mle))})",
                     f"{mixed['eval'][-1]['reward_sampled']:.4f} ({signed(end_minus_start(mixed))})", signed(lead)])
    steps = next(iter(seeds.values()))["runs"]["mixed"]["steps"]
    mean = lambda key: statistics.mean(gains[key])  # noqa: E731
    led = sum(x > 0 for x in gains["lead"])
    rows.append(["mean", f"{mean('start'):.4f}", signed(mean("mle")), f"**{signed(mean('mixed'))}**",
                 f"**{signed(mean('lead'))}** ({led} of {len(seeds)} seeds > 0)"])
    return harness.table(["seed", "start (after warm start)", f"MLE only, step {steps}", f"mixed γ = 0.9, step {steps}",
                          "mixed − MLE"], rows, "lrrrr")


def names_table(seeds: dict) -> dict:
    return harness.table(["seed", "warm start", "MLE only", "mixed"],
                         [[seed, *(f"{a:.2f} / {b:.2f}" for a, b in (f["names"][p] for p in PHASES))]
                          for seed, f in seeds.items()], "lrrr")


def series(run: dict, split: str, key: str = "reward_sampled") -> str:
    return " / ".join(plain(e[key]) for e in run[split])


def count_seeds(seeds: dict, index: int) -> int:
    """How many seeds' mixed run names the person (``index`` 0) or city (1) more often than MLE's."""
    return sum(f["names"]["mixed"][index] > f["names"]["mle"][index] for f in seeds.values())


def report(seeds: dict, samples: int, extra: list[str]) -> list:
    first_seed, first = next(iter(seeds.items()))
    mle, mixed = first["runs"]["mle"], first["runs"]["mixed"]
    steps = mixed["steps"]
    walls = [f["wall_seconds"] for f in seeds.values()]
    rest = list(seeds.values())[1:]
    others = lambda name: " / ".join(plain(f["runs"][name]["train"][-1]["reward_sampled"]) for f in rest)  # noqa: E731
    greedy = lambda name: " / ".join(plain(f["runs"][name]["eval"][-1]["reward_greedy"]) for f in seeds.values())  # noqa: E731
    advantage_first = [f["runs"]["mixed"]["advantage_first"] for f in seeds.values()]
    advantage_last = [f["runs"]["mixed"]["advantage_last"] for f in seeds.values()]
    leads = [f["runs"]["mixed"]["eval"][-1]["reward_sampled"] - f["runs"]["mle"]["eval"][-1]["reward_sampled"]
             for f in seeds.values()]
    person, city = count_seeds(seeds, 0), count_seeds(seeds, 1)
    n = len(seeds)
    c = first["config"]
    below = all(a < 0 for a in advantage_first + advantage_last)
    return [
        f"Each seed is the recipe's toy comparison ({c['warmup_epochs']} warm-start epochs of MLE at lr "
        f"{c['lr'] if c['warmup_lr'] is None else c['warmup_lr']:g}, then {c['epochs']} epochs = {steps} steps per run at lr {c['lr']:g}, γ = {c['gamma']:g}, "
        f"log p(ŷ) {'summed' if c['logprob'] == 'sum' else 'averaged'} over the sampled tokens, batch "
        f"{c['batch_size']}), one seed at a time in a process of its own:\n\n"
        "    python recipes/self_critical_summarization.py " + shlex.join(RECIPE_OPTIONS)
        + " \\\n        --output-dir <runs>/seed<S> --seed <S>" + (" " + shlex.join(extra) if extra else "") + "\n\n"
        f"Wall time: {min(walls):.0f}–{max(walls):.0f} s of one core per seed (summary.json `wall_seconds`). "
        f"Reward: `{first['reward']}` (the recipe's `SelfCriticalReward`, centering fixed "
        "on the training references).",
        "## The task\n\n"
        "`recipes/data/toy_summarization.jsonl` (`make_toy_dataset()`): 200 synthetic news items of 2–4 "
        "sentences, summary `\"<name> <verb> a <adj> <object> in <city>.\"`. Each of the 160 training documents "
        "comes with **four reference summaries, one of them from a careless annotator** (another name and another "
        "city); the 40 held-out documents have their correct summary. MLE fits the annotators' distribution, so "
        "its sampled summaries carry that noise; the reward is highest for the summary most annotators agree on, "
        "so the RL term can learn to avoid it. That is the situation in which an RL objective is expected to beat "
        "MLE on the metric (it optimises expected reward, not the likelihood of noisy references); see the last "
        "section for the clean task.",
        f"## Results: held-out sampled reward ({c['eval_examples']} documents × {c['eval_samples']} samples, "
        "fixed sampling seed)",
        {"table": "rewards"},
        f"Seed {first_seed} over training (evaluations every {c['eval_every']} steps), held-out sampled reward: MLE "
        f"{series(mle, 'eval')}, mixed {series(mixed, 'eval')}. On {c['eval_examples']} training documents (dotted in the plot) "
        f"the mixed run's sampled reward goes {plain(mixed['train'][0]['reward_sampled'])} → "
        f"{plain(mixed['train'][-1]['reward_sampled'])} vs MLE's {plain(mle['train'][0]['reward_sampled'])} → "
        f"{plain(mle['train'][-1]['reward_sampled'])}"
        + (f" (the other seeds, at step {steps}: {others('mixed')} vs {others('mle')})" if rest else "")
        + f". Greedy summaries (the mode), held-out, step {steps}: MLE {greedy('mle')}, mixed {greedy('mixed')}. "
        f"Plot of seed {first_seed}: `self_critical_toy.png` (the recipe's `reward_curves.png`).",
        f"## The mechanism: sampled summaries that name the document's person / city\n\n"
        f"On each phase's final model, {samples} sample(s) for each of the 40 held-out documents (fixed seed; "
        "`self_critical_names.name_and_city_rates`):",
        {"table": "names"},
        f"The mixed objective names the right person more often than MLE alone in {person} of {n} seeds, and the "
        f"right city in {city} of {n}. (The tiny model copies names poorly on held-out documents whatever the "
        "objective: it has seen 160.)",
        "## Earlier attempt: the clean task (every reference correct), and why it was replaced\n\n"
        "Measured on an earlier version of the toy data and not rerun here (those runs predate results that "
        "record their commit). The first version had one correct summary per document; the recipe then warmed "
        "up for 60 epochs (the model memorised the 160 training documents: training rewards ≈ 1.0, mean "
        "training advantage ≈ −0.008) and ran 100 steps. Seed 0 showed mixed 0.868 → 0.896 vs MLE 0.868 → 0.879, "
        "but seeds 1 and 2 did not replicate it: mixed +0.007 / −0.004 vs MLE +0.013 / +0.013 (mixed − MLE over "
        "the three seeds: +0.017, −0.006, −0.017). A variant with 1,960 clean training documents and a 5-epoch "
        "warm start (so that nothing is memorised) favoured MLE too (mixed − MLE −0.012 and −0.005, two seeds). "
        "On a deterministic extractive task the reference *is* the reward's optimum and MLE reaches it with a "
        "lower-variance signal than sampling, so there is nothing for the RL term to add; the noisy references "
        "above are the smallest change that gives it something to do. The settings of the current task (4 "
        "copies, one noisy; 15 + 3 epochs) were fixed before its first run and not tuned afterwards.",
        "## Caveats\n\n"
        f"- {n} seed(s), {c['eval_examples']} held-out documents × {c['eval_samples']} samples per evaluation: the "
        f"mixed run's lead over MLE ranges from {signed(min(leads))} to {signed(max(leads))} across seeds, positive "
        f"in {sum(x > 0 for x in leads)} of {n}.\n"
        f"- The mixed run's mean training advantage (first and last logged {c['log_every']} steps): "
        f"{signed(min(advantage_first))} to {signed(max(advantage_first))} at the start, "
        f"{signed(min(advantage_last))} to {signed(max(advantage_last))} at the end"
        + (": samples score below greedy, as expected for pure ancestral sampling; the gradient pushes bad samples "
           "down more than it pushes good ones up.\n" if below else ".\n")
        + "- A toy task on a tiny randomly initialised T5; nothing here is a claim about CNN/DailyMail.",
    ]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=Path, default=REPO / "runs" / "toy_scst",
                        help="directory of the runs, one seed<S>/ each (default: runs/toy_scst)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3], help="default: %(default)s")
    parser.add_argument("--samples", type=int, default=8, help="samples per held-out document for the name and "
                                                                "city rates (default: %(default)s)")
    parser.add_argument("--recipe-options", default="", help="more options for the recipe (e.g. a shorter run)")
    parser.add_argument("--overwrite", action="store_true", help="rerun seeds that finished before")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results", help="output directory")
    args = parser.parse_args(argv)
    extra = shlex.split(args.recipe_options)
    for seed in args.seeds:
        run_seed(args.runs / f"seed{seed}", seed, extra, args.overwrite)
    seeds = {str(seed): seed_figures(args.runs / f"seed{seed}", args.samples) for seed in args.seeds}
    args.out.mkdir(parents=True, exist_ok=True)
    plot = args.runs / f"seed{args.seeds[0]}" / "reward_curves.png"
    if plot.is_file():  # copied atomically, like the result
        shutil.copyfile(plot, args.out / "self_critical_toy.png.tmp")
        (args.out / "self_critical_toy.png.tmp").replace(args.out / "self_critical_toy.png")
    harness.publish(args.out, "self_critical_toy",
                    "Self-critical (mixed γ·L_RL + (1−γ)·L_MLE) vs MLE alone on the toy summarization task",
                    {"seeds": seeds, "samples": args.samples, "recipe_options": [*RECIPE_OPTIONS, *extra]},
                    {"rewards": reward_table(seeds), "names": names_table(seeds)}, report(seeds, args.samples, extra))


if __name__ == "__main__":
    main()
