"""``Scorer(compile=True)``: the transport terms compile without graph breaks, and compiled scores equal
eager ones. Compiling needs inductor's C++ toolchain: skipped where it cannot run."""
from __future__ import annotations

import shutil

import pytest
import torch

from torchmover import Scorer
from torchmover.functional.compiled import compilable_methods, compiled_member_term
from torchmover.functional.members import member_term

HYPS = ["the cat sat on the mat", "a dog ran", "", "the quick brown fox jumps over the lazy dog"]
REFS = ["a cat was on the mat", ["the dog barked", "a dog runs in the city"], "the sun", "a fox jumps"]


def clouds(batch=3, rows=6, cols=4, dim=8):
    torch.manual_seed(0)
    x = torch.nn.functional.normalize(torch.randn(batch, rows, dim), dim=-1)
    y = torch.nn.functional.normalize(torch.randn(batch, cols, dim), dim=-1)
    row_mask, col_mask = torch.ones(batch, rows, dtype=torch.bool), torch.ones(batch, cols, dtype=torch.bool)
    row_mask[0, rows // 2:] = False
    a, b = row_mask / row_mask.sum(-1, keepdim=True), col_mask / col_mask.sum(-1, keepdim=True)
    return x * row_mask.unsqueeze(-1), y, row_mask, col_mask, a, b  # vectors 0 at padding, as token_cloud's


@pytest.mark.parametrize("method", compilable_methods())
def test_transport_terms_trace_as_one_graph_without_breaks(method):
    terms = member_term(method, {"twmd": 0.1, "trwmd": 0.15}.get(method), n_iter=1)
    for term in terms.values() if isinstance(terms, dict) else [terms]:
        explanation = torch._dynamo.explain(term)(*clouds())
        assert explanation.graph_break_count == 0, explanation.break_reasons
        assert explanation.graph_count == 1


def test_options_are_checked(tiny_encoder):
    with pytest.raises(ValueError, match="compile=True supports"):
        Scorer(tiny_encoder, method="wmd", compile=True)
    with pytest.raises(ValueError, match="compile=True supports"):
        Scorer(tiny_encoder, n_iter=None, compile=True)
    with pytest.raises(TypeError, match="compile must be"):
        Scorer(tiny_encoder, compile="yes")
    assert compiled_member_term("twmd", 0.1, 1) is compiled_member_term("twmd", 0.1, 1)  # compiled once


def test_compiled_scores_equal_eager_scores(tiny_encoder):
    """One compile (twmd recall, dynamic shapes), called on batches of different sizes."""
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("torch.compile (inductor) needs a C compiler")
    eager = Scorer(tiny_encoder, centering="none")
    compiled = Scorer(tiny_encoder, centering="none", compile=True)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    with torch.no_grad():
        try:
            first = compiled(HYPS, REFS)
        except torch._dynamo.exc.BackendCompilerFailed as error:
            pytest.skip(f"inductor cannot build kernels here: {error}")
        assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > graphs  # the compiled path ran
        torch.testing.assert_close(first, eager(HYPS, REFS), rtol=1e-5, atol=1e-6)
        # another batch size and token counts: dynamic shapes, same compiled graph
        torch.testing.assert_close(compiled(HYPS[:2], REFS[:2]), eager(HYPS[:2], REFS[:2]), rtol=1e-5, atol=1e-6)
    assert compiled.signature == eager.signature  # compilation changes no score: not in the signature
