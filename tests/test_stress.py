"""torchmover stress: the degenerate variants, the report, its flags and fixes, the command."""
import json
import random

import pytest
import torch

from torchmover import Scorer, ScorerConfig
from torchmover.cli import main
from torchmover.evaluation.stress import VARIANTS, fix_for, make_variant, stress_test

HYP, OTHER = "the cat sat on the mat", "a dog barked"


def variant(name, hyp=HYP, seed=0):
    return make_variant(name, hyp, OTHER, random.Random(seed))


def test_variants_are_what_they_say():
    words = HYP.split()
    assert variant("twice") == f"{HYP} {HYP}"
    assert variant("doubled").split() == [w for w in words for _ in range(2)]
    assert sorted(variant("shuffled").split()) == sorted(words)
    assert variant("truncated").split() == words[:3]
    padded = variant("pad-own").split()
    assert padded[:6] == words and len(padded) == 9 and set(padded[6:]) <= set(words)
    assert variant("pad-unrelated") == HYP + " " + OTHER
    assert variant("empty") == ""
    assert variant("truncated", "one") == "one" and variant("twice", "") == ""
    with pytest.raises(ValueError, match="variant must be one of"):
        variant("reversed")


def test_a_length_rewarding_metric_is_flagged_with_its_fix():
    report = stress_test(lambda hyps, refs: [len(h.split()) / 20 for h in hyps], [HYP, "a man plays a guitar"],
                         ["a cat sat", "a man plays"])
    rows = {r.variant: r for r in report.rows}
    for longer in ("pad-own", "pad-unrelated", "twice", "doubled"):
        assert rows[longer].win_rate == 1.0 and rows[longer].flagged
    assert rows["pad-own"].fix.startswith("direction='f1'") and rows["twice"].fix is None  # no option stops it
    assert rows["truncated"].win_rate == 0 and rows["shuffled"].mean_change == 0 and not rows["shuffled"].flagged
    assert rows["empty"].mean_change == pytest.approx(-report.mean_score)
    assert "twice: wins in 100% of the pairs; no scorer option stops it" in report.to_table()


def test_fixes_depend_on_the_direction():
    recall, precision, f1 = (ScorerConfig(direction=d) for d in ("recall", "precision", "f1"))
    assert fix_for("pad-own", recall) and fix_for("pad-own", precision) is None and fix_for("pad-own", f1) is None
    assert fix_for("truncated", precision) and fix_for("truncated", recall) is None
    assert fix_for("shuffled", recall) is None


@pytest.mark.parametrize("method", ["sbert", "cka", "wmd", "moverscore"])
def test_a_member_without_directions_gets_no_direction_to_try(method):
    """These members have no ``direction`` (a config refuses one): suggesting ``direction='f1'`` (as it
    was) would name an option they refuse."""
    assert fix_for("pad-own", ScorerConfig(method=method)) is None
    with pytest.raises(ValueError, match="has no directions"):
        ScorerConfig(method=method, direction="precision")


def test_a_scorer_report_is_consistent_with_its_scores(tiny_encoder):
    scorer = Scorer(tiny_encoder, centering="none")
    hyps, refs = [HYP, "a man plays a guitar", "the sun"], ["a cat sat on a mat", "a man plays", "the moon"]
    report = stress_test(scorer, hyps, refs)
    assert [r.variant for r in report.rows] == list(VARIANTS) and report.n_pairs == 3
    assert report.mean_score == pytest.approx(scorer.score(hyps, refs, progress=False).mean().item(), abs=1e-6)
    rows = {r.variant: r for r in report.rows}
    assert rows["empty"].mean_change == pytest.approx(-report.mean_score, abs=1e-6) and rows["empty"].win_rate == 0
    assert report.signature == scorer.signature


def test_mismatched_pairs_are_refused():
    with pytest.raises(ValueError, match="as many references as hypotheses"):
        stress_test(lambda h, r: [0.0] * len(h), ["a"], [])


def write(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def test_stress_command_on_files_and_on_ratings(tmp_path, tiny_model_dir, capsys):
    hyps = write(tmp_path / "h.txt", [HYP, "a man plays a guitar", "the sun"])
    refs = write(tmp_path / "r.txt", ["a cat sat on a mat", "a man plays", "the moon"])
    out = tmp_path / "report.json"
    model = ["--model", str(tiny_model_dir), "--layer", "2", "--no-progress"]
    assert main(["stress", "--hyps", hyps, "--refs", refs, "--json", str(out), *model]) == 0
    table = capsys.readouterr().out
    assert table.startswith("pairs: 3,") and "| truncated |" in table and "signature: twmd|" in table
    assert [r["variant"] for r in json.loads(out.read_text())["rows"]] == list(VARIANTS)
    ratings = write(tmp_path / "ratings.tsv", ["lp\tyear\tref\thyp\tscore"]
                    + [f"de-en\t2016\tthe cat sat {i}\ta cat sat {i}\t0.{i}" for i in range(5)])
    assert main(["stress", "--data", ratings, "--sample", "2", *model]) == 0
    assert capsys.readouterr().out.startswith("pairs: 2,")


@pytest.mark.parametrize("args, message", [([], "give the pairs"), (["--data", "x", "--hyps", "y"], "not both")])
def test_stress_command_needs_one_source_of_pairs(args, message, capsys):
    with pytest.raises(SystemExit):
        main(["stress", *args])
    assert message in capsys.readouterr().err


def test_a_reward_is_stressed_as_it_rewards(tiny_encoder):
    """A reward's own call, its shaping included: a shaping that pays for length makes padding win, and
    the fix read from the reward's scorer (recall) is f1."""
    from torchmover import MoverReward

    reward = MoverReward(Scorer(tiny_encoder, centering="none"),
                         shaping=lambda hyps, scores: scores + torch.tensor([len(h.split()) for h in hyps]))
    report = stress_test(reward, [HYP, "a man plays a guitar"], ["a cat sat on a mat", "a man plays"])
    rows = {r.variant: r for r in report.rows}
    assert rows["pad-own"].win_rate == 1.0 and rows["pad-own"].fix.startswith("direction='f1'")
    assert rows["truncated"].win_rate == 0 and report.signature == reward.signature
