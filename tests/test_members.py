"""The member registry: each member's traits declared once, and everything that depends on them —
the Scorer's methods, defaults, signature, compile check, sensitivity factors, the command line and
the TRL reward name — read from it. A toy member registered in one place works everywhere."""
from __future__ import annotations

import pytest
import torch

from torchmover import MoverReward, Scorer
from torchmover.functional.compiled import check_compile
from torchmover.functional.members import MEMBERS, Member, get_member, member_term
from torchmover.evaluation.sensitivity import _check_factors
from torchmover.integrations.trl import reward_name

HYPS = ["the cat sat on the mat", "a dog barked", "the quick brown fox"]
REFS = ["a cat sat on a mat", "the dog barked", "a quick brown fox jumps"]


def dot_term(t, n):
    """``C = Σ_ij a_i b_j S_ij``: sbert's term, under another name."""
    return lambda x, y, rows, cols, a, b: (a.unsqueeze(-1) * b.unsqueeze(-2) * (x @ y.transpose(-1, -2))).sum((-1, -2))


@pytest.fixture
def toy_members(monkeypatch):
    """Two toy members, registered for the test only: ``dot`` (no traits: sbert's term) and
    ``twmd-copy`` (twmd's term and traits, with its own default temperature)."""
    twmd = MEMBERS["twmd"]
    monkeypatch.setitem(MEMBERS, "dot", Member("dot", dot_term))
    monkeypatch.setitem(MEMBERS, "twmd-copy", Member("twmd-copy", twmd.term, directed=True, temperature="tuned",
                                                     default_temperature=0.07, iterations=True, compilable=True))


def test_a_registered_member_works_through_the_scorer_and_its_shells(tiny_encoder, toy_members):
    dot, sbert = Scorer(tiny_encoder, method="dot", centering="none"), Scorer(tiny_encoder, method="sbert", centering="none")
    with torch.no_grad():
        torch.testing.assert_close(dot(HYPS, REFS), sbert(HYPS, REFS))
    torch.testing.assert_close(dot.score(HYPS, REFS, progress=False), sbert.score(HYPS, REFS, progress=False))
    torch.testing.assert_close(MoverReward(dot)(HYPS, REFS), MoverReward(sbert)(HYPS, REFS))
    assert dot.signature.startswith("dot|") and "direction:" not in dot.signature and "|T:" not in dot.signature
    assert reward_name(dot.config) == "torchmover_dot"
    assert _check_factors(None, "dot") == [f for f in _check_factors(None, "sbert")]


def test_a_registered_members_traits_decide_defaults_signature_and_compile(tiny_encoder, toy_members):
    copy, twmd = Scorer(tiny_encoder, method="twmd-copy"), Scorer(tiny_encoder, method="twmd", temperature=0.07)
    assert copy.config.temperature == 0.07  # its own default, from its declaration
    with torch.no_grad():
        torch.testing.assert_close(copy(HYPS, REFS), twmd(HYPS, REFS))
    fields = copy.signature.split("|")
    assert {"direction:recall", "T:0.07", "iter:1"} <= set(fields)
    assert reward_name(copy.config) == "torchmover_twmd-copy_recall"
    assert check_compile(True, "twmd-copy", 1) and "temperature" in _check_factors(None, "twmd-copy")
    with pytest.raises(ValueError, match="compile=True supports"):
        check_compile(True, "twmd-copy", None)  # a converged solver does not compile


def test_the_command_line_offers_every_registered_member(toy_members):
    from torchmover.cli import build_parser

    args = build_parser().parse_args(["score", "--hyp", "a", "--ref", "b", "--method", "dot"])
    assert args.method == "dot"


def test_traits_of_the_published_members():
    traits = {name: (m.directed, m.normalized, m.temperature, m.compilable, m.matching, m.documents)
              for name, m in MEMBERS.items()}
    assert traits == {
        "twmd": (True, True, "tuned", True, False, False), "trwmd": (True, True, "tuned", True, True, False),
        "wmd": (False, True, "fixed", False, False, False), "moverscore": (False, False, "fixed", False, False, False),
        "bertscore": (True, False, None, True, True, False), "sbert": (False, True, None, True, False, False),
        "cka": (False, True, None, True, False, False), "sms": (False, False, "optional", False, False, True),
        "s+wms": (False, False, "optional", False, False, True), "wms": (False, False, "optional", False, False, True)}
    assert (MEMBERS["twmd"].default_temperature, MEMBERS["trwmd"].default_temperature) == (0.10, 0.15)


@pytest.mark.parametrize("kwargs, match", [
    (dict(temperature="warm"), "temperature must be one of"),
    (dict(temperature="tuned"), "default_temperature is given exactly"),
    (dict(default_temperature=0.1), "default_temperature is given exactly"),
    (dict(documents=True), "has a term unless"),
])
def test_inconsistent_traits_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Member("bad", dot_term, **kwargs)


def test_unknown_and_document_members_say_what_is_wrong(monkeypatch):
    from torchmover import Encoder

    with pytest.raises(ValueError, match=r"method must be one of \('twmd'"):
        get_member("nope")
    with pytest.raises(ValueError, match="moves whole documents"):
        member_term("sms")
    monkeypatch.setattr(Encoder, "from_pretrained", lambda *a, **k: pytest.fail("the model was loaded"))
    with pytest.raises(ValueError, match="method must be one of"):
        Scorer(method="nope")  # refused before any model is loaded
