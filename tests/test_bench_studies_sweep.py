"""Smoke tests of the studies that sweep configurations on the library (bench/studies/select_defaults.py,
robustness.py, base_encoder.py): each runs end to end on tiny data (the tiny random model of
conftest.py, a 24-row WMT-style directory, a tiny STS-style directory) and publishes a result with its
provenance; the sweep scores as the library's Scorer does."""
import json
import random
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from conftest import WORDS, load_file

ROOT = Path(__file__).resolve().parents[1]
STUDIES = ROOT / "bench" / "studies"
sys.path[:0] = [str(ROOT / "bench"), str(STUDIES)]

import harness  # noqa: E402


def load_study(name: str):
    return load_file(STUDIES / f"{name}.py", f"study_{name}")


def sentence(rng: random.Random) -> str:
    return " ".join(rng.choices(WORDS, k=rng.randint(3, 9)))


@pytest.fixture(scope="module")
def wmt(tmp_path_factory):
    """Two WMT-style files of 12 rows each over the tiny model's vocabulary."""
    directory = tmp_path_factory.mktemp("wmt")
    rng = random.Random(0)
    for k, name in enumerate(("wmt15.cs-en.tsv", "wmt16.de-en.tsv")):
        rows = ["lp\tyear\tref\thyp\tscore"]
        for _ in range(12):
            rows.append(f"{name[6:11]}\t{2015 + k}\t{sentence(rng)}\t{sentence(rng)}\t{rng.uniform(-1, 1):.3f}")
        (directory / name).write_text("\n".join(rows) + "\n", encoding="utf-8")
    return directory


@pytest.fixture(scope="module")
def sts(tmp_path_factory):
    """Every STS12-16 subset the robustness study reads, 5 sentence pairs each (one without a gold
    score, which is dropped)."""
    robustness = load_study("robustness")
    root = tmp_path_factory.mktemp("sts")
    rng = random.Random(1)
    for year, subsets in robustness.STS_SUBSETS.items():
        folder = root / f"STS{year}-en-test"
        folder.mkdir()
        for subset in subsets:
            pairs = [f"{sentence(rng)}\t{sentence(rng)}" for _ in range(5)]
            gold = [f"{rng.uniform(0, 5):.2f}" for _ in range(4)] + [""]
            (folder / f"STS.input.{subset}.txt").write_text("\n".join(pairs) + "\n", encoding="utf-8")
            (folder / f"STS.gs.{subset}.txt").write_text("\n".join(gold) + "\n", encoding="utf-8")
    return root


def published(out: Path, study: str) -> dict:
    """The one result ``study`` published in ``out``, checked for provenance and rendering."""
    (path,) = out.glob(f"{study}*.json")
    name = path.stem
    res = harness.load(path)
    assert res["provenance"]["commit"] != "unknown" and res["provenance"]["command"].startswith("python")
    assert (out / f"{name}.md").read_text(encoding="utf-8") == harness.render(res)
    return res


def test_select_defaults_runs_end_to_end(wmt, tiny_model_dir, tmp_path):
    study = load_study("select_defaults")
    study.main(["--data", str(wmt), "--model", str(tiny_model_dir), "--out", str(tmp_path)])
    res = published(tmp_path, "select_defaults")
    figures = res["figures"]
    assert figures["n_pairs"] == 24 and res["provenance"]["data"]["files"] == ["wmt15.cs-en.tsv", "wmt16.de-en.tsv"]
    results = figures["results"]
    assert {v["layer"] for v in results.values()} == {1, 2, 3}
    assert {"twmd", "trwmd", "bertscore", "sbert", "cka", "wmd"} == {v["method"] for v in results.values()}
    assert {v["centering"] for v in results.values()} == {"none", "batch", "fixed", "sentence"}
    chosen = results[figures["chosen"]]
    assert chosen["method"] == "twmd" and chosen["n_iter"] == 1
    assert all(chosen["avg_r"] >= v["avg_r"] for v in results.values() if v["method"] == "twmd" and v["n_iter"] == 1)
    # the centering's evidence: the chosen against the best other centering at its layer, T and direction
    boot = figures["bootstrap_chosen_minus_other_centering"]
    against = results[boot["against"]]
    same = ("method", "layer", "temperature", "direction", "n_iter")
    others = [v for v in results.values() if all(v[k] == chosen[k] for k in same) and v["centering"] != chosen["centering"]]
    assert len(others) == 3 and against["avg_r"] == max(v["avg_r"] for v in others) and against in others
    assert boot["observed"] == pytest.approx(chosen["avg_r"] - against["avg_r"], abs=1e-12)
    assert boot["ci95"][0] <= boot["mean"] <= boot["ci95"][1]
    assert res["tables"]["docs_choice"] == study.docs_choice_table(figures)
    assert f"{chosen['centering']} − {against['centering']} = {boot['mean']:+.4f}" in str(res["tables"]["docs_choice"])
    assert res["tables"]["docs_default"] == study.docs_default_table(figures)


def test_the_sweep_scores_as_the_scorer_and_centers_per_paper_batch(wmt, tiny_model_dir):
    """A configuration of the sweep is the library's Scorer on the encoder cut at its layer: ``none``
    as ``Scorer.score``, ``batch`` as the scorer called on each paper batch (its own mean), which is
    not the whole call's mean."""
    from torchmover import Encoder, Scorer
    from torchmover.evaluation.sweep import AllLayers

    study = load_study("select_defaults")
    pairs = harness.wmt_sample(wmt, None, 0)
    sweep = study.Sweep(pairs, AllLayers(str(tiny_model_dir)), batch_size=8)
    hyps, refs = [p["hyp"] for p in pairs], [p["ref"] for p in pairs]
    scorer = {c: Scorer(Encoder.from_pretrained(str(tiny_model_dir), layer=2), temperature=0.1, centering=c,
                        device="cpu") for c in ("none", "batch")}
    none = sweep.score(study.cfg(2, "none", "twmd", 0.1, "recall"))
    np.testing.assert_allclose(none, scorer["none"].score(hyps, refs).double().numpy(), rtol=0, atol=1e-6)
    batch = sweep.score(study.cfg(2, "batch", "twmd", 0.1, "recall"))
    assert len(sweep.batches) == 3 and sorted(i for b in sweep.batches for i in b) == list(range(24))
    for idx in sweep.batches:
        expected = scorer["batch"].score([hyps[i] for i in idx], [refs[i] for i in idx]).double().numpy()
        np.testing.assert_allclose(batch[idx], expected, rtol=0, atol=1e-6)
    assert np.abs(batch - scorer["batch"].score(hyps, refs).double().numpy()).max() > 1e-4


def test_select_defaults_correlates_as_scipy_does_per_group():
    """The sweep's per-group Pearson r and Kendall tau (through ``evaluation.correlate``) are scipy's."""
    select_defaults = load_study("select_defaults")
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


def test_the_docs_choice_table_is_computed_from_the_stored_figures():
    study = load_study("select_defaults")
    res = harness.load(ROOT / "bench" / "results" / "select_defaults.json")
    assert study.docs_choice_table(res["figures"]) == res["tables"]["docs_choice"]


def test_robustness_runs_end_to_end(wmt, sts, tiny_model_dir, tmp_path):
    study = load_study("robustness")
    study.main(["--data", str(wmt), "--sts", str(sts), "--model", str(tiny_model_dir), "--out", str(tmp_path)])
    res = published(tmp_path, "robustness")
    figures = res["figures"]
    assert figures["n_wmt"] == 24 and figures["n_sts"] == 4 * sum(map(len, study.STS_SUBSETS.values()))
    assert set(figures["rows"]) >= set(study.DOCS_ROWS)
    assert all(-1 <= row["sts_r"] <= 1 and set(map(int, row["sts_years"])) == set(study.STS_SUBSETS) for row in figures["rows"].values())
    assert res["tables"]["docs_variants"] == study.docs_table(figures)


def test_base_encoder_runs_end_to_end(wmt, tiny_model_dir, tmp_path):
    from torchmover import Scorer

    finetuned = tmp_path / "run" / "final"
    Scorer(str(tiny_model_dir), layer=2, device="cpu").save_pretrained(finetuned)
    study = load_study("base_encoder")
    study.main(["--data", str(wmt), "--model", str(tiny_model_dir), "--systems", "torchmover", "--finetuned",
                str(finetuned), "--work", str(tmp_path / "work"), "--out", str(tmp_path)])
    res = published(tmp_path, "base_encoder")
    figures = res["figures"]
    assert set(figures) == {"torchmover default (untuned)", "torchmover fine-tuned (run)"}
    assert set(figures["torchmover default (untuned)"]["groups"]) == {"cs-en 2015", "de-en 2016"}
    assert set(figures["torchmover fine-tuned (run)"]["groups"]) == {"de-en 2016"}  # WMT16 only
    scores = Scorer(str(tiny_model_dir), device="cpu").score(*zip(*[(r["hyp"], r["ref"]) for r in harness.wmt_sample(wmt, None)]))
    assert figures["torchmover default (untuned)"]["groups"]["cs-en 2015"] == pytest.approx(json.loads(json.dumps(
        study.group_pearson(harness.wmt_sample(wmt, None), scores.tolist())))["cs-en 2015"], abs=1e-6)


def test_the_sweep_holds_one_batching_of_the_texts_at_a_time(wmt, tiny_model_dir):
    """Consecutive stages of ``Scorer.score`` configurations share one encoding; another way of
    batching the texts (the paper's batches, ``fit_centering``'s) clears the memo first."""
    from torchmover.evaluation.sweep import AllLayers

    study = load_study("select_defaults")
    layers = AllLayers(str(tiny_model_dir))
    runs = []
    layers._full.model.register_forward_hook(lambda *_: runs.append(1))
    sweep = study.Sweep(harness.wmt_sample(wmt, None, 0), layers, batch_size=8)
    sweep.run([study.cfg(k, "none", "twmd", 0.1, "recall") for k in (1, 2, 3)], "first stage")
    encoded = len(runs)
    assert layers.batches == encoded > 0
    sweep.run([study.cfg(k, "sentence", "bertscore", direction="f1") for k in (1, 3)], "second stage")
    assert len(runs) == encoded  # the same encoding, every layer
    sweep.run([study.cfg(2, "batch", "twmd", 0.1, "recall")], "paper batches")
    assert layers.batches == len(sweep.batches) == len(runs) - encoded  # the memo: the paper batches alone
