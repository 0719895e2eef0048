"""Choose the default layer, temperature, direction and centering of an encoder on WMT15-16.

Measures the segment-level agreement (Pearson r and Kendall tau-b, ``torchmover.evaluation.correlation``)
between members of the TWMD family and human direct-assessment scores on WMT15-16 (10 groups:
language pair x year, 5,344 segments), for ``--model`` (default ``sentence-transformers/all-MiniLM-L6-v2``, loaded offline
through ``torchmover.text.encoder.resolve_model_path``; or a local directory, e.g. of
``all-mpnet-base-v2``). The default is the configuration with the best average Pearson r over the 10
groups.

Every distinct text is encoded once (every layer, length-sorted batches, special tokens kept and
flagged by the tokenizer's special-tokens mask; the sweep drops them, as ``torchmover.text.encoder.
Encoder`` does by default) and kept in memory, or memory-mapped from ``--cache DIR`` (a base-size
encoder's 12 layers do not fit in memory). Scores
come from ``torchmover.functional`` on batches of 32 pairs (pairs sorted by decreasing ``len(hyp) +
len(ref)``; the distinct texts of a batch are padded together and, for ``batch`` centering, centered
together: the paper's per-batch mean). ``Scorer.score`` does not batch that way: its ``batch``
centering uses the mean of the whole call's distinct texts, whatever ``batch_size``, so the sweep's
``batch`` figures are those of a scorer called on the sweep's batches of 32 one by one. The other
centering modes do not depend on the batch; the last step scores the data with ``Scorer()`` (the
library default) to check that it reproduces the sweep's number for it.

Centering modes: ``none``; ``batch`` (mean of all real tokens of the batch's distinct hyps and refs,
the paper's choice); ``fixed`` (mean of all real tokens of every distinct text of the data set);
``sentence`` (each text minus its own mean).

Sweep (staged, to keep the grid small):
  A. every layer x centering, TWMD (n_iter=1) T=0.1 recall;
  B. layer x T for TWMD (n_iter=1, recall) with the best centering of A, then direction x T at the
     best layer;
  C. per layer: BERTScore (P/R/F), SBERT, CKA, TRWMD (T=0.1, recall); at the best layer: TRWMD
     (T x direction), exact WMD, TWMD with n_iter=3 and converged;
  D. every centering at the chosen (layer, T, direction), and at the library's current default.
Exact WMD is solved per pair as a linear program with POT (``ot.emd2``, the ``test`` extra): the
library's ``torchmover.functional.wmd`` (entropic, T=1e-3, run to convergence) takes seconds per batch
on real text, too slow for this sweep; it is checked against the LP on the first ``--wmd-check``
batches instead (agreement and time). Then ``torchmover.Scorer()`` (library defaults) scores the same data with ``batch_size=32``, to check
that the library reproduces the sweep's numbers.

Commands (from the repository root)::

    python bench/studies/select_defaults.py --data ../shared/data/wmt15-16 --out bench/results/
    python bench/studies/select_defaults.py --data ../shared/data/wmt15-16 --model <all-mpnet-base-v2 dir> \
        --cache <scratch dir> --out bench/results/

Writes ``select_defaults.md`` (tables) and ``select_defaults.json`` (every number) into ``--out``, for
another model ``select_defaults_<name>.md`` / ``.json``.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence
from tqdm.auto import tqdm

import torchmover
import torchmover.functional as F
from torchmover.functional.centering import center
from torchmover.functional.family import pair_similarity, token_cloud
from torchmover.functional.members import get_member, member_term
from torchmover.text.weights import IDF
from torchmover.evaluation.correlation import correlate
from torchmover.evaluation.data import read_tsv_dir
from torchmover.text.encoder import DEFAULT_MODEL, resolve_model_path

import sys  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import harness  # noqa: E402
from harness import wmt_parser  # noqa: E402
TEMPERATURES = (0.02, 0.05, 0.1, 0.15, 0.2, 0.3)
DIRECTIONS = ("recall", "precision", "f1")
CENTERINGS = ("none", "batch", "fixed", "sentence")


# --- data -------------------------------------------------------------------------------------------

def load_wmt(data_dir: Path) -> list[dict]:
    """Rows ``{lp, year, ref, hyp, score}`` of every ``*.tsv`` in ``data_dir`` (sorted file order)."""
    files = sorted(data_dir.glob("*.tsv"))
    if not files:
        raise SystemExit(f"no *.tsv files in {data_dir} (pass --data DIR)")
    return [dict(dataclasses.asdict(r), group=f"{r.lp} {r.year}") for r in read_tsv_dir(data_dir)]


# --- encoding (once, every layer) -------------------------------------------------------------------

class EmbeddingCache:
    """Token vectors of every distinct text at every layer, special tokens included and flagged:
    ``flat[layer]`` ``[T, D]`` float32 rows, text ``i`` at ``offsets[i]:offsets[i + 1]``, with each row's
    token id (``ids``) and special-token flag (``special``).

    With ``directory`` the rows live in ``.npy`` files there, memory-mapped (a base-size encoder's
    12 layers of a data set do not fit in memory), and are written as the batches are encoded; a
    directory that already holds the encoding of the same texts by the same model is read instead
    (so a later script — ``bench/studies/robustness.py`` — reuses it). ``padded`` gives a batch of texts under a
    special-tokens policy, as :class:`torchmover.Encoder` keeps them.
    """

    def __init__(self, texts: list[str], model_name: str, batch_size: int, directory: Path | None = None):
        from transformers import AutoModel, AutoTokenizer

        path = resolve_model_path(model_name)
        tokenizer = AutoTokenizer.from_pretrained(path, use_fast=True)
        model = AutoModel.from_pretrained(path).eval()
        limits = [m for m in (tokenizer.model_max_length, model.config.max_position_embeddings) if m < 1_000_000]
        max_length = min(limits) if limits else 512
        self.n_layers, dim = model.config.num_hidden_layers, model.config.hidden_size
        self.tokenizer = tokenizer
        tokens = tokenizer(texts, truncation=True, max_length=max_length, return_special_tokens_mask=True)
        self.lengths = torch.tensor([len(ids) for ids in tokens["input_ids"]])
        self.offsets = torch.cat([torch.zeros(1, dtype=torch.long), self.lengths.cumsum(0)])
        self.ids = torch.tensor([i for ids in tokens["input_ids"] for i in ids])
        self.special = torch.tensor([m for mask in tokens["special_tokens_mask"] for m in mask], dtype=torch.bool)
        layers = range(1, self.n_layers + 1)  # hidden_states[0] (embeddings) is not swept
        meta = {"model": model_name, "texts": hashlib.sha256("\0".join(texts).encode()).hexdigest(),
                "rows": int(self.offsets[-1]), "dim": dim, "layers": self.n_layers}
        done = directory is not None and (directory / "meta.json").is_file() and json.loads(
            (directory / "meta.json").read_text()) == meta
        if done:
            self.flat = {layer: torch.from_numpy(np.load(directory / f"layer{layer}.npy", mmap_mode="r"))
                         for layer in layers}
        else:
            self.flat = self._encode(model, texts, layers, dim, batch_size, max_length, directory)
            if directory is not None:
                (directory / "meta.json").write_text(json.dumps(meta))  # last: the files are complete
        self._rows: dict[str, list[torch.Tensor]] = {}
        self._means: dict[tuple[int, str], torch.Tensor] = {}

    def _encode(self, model, texts, layers, dim, batch_size, max_length, directory) -> dict[int, torch.Tensor]:
        n_rows = int(self.offsets[-1])
        if directory is None:
            flat = {layer: torch.empty(n_rows, dim) for layer in layers}
        else:
            directory.mkdir(parents=True, exist_ok=True)
            flat = {layer: torch.from_numpy(np.lib.format.open_memmap(
                directory / f"layer{layer}.npy", mode="w+", dtype=np.float32, shape=(n_rows, dim))) for layer in layers}
        order = sorted(range(len(texts)), key=lambda i: -int(self.lengths[i]))
        with torch.no_grad():
            for start in tqdm(range(0, len(order), batch_size), desc="encoding (all layers)", unit="batch"):
                idx = order[start:start + batch_size]
                batch = self.tokenizer([texts[i] for i in idx], padding=True, truncation=True, max_length=max_length,
                                       return_tensors="pt")
                hidden = model(**batch, output_hidden_states=True, return_dict=True).hidden_states
                for layer in layers:
                    for k, i in enumerate(idx):
                        flat[layer][self.offsets[i]:self.offsets[i + 1]] = hidden[layer][k][:int(self.lengths[i])]
        return flat

    def rows(self, special_tokens: str) -> list[torch.Tensor]:
        """Per text, the rows of its tokens that ``special_tokens`` keeps (``drop``: none of the
        special tokens; ``cls``: the first token too; ``keep`` / ``target``: all)."""
        if special_tokens not in self._rows:
            out = []
            for i in range(len(self.lengths)):
                a, b = int(self.offsets[i]), int(self.offsets[i + 1])
                keep = ~self.special[a:b]
                if special_tokens == "cls":
                    keep[0] = True
                elif special_tokens in ("keep", "target"):
                    keep[:] = True
                out.append(torch.arange(a, b)[keep])
            self._rows[special_tokens] = out
        return self._rows[special_tokens]

    def padded(self, layer: int, ids: list[int], special_tokens: str = "drop"):
        """``[N, L, D]`` zero-padded vectors of texts ``ids``, their ``[N, L]`` mask, and ``[N, L]`` token
        ids (0 at padding) and special flags, under ``special_tokens``."""
        rows = [self.rows(special_tokens)[i] for i in ids]
        x = pad_sequence([self.flat[layer][r] for r in rows], batch_first=True)
        mask = pad_sequence([torch.ones(len(r), dtype=torch.bool) for r in rows], batch_first=True)
        token_ids = pad_sequence([self.ids[r] for r in rows], batch_first=True)
        special = pad_sequence([self.special[r] for r in rows], batch_first=True)
        return x, mask, token_ids, special

    def dataset_mean(self, layer: int, special_tokens: str = "drop") -> torch.Tensor:
        """``[D]`` mean of every token kept by ``special_tokens`` over all texts (``fixed`` centering)."""
        key = (layer, special_tokens)
        if key not in self._means:
            total, count = torch.zeros(self.flat[layer].shape[1], dtype=torch.float64), 0
            for r in self.rows(special_tokens):
                total += self.flat[layer][r].double().sum(0)
                count += len(r)
            self._means[key] = (total / count).float()
        return self._means[key]


# --- batches and scoring ----------------------------------------------------------------------------

def make_batches(hyps: list[int], refs: list[int], text_len: list[int], batch_size: int):
    """Batches of pairs as ``Scorer.score`` forms them: sorted by decreasing ``len(hyp)+len(ref)`` (in
    characters); each batch = (pair indices, distinct text ids, hyp positions, ref positions)."""
    order = sorted(range(len(hyps)), key=lambda i: -(text_len[hyps[i]] + text_len[refs[i]]))
    batches = []
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        distinct = list(dict.fromkeys([hyps[i] for i in idx] + [refs[i] for i in idx]))
        pos = {t: k for k, t in enumerate(distinct)}
        batches.append((idx, distinct, torch.tensor([pos[hyps[i]] for i in idx]),
                        torch.tensor([pos[refs[i]] for i in idx])))
    return batches


def config_key(c: dict) -> str:
    parts = [f"L{c['layer']}", c["centering"], c["method"]]
    if c["method"] in ("twmd", "trwmd"):
        parts.append(f"T={c['temperature']:g}")
    if c["method"] in ("twmd", "trwmd", "bertscore"):
        parts.append(c["direction"])
    if c["method"] == "twmd" and c.get("n_iter", 1) != 1:
        parts.append(f"iter={'conv' if c['n_iter'] is None else c['n_iter']}")
    if c.get("special_tokens", "drop") != "drop":
        parts.append(f"special={c['special_tokens']}")
    if c.get("idf"):
        parts.append("idf")
    return "/".join(parts)


def cfg(layer, centering, method, temperature=None, direction=None, n_iter=1, special_tokens="drop",
        idf=False) -> dict:
    """A configuration (``special_tokens``: the encoder's policy; ``idf``: IDF weights from the
    references, as ``Scorer(idf=True).fit_idf(references)``)."""
    return dict(layer=layer, centering=centering, method=method, temperature=temperature,
                direction=direction, n_iter=n_iter, special_tokens=special_tokens, idf=idf)


def wmd_lp(h, r, hm, rm) -> torch.Tensor:
    """Exact WMD similarity ``max_π Σ π_ij S_ij`` (uniform masses, cosine ``S``) per pair, by POT's
    network simplex on ``M = 1 − S``. With unit vectors ``C(X, X) = 1``, so this is the normalised
    score of :func:`torchmover.functional.wmd`; a pair with an empty text scores 0."""
    try:
        import ot
    except ImportError as err:
        raise SystemExit("exact WMD needs POT: pip install pot (or pass --no-wmd)") from err
    out = torch.zeros(h.shape[0], dtype=torch.float64)
    for k in range(h.shape[0]):
        x = torch.nn.functional.normalize(r[k][rm[k]].double(), dim=-1)  # [n1, D] reference
        y = torch.nn.functional.normalize(h[k][hm[k]].double(), dim=-1)  # [n2, D] hypothesis
        if len(x) and len(y):
            cost = (1.0 - x @ y.T).numpy()  # [n1, n2]
            a, b = np.full(len(x), 1.0 / len(x)), np.full(len(y), 1.0 / len(y))
            out[k] = 1.0 - ot.emd2(a, b, cost, numItermax=1_000_000)
    return out


def score_batch(c: dict, h, r, hm, rm, hw=None, rw=None) -> torch.Tensor:
    """Scores of aligned pairs (``h``: hypotheses, ``r``: references, with masks and optional token
    weights) under configuration ``c``, through the family as ``Scorer`` runs it (``special_tokens=
    "target"``: weight-0 tokens stay matching targets)."""
    m = c["method"]
    if m == "wmd":
        return wmd_lp(h, r, hm, rm)
    term = member_term(m, c["temperature"], c["n_iter"])
    targets = c.get("special_tokens") == "target"
    clouds = [token_cloud(x, mask, w, zero_mass_targets=targets) for x, mask, w in ((h, hm, hw), (r, rm, rw))]
    return pair_similarity(term, *clouds, normalize=get_member(m).normalized, direction=c["direction"] or "recall")


class Sweep:
    """Scores configurations on the cached embeddings; memoises scores and correlations by key."""

    def __init__(self, cache: EmbeddingCache, batches, n_pairs: int, groups: np.ndarray, human: np.ndarray,
                 idf: IDF | None = None):
        self.cache, self.batches, self.n_pairs, self.idf = cache, batches, n_pairs, idf
        self.groups, self.human = groups, human
        self.group_names = sorted(set(groups.tolist()))
        self.scores: dict[str, np.ndarray] = {}
        self.results: dict[str, dict] = {}

    def run(self, configs: list[dict], desc: str) -> None:
        todo = {config_key(c): c for c in configs if config_key(c) not in self.scores}
        by_view = defaultdict(list)
        for c in todo.values():
            by_view[(c["layer"], c["centering"], c["special_tokens"])].append(c)
        bar = tqdm(total=len(self.batches) * len(by_view), desc=desc, unit="batch")
        for (layer, centering, special_tokens), group in by_view.items():
            out = {config_key(c): torch.zeros(self.n_pairs, dtype=torch.float64) for c in group}
            for idx, distinct, hpos, rpos in self.batches:
                x, mask, ids, special = self.cache.padded(layer, distinct, special_tokens)  # [N, L, D], [N, L] x3
                x = self._center(x, mask, layer, centering, special_tokens)
                h, r, hm, rm = x[hpos], x[rpos], mask[hpos], mask[rpos]
                for c in group:
                    w = self.weights(c, ids, mask, special)
                    hw, rw = (None, None) if w is None else (w[hpos], w[rpos])
                    out[config_key(c)][idx] = score_batch(c, h, r, hm, rm, hw, rw).double()
                bar.update()
            for key, s in out.items():
                self.scores[key] = s.numpy()
                self.results[key] = {**todo[key], **self.correlate(self.scores[key])}
        bar.close()

    def check_library_wmd(self, layer: int, centering: str, n_batches: int) -> dict:
        """``torchmover.functional.wmd`` vs the LP on the first ``n_batches`` batches (diff and time)."""
        diffs, t_lib, t_lp, not_converged = [], 0.0, 0.0, 0
        mid = len(self.batches) // 2  # typical lengths (the batches are sorted by length)
        chosen = self.batches[mid:mid + n_batches]
        for idx, distinct, hpos, rpos in tqdm(chosen, desc="check F.wmd vs LP", unit="batch"):
            x, mask, _, _ = self.cache.padded(layer, distinct)
            x = self._center(x, mask, layer, centering)
            h, r, hm, rm = x[hpos], x[rpos], mask[hpos], mask[rpos]
            t = time.perf_counter()
            lib = F.wmd(h, r, hm, rm, return_plan=True)
            t_lib += time.perf_counter() - t
            t = time.perf_counter()
            lp = wmd_lp(h, r, hm, rm)
            t_lp += time.perf_counter() - t
            diffs.append((lib.score.double() - lp).abs().max().item())
            not_converged += int((~lib.plan.converged).sum())
        return {"batches": len(chosen), "pairs": sum(len(b[0]) for b in chosen),
                "max_abs_diff": max(diffs), "library_s_per_batch": t_lib / len(chosen),
                "lp_s_per_batch": t_lp / len(chosen), "library_not_converged": not_converged}

    def weights(self, c: dict, ids, mask, special) -> torch.Tensor | None:
        """Token weights of configuration ``c``: IDF, 0 at special tokens (``target``), or None (uniform)."""
        if not c.get("idf") and c["special_tokens"] != "target":
            return None
        w = self.idf(ids) if c.get("idf") else mask.float()
        return w * ~special if c["special_tokens"] == "target" else w

    def _center(self, x, mask, layer, centering, special_tokens="drop"):
        if centering == "fixed":
            return center(x, mask, "fixed", self.cache.dataset_mean(layer, special_tokens))
        return center(x, mask, centering)

    def correlate(self, scores: np.ndarray) -> dict:
        """Pearson r and Kendall τ-b per group and their unweighted average (``evaluation.correlate``)."""
        report = correlate(scores, self.human, self.groups, n_boot=0)
        per = {g.name: {"r": g.pearson.value, "tau": g.kendall.value} for g in report.groups}
        return {"avg_r": report.average.pearson.value, "avg_tau": report.average.kendall.value, "per_group": per}

    def best(self, keys) -> str:
        return max(keys, key=lambda k: self.results[k]["avg_r"])

    def bootstrap_diff(self, key_a: str, key_b: str, n_boot: int = 1000, seed: int = 0) -> dict:
        """Paired bootstrap (segments resampled within each group) of avg r(a) - avg r(b)."""
        rng = np.random.default_rng(seed)
        a, b, y = self.scores[key_a], self.scores[key_b], self.human
        diffs = np.zeros(n_boot)
        for g in self.group_names:
            sel = np.flatnonzero(self.groups == g)
            idx = sel[rng.integers(0, len(sel), size=(n_boot, len(sel)))]  # [n_boot, n_g]
            diffs += _rowwise_pearson(a[idx], y[idx]) - _rowwise_pearson(b[idx], y[idx])
        diffs /= len(self.group_names)
        lo, hi = np.percentile(diffs, [2.5, 97.5])
        return {"mean": float(diffs.mean()), "ci95": [float(lo), float(hi)], "p_le_0": float((diffs <= 0).mean())}


def _rowwise_pearson(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    x = x - x.mean(1, keepdims=True)
    y = y - y.mean(1, keepdims=True)
    return (x * y).sum(1) / np.sqrt((x * x).sum(1) * (y * y).sum(1))


# --- report -----------------------------------------------------------------------------------------

def docs_default_table(figures: dict) -> dict:
    """The per-group table of ``docs/results.md`` (``docs_default``): the chosen configuration's
    Pearson r and Kendall τ per group (``cs-en 2015`` shown as ``cs-en 15``) and their average."""
    res = figures["results"][figures["chosen"]]
    groups = list(res["per_group"])
    rows = [[label, *(f"{res['per_group'][g][key]:.3f}" for g in groups), f"**{res[average]:.3f}**"]
            for label, key, average in (("Pearson r", "r", "avg_r"), ("Kendall τ", "tau", "avg_tau"))]
    return harness.table(["", *(f"{g.split()[0]} {g.split()[1][2:]}" for g in groups), "**avg**"], rows)


def fmt(v: float) -> str:
    return f"{v:.4f}" if not math.isnan(v) else "nan"


def grid_table(sweep: Sweep, rows, cols, key_of, row_label: str, col_label) -> list[str]:
    """Markdown table of ``avg r / avg tau``; the best cell (by r) in bold."""
    keys = [key_of(rv, cv) for rv in rows for cv in cols]
    best = sweep.best([k for k in keys if k in sweep.results])
    lines = [f"| {row_label} | " + " | ".join(col_label(c) for c in cols) + " |",
             "|---|" + "---|" * len(cols)]
    for rv in rows:
        cells = []
        for cv in cols:
            k = key_of(rv, cv)
            if k not in sweep.results:
                cells.append("–")
                continue
            res = sweep.results[k]
            cell = f"{res['avg_r']:.4f} / {res['avg_tau']:.4f}"
            cells.append(f"**{cell}**" if k == best else cell)
        lines.append(f"| {rv} | " + " | ".join(cells) + " |")
    return lines


def ranked_table(sweep: Sweep, keys, ref_key: str | None = None) -> list[str]:
    keys = sorted(keys, key=lambda k: -sweep.results[k]["avg_r"])
    top = sweep.results[keys[0]]["avg_r"]
    lines = ["| configuration | avg r | avg τ | Δr to best |", "|---|---|---|---|"]
    for k in keys:
        res = sweep.results[k]
        name = f"**{k}**" if k == ref_key else k
        lines.append(f"| {name} | {res['avg_r']:.4f} | {res['avg_tau']:.4f} | {res['avg_r'] - top:+.4f} |")
    return lines


def main(argv=None) -> None:
    parser = wmt_parser(__doc__)
    parser.add_argument("--model", default=DEFAULT_MODEL, help="encoder (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=32, help="pairs per scoring/centering batch")
    parser.add_argument("--encode-batch-size", type=int, default=64, help="texts per encoder forward")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default: %(default)s)")
    parser.add_argument("--no-wmd", action="store_true", help="skip exact WMD (needs POT)")
    parser.add_argument("--wmd-check", type=int, default=2,
                        help="batches on which torchmover.functional.wmd is compared with the LP (0: skip)")
    parser.add_argument("--no-scorer-check", action="store_true", help="skip the torchmover.Scorer() check")
    parser.add_argument("--cache", type=Path, help="keep the encoded texts in this directory (memory-mapped; "
                                                   "reused when it holds them already)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    t_start = time.perf_counter()
    timings = {}

    rows = load_wmt(args.data)
    texts = list(dict.fromkeys([r["hyp"] for r in rows] + [r["ref"] for r in rows]))
    tid = {t: i for i, t in enumerate(texts)}
    hyps, refs = [tid[r["hyp"]] for r in rows], [tid[r["ref"]] for r in rows]
    groups = np.array([r["group"] for r in rows])
    human = np.array([r["score"] for r in rows])
    print(f"{len(rows)} pairs, {len(texts)} distinct texts, {len(set(groups.tolist()))} groups")

    library = torchmover.Scorer(args.model, device="cpu").config  # the library's defaults for the model now
    current_default = dict(layer=library.layer, centering=library.centering, method=library.method,
                           temperature=library.temperature, direction=library.direction, n_iter=library.n_iter)
    name = library.model
    report_name = "select_defaults" + ("" if name == DEFAULT_MODEL else "_" + name.rsplit("/", 1)[-1])
    t0 = time.perf_counter()
    cache = EmbeddingCache(texts, args.model, args.encode_batch_size, args.cache)
    timings["encode_all_layers_s"] = time.perf_counter() - t0
    batches = make_batches(hyps, refs, [len(t) for t in texts], args.batch_size)
    sweep = Sweep(cache, batches, len(rows), groups, human)
    layers = range(1, cache.n_layers + 1)

    # A. layer x centering, TWMD T=0.1 recall
    t0 = time.perf_counter()
    stage_a = [cfg(l, c, "twmd", 0.1, "recall") for l in layers for c in CENTERINGS]
    sweep.run(stage_a + [cfg(**current_default)], "A: layer x centering")
    best_a = sweep.results[sweep.best([config_key(c) for c in stage_a])]
    centering = best_a["centering"]

    # B. layer x T (recall), then direction x T at the best layer; TWMD n_iter=1, best centering of A
    stage_b = [cfg(l, centering, "twmd", t, "recall") for l in layers for t in TEMPERATURES]
    sweep.run(stage_b, "B: layer x T")
    layer = sweep.results[sweep.best([config_key(c) for c in stage_b])]["layer"]
    stage_b2 = [cfg(layer, centering, "twmd", t, d) for t in TEMPERATURES for d in DIRECTIONS]
    sweep.run(stage_b2, "B: direction x T")
    best_b = sweep.results[sweep.best([config_key(c) for c in stage_b + stage_b2])]
    layer = best_b["layer"]

    # C. other members: per layer (cheap ones) and at the best layer (all)
    stage_c = [cfg(l, centering, "bertscore", direction=d) for l in layers for d in DIRECTIONS]
    stage_c += [cfg(l, centering, m) for l in layers for m in ("sbert", "cka")]
    stage_c += [cfg(l, centering, "trwmd", 0.1, "recall") for l in layers]
    stage_c += [cfg(layer, centering, "trwmd", t, d) for t in TEMPERATURES for d in DIRECTIONS]
    sweep.run(stage_c, "C: other members per layer")
    t_best, d_best = best_b["temperature"], best_b["direction"]
    stage_c2 = [cfg(layer, centering, "twmd", t_best, d_best, n) for n in (3, None)]
    stage_c2 += [cfg(layer, centering, "twmd", 0.1, "recall", n) for n in (3, None)]
    sweep.run(stage_c2, "C: TWMD iterations")
    wmd_check = None
    if not args.no_wmd:
        sweep.run([cfg(layer, centering, "wmd")], "C: exact WMD (LP)")
        if args.wmd_check:
            wmd_check = sweep.check_library_wmd(layer, centering, args.wmd_check)

    # D. every centering at the chosen TWMD configuration (and at the current default's layer/T)
    stage_d = [cfg(layer, c, "twmd", t_best, d_best) for c in CENTERINGS]
    stage_d += [cfg(current_default["layer"], c, "twmd", current_default["temperature"], "recall") for c in CENTERINGS]
    sweep.run(stage_d, "D: centering at the chosen config")
    timings["sweep_s"] = time.perf_counter() - t0

    twmd_keys = [k for k, v in sweep.results.items() if v["method"] == "twmd"]
    chosen_key = sweep.best([k for k in twmd_keys if sweep.results[k]["n_iter"] == 1])
    chosen = sweep.results[chosen_key]
    current_key = config_key(cfg(**current_default))
    current = sweep.results[current_key]
    overall_key = sweep.best(list(sweep.results))
    near = [k for k in twmd_keys if sweep.results[k]["n_iter"] == 1
            and chosen["avg_r"] - sweep.results[k]["avg_r"] <= 0.005]
    boot = sweep.bootstrap_diff(chosen_key, current_key) if chosen_key != current_key else None

    # Scorer() with the library's defaults, same data, batch_size=32
    scorer_check = None
    if not args.no_scorer_check:
        t0 = time.perf_counter()
        scorer = torchmover.Scorer(args.model)
        s = scorer.score([r["hyp"] for r in rows], [r["ref"] for r in rows], batch_size=args.batch_size).double().numpy()
        c = scorer.config
        lib_key = config_key(cfg(c.layer, c.centering, c.method, c.temperature, c.direction, c.n_iter))
        if lib_key not in sweep.scores:
            sweep.run([cfg(c.layer, c.centering, c.method, c.temperature, c.direction, c.n_iter)], "Scorer config")
        scorer_check = {"signature": scorer.signature, "sweep_key": lib_key, **sweep.correlate(s),
                        "max_abs_diff_vs_sweep": float(np.abs(s - sweep.scores[lib_key]).max())}
        timings["scorer_s"] = time.perf_counter() - t0
    timings["total_s"] = time.perf_counter() - t_start

    # --- write --------------------------------------------------------------------------------------
    env = {"threads": args.threads, "batch_size": args.batch_size}
    figures = {"model": name, "n_pairs": len(rows), "n_texts": len(texts), "env": env,
               "timings": timings, "chosen": chosen_key, "current_default": current_key,
               "best_overall": overall_key, "near_ties_0.005": near, "bootstrap_chosen_minus_current": boot,
               "scorer_check": scorer_check, "wmd_check": wmd_check, "results": sweep.results}

    pct = lambda v: f"{v:.4f}"  # noqa: E731
    title = f"Default layer / temperature / direction / centering for `{name}` on WMT15–16"
    L = [f"{len(rows)} pairs, {len(texts)} distinct texts, {len(sweep.group_names)} groups = language pair × year). "
         f"Cells are the average over the groups of Pearson r / Kendall τ-b against the human DA score. "
         f"Scoring batches: {args.batch_size} pairs, sorted by length, `batch` centering per batch (module docs). "
         f"torch {torch.__version__}, {args.threads} thread(s); wall time {timings['total_s'] / 60:.1f} min.", "",
         "## Choice", "",
         f"- **Chosen default (best average Pearson r among one-iteration TWMD): `{chosen_key}`** — "
         f"avg r = {pct(chosen['avg_r'])}, avg τ = {pct(chosen['avg_tau'])}.",
         f"- Current library default `{current_key}`: avg r = {pct(current['avg_r'])}, avg τ = {pct(current['avg_tau'])} "
         f"(Δr = {current['avg_r'] - chosen['avg_r']:+.4f}).",
         f"- Best of every configuration scored: `{overall_key}` — avg r = {pct(sweep.results[overall_key]['avg_r'])}, "
         f"avg τ = {pct(sweep.results[overall_key]['avg_tau'])}.",
         f"- One-iteration TWMD configurations within 0.005 of the best avg r ({len(near)}): "
         + ", ".join(f"`{k}` ({sweep.results[k]['avg_r']:.4f})" for k in sorted(near, key=lambda k: -sweep.results[k]["avg_r"])) + "."]
    if boot:
        L.append(f"- Paired bootstrap (1000 resamples of segments within each group) of avg r(chosen) − avg r(current): "
                 f"{boot['mean']:+.4f}, 95% CI [{boot['ci95'][0]:+.4f}, {boot['ci95'][1]:+.4f}], "
                 f"P(diff ≤ 0) = {boot['p_le_0']:.3f}.")
    L += ["", "## A. Layer × centering (TWMD, n_iter=1, T=0.1, recall)", ""]
    L += grid_table(sweep, layers, CENTERINGS, lambda l, c: config_key(cfg(l, c, "twmd", 0.1, "recall")), "layer", str)
    L += ["", f"## B. Layer × temperature (TWMD, n_iter=1, recall, centering={centering})", ""]
    L += grid_table(sweep, layers, TEMPERATURES, lambda l, t: config_key(cfg(l, centering, "twmd", t, "recall")),
                    "layer", lambda t: f"T={t:g}")
    L += ["", f"## B'. Direction × temperature at layer {layer} (TWMD, n_iter=1, centering={centering})", ""]
    L += grid_table(sweep, DIRECTIONS, TEMPERATURES, lambda d, t: config_key(cfg(layer, centering, "twmd", t, d)),
                    "direction", lambda t: f"T={t:g}")
    L += ["", f"## C. TRWMD: direction × temperature at layer {layer} (centering={centering})", ""]
    L += grid_table(sweep, DIRECTIONS, TEMPERATURES, lambda d, t: config_key(cfg(layer, centering, "trwmd", t, d)),
                    "direction", lambda t: f"T={t:g}")
    L += ["", f"## C. Best configuration scored of each member per layer (centering={centering}; avg r / avg τ; "
          f"TWMD: T grid × recall, plus directions at layer {layer}; TRWMD: T=0.1 recall, plus the grid at layer {layer})", ""]
    members = ["twmd", "trwmd", "bertscore", "sbert", "cka"] + ([] if args.no_wmd else ["wmd"])
    L += ["| layer | " + " | ".join(members) + " |", "|---|" + "---|" * len(members)]
    for l in layers:
        cells = []
        for m in members:
            ks = [k for k, v in sweep.results.items() if v["method"] == m and v["layer"] == l
                  and v["centering"] == centering and v["n_iter"] == 1]
            if not ks:
                cells.append("–")
                continue
            k = sweep.best(ks)
            v = sweep.results[k]
            extra = "/".join(str(x) for x in (v["temperature"] and f"T={v['temperature']:g}", v["direction"]) if x)
            cells.append(f"{v['avg_r']:.4f} / {v['avg_tau']:.4f}" + (f" ({extra})" if extra else ""))
        L.append(f"| {l} | " + " | ".join(cells) + " |")
    L += ["", f"## C. Every member at layer {layer} (centering={centering}), ranked", ""]
    L += ranked_table(sweep, [k for k, v in sweep.results.items() if v["layer"] == layer and v["centering"] == centering],
                      chosen_key)
    if wmd_check:
        L += ["", f"Exact WMD above is the LP (POT `ot.emd2`). `torchmover.functional.wmd` on "
              f"{wmd_check['batches']} middle-length batches ({wmd_check['pairs']} pairs, layer {layer}): max |diff| to the LP = "
              f"{wmd_check['max_abs_diff']:.2e}, {wmd_check['library_not_converged']} pair(s) not converged; "
              f"{wmd_check['library_s_per_batch']:.1f} s per batch of {args.batch_size} vs "
              f"{wmd_check['lp_s_per_batch']:.2f} s for the LP."]
    L += ["", "## D. Centering at the chosen configuration and at the current default", ""]
    L += ranked_table(sweep, [config_key(c) for c in stage_d], chosen_key)
    L += ["", f"## Per language pair: chosen `{chosen_key}`, current default `{current_key}`"
          + (", and `torchmover.Scorer()`" if scorer_check else ""), ""]
    head = "| group | chosen r | chosen τ | current r | current τ |" + (" Scorer() r | Scorer() τ |" if scorer_check else "")
    L += [head, "|" + "---|" * (head.count("|") - 1)]
    for g in sweep.group_names:
        cells = [chosen["per_group"][g]["r"], chosen["per_group"][g]["tau"],
                 current["per_group"][g]["r"], current["per_group"][g]["tau"]]
        if scorer_check:
            cells += [scorer_check["per_group"][g]["r"], scorer_check["per_group"][g]["tau"]]
        L.append(f"| {g} | " + " | ".join(fmt(v) for v in cells) + " |")
    avg = [chosen["avg_r"], chosen["avg_tau"], current["avg_r"], current["avg_tau"]]
    if scorer_check:
        avg += [scorer_check["avg_r"], scorer_check["avg_tau"]]
    L.append("| **average** | " + " | ".join(f"**{v:.4f}**" for v in avg) + " |")
    if scorer_check:
        L += ["", f"`torchmover.Scorer()` ({scorer_check['signature']}) reproduces the sweep's `{scorer_check['sweep_key']}`: "
              f"max |score difference| over the {len(rows)} pairs = {scorer_check['max_abs_diff_vs_sweep']:.2e}."]
    L += ["", "## Timings", "", "| step | seconds |", "|---|---|"]
    L += [f"| {k} | {v:.1f} |" for k, v in timings.items()]
    harness.publish(args.out, report_name, title, figures, {"docs_default": docs_default_table(figures)},
                    body=["\n".join(L), "## The table of the documentation", {"table": "docs_default"}],
                    data=harness.data_provenance(args.data))


if __name__ == "__main__":
    main()
