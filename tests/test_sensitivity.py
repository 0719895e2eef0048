import dataclasses
import json
import math
import statistics

import numpy as np
import pytest
import torch

from conftest import tiny_model, tiny_tokenizer
from torchmover import Encoder, Scorer
from torchmover.cli import main
from torchmover.evaluation.correlation import correlate
from torchmover.evaluation.data import Rating, read_ratings
from torchmover.evaluation.sensitivity import (FactorResult, Level, SensitivityReport, _check_factors, coefficient_of_variation,
                                    relative_difference, run_sensitivity, select_per_group)

GROUPS = ("cs-en/2015", "de-en/2016", "fi-en/2016")
# Made-up correlations: factor -> level -> per-group r (group order as GROUPS).
TABLE = {
    "stopwords": {"none": [0.30, 0.50, 0.40], "english": [0.36, 0.45, 0.40]},
    "centering": {"none": [0.20, 0.40, -0.10], "batch": [0.40, 0.50, 0.10], "fixed": [0.30, 0.60, 0.00]},
}
BASES = {"stopwords": 0, "centering": 1}


def made_up_report() -> SensitivityReport:
    factors = []
    for name, levels in TABLE.items():
        built = []
        for level, values in levels.items():
            pearson = dict(zip(GROUPS, values), average=float(np.mean(values)))
            built.append(Level(level, f"sig-{name}-{level}", pearson, {g: v / 2 for g, v in pearson.items()}, 0.0))
        factors.append(FactorResult(name, tuple(built), BASES[name]))
    return SensitivityReport(tuple(factors), GROUPS, "base-signature", 32, 24, 1.0)


# --- the two summaries against hand-computed values ----------------------------------------------

def test_cv_is_population_std_over_absolute_mean():
    # mean 0.33, deviations ±0.03 and 0: σ = sqrt(0.0018 / 3) = 0.0244949
    assert coefficient_of_variation([0.30, 0.36, 0.33]) == pytest.approx(100 * math.sqrt(0.0006) / 0.33)
    assert coefficient_of_variation([0.30, 0.36, 0.33]) == pytest.approx(
        100 * statistics.pstdev([0.30, 0.36, 0.33]) / 0.33)
    # a negative mean: |μ| in the denominator, so CV stays positive
    assert coefficient_of_variation([-0.2, -0.4]) == pytest.approx(100 * 0.1 / 0.3)
    assert coefficient_of_variation([0.5, 0.5, 0.5]) == 0.0
    assert math.isnan(coefficient_of_variation([0.1, -0.1]))  # μ = 0
    assert math.isnan(coefficient_of_variation([0.1, float("nan")]))


def test_relative_difference_is_largest_change_from_the_base():
    assert relative_difference([0.30, 0.36, 0.33], base=0) == pytest.approx(20.0)  # |0.36 − 0.30| / 0.30
    assert relative_difference([0.30, 0.36, 0.33], base=1) == pytest.approx(100 * 0.06 / 0.36)
    assert relative_difference([0.20, 0.40, -0.10], base=1) == pytest.approx(100 * 0.5 / 0.4)
    assert relative_difference([0.4, 0.4], base=1) == 0.0
    assert math.isnan(relative_difference([0.0, 0.4], base=0))
    with pytest.raises(ValueError, match="base"):
        relative_difference([0.1, 0.2], base=2)


def test_report_tables_on_a_made_up_correlation_table():
    report = made_up_report()
    cv, rd = report.cv_table(), report.rd_table()
    # stopwords, cs-en: levels 0.30 / 0.36 -> μ 0.33, σ 0.03
    assert cv["stopwords"]["cs-en/2015"] == pytest.approx(100 * 0.03 / 0.33)
    assert cv["stopwords"]["fi-en/2016"] == 0.0
    assert rd["stopwords"]["de-en/2016"] == pytest.approx(10.0)  # |0.45 − 0.50| / 0.50
    # centering, cs-en: 0.2 / 0.4 / 0.3 -> μ 0.3, σ sqrt(0.02 / 3); base (batch) 0.4 -> RD 50 %
    assert cv["centering"]["cs-en/2015"] == pytest.approx(100 * math.sqrt(0.02 / 3) / 0.3)
    assert rd["centering"]["cs-en/2015"] == pytest.approx(50.0)
    assert rd["centering"]["fi-en/2016"] == pytest.approx(200.0)  # |−0.1 − 0.1| / 0.1
    assert math.isnan(cv["centering"]["fi-en/2016"])  # μ = 0
    # the average skips the undefined group
    assert cv["centering"]["average"] == pytest.approx(np.mean([cv["centering"][g] for g in GROUPS[:2]]))
    assert rd["stopwords"]["average"] == pytest.approx(np.mean([20.0, 10.0, 0.0]))
    assert [name for name, _ in report.ranking()] == ["centering", "stopwords"]
    assert report.cv_table("kendall")["stopwords"]["cs-en/2015"] == pytest.approx(cv["stopwords"]["cs-en/2015"])


def test_made_up_report_table_json_and_plot(tmp_path):
    report = made_up_report()
    table = report.to_table()
    assert "population std" in table and "cs-en/15" in table and "avg" in table
    assert "none* 0.4000" in table  # stopwords' base level and its average r
    data = json.loads(report.to_json())
    assert data["factors"][1]["cv_pearson"]["fi-en/2016"] is None  # NaN -> null
    assert data["factors"][1]["base_level"] == "batch"
    assert data["factors"][0]["rd_pearson"]["de-en/2016"] == pytest.approx(10.0)
    assert report.plot(tmp_path / "made_up.png").stat().st_size > 0
    again = SensitivityReport.from_json(report.to_json())
    assert again.to_table() == report.to_table() and again.to_json() == report.to_json()


def test_factor_checks():
    assert "temperature" not in _check_factors(None, "bertscore")
    assert _check_factors("idf, layer,idf", "twmd") == ["idf", "layer"]
    with pytest.raises(ValueError, match="do not apply"):
        _check_factors(["iterations"], "trwmd")
    with pytest.raises(ValueError, match="unknown factor"):
        _check_factors(["colour"], "twmd")


def test_select_per_group_takes_the_first_n_of_each_group():
    records = [Rating("de-en", 2016, f"r{i}", f"h{i}", float(i)) for i in range(5)]
    records += [Rating("cs-en", 2015, f"r{i}", f"h{i}", float(i)) for i in range(3)]
    chosen = select_per_group(records, 2)
    assert [(r.lp, r.hyp) for r in chosen] == [("de-en", "h0"), ("de-en", "h1"), ("cs-en", "h0"), ("cs-en", "h1")]
    assert select_per_group(records, None) == records
    with pytest.raises(ValueError, match="max_per_group"):
        select_per_group(records, 1)


# --- a run on a tiny data set --------------------------------------------------------------------

SENTENCES = [
    "the quick brown fox jumps over the lazy dog", "a small cat sat on the red mat",
    "the old man eats good food in the city", "she runs to the big house with a blue car",
    "the sun and the moon in the night", "a green tree on the road to the city",
    "the child was in the new house", "they ran over the red road with the dog",
]
HYPS = [
    "a quick fox jumps over a lazy dog", "the cat sat on a mat", "an old man eats bad food", "she ran to a house",
    "the moon in the day", "a big tree on a road", "the woman was in the old house", "we ran with the cat",
]


def write_ratings(path, n_per_group=8):
    rng = np.random.default_rng(0)
    lines = ["lp\tyear\tref\thyp\tscore"]
    for lp, year in (("cs-en", 2015), ("de-en", 2016), ("fi-en", 2016)):
        for i in range(n_per_group):
            hyp = HYPS[(i + len(lp) + year) % len(HYPS)] if rng.random() < 0.5 else HYPS[i]
            lines.append(f"{lp}\t{year}\t{SENTENCES[i]}\t{hyp}\t{rng.normal():.4f}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def ratings(tmp_path):
    return read_ratings(write_ratings(tmp_path / "ratings.tsv"))


def test_two_factors_give_their_levels_and_finite_correlations(ratings, tiny_encoder):
    report = run_sensitivity(ratings, {"model": tiny_encoder}, factors=["stopwords", "centering"], batch_size=8,
                             progress=False)
    assert report.groups == GROUPS and report.n_records == 24 and report.batch_size == 8
    stop, center = report["stopwords"], report["centering"]
    assert [lv.name for lv in stop.levels] == ["none", "english"] and stop.base == 0
    assert [lv.name for lv in center.levels] == ["none", "batch", "fixed", "sentence"] and center.base == 1
    for f in report.factors:
        for lv in f.levels:
            assert all(math.isfinite(v) for v in (*lv.pearson.values(), *lv.kendall.values()))
            assert set(lv.pearson) == {*GROUPS, "average"}
    # 1 + 1 + 3 distinct variants: the base is scored once and shared
    shared = stop.levels[0], center.levels[1]
    assert shared[0].signature == shared[1].signature and shared[0].pearson == shared[1].pearson
    assert len({lv.signature for f in report.factors for lv in f.levels}) == 5
    assert "stop:english" in stop.levels[1].signature and "center:fixed-" in center.levels[2].signature
    assert all(math.isfinite(report.cv_table()[f.name]["average"]) for f in report.factors)


def test_variants_score_as_scorers_built_directly(ratings, tiny_encoder):
    """The shared, memoised encoder changes nothing: each level equals a Scorer built for it."""
    report = run_sensitivity(ratings, {"model": tiny_encoder}, factors=["centering", "idf"], batch_size=8,
                             progress=False)
    hyps, refs, human = [r.hyp for r in ratings], [r.ref for r in ratings], [r.score for r in ratings]
    groups = [r.group for r in ratings]

    def pearson(scorer):
        return correlate(scorer.score(hyps, refs, batch_size=8, progress=False), human, groups, n_boot=0)

    for level, scorer in (("none", Scorer(tiny_encoder, centering="none")),
                          ("batch", Scorer(tiny_encoder)),
                          ("fixed", Scorer(tiny_encoder, centering="fixed").fit_centering(
                              list(dict.fromkeys(refs)), 8, progress=False))):
        expected = pearson(scorer)
        got = next(lv for lv in report["centering"].levels if lv.name == level)
        assert got.signature == scorer.signature
        for g in expected.groups:
            assert got.pearson[g.name] == pytest.approx(g.pearson.value, abs=1e-6)
            assert got.kendall[g.name] == pytest.approx(g.kendall.value, abs=1e-6)
    separate = Scorer(tiny_encoder, idf=True).fit_idf(list(dict.fromkeys(refs)), list(dict.fromkeys(hyps)))
    level = report["idf"].levels[2]
    assert level.name == "separate" and level.signature == separate.signature
    assert level.pearson["average"] == pytest.approx(pearson(separate).average.pearson.value, abs=1e-6)
    assert report["idf"].levels[1].signature != level.signature  # references-only IDF differs


def test_outer_whitespace_makes_no_other_text_in_the_fitted_statistics(ratings, tiny_encoder):
    """IDF and the fixed mean are fitted on the distinct texts, texts equal up to outer whitespace being one
    (as the command line and ``torchmover.score`` fit them): a trailing space on some ratings' texts changes
    no correlation."""
    padded = [dataclasses.replace(r, hyp=r.hyp + " ", ref=" " + r.ref) if i % 2 else r for i, r in enumerate(ratings)]
    plain, spaced = (run_sensitivity(records, {"model": tiny_encoder}, factors=["idf", "centering"], batch_size=8,
                                     progress=False) for records in (ratings, padded))
    for name in ("idf", "centering"):
        for a, b in zip(plain[name].levels, spaced[name].levels):
            assert a.signature == b.signature and a.pearson == pytest.approx(b.pearson, abs=1e-6), (name, a.name)


def test_layer_temperature_and_iterations(ratings, tiny_encoder):
    def at_layer(k):
        return Encoder(tiny_model(), tiny_tokenizer(), layer=k, name="tiny-bert")

    report = run_sensitivity(ratings, {"model": tiny_encoder, "temperature": 0.3},
                             factors="layer,temperature,iterations", batch_size=8, progress=False,
                             encoder_for_layer=at_layer, n_layers=3)
    layer, temperature, iterations = report["layer"], report["temperature"], report["iterations"]
    assert [lv.name for lv in layer.levels] == ["1", "2", "3"] and layer.base == 1
    assert all("layer:%d" % k in lv.signature for k, lv in zip((1, 2, 3), layer.levels))
    # a base temperature outside the grid is added as a level
    assert [lv.name for lv in temperature.levels] == ["0.02", "0.05", "0.1", "0.15", "0.2", "0.3"]
    assert temperature.base == 5
    assert [lv.name for lv in iterations.levels] == ["1", "2", "5", "converged"] and iterations.base == 0
    assert len({lv.signature for f in report.factors for lv in f.levels}) == 3 + 5 + 3
    assert all(math.isfinite(lv.pearson["average"]) for f in report.factors for lv in f.levels)


def test_input_errors(ratings, tiny_encoder):
    with pytest.raises(ValueError, match="records is empty"):
        run_sensitivity([], {"model": tiny_encoder})
    with pytest.raises(ValueError, match="fewer than 2"):
        run_sensitivity(ratings[:9], {"model": tiny_encoder}, factors=["punctuation"])
    with pytest.raises(ValueError, match="batch_size"):
        run_sensitivity(ratings, {"model": tiny_encoder}, batch_size=0)
    with pytest.raises(ValueError, match="do not apply"):
        run_sensitivity(ratings, {"model": tiny_encoder, "method": "bertscore"}, factors=["temperature"])


def test_report_outputs_from_a_run(ratings, tiny_encoder, tmp_path):
    report = run_sensitivity(ratings, {"model": tiny_encoder}, factors=["punctuation", "subwords"], batch_size=8,
                             progress=False)
    table = report.to_table()
    assert "punctuation" in table and "subwords" in table and "CV (%)" in table
    assert "kendall" not in table.lower() or "Kendall" in report.to_table("kendall")
    data = json.loads(report.to_json())
    assert [f["factor"] for f in data["factors"]] == ["punctuation", "subwords"]
    assert [lv["level"] for lv in data["factors"][1]["levels"]] == ["all", "first", "mean"]
    assert set(data["factors"][0]["cv_pearson"]) == {*GROUPS, "average"}
    assert "population" in data["definitions"]["cv"]
    path = report.plot(tmp_path / "sensitivity.png", statistic="kendall")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- command line --------------------------------------------------------------------------------

def test_cli_sensitivity(tmp_path, tiny_model_dir, capsys):
    data = write_ratings(tmp_path / "ratings.tsv")
    out, png = tmp_path / "report.json", tmp_path / "report.png"
    code = main(["sensitivity", "--data", str(data), "--model", str(tiny_model_dir), "--layer", "2",
                 "--factors", "punctuation,layer", "--max-per-group", "6", "--no-progress",
                 "--json", str(out), "--plot", str(png)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "CV (%)" in printed and "punctuation" in printed and "layer" in printed
    report = json.loads(out.read_text())
    assert report["n_records"] == 18 and report["batch_size"] == 32  # the paper's batch size by default
    layer = next(f for f in report["factors"] if f["factor"] == "layer")
    assert [lv["level"] for lv in layer["levels"]] == ["1", "2", "3"]  # the saved model's 3 layers
    assert png.stat().st_size > 0


def test_cli_unknown_factor_is_a_clear_error(tmp_path, tiny_model_dir, capsys):
    data = write_ratings(tmp_path / "ratings.tsv")
    with pytest.raises(SystemExit) as exit_info:
        main(["sensitivity", "--data", str(data), "--model", str(tiny_model_dir), "--layer", "2",
              "--factors", "colour", "--no-progress"])
    assert exit_info.value.code == 2
    assert "unknown factor" in capsys.readouterr().err


def test_variants_that_keep_the_encoder_encode_each_batch_once(ratings, tiny_encoder, monkeypatch):
    calls, tokenized = [], []
    forward, tokenize = Encoder.forward, Encoder.tokenize

    def counting(self, texts, *args, **kwargs):
        calls.append(tuple(texts))
        return forward(self, texts, *args, **kwargs)

    def counting_tokenize(self, texts, **kwargs):
        tokenized.append(tuple(texts))
        return tokenize(self, texts, **kwargs)

    monkeypatch.setattr(Encoder, "forward", counting)
    monkeypatch.setattr(Encoder, "tokenize", counting_tokenize)
    report = run_sensitivity(ratings, {"model": tiny_encoder}, factors=["punctuation", "temperature"], batch_size=8,
                             progress=False)
    assert sum(len(f.levels) for f in report.factors) == 3 + 5  # punctuation keep/drop/ascii, 5 temperatures
    distinct = {t for r in ratings for t in (r.hyp, r.ref)}
    # each batch of 8 distinct texts is encoded once, for all the variants together
    assert len(calls) == len(set(calls)) == -(-len(distinct) // 8)
    assert sorted(t for batch in calls for t in batch) == sorted(distinct)
    # and the call's texts are tokenized once, for all the variants together
    assert len(tokenized) == 1 and sorted(tokenized[0]) == sorted(distinct)


def test_the_memo_encoder_gives_what_its_encoder_gives_under_every_token_policy(tiny_encoder):
    """Masks and host spans: a text that a policy leaves without a token has the span (0, 0) there too."""
    from torchmover.evaluation.sensitivity import _MemoEncoder

    texts = ["the a", "the cat sat", "...", ""]
    memo = _MemoEncoder(tiny_encoder).eval()
    for options in ({}, {"stopwords": ("the", "a")}, {"punctuation": "drop"}):
        policy = Scorer(tiny_encoder, **options)._keep_mask if options else None
        with torch.no_grad():
            expected, got = tiny_encoder(texts, token_policy=policy), memo(texts, token_policy=policy)
        assert torch.equal(got.mask, expected.mask) and got.spans == expected.spans
    assert got.spans[2] == (0, 0)
