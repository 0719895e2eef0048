"""What bounds a scoring call's memory: encoder batches of bounded padded area, longest first; the
encoder's last state alone once it is known to be the layer's; the batch mean summed from the stored
units (never every text padded to one width). The measured peaks are in bench/results/bench_corpus_memory.md."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from torchmover import Encoder, Scorer
from torchmover._internal.arena import TokenArena
from torchmover.scorer.plan import length_batches

HYPS = ["the cat sat on the mat", "a dog barked", "the quick brown fox jumps over the lazy dog", "the sun",
        "a small child eats good food in the city", "they ran"]
REFS = ["a cat was on the mat", "the dog barked", "a fox jumps over the dog", "the moon is blue",
        "the child eats", "we ran to the old house"]


def test_length_batches_fill_a_token_budget_longest_first():
    lengths = [5] * 40 + [10] * 30 + [300, 280, 250, 240]
    batches = length_batches(lengths, 16)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))  # every text once
    in_order = [lengths[i] for b in batches for i in b]
    assert in_order == sorted(lengths, reverse=True)  # consecutive by length, the longest batch first
    budget = 16 * 2 * 5  # batch_size x twice the median length
    assert all(len(b) * lengths[b[0]] <= budget or len(b) == 1 for b in batches)
    # each batch as full as the budget allows: the next longer text would have broken it
    assert all((len(b) + 1) * lengths[longer[-1]] > budget for longer, b in zip(batches, batches[1:]))
    assert [len(b) for b in batches] == [1, 1, 1, 1, 6, 16, 16, 32]  # 32 texts of 5 tokens, then 16 of up to 10
    assert length_batches([], 8) == [] and length_batches([1] * 3, 8) == [[0, 1, 2]]
    # a length counts as 1 at least; equal lengths in input order
    assert length_batches([0] * 20, 2) == [list(range(k, k + 4)) for k in range(0, 20, 4)]


@given(lengths=st.lists(st.integers(0, 40), max_size=80), batch_size=st.integers(1, 10),
       most=st.none() | st.integers(1, 12), squares=st.booleans())
@settings(max_examples=8 * settings().max_examples)  # cheap cases: 8x the profile's
def test_length_batches_are_the_greedy_cut_of_the_texts_by_length_under_every_bound(lengths, batch_size, most,
                                                                                    squares):
    """Generated lengths: every position once, longest first (equal lengths in input order); each batch
    within the budget (or one item), at most ``most`` items, its longest square at most twice its
    shortest's with ``squares``; and cut greedily: the item that opened each batch, the shortest of the
    next batch, would have broken one of those bounds in the batch before it (in cut order)."""
    batches = length_batches(lengths, batch_size, most=most, squares=squares)
    assert [i for b in batches for i in b] == sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    budget = batch_size * 2 * max(sorted(lengths)[len(lengths) // 2], 1) if lengths else 0

    def fits(batch):  # every bound of a batch (its items' positions)
        longest, shortest = max(lengths[i] for i in batch), min(lengths[i] for i in batch)
        return ((len(batch) * max(longest, 1) <= budget or len(batch) == 1) and (most is None or len(batch) <= most)
                and (not squares or longest ** 2 <= 2 * shortest ** 2))
    assert all(batch and fits(batch) for batch in batches)
    assert all(not fits(shorter + [longer[-1]]) for longer, shorter in zip(batches, batches[1:]))


def test_the_encoders_batches_hold_at_most_batch_size_texts_too():
    lengths = [5] * 40 + [10] * 30 + [300, 280, 250, 240]
    batches = length_batches(lengths, 16, most=16)
    assert [len(b) for b in batches] == [1, 1, 1, 1, 6, 16, 16, 16, 16]  # 16 texts at a time, not 32 of 5 tokens
    assert [lengths[i] for b in batches for i in b] == sorted(lengths, reverse=True)
    assert all(len(b) * lengths[b[0]] <= 16 * 2 * 5 or len(b) == 1 for b in batches)


def test_score_batches_texts_by_their_token_counts_and_tokenizes_each_once(tiny_encoder, monkeypatch):
    """Texts whose order by characters interleaves their token counts (an unknown word is one token,
    "a" is one too): the encoder's batches are cut by tokens, so they pad less than batches by
    characters would, and every text is tokenized once in the call."""
    scorer = Scorer(tiny_encoder, centering="none")
    texts = [" ".join("a" * (k + 7)) if k % 2 else "abcdefghij" + "k" * k for k in range(8)]  # 10-18 tokens
    hyps, refs = texts[:4], texts[4:]
    tokenized, widths = [], []
    tokenize, forward = scorer.encoder.tokenize, scorer.encoder.model.forward
    monkeypatch.setattr(scorer.encoder, "tokenize", lambda texts, **k: tokenized.extend(texts) or tokenize(texts, **k))
    monkeypatch.setattr(scorer.encoder.model, "forward",
                        lambda input_ids, **k: widths.append(tuple(input_ids.shape)) or forward(input_ids, **k))
    expected = scorer(hyps, refs)
    tokenized.clear(), widths.clear()
    torch.testing.assert_close(scorer.score(hyps, refs, batch_size=2, progress=False), expected, rtol=0, atol=1e-6)
    assert sorted(tokenized) == sorted(texts)  # each text tokenized once
    counts = scorer.encoder.token_counts(texts)
    area = sum(n * w for n, w in widths)
    assert widths == [(len(b), max(counts[i] for i in b)) for b in length_batches(counts, 2, most=2)]
    by_characters = sum(len(b) * max(counts[i] for i in b) for b in length_batches(list(map(len, texts)), 2, most=2))
    assert area < by_characters and area == sum(max(pair) * 2 for pair in zip(*[iter(sorted(counts))] * 2))


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


def test_score_cuts_its_pair_batches_by_the_token_budget(tiny_encoder, monkeypatch):
    """Pair batches hold as many pairs as ``batch_size`` × twice the median of the pairs' longest texts
    allows (here more than ``batch_size``), each at most that budget, and the scores are those of one
    pair at a time."""
    import torchmover.scorer.module

    scorer = Scorer(tiny_encoder, centering="none")
    hyps, refs = HYPS * 3, REFS * 3
    batches = []
    transport = torchmover.scorer.module.pair_similarities

    def counting_transport(term, hyp, ref, *args, **kwargs):
        out = transport(term, hyp, ref, *args, **kwargs)
        batches.append((max(map(len, out.values())), max(hyp.mask.shape[1], ref.mask.shape[1])))  # pairs, width
        return out

    monkeypatch.setattr(torchmover.scorer.module, "pair_similarities", counting_transport)
    scores = scorer.score(hyps, refs, batch_size=2, progress=False)
    monkeypatch.undo()
    one_at_a_time = torch.cat([scorer.score([h], [r], progress=False) for h, r in zip(hyps, refs)])
    torch.testing.assert_close(scores, one_at_a_time, rtol=0, atol=1e-6)
    units = {t: stop - first for texts in (hyps, refs) for t, (first, stop) in zip(texts, scorer.encoder(texts).spans)}
    longest = sorted(max(units[h], units[r]) for h, r in zip(hyps, refs))
    assert sum(n for n, _ in batches) == len(hyps) and max(n for n, _ in batches) > 2
    assert all(n * width <= 2 * 2 * longest[len(longest) // 2] or n == 1 for n, width in batches)


def test_score_returns_the_free_heap_after_each_quarter_of_the_tokens_on_the_cpu(tiny_encoder, monkeypatch):
    """On the CPU, the C heap's free pages go back to the system once after the encoder batch in which
    the tokens encoded reach each quarter of the chunk's tokens (four times a chunk, whatever its number of
    batches), and the scores are those of a call without it."""
    import torchmover.scorer.corpus as corpus

    scorer = Scorer(tiny_encoder, centering="none")
    hyps, refs = HYPS * 3, REFS * 3
    expected = scorer.score(hyps, refs, progress=False)
    tokens = {text: len(ids) for text, ids in zip(hyps + refs, scorer.tokenize(hyps + refs)["input_ids"])}
    encoded, at_trims = [], []
    embed = scorer.embed_with_spans

    def counting_embed(texts, tokenized=None):
        encoded.append(sum(tokens[t] for t in texts))
        return embed(texts, tokenized)

    monkeypatch.setattr(scorer, "embed_with_spans", counting_embed)
    monkeypatch.setattr(corpus, "release_free_heap", lambda: at_trims.append(sum(encoded)))
    scores = scorer.score(hyps, refs, batch_size=2, progress=False)
    total = sum(tokens.values())
    so_far = [sum(encoded[:i + 1]) for i in range(len(encoded))]
    first_reaching = [next(n for n in so_far if 4 * n >= k * total) for k in (1, 2, 3, 4)]
    assert len(encoded) > 4 and at_trims == sorted(set(first_reaching))
    torch.testing.assert_close(scores, expected, rtol=0, atol=0)


def test_release_free_heap_returns_freed_pages_to_the_system_with_glibc(monkeypatch):
    """Freed heap memory that the allocator keeps (blocks under its mmap threshold, freed between blocks
    still in use) leaves the resident set when ``release_free_heap`` says it could; it can wherever the C
    library is glibc."""
    import os
    import platform

    from torchmover.runtime.heap import release_free_heap

    def resident_mib():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    if platform.libc_ver()[0] != "glibc" or not os.path.exists("/proc/self/statm"):
        pytest.skip("the C library is not glibc: malloc_trim is glibc's")
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    blocks = [bytearray(64 << 10) for _ in range(1600)]  # 100 MiB in 64 KiB blocks: under the mmap threshold
    kept = blocks[::16]  # one block in 16 stays, so the freed ones are not at the heap's top
    del blocks
    before = resident_mib()
    assert release_free_heap()
    assert before - resident_mib() > 50, "the freed blocks stayed resident"
    del kept


@pytest.mark.parametrize("name, value", [
    ("MALLOC_TRIM_THRESHOLD_", "4294967296"),
    ("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=1:glibc.malloc.trim_threshold=0"),
])
def test_a_process_that_sets_its_own_trim_threshold_is_never_trimmed(monkeypatch, name, value):
    """Where the process chose glibc's trim threshold itself, ``release_free_heap`` does nothing and says
    so; another tunable alone does not count."""
    import torchmover.runtime.heap as heap

    calls = []
    monkeypatch.setattr(heap, "_malloc_trim", lambda: calls.append)
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=1")
    assert heap.release_free_heap() and calls == [0]
    monkeypatch.setenv(name, value)
    assert not heap.release_free_heap() and calls == [0]
