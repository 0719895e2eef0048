"""bench/studies/precision.py: its drift summary and memory reading against hand-computed cases, its
command line's checks, and a run end to end on tiny data (the tiny random model of conftest.py in
float32 and bf16, a 24-row WMT-style directory) that publishes what the library's Scorer and
``evaluation.correlation`` compute."""
import sys
import time
from pathlib import Path

import pytest
import torch

from test_bench_scripts import write_wmt

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "bench" / "studies")]

import harness  # noqa: E402
from conftest import load_file


precision = load_file(ROOT / "bench" / "studies" / "precision.py", "study_precision")


def test_drift_of_scores_that_keep_their_order():
    d = precision.drift([0.1, 0.2, 0.3, 0.4], [0.1, 0.2025, 0.28, 0.41])
    # |Δ| = 0, 0.0025, 0.02, 0.01: max 0.02, mean 0.0325 / 4; three of four above 1e-3; no pair swaps
    assert d["max_abs"] == pytest.approx(0.02) and d["mean_abs"] == pytest.approx(0.008125)
    assert d["moved"] == 0.75 and d["kendall"] == pytest.approx(1.0) and d["non_finite"] == 0


def test_drift_counts_a_swapped_pair_and_a_score_that_is_not_finite():
    d = precision.drift([0.1, 0.2, 0.3, 0.4, 0.5], [0.1, 0.31, 0.3, 0.4, float("nan")])
    # over the four finite pairs: |Δ| = 0, 0.11, 0, 0; of their 6 pairs of pairs one swaps: τ = (5 − 1) / 6
    assert d["max_abs"] == pytest.approx(0.11) and d["mean_abs"] == pytest.approx(0.0275)
    assert d["moved"] == 0.25 and d["kendall"] == pytest.approx(2 / 3) and d["non_finite"] == 1
    assert precision.drift([1.0, 2.0], [1.0, 2.0]) == {"max_abs": 0.0, "mean_abs": 0.0, "moved": 0.0, "kendall": 1.0,
                                                        "non_finite": 0}


def test_drift_is_undefined_where_fewer_than_two_pairs_have_finite_scores():
    d = precision.drift([0.1, 0.2, 0.3], [float("nan"), float("inf"), 0.3])
    assert d["non_finite"] == 2 and all(d[k] != d[k] for k in ("max_abs", "mean_abs", "moved", "kendall"))  # NaN


@pytest.mark.parametrize("reference, other", [([0.1, 0.2], [0.1]), ([], []), ([[0.1]], [[0.1]])])
def test_drift_refuses_lists_that_do_not_match(reference, other):
    with pytest.raises(ValueError, match="equally long, non-empty"):
        precision.drift(reference, other)


def test_peak_memory_on_the_cpu_sees_a_buffer_held_during_the_block():
    with precision.PeakMemory(torch.device("cpu")) as memory:
        x = torch.ones(64 * 2**20 // 4)  # 64 MiB, written
        time.sleep(0.05)  # several samples
        del x
    assert 48 <= memory.growth_mib < 1024


@pytest.mark.parametrize("dtypes, message", [("float32", "at least two"), ("float32,fp32", "at least two"),
                                              ("float32,int8", "--dtypes: dtype must be")])
def test_the_command_line_refuses_dtypes_it_cannot_compare(dtypes, message, capsys):
    with pytest.raises(SystemExit) as done:
        precision.main(["--dtypes", dtypes])
    assert done.value.code == 2 and message in capsys.readouterr().err


def test_precision_runs_end_to_end_on_tiny_data(tiny_model_dir, tmp_path):
    from torchmover.evaluation.correlation import correlate

    wmt = write_wmt(tmp_path, ("wmt15.cs-en.tsv", "wmt16.de-en.tsv"), 12)
    precision.main(["--data", str(wmt), "--model", str(tiny_model_dir), "--layer", "2", "--rounds", "2",
                    "--n-boot", "50", "--out", str(tmp_path)])
    (path,) = tmp_path.glob("precision_cpu*.json")
    res = harness.load(path)
    assert (tmp_path / f"{path.stem}.md").read_text(encoding="utf-8") == harness.render(res)
    assert res["provenance"]["commit"] != "unknown" and res["provenance"]["data"]["files"] == [
        "wmt15.cs-en.tsv", "wmt16.de-en.tsv"]
    figures = res["figures"]
    assert figures["n_pairs"] == 24 and figures["dtypes"] == ["float32", "bf16"] and figures["device"] == "cpu"
    assert set(figures["systems"]) == {"twmd", "bertscore"}

    pairs = harness.wmt_sample(wmt, None, 0)
    hyps, refs = [p["hyp"] for p in pairs], [p["ref"] for p in pairs]
    human, groups = [p["score"] for p in pairs], [f"{p['lp']}/{p['year']}" for p in pairs]
    for system, runs in figures["systems"].items():
        fp32, bf16 = runs["float32"], runs["bf16"]
        scores = {dtype: precision.make_scorer(system, str(tiny_model_dir), 2, dtype, "cpu").score(hyps, refs)
                  for dtype in ("float32", "bf16")}
        report = correlate(scores["float32"], human, groups, n_boot=0)  # the library's scorer and correlation
        assert fp32["pearson"] == pytest.approx({g.name: g.pearson.value for g in report.groups}, abs=1e-12)
        assert fp32["pearson_avg"] == pytest.approx(report.average.pearson.value, abs=1e-12)
        assert fp32["drift"]["max_abs"] == 0 and fp32["speedup"] == 1 and "pearson_diff" not in fp32
        assert bf16["drift"] == pytest.approx(precision.drift(scores["float32"].tolist(), scores["bf16"].tolist()))
        assert 0 < bf16["drift"]["max_abs"] < 0.05 and bf16["drift"]["non_finite"] == 0  # bf16 rounds, a little
        diff = bf16["pearson_diff"]
        assert diff["value"] == pytest.approx(bf16["pearson_avg"] - fp32["pearson_avg"], abs=1e-12)
        assert diff["low"] <= diff["value"] <= diff["high"]
        for run in (fp32, bf16):
            assert len(run["runs_s"]) == len(run["cpu_s"]) == 2 and run["best_s"] == min(run["runs_s"])
            assert run["pairs_per_s"] == pytest.approx(24 / run["best_s"]) and run["repeat_max_abs"] == 0
            assert -1 <= run["range"][0] <= run["range"][1] <= 1 and run["memory_growth_mib"] is not None
        assert bf16["weights_mib"] == pytest.approx(fp32["weights_mib"] / 2)
        assert bf16["speedup"] == pytest.approx(fp32["best_s"] / bf16["best_s"])
    assert res["tables"]["docs_precision"] == precision.docs_table(figures)
    assert len(res["tables"]["docs_precision"]["rows"]) == 4 and len(res["tables"]["correlation"]["rows"]) == 3


def test_the_docs_table_is_computed_from_the_stored_figures():
    res = harness.load(ROOT / "bench" / "results" / "precision_cpu.json")
    assert precision.docs_table(res["figures"]) == res["tables"]["docs_precision"]
