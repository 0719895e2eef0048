"""Smoke tests of bench/ and bench/studies/: every script imports and parses its command line, and the
ones that run in seconds on tiny data (the tiny random model of conftest.py, a 24-row WMT-style
directory) run end to end and publish a result with its provenance."""
import importlib.util
import sys
from pathlib import Path

import pytest

from conftest import WORDS

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
sys.path[:0] = [str(BENCH), str(BENCH / "studies")]

import harness  # noqa: E402

SCRIPTS = sorted(p for p in [*BENCH.glob("*.py"), *(BENCH / "studies").glob("*.py")]
                 if p.name not in ("harness.py", "bench_common.py"))


def load_script(path: Path):
    spec = importlib.util.spec_from_file_location(f"bench_smoke_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def wmt(tmp_path_factory):
    """Two WMT-style files of 12 rows each over the tiny model's vocabulary."""
    import random

    directory = tmp_path_factory.mktemp("wmt")
    rng = random.Random(0)
    for k, name in enumerate(("wmt15.cs-en.tsv", "wmt16.de-en.tsv")):
        rows = ["lp\tyear\tref\thyp\tscore"]
        for _ in range(12):
            ref, hyp = (" ".join(rng.choices(WORDS, k=rng.randint(3, 9))) for _ in range(2))
            rows.append(f"{name[6:11]}\t{2015 + k}\t{ref}\t{hyp}\t{rng.uniform(-1, 1):.3f}")
        (directory / name).write_text("\n".join(rows) + "\n", encoding="utf-8")
    return directory


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


@pytest.mark.parametrize("script, name, args", [
    ("bench_evaluation.py", "bench_evaluation", ["--pairs", "12", "--repeats", "1", "--threads", "1", "--model", TINY]),
    ("bench_ops.py", "bench_ops", ["--pairs", "24", "--model", TINY]),
    ("studies/reward_scale.py", "reward_scale", ["--pairs", "8", "--threads", "1", "--model", TINY]),
    ("bench_batching.py", "bench_batching", ["--calls", "8", "--callers", "2", "--repeats", "1", "--threads", "1"]),
    ("studies/compare_bertscore.py", "compare_bertscore", ["--pairs", "8", "--batch-size", "4"]),
], ids=lambda v: v if isinstance(v, str) and v.endswith(".py") else "")
def test_a_script_runs_on_tiny_data_and_publishes(script, name, args, wmt, tiny_model_dir, tmp_path, capsys):
    """(bench_batching and compare_bertscore read the default offline model.)"""
    module = load_script(BENCH / script)
    args = [str(tiny_model_dir) if a is TINY else a for a in args]
    module.main([*args, "--data", str(wmt), "--out", str(tmp_path)])
    res = published(tmp_path, name, args)
    assert res["provenance"]["data"]["files"] == ["wmt15.cs-en.tsv", "wmt16.de-en.tsv"]
    assert res["body"] and all(t["rows"] for t in res["tables"].values())


def test_select_defaults_correlates_as_scipy_does_per_group():
    """The study's correlations come from ``evaluation.correlate``: the Pearson r and Kendall τ-b of
    each group that ``scipy.stats`` gives, and their unweighted average."""
    import types

    import numpy as np
    from scipy import stats

    select_defaults = load_script(BENCH / "studies" / "select_defaults.py")
    rng = np.random.default_rng(0)
    groups = np.array(["cs-en 2015"] * 40 + ["de-en 2016"] * 30)
    human = rng.normal(size=70)
    scores = human + rng.normal(size=70)
    scores[:5] = scores[5]  # ties
    sweep = types.SimpleNamespace(groups=groups, human=human)
    out = select_defaults.Sweep.correlate(sweep, scores)
    for g in ("cs-en 2015", "de-en 2016"):
        sel = groups == g
        assert out["per_group"][g]["r"] == pytest.approx(stats.pearsonr(scores[sel], human[sel])[0], abs=1e-12)
        assert out["per_group"][g]["tau"] == pytest.approx(stats.kendalltau(scores[sel], human[sel])[0], abs=1e-12)
    assert out["avg_r"] == pytest.approx(np.mean([v["r"] for v in out["per_group"].values()]))


@pytest.mark.parametrize("study, table, make", [
    ("select_defaults", "docs_default", "docs_default_table"),
    ("compare_bertscore", "docs_comparison", "docs_table"),
    ("compare_moverscore", "docs_comparison", "docs_table"),
    ("compare_authors", "docs_members", "docs_table"),
    ("robustness", "docs_variants", "docs_table"),
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
    row = bench_gpu.reward_breakdown(str(tiny_model_dir), 2, pairs, "cpu", 2, repeats=2)
    assert row["completions"] == 2 * bench_gpu.COMPLETIONS_PER_PROMPT and len(row["scores"]) == row["completions"]
    assert row["call"] >= row["encoder"] > 0 and row["call_without_syncs"] > 0
    row.update(variant="fp32", max_diff=0.0)
    tables = bench_gpu.docs_tables({"default": {"layer": 2, "systems": systems, "reward": [row]}}, len(pairs))
    assert len(tables["docs_scoring"]["rows"]) == 2 and tables["docs_reward"]["rows"][0][2] == "fp32"
