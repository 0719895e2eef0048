"""torchmover show: one pair's token match, each token's contribution, the picture."""
import sys

import pytest
import torch

from torchmover import Scorer
from torchmover.cli import main
from torchmover.evaluation.show import draw_token_match, token_match

HYP, REF = "the cat sat on the mat today", "a cat sat on a mat"

MEMBERS = [dict(method="twmd", direction=d) for d in ("recall", "precision", "f1")] + [
    dict(method="twmd", n_iter=None, temperature=0.05), dict(method="wmd"), dict(method="moverscore"),
    dict(method="trwmd", direction="recall"), dict(method="trwmd", direction="f1"),
    dict(method="bertscore", direction="precision"), dict(method="bertscore", direction="f1"),
    dict(method="bertscore", direction="f1", special_tokens="target"),
    dict(method="sbert"), dict(method="cka"), dict(centering="batch", center_scope="separate"),
    dict(centering="none", stopwords=["the", "a"]), dict(subwords="mean"),
]


@pytest.mark.parametrize("options", MEMBERS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_the_contributions_add_up_to_the_scorers_score(tiny_encoder, tiny_model_dir, options):
    """The margins are computed from the plan alone (normalised by self-terms computed the same way);
    the score comes from the scorer's own call: they must agree."""
    model = (str(tiny_model_dir), {"layer": 2, "device": "cpu"}) if "special_tokens" in options else (tiny_encoder, {})
    match = token_match(Scorer(model[0], **model[1], **options), HYP, REF)
    assert match.raw_score == pytest.approx(match.score, abs=1e-5)
    if match.direction == "f1":
        r, p = sum(match.ref_contributions), sum(match.hyp_contributions)
        assert 2 * r * p / (r + p) == pytest.approx(match.score, abs=1e-5)
    else:
        assert sum(match.ref_contributions) == pytest.approx(match.score, abs=1e-5)
        assert sum(match.hyp_contributions) == pytest.approx(match.score, abs=1e-5)


def test_a_recall_plan_ships_each_reference_tokens_mass(tiny_encoder):
    match = token_match(Scorer(tiny_encoder), HYP, REF)
    plan = torch.tensor(match.matrix)
    assert plan.shape == (len(match.ref_tokens), len(match.hyp_tokens)) == (6, 10)  # "today": to ##d ##a ##y
    assert torch.allclose(plan.sum(1), torch.full((6,), 1 / 6, dtype=plan.dtype), atol=1e-6)
    assert (plan >= 0).all()


def test_tokens_are_those_the_token_policy_keeps(tiny_encoder):
    match = token_match(Scorer(tiny_encoder, stopwords=["the", "a", "on"]), HYP, REF)
    assert match.hyp_tokens[:3] == ["cat", "sat", "mat"] and match.hyp_tokens[3].startswith("t")
    assert all(t.startswith("##") for t in match.hyp_tokens[4:])
    match = token_match(Scorer(tiny_encoder, stopwords=["the", "a", "on"], subwords="mean"), HYP, REF)
    assert match.hyp_tokens == ["cat", "sat", "mat", "today"]
    assert match.ref_tokens == ["cat", "sat", "mat"]


def test_greedy_members_draw_similarities_matched_to_themselves(tiny_encoder):
    match = token_match(Scorer(tiny_encoder, method="bertscore", direction="f1"), REF, REF)
    similarity = torch.tensor(match.matrix)
    assert match.matrix_kind == "similarity" and match.score == pytest.approx(1.0, abs=1e-5)
    assert torch.allclose(similarity.diagonal(), torch.ones(6, dtype=similarity.dtype), atol=1e-5)


@pytest.mark.parametrize("hyp, ref, message", [("", REF, "hypothesis is empty"), (HYP, "  ", "reference is empty")])
def test_an_empty_text_has_nothing_to_draw(tiny_encoder, hyp, ref, message):
    with pytest.raises(ValueError, match=message):
        token_match(Scorer(tiny_encoder), hyp, ref)


def test_sentence_movers_have_no_token_plan(tiny_encoder):
    with pytest.raises(ValueError, match="moves sentences"):
        token_match(Scorer(tiny_encoder, method="sms"), HYP, REF)


@pytest.mark.parametrize("suffix, magic", [(".png", b"\x89PNG"), (".svg", b"<?xml")])
def test_show_command_writes_the_picture(tmp_path, tiny_model_dir, capsys, suffix, magic):
    out = tmp_path / "sub" / f"plan{suffix}"
    assert main(["show", "--hyp", HYP, "--ref", REF, "--output", str(out), "--model", str(tiny_model_dir),
                 "--layer", "2", "--no-progress"]) == 0
    assert out.read_bytes().startswith(magic)
    stdout, err = capsys.readouterr()
    assert 0 < float(stdout) <= 1 and "signature: twmd|" in err


def test_show_without_matplotlib_names_the_extra(tmp_path, tiny_model_dir, tiny_encoder, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    with pytest.raises(SystemExit) as exit_info:
        main(["show", "--hyp", HYP, "--ref", REF, "--output", str(tmp_path / "p.png"),
              "--model", str(tiny_model_dir), "--layer", "2"])
    assert exit_info.value.code == 2 and 'pip install "torchmover[plot]"' in capsys.readouterr().err
    with pytest.raises(ImportError, match=r"torchmover\[plot\]"):
        draw_token_match(token_match(Scorer(tiny_encoder), HYP, REF), tmp_path / "p.png")


@pytest.mark.parametrize("name", ["p.txt", "p.jpg", "plan"])
def test_the_python_show_refuses_a_path_it_would_not_write_before_scoring(tmp_path, tiny_encoder, monkeypatch, name):
    """matplotlib writes ``plan`` as ``plan.png`` (the returned path did not exist) and fails on
    ``.txt`` only after the pair was scored."""
    import torchmover.evaluation.show as show_module

    monkeypatch.setattr(show_module, "token_match", lambda *a: pytest.fail("scored before the path was checked"))
    with pytest.raises(ValueError, match="path must end in .png, .svg or .pdf"):
        show_module.show(Scorer(tiny_encoder), HYP, REF, tmp_path / name)
    assert list(tmp_path.iterdir()) == []


def test_show_refuses_an_unknown_picture_format(tmp_path, tiny_model_dir, capsys):
    with pytest.raises(SystemExit):
        main(["show", "--hyp", HYP, "--ref", REF, "--output", str(tmp_path / "p.txt"),
              "--model", str(tiny_model_dir), "--layer", "2"])
    assert "--output must end in .png, .svg or .pdf" in capsys.readouterr().err
