"""What bounds a scoring call's memory: encoder batches of bounded padded tokens, longest first; the
encoder's last state alone once it is known to be the layer's; the batch mean summed block by block
(never every text padded to one width). The measured peaks are in bench/results/bench_corpus_memory.md."""
import pytest
import torch
from torch import nn

from torchmover import Encoder, Scorer
from torchmover._internal.arena import TokenArena
from torchmover.scorer.plan import token_batches

HYPS = ["the cat sat on the mat", "a dog barked", "the quick brown fox jumps over the lazy dog", "the sun",
        "a small child eats good food in the city", "they ran"]
REFS = ["a cat was on the mat", "the dog barked", "a fox jumps over the dog", "the moon is blue",
        "the child eats", "we ran to the old house"]


def test_token_batches_bound_their_padded_tokens_longest_first():
    lengths = [5] * 40 + [10] * 30 + [300, 280, 250, 240] + [3] * 7
    batches = token_batches(lengths, 160)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))  # every text once
    longest = [max(lengths[i] for i in b) for b in batches]
    assert longest == sorted(longest, reverse=True)  # the longest batch first
    for batch in batches:  # within the budget (a text longer than it alone), sorted: no item between batches
        assert len(batch) == 1 or len(batch) * max(lengths[i] for i in batch) <= 160
    for before, after in zip(batches, batches[1:]):
        assert min(lengths[i] for i in before) >= max(lengths[i] for i in after)
        assert (len(before) + 1) * lengths[before[0]] > 160  # a batch closes only when the next would not fit
    assert [len(b) for b in batches[4:]] == [16, 16, 32, 13]  # packed by tokens: short texts many to a batch
    assert token_batches([], 8) == [] and token_batches([3] * 3, 8) == [[0, 1], [2]]


def test_a_call_tokenizes_each_text_once_and_encodes_batches_sorted_by_token_count(tiny_encoder, monkeypatch):
    scorer = Scorer(tiny_encoder, centering="none")
    expected = scorer.score(HYPS, REFS, batch_size=2)
    calls, batches = [], []
    tokenize, embed = tiny_encoder.tokenize, scorer.embed_with_spans
    monkeypatch.setattr(tiny_encoder, "tokenize", lambda texts, **k: calls.append(list(texts)) or tokenize(texts, **k))
    monkeypatch.setattr(scorer, "embed_with_spans", lambda texts, **k: batches.append(texts) or embed(texts, **k))
    assert torch.equal(scorer.score(HYPS, REFS, batch_size=2), expected)
    assert len(calls) == 1 and sorted(calls[0]) == sorted(set(HYPS + REFS))  # one tokenizer call, every text once
    counts = dict(zip(calls[0], tiny_encoder.token_counts(calls[0])))
    in_order = [counts[t] for batch in batches for t in batch]
    assert in_order == sorted(in_order, reverse=True)  # batches sorted by token count, the longest first
    budget = 2 * sorted(counts.values())[len(counts) // 2]
    assert all(len(b) == 1 or len(b) * max(map(counts.get, b)) <= budget for b in batches)


def test_the_encoder_reads_a_given_tokenization_as_its_own(tiny_encoder):
    texts = HYPS + REFS
    tokens = tiny_encoder.tokenize(texts, word_ids=True)
    for positions in ([0, 1, 2], [7, 3, 11, 0]):
        batch = [texts[i] for i in positions]
        for word_ids in (False, True):
            own = tiny_encoder(batch, with_word_ids=word_ids)
            given = tiny_encoder(batch, with_word_ids=word_ids, tokens=tiny_encoder.take(tokens, positions))
            assert own.spans == given.spans and own.num_words == given.num_words
            for a, b in zip(own, given):
                assert a is b is None or not isinstance(a, torch.Tensor) or torch.equal(a, b)
    with pytest.raises(ValueError, match="tokenization of the 2 texts"):
        tiny_encoder(texts[:2], tokens=tiny_encoder.take(tokens, [0, 1, 2]))
    with pytest.raises(ValueError, match="without word ids"):
        tiny_encoder(texts[:2], tokens=tiny_encoder.tokenize(texts[:2], word_ids=False))


def test_the_encoder_reads_the_last_state_alone_once_it_is_the_layers(tiny_encoder):
    first = tiny_encoder(HYPS).embeddings
    assert tiny_encoder.last_state_is_layer is True
    asked = []
    forward = tiny_encoder.model.forward
    tiny_encoder.model.forward = lambda *a, **k: asked.append(k.get("output_hidden_states")) or forward(*a, **k)
    assert torch.equal(tiny_encoder(HYPS).embeddings, first) and asked == [None]


class FinalNorm(nn.Module):
    """A model whose last state is not its last layer's hidden state (a norm after the layers)."""

    def __init__(self, model):
        super().__init__()
        self.model, self.config = model, model.config

    def forward(self, **kwargs):
        out = self.model(**kwargs)
        out.last_hidden_state = out.last_hidden_state * 2
        return out


def test_a_model_that_changes_its_last_state_keeps_reading_the_layer():
    from conftest import tiny_model, tiny_tokenizer

    plain = Encoder(tiny_model(), tiny_tokenizer(), layer=3, name="tiny-bert")
    normed = Encoder(FinalNorm(tiny_model()), tiny_tokenizer(), layer=3, name="tiny-bert")
    for _ in range(2):
        assert torch.equal(normed(HYPS).embeddings, plain(HYPS).embeddings)
    assert normed.last_state_is_layer is False


def test_the_batch_mean_is_summed_without_gathering_every_text(tiny_encoder, monkeypatch):
    gathered = []
    gather = TokenArena.gather
    monkeypatch.setattr(TokenArena, "gather", lambda self, rows, where, *a: gathered.append(where.n) or
                        gather(self, rows, where, *a))
    scorer = Scorer(tiny_encoder, centering="batch")
    scores = scorer.score(HYPS, REFS, batch_size=2, progress=False)
    assert max(gathered) <= 4  # the texts of one batch of two pairs, never the call's twelve at once
    with torch.no_grad():
        torch.testing.assert_close(scores, scorer(HYPS, REFS))
