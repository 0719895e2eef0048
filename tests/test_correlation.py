import importlib.util
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats

from torchmover.evaluation import correlation as C
from torchmover.evaluation.correlation import compare, correlate, score_and_correlate, williams_test
from torchmover.evaluation.data import read_tsv_dir

FIXTURES = Path(__file__).parent / "fixtures"


def tied_data(seed: int, n: int, levels: int = 7):
    """Correlated scores with many ties in both variables."""
    rng = np.random.default_rng(seed)
    h = rng.integers(0, levels, n).astype(float)
    s = np.round(h + rng.normal(0, 2, n))  # ties in the metric too
    return s, h


def scipy_stats(x, y):
    return np.array([stats.pearsonr(x, y)[0], stats.spearmanr(x, y)[0], stats.kendalltau(x, y, variant="b")[0]])


def values(g):
    return np.array([g.pearson.value, g.spearman.value, g.kendall.value])


# --- point estimates -----------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(5))
def test_point_estimates_match_scipy_with_ties(seed):
    s, h = tied_data(seed, 40 + 17 * seed)
    report = correlate(s, h, n_boot=0)
    np.testing.assert_allclose(values(report["all"]), scipy_stats(s, h), rtol=0, atol=1e-10)
    assert report["all"].n == len(s)


def test_continuous_data_and_tensor_input_match_scipy():
    rng = np.random.default_rng(0)
    h = rng.normal(size=200)
    s = torch.tensor(h + rng.normal(size=200), requires_grad=True)
    report = correlate(s, h.tolist(), n_boot=0)
    np.testing.assert_allclose(values(report.average), scipy_stats(s.detach().numpy(), h), atol=1e-10)


def test_kendall_in_blocks_matches_scipy(monkeypatch):
    monkeypatch.setattr(C, "_BLOCK", 50)  # forces many row blocks of the sign matrices
    s, h = tied_data(7, 123)
    np.testing.assert_allclose(correlate(s, h, n_boot=0)["all"].kendall.value,
                               stats.kendalltau(s, h)[0], atol=1e-10)


def test_groups_are_sorted_and_averaged_without_weights():
    s1, h1 = tied_data(1, 30)
    s2, h2 = tied_data(2, 90)
    report = correlate(np.r_[s2, s1], np.r_[h2, h1], ["de-en/2016"] * 90 + ["cs-en/2016"] * 30, n_boot=0)
    assert [g.name for g in report.groups] == ["cs-en/2016", "de-en/2016"]
    assert report.average.n == 120
    expected = (scipy_stats(s1, h1) + scipy_stats(s2, h2)) / 2
    np.testing.assert_allclose(values(report.average), expected, atol=1e-10)


def test_perfect_and_reversed_order():
    x = np.arange(10.0)
    np.testing.assert_allclose(values(correlate(x, x ** 3, n_boot=0).average)[1:], [1, 1])
    np.testing.assert_allclose(values(correlate(x, -x, n_boot=0).average), [-1, -1, -1])


# --- bootstrap -----------------------------------------------------------------------------------

def test_bootstrap_matches_an_independent_loop():
    """Same seed, same draws: resample g (sorted by name) takes ``rng.integers(0, n_g, (n_boot, n_g))``."""
    n_boot, seed = 150, 11
    data = {"ro-en/2016": tied_data(3, 25, levels=12), "cs-en/2015": tied_data(4, 35, levels=12)}
    names = list(data)
    s = np.concatenate([data[g][0] for g in names])
    h = np.concatenate([data[g][1] for g in names])
    labels = [g for g in names for _ in data[g][0]]
    report = correlate(s, h, labels, n_boot=n_boot, seed=seed, confidence=0.9)

    rng = np.random.default_rng(seed)
    reps = {}
    for name in sorted(data):
        x, y = data[name]
        draws = rng.integers(0, len(x), size=(n_boot, len(x)))
        reps[name] = np.array([scipy_stats(x[d], y[d]) for d in draws])
        low, high = np.percentile(reps[name], [5, 95], axis=0)
        g = report[name]
        np.testing.assert_allclose([g.pearson.low, g.spearman.low, g.kendall.low], low, atol=1e-10)
        np.testing.assert_allclose([g.pearson.high, g.spearman.high, g.kendall.high], high, atol=1e-10)
    low, high = np.percentile((reps["cs-en/2015"] + reps["ro-en/2016"]) / 2, [5, 95], axis=0)
    a = report.average
    np.testing.assert_allclose([a.pearson.low, a.spearman.low, a.kendall.low], low, atol=1e-10)
    np.testing.assert_allclose([a.pearson.high, a.spearman.high, a.kendall.high], high, atol=1e-10)


def test_interval_contains_estimate_narrows_with_n_and_is_seeded():
    widths = []
    for n in (40, 400):
        s, h = tied_data(5, n, levels=50)
        report = correlate(s, h, n_boot=400, seed=0)
        g = report["all"]
        for est in (g.pearson, g.spearman, g.kendall):
            assert est.low <= est.value <= est.high
        widths.append(g.pearson.high - g.pearson.low)
        assert correlate(s, h, n_boot=400, seed=0) == report
        assert correlate(s, h, n_boot=400, seed=1)["all"].pearson.low != g.pearson.low
    assert widths[1] < widths[0] / 2


def test_wider_confidence_gives_wider_interval():
    s, h = tied_data(6, 60, levels=20)
    narrow, wide = (correlate(s, h, n_boot=300, confidence=c)["all"].kendall for c in (0.5, 0.99))
    assert wide.low < narrow.low <= narrow.high < wide.high


def test_no_bootstrap_gives_nan_interval():
    g = correlate([1, 2, 3, 4], [1, 3, 2, 4], n_boot=0)["all"]
    assert math.isnan(g.pearson.low) and math.isnan(g.kendall.high) and not math.isnan(g.pearson.value)


def test_constant_scores_give_nan_with_warning():
    with pytest.warns(UserWarning, match="constant"):
        report = correlate([0.5] * 6 + [1, 2, 3], [1, 2, 3, 4, 5, 6, 1, 2, 4], ["a"] * 6 + ["b"] * 3, n_boot=20)
    assert all(math.isnan(v) for v in values(report["a"]))
    assert math.isnan(report.average.pearson.value)
    assert not math.isnan(report["b"].pearson.value)


@pytest.mark.parametrize("kwargs, match", [
    (dict(scores=[1, 2, 3], human=[1, 2]), "same length"),
    (dict(scores=[1, 2, float("nan")], human=[1, 2, 3]), "scores must be finite, got nan at index 2"),
    (dict(scores=[[1, 2]], human=[[1, 2]]), "one-dimensional"),
    (dict(scores=[1, 2, 3], human=[1, 2, 3], groups=["a", "a"]), "one label per score"),
    (dict(scores=[1, 2, 3], human=[1, 2, 3], groups=["a", "a", "b"]), "group 'b' has 1 segment"),
    (dict(scores=[], human=[]), "no scores"),
    (dict(scores=[1, 2, 3], human=[1, 2, 3], n_boot=-1), "n_boot"),
    (dict(scores=[1, 2, 3], human=[1, 2, 3], confidence=1.0), "confidence"),
])
def test_correlate_rejects_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        correlate(**kwargs)


# --- Williams test -------------------------------------------------------------------------------

def test_williams_against_hand_computation_and_scipy_t():
    r12, r13, r23, n = 0.6, 0.5, 0.8, 500
    K = 1 - 0.36 - 0.25 - 0.64 + 2 * 0.6 * 0.5 * 0.8  # = 0.23
    t_hand = 0.1 * math.sqrt(499 * 1.8) / math.sqrt(2 * K * 499 / 497 + 1.1 ** 2 / 4 * 0.2 ** 3)
    t, p = williams_test(r12, r13, r23, n)
    assert t == pytest.approx(t_hand, rel=1e-12) and t == pytest.approx(4.39846, abs=1e-5)
    assert p == pytest.approx(stats.t.sf(t_hand, n - 3), rel=1e-9)


@pytest.mark.parametrize("t, df", [(0.0, 1), (0.3, 2), (-1.7, 5), (2.1, 30), (6.0, 557), (-25.0, 3000), (40.0, 1000)])
def test_student_t_tail_matches_scipy(t, df):
    assert C._t_sf(t, df) == pytest.approx(stats.t.sf(t, df), rel=1e-10, abs=1e-300)


def test_williams_properties():
    t, p = williams_test(0.55, 0.5, 0.7, 100)
    assert t > 0 and p < 0.5
    t2, p2 = williams_test(0.5, 0.55, 0.7, 100)  # swapping the metrics
    assert t2 == pytest.approx(-t) and p2 == pytest.approx(1 - p)
    assert williams_test(0.5, 0.5, 0.7, 100) == (0.0, 0.5)
    ps = [williams_test(0.55, 0.5, 0.7, n)[1] for n in (30, 300, 3000, 30000)]
    assert ps == sorted(ps, reverse=True) and ps[-1] < 1e-10
    # more strongly correlated metrics make the same difference more significant
    assert williams_test(0.55, 0.5, 0.9, 300)[1] < williams_test(0.55, 0.5, 0.3, 300)[1]


@pytest.mark.parametrize("args, match", [
    ((1.2, 0.5, 0.5, 50), "r12 must be a correlation"),
    ((0.5, 0.5, 0.5, 3), "n must be an int of at least 4"),
    ((0.5, 0.5, 0.5, 10.0), "n must be an int"),
    ((0.9, -0.9, 0.9, 50), "not the correlations of three variables"),
])
def test_williams_rejects_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        williams_test(*args)


def test_compare_prefers_the_less_noisy_metric():
    rng = np.random.default_rng(0)
    human = rng.normal(size=400)
    good, bad = human + rng.normal(0, 0.8, 400), human + rng.normal(0, 1.5, 400)
    result = compare(good, bad, human)
    assert result.r_a == pytest.approx(stats.pearsonr(human, good)[0], abs=1e-12)
    assert result.r_ab == pytest.approx(stats.pearsonr(good, bad)[0], abs=1e-12)
    assert result.n == 400 and result.p < 1e-3
    assert (result.t, result.p) == williams_test(result.r_a, result.r_b, result.r_ab, 400)
    assert compare(bad, good, human).p > 0.999
    ranked = compare(good, bad, human, method="spearman")
    assert ranked.r_a == pytest.approx(stats.spearmanr(human, good)[0], abs=1e-12) and ranked.p < 1e-3
    with pytest.raises(ValueError, match="same length"):
        compare(good[:-1], bad, human)
    with pytest.raises(ValueError, match="method"):
        compare(good, bad, human, method="kendall")


# --- report output -------------------------------------------------------------------------------

@pytest.fixture
def report():
    s1, h1 = tied_data(1, 50, levels=30)
    s2, h2 = tied_data(2, 80, levels=30)
    return correlate(np.r_[s1, s2], np.r_[h1, h2], ["cs-en/2016"] * 50 + ["tr-en/2016"] * 80, n_boot=100,
                     metric="twmd|model:tiny|layer:2")


def test_to_table(report):
    table = report.to_table()
    lines = table.splitlines()
    assert lines[0] == "metric: twmd|model:tiny|layer:2"
    assert "Kendall τ-b" in table and "95% CI" in table and "100 resamples" in table
    rows = [line for line in lines if line.startswith(("cs-en/2016", "tr-en/2016", "average"))]
    assert len(rows) == 3 and len({len(r) for r in rows}) == 1  # fixed width
    assert rows[2].split()[:2] == ["average", "130"]
    assert f"{report.average.kendall}" in rows[2] and str(report) == table


def test_to_json_round_trip(report):
    d = json.loads(report.to_json())
    assert d["kendall_variant"] == "tau-b" and d["n_boot"] == 100 and d["confidence"] == 0.95
    assert [g["group"] for g in d["groups"]] == ["cs-en/2016", "tr-en/2016"]
    assert d["average"]["spearman"]["value"] == pytest.approx(report.average.spearman.value)
    assert d["groups"][1]["n"] == 80
    no_ci = json.loads(correlate([1, 2, 3], [1, 3, 2], n_boot=0).to_json())
    assert no_ci["average"]["pearson"]["low"] is None  # NaN -> null: valid JSON


def test_getitem_names_groups(report):
    assert report["average"] is report.average
    with pytest.raises(KeyError, match="tr-en/2016"):
        report["xx-en/2016"]


def test_plot_writes_png(report, tmp_path):
    pytest.importorskip("matplotlib")
    path = report.plot(tmp_path / "scatter.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_plot_without_matplotlib_says_what_to_install(report, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(ImportError, match=r"pip install torchmover\[plot\]"):
        report.plot(tmp_path / "x.png")


# --- scoring ratings and the command line --------------------------------------------------------

def test_score_and_correlate_with_tiny_scorer(tiny_scorer):
    records = read_tsv_dir(FIXTURES / "tsv")
    report = score_and_correlate(tiny_scorer, records, batch_size=2, n_boot=50, progress=False)
    assert [(g.name, g.n) for g in report.groups] == [("cs-en/2015", 3), ("de-en/2016", 2)]
    assert report.metric == tiny_scorer.signature
    scores = tiny_scorer.score([r.hyp for r in records], [r.ref for r in records], batch_size=2, progress=False)
    expected = correlate(scores, [r.score for r in records], [r.group for r in records], n_boot=50)
    assert report.groups == expected.groups and report.average == expected.average
    np.testing.assert_allclose(report.data["cs-en/2015"][1], [0.412, -0.1375, 0.05])
    with pytest.raises(ValueError, match="records is empty"):
        score_and_correlate(tiny_scorer, [])


def test_cli_correlate_writes_table_json_and_plot(tmp_path, tiny_model_dir, capsys):
    from torchmover.cli import main

    out, png = tmp_path / "report.json", tmp_path / "report.png"
    extra = ["--plot", str(png)] if _has_matplotlib() else []
    assert main(["correlate", "--data", str(FIXTURES / "tsv"), "--model", str(tiny_model_dir), "--layer", "2",
                 "--centering", "fixed", "--n-boot", "40", "--no-progress", "--json", str(out), *extra]) == 0
    table = capsys.readouterr().out
    assert [line.split()[:2] for line in table.splitlines()[-4:] if not line.startswith("-")] == [
        ["cs-en/2015", "3"], ["de-en/2016", "2"], ["average", "5"]]
    d = json.loads(out.read_text())
    assert [g["group"] for g in d["groups"]] == ["cs-en/2015", "de-en/2016"]
    assert d["n_boot"] == 40 and "center:fixed-" in d["metric"] and "layer:2" in d["metric"]
    if extra:
        assert png.read_bytes()[:4] == b"\x89PNG"


def test_cli_correlate_reports_data_errors(tmp_path, tiny_model_dir, capsys):
    from torchmover.cli import main

    with pytest.raises(SystemExit) as exit_info:  # the WMT17 fixture has a single de-en segment
        main(["correlate", "--data", str(FIXTURES / "wmt17"), "--model", str(tiny_model_dir), "--layer", "2",
              "--n-boot", "0", "--no-progress"])
    assert exit_info.value.code == 2
    assert "group 'de-en/2017' has 1 segment" in capsys.readouterr().err
    bad = tmp_path / "bad.tsv"
    bad.write_text("lp\tyear\tref\thyp\tscore\ncs-en\t2016\ta\tb\n", encoding="utf-8")
    with pytest.raises(SystemExit):
        main(["correlate", "--data", str(bad), "--model", str(tiny_model_dir), "--no-progress"])
    assert f"{bad}:2: expected 5 tab-separated columns" in capsys.readouterr().err


def _has_matplotlib() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


# --- system level --------------------------------------------------------------------------------

def test_system_means_average_each_system_within_its_group():
    mx, my, groups, systems = C.system_means([1.0, 3.0, 5.0, 2.0, 4.0], [0.0, 1.0, 2.0, 3.0, 4.0],
                                             ["a", "a", "a", "b", "b"], ["s1", "s2", "s1", "s1", "s1"])
    assert groups == ["a", "a", "b"] and systems == ["s1", "s2", "s1"]
    np.testing.assert_allclose(mx, [3.0, 3.0, 3.0])
    np.testing.assert_allclose(my, [1.0, 1.0, 3.5])
    with pytest.raises(ValueError, match=r"systems\[1\] is None"):
        C.system_means([1, 2], [1, 2], ["a", "a"], ["s", None])
    with pytest.raises(ValueError, match="same length"):
        C.system_means([1, 2], [1, 2], ["a", "a"], ["s"])


def system_data(seed=0, n_systems=6, per_system=30):
    """Two groups; each system has its own quality, and noisy segments around it."""
    rng = np.random.default_rng(seed)
    scores, human, groups, systems = [], [], [], []
    for group in ("cs-en/2016", "de-en/2016"):
        for k in range(n_systems):
            quality = rng.normal()
            h = quality + rng.normal(0, 1, per_system)
            scores += list(h + rng.normal(0, 1, per_system))
            human += list(h)
            groups += [group] * per_system
            systems += [f"sys{k}"] * per_system
    return np.array(scores), np.array(human), groups, systems


def test_system_level_is_the_correlation_of_system_means():
    scores, human, groups, systems = system_data()
    report = correlate(scores, human, groups, systems=systems, n_boot=200, seed=3)
    level = report.system_level
    assert level.unit == "systems" and [(g.name, g.n) for g in level.groups] == [("cs-en/2016", 6), ("de-en/2016", 6)]
    for g in level.groups:  # naive: loop over the systems of the group
        mine = [i for i, gr in enumerate(groups) if gr == g.name]
        names = sorted({systems[i] for i in mine})
        mx = [np.mean([scores[i] for i in mine if systems[i] == s]) for s in names]
        my = [np.mean([human[i] for i in mine if systems[i] == s]) for s in names]
        np.testing.assert_allclose(values(g), scipy_stats(mx, my), atol=1e-12)
        assert g.pearson.low <= g.pearson.value <= g.pearson.high
    # segment-level part unchanged by asking for the system level; averaging over systems helps here
    assert report.groups == correlate(scores, human, groups, n_boot=200, seed=3).groups
    assert level.average.pearson.value > report.average.pearson.value
    assert json.loads(report.to_json())["system_level"]["unit"] == "systems"
    table = report.to_table()
    assert "system level: mean metric score vs mean human score of each system" in table
    assert "resamples of systems" in table and "resamples of segments" in table
    assert correlate(scores, human, groups, n_boot=0).system_level is None


def test_groups_with_a_single_system_are_left_out_of_the_system_level():
    scores, human, groups, systems = system_data(n_systems=3)
    systems = [s if g == "cs-en/2016" else "only" for s, g in zip(systems, groups)]
    with pytest.warns(UserWarning, match=r"\['de-en/2016'\] have a single system"):
        report = correlate(scores, human, groups, systems=systems, n_boot=0)
    assert [g.name for g in report.system_level.groups] == ["cs-en/2016"]


def test_score_and_correlate_reports_the_system_level_when_records_name_systems(tiny_scorer):
    from torchmover.evaluation.data import Rating

    texts = ["the cat sat", "a dog barked", "the sun is red", "we ran home", "it rained", "birds sing"]
    records = [Rating("cs-en", 2016, ref, hyp, float(i % 4), system=f"s{i % 3}")
               for i, (ref, hyp) in enumerate(zip(texts, texts[1:] + texts[:1]))]
    report = score_and_correlate(tiny_scorer, records, batch_size=4, n_boot=0, progress=False)
    assert report.system_level.groups[0].n == 3
    unnamed = [Rating(r.lp, r.year, r.ref, r.hyp, r.score) for r in records]
    assert score_and_correlate(tiny_scorer, unnamed, n_boot=0, progress=False).system_level is None


def test_cli_correlate_prints_the_system_level(tmp_path, tiny_model_dir, capsys):
    from torchmover.cli import main

    rows = ["lp\tyear\tref\thyp\tscore\tsystem"]
    words = "the cat sat on a mat while dogs ran past birds".split()
    for i in range(12):
        rows.append(f"cs-en\t2016\t{' '.join(words[i % 5:i % 5 + 4])}\t{' '.join(words[i % 7:i % 7 + 3])}\t"
                    f"{(i * 7) % 5 / 5}\tsys{i % 4}")
    (tmp_path / "r.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    assert main(["correlate", "--data", str(tmp_path / "r.tsv"), "--model", str(tiny_model_dir), "--layer", "2",
                 "--n-boot", "20", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "system level" in out and out.count("cs-en/2016") == 2
    assert [line.split()[:2] for line in out.splitlines() if line.startswith("cs-en/2016")] == [
        ["cs-en/2016", "12"], ["cs-en/2016", "4"]]


# --- paired permutation test ---------------------------------------------------------------------

def naive_permutation_p(a, b, h, method, n_permutations, seed):
    """The test written as a loop: the same swap draws, scipy's correlations."""
    corr = (lambda u, v: stats.pearsonr(u, v)[0]) if method == "pearson" else (lambda u, v: stats.spearmanr(u, v)[0])
    observed = corr(h, a) - corr(h, b)
    swap = np.random.default_rng(seed).random((n_permutations, len(h))) < 0.5
    reached = 0
    for s in swap:
        pa, pb = np.where(s, b, a), np.where(s, a, b)
        reached += corr(h, pa) - corr(h, pb) >= observed - 1e-12
    return (1 + reached) / (1 + n_permutations)


@pytest.mark.parametrize("method", ["pearson", "spearman"])
@pytest.mark.parametrize("seed", [0, 1])
def test_permutation_test_matches_a_naive_loop(method, seed):
    rng = np.random.default_rng(seed)
    human = rng.integers(0, 6, 60).astype(float)  # ties, for the ranks
    a = np.round(human + rng.normal(0, 1.5, 60))
    b = np.round(human + rng.normal(0, 2.0, 60))
    p = C.paired_permutation_test(a, b, human, method=method, n_permutations=300, seed=seed)
    assert p == naive_permutation_p(a, b, human, method, 300, seed)


def test_row_ranks_match_scipy_with_ties():
    codes = np.random.default_rng(0).integers(0, 5, (7, 20))
    np.testing.assert_array_equal(C._row_ranks(codes, 5), stats.rankdata(codes, axis=1))
    np.testing.assert_array_equal(C._row_ranks(codes, 9), stats.rankdata(codes, axis=1))  # unused codes


def test_permutation_test_known_cases():
    rng = np.random.default_rng(0)
    human = rng.normal(size=80)
    noise = rng.normal(size=80)
    # identical metrics: every permutation reaches Δ = 0
    assert C.paired_permutation_test(noise, noise, human, n_permutations=200) == 1.0
    # the human scores themselves against noise: no permutation does as well
    assert C.paired_permutation_test(human, noise, human, n_permutations=200) == 1 / 201
    # A vs B and B vs A use the same swaps: Δ_k flips sign, so (no ties) the p-values add up to 1 + 1/(N + 1)
    a, b = human + rng.normal(0, 1, 80), human + rng.normal(0, 1.2, 80)
    p_ab = C.paired_permutation_test(a, b, human, n_permutations=500, seed=4)
    p_ba = C.paired_permutation_test(b, a, human, n_permutations=500, seed=4)
    assert p_ab + p_ba == pytest.approx(1 + 1 / 501, abs=1e-12)
    with pytest.raises(ValueError, match="n_permutations"):
        C.paired_permutation_test(a, b, human, n_permutations=0)


def test_permutation_p_values_are_uniform_under_the_null():
    """Exchangeable metrics: P(p <= 0.1) is ~0.1 (200 data sets; binomial sd 0.021)."""
    rng = np.random.default_rng(0)
    ps = []
    for _ in range(200):
        human = rng.normal(size=40)
        a, b = human + rng.normal(0, 1, 40), human + rng.normal(0, 1, 40)
        ps.append(C.paired_permutation_test(a, b, human, n_permutations=199, seed=int(rng.integers(1 << 30))))
    assert 0.04 <= np.mean(np.array(ps) <= 0.1) <= 0.16


def test_compare_reports_williams_and_permutation_side_by_side():
    rng = np.random.default_rng(0)
    human = rng.normal(size=400)
    good, bad = human + rng.normal(0, 0.8, 400), human + rng.normal(0, 1.5, 400)
    result = compare(good, bad, human, n_permutations=500, seed=1)
    assert result.p < 1e-3 and result.p_permutation == 1 / 501 and result.n_permutations == 500
    assert result.p_permutation == C.paired_permutation_test(good, bad, human, n_permutations=500, seed=1)
    assert compare(bad, good, human, n_permutations=500).p_permutation > 0.99
    ranked = compare(good, bad, human, method="spearman", n_permutations=100)
    assert ranked.p_permutation == C.paired_permutation_test(good, bad, human, method="spearman", n_permutations=100)
    assert math.isnan(compare(good, bad, human, n_permutations=0).p_permutation)


# --- paired bootstrap of the difference of two average correlations ---------------------------------

def naive_bootstrap_difference(a, b, h, groups, method, n_boot, seed):
    """The definition, one resample and one group at a time with scipy."""
    corr = stats.pearsonr if method == "pearson" else stats.spearmanr
    rng = np.random.default_rng(seed)
    names = sorted(set(groups))
    draws = {}
    for g in names:  # the draws, group after group, as correlate() makes them
        sel = np.flatnonzero(np.asarray(groups) == g)
        draws[g] = sel[rng.integers(0, len(sel), size=(n_boot, len(sel)))]
    deltas = [np.mean([corr(a[draws[g][k]], h[draws[g][k]])[0] - corr(b[draws[g][k]], h[draws[g][k]])[0]
                       for g in names]) for k in range(n_boot)]
    observed = np.mean([corr(a[np.asarray(groups) == g], h[np.asarray(groups) == g])[0]
                        - corr(b[np.asarray(groups) == g], h[np.asarray(groups) == g])[0] for g in names])
    return observed, np.array(deltas)


@pytest.mark.parametrize("method", ["pearson", "spearman"])
def test_paired_bootstrap_difference_matches_a_naive_loop(method):
    rng = np.random.default_rng(3)
    groups = ["de-en/2016"] * 40 + ["cs-en/2015"] * 25
    h = rng.normal(size=65)
    a = np.round(h + rng.normal(0, 0.8, 65), 1)  # ties, for the ranks
    b = h + rng.normal(0, 1.5, 65)
    result = C.paired_bootstrap_difference(a, b, h, groups, method=method, n_boot=200, seed=7, confidence=0.9)
    observed, deltas = naive_bootstrap_difference(a, b, h, groups, method, 200, 7)
    assert result.value == pytest.approx(observed, abs=1e-12)
    assert result.mean == pytest.approx(deltas.mean(), abs=1e-12)
    assert (result.low, result.high) == pytest.approx(tuple(np.percentile(deltas, [5, 95])), abs=1e-12)
    assert result.p_le_0 == (deltas <= 0).mean()
    assert result.n_boot == 200 and result.confidence == 0.9


def test_paired_bootstrap_difference_is_antisymmetric_and_zero_for_one_metric():
    s, h = tied_data(1, 80)
    other = s + np.random.default_rng(2).normal(0, 3, 80)
    ab = C.paired_bootstrap_difference(s, other, h, n_boot=300)
    ba = C.paired_bootstrap_difference(other, s, h, n_boot=300)
    assert (ab.value, ab.mean, ab.low, ab.high) == pytest.approx((-ba.value, -ba.mean, -ba.high, -ba.low), abs=1e-12)
    assert ab.value > 0 and ab.low > 0 and ab.p_le_0 == 0  # the noisier copy correlates worse
    same = C.paired_bootstrap_difference(s, s, h, n_boot=50)
    assert (same.value, same.low, same.high, same.p_le_0) == (0, 0, 0, 1)  # paired: every resample ties


def test_paired_bootstrap_difference_refuses_bad_input():
    s, h = tied_data(0, 20)
    with pytest.raises(ValueError, match="same length"):
        C.paired_bootstrap_difference(s, s[:-1], h)
    with pytest.raises(ValueError, match="method"):
        C.paired_bootstrap_difference(s, s, h, method="kendall")
    with pytest.raises(ValueError, match="n_boot"):
        C.paired_bootstrap_difference(s, s, h, n_boot=0)
    with pytest.raises(ValueError, match="at least 2"):
        C.paired_bootstrap_difference(s, s, h, ["a"] + ["b"] * 19)
    with pytest.raises(ValueError, match="undefined"):
        C.paired_bootstrap_difference(np.ones(20), s, h, n_boot=5)
