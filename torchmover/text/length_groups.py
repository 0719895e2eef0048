"""Which texts of a call the encoder runs together: groups of similar length, each one forward pass.

A forward pass pads its texts to the longest of them, and the model's work grows with the padded
tokens. Texts of one call often differ in length several times over (a reward call's completions:
512 WMT hypotheses hold 13,745 tokens; padded to their longest, 52,224), so running them in one pass
spends most of the work on padding. Cut into groups of similar length, each padded to its own
longest, they cost fewer padded tokens, but each pass costs its own fixed overhead too (the launch
of every kernel of every layer, on a GPU; the framework's calls on a CPU).

:func:`length_groups` chooses the groups that minimise

    padded tokens + pass_cost · passes,

``pass_cost`` being one pass's overhead counted in the tokens the model could run in that time. The
texts are sorted by length, and some optimal grouping cuts that order into runs (a group's cost is its
size times its longest text: a longer text moved into a group of shorter ones lengthens it), so dynamic
programming over the distinct lengths finds the best: for the ``j`` shortest distinct lengths
``v_1 < … < v_j`` (with ``C_j`` texts of length at most ``v_j``),

    best(j) = min over i < j of  best(i) + (C_j − C_i) · v_j + pass_cost,   best(0) = 0.

Where all padding together is less than ``pass_cost`` (``N · max − Σ lengths < pass_cost``) no split
can pay, and no search runs: one pass.
"""
from __future__ import annotations

from typing import cast

import numpy as np

#: ``pass_cost`` of ``"auto"``, by device type. On a 2-core CPU ``bench/bench_passes.py`` fits one pass
#: of the default model at a few dozen tokens' time (29 to 58 over three runs), and reward calls of 64
#: and 512 completions were fastest with ``pass_cost`` between 32 and 128 (0 and 512 were slower). On
#: a GPU a pass of a small model is mostly kernel launches: on an H200 ``bench_passes.py --device cuda``
#: fits one pass of the default model at 4.6 ms and a token at 0.53 µs, 8,617 tokens; 8192 keeps a call
#: of 64 completions in one pass and cuts one of 512 into two, the fastest of the costs it timed there
#: (a larger encoder's token costs more, so its pass is worth fewer tokens: measure it there).
AUTO_PASS_COST = {"cpu": 128}
AUTO_PASS_COST_ACCELERATOR = 8192


def resolve_pass_cost(pass_cost: int | str | None, device_type: str) -> int | None:
    """``pass_cost`` as a number of tokens (``"auto"``: :data:`AUTO_PASS_COST` for ``device_type``, else
    :data:`AUTO_PASS_COST_ACCELERATOR`), or None (one pass, whatever the lengths)."""
    if pass_cost == "auto":
        return AUTO_PASS_COST.get(device_type, AUTO_PASS_COST_ACCELERATOR)
    return cast(int | None, pass_cost)  # callers pass a checked pass_cost (check_pass_cost): "auto", None or an int


def check_pass_cost(pass_cost) -> None:
    """Raise ``ValueError`` unless ``pass_cost`` is ``"auto"``, None or an int ≥ 0."""
    if not (pass_cost in ("auto", None) or (isinstance(pass_cost, int) and not isinstance(pass_cost, bool)
                                           and pass_cost >= 0)):
        raise ValueError(f"pass_cost must be 'auto', None or an int >= 0 (tokens), got {pass_cost!r}")


def length_groups(lengths: np.ndarray, pass_cost: int | None) -> list[np.ndarray] | None:
    """The positions of ``lengths`` (each text's token count) cut into groups of similar length, the
    shortest group first, each sorted by length: the grouping of least padded tokens plus
    ``pass_cost`` per group (module docs). None where one group is best, or ``pass_cost`` is None."""
    lengths = np.asarray(lengths, dtype=np.int64).reshape(-1)
    if pass_cost is None or len(lengths) < 2 or len(lengths) * int(lengths.max()) - int(lengths.sum()) < pass_cost:
        return None
    order = np.argsort(lengths, kind="stable")
    values, counts = np.unique(lengths[order], return_counts=True)
    cumulative = np.concatenate([[0], np.cumsum(counts)])  # C_0 = 0, C_j
    best = np.zeros(len(values) + 1)
    cut = np.zeros(len(values) + 1, dtype=np.int64)
    for j in range(1, len(values) + 1):
        costs = best[:j] + (cumulative[j] - cumulative[:j]) * values[j - 1]
        cut[j] = int(np.argmin(costs))
        best[j] = costs[cut[j]] + pass_cost
    ends = [len(values)]
    while ends[-1]:
        ends.append(int(cut[ends[-1]]))
    if len(ends) == 2:  # [m, 0]: one group
        return None
    bounds = cumulative[ends[::-1]]
    return [order[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
