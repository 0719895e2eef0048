"""Run a function on W local ``gloo`` processes (CPU) and collect what each rank returns.

Workers are module-level functions of importable modules (here, or ``conftest``): spawned children
unpickle them by name, with the parent's ``sys.path``. Everything has a deadline — the process group
(collectives fail after ``timeout``) and the parent (kills its children after ``timeout``) — so a
broken collective fails the test instead of hanging it.
"""
from __future__ import annotations

import datetime
import os
import socket
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

TESTS = str(Path(__file__).resolve().parent)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, fn, world_size: int, port: int, out_dir: str, timeout: float, args: tuple) -> None:
    torch.set_num_threads(1)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout))
    try:
        result = fn(rank, world_size, *args)
        path = os.path.join(out_dir, f"rank{rank}.pt")
        torch.save(result, path + ".tmp")
        os.replace(path + ".tmp", path)  # the file exists only once complete
        dist.barrier()  # no rank tears gloo down while another is still inside a collective
    finally:
        dist.destroy_process_group()


def run(fn, world_size: int, out_dir, *args, timeout: float = 60.0) -> list:
    """``[fn(rank, world_size, *args) for rank in range(world_size)]``, each rank in its own process
    inside one process group; results travel through ``torch.save`` / ``torch.load(weights_only=True)``
    (tensors, lists, dicts)."""
    if TESTS not in sys.path:
        sys.path.insert(0, TESTS)  # children import this module and conftest by name
    ctx = mp.start_processes(_entry, args=(fn, world_size, free_port(), str(out_dir), timeout / 2, args),
                             nprocs=world_size, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout
    results = [Path(out_dir) / f"rank{r}.pt" for r in range(world_size)]
    try:
        while not ctx.join(timeout=1.0):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{getattr(fn, '__name__', fn)} on {world_size} processes took over {timeout} s")
    except mp.ProcessExitedException as error:
        # gloo can abort a process while it is torn down (seen once in CI: "terminate called without an
        # active exception", SIGABRT); a rank that crashed before its result was written fails the test
        if not all(path.exists() for path in results):
            raise
        warnings.warn(f"a rank exited abnormally after every rank had written its result: {error}")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
                p.join(5)
    return [torch.load(path, weights_only=True) for path in results]


# --- workers (module level, so that spawned processes can import them) ---------------------------

def tiny_scorer(centering: str = "batch", **options):
    """The conftest tiny scorer (``options``: more of the Scorer's) with its centering in training mode
    (distributed sync on) and the encoder in eval mode (no dropout, so runs are deterministic)."""
    from conftest import tiny_model, tiny_tokenizer
    from torchmover import Encoder, Scorer

    scorer = Scorer(Encoder(tiny_model(), tiny_tokenizer(), layer=2, name="tiny-bert"), centering=centering,
                    **options)
    scorer.train()
    scorer.encoder.eval()
    return scorer


LONE_TEXTS = ["a dog", "the cat"]  # 2 tokens each: one bigram
BIGRAMS = {"ngram": 2}


def loss_and_grad(scorer, hyps, refs) -> dict:
    """Scores of ``hyps`` vs ``refs``, loss = their sum, and the flat gradient of the loss w.r.t. the
    encoder's parameters (zeros where a parameter gets none)."""
    scorer.zero_grad(set_to_none=True)
    scores = scorer(hyps, refs)
    loss = scores.sum()
    loss.backward()
    grad = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten()
                      for p in scorer.encoder.parameters()])
    return {"scores": scores.detach(), "loss": loss.detach(), "grad": grad,
            "mean": scorer.centering.mean.clone(), "num_tokens": scorer.centering.num_tokens.clone()}


def centering_worker(rank: int, world_size: int, hyps, refs) -> dict:
    """One training step of each centering mode on this rank's slice ``[rank::world_size]``."""
    h, r = hyps[rank::world_size], refs[rank::world_size]
    out = {}
    for name, centering, sync in [("batch", "batch", True), ("running", "running", True),
                                  ("batch_nosync", "batch", False)]:
        scorer = tiny_scorer(centering)
        scorer.centering.sync = sync
        out[name] = loss_and_grad(scorer, h, r)
    # bigrams: each rank's one text's mean is its own, the mean over the ranks is neither's
    texts = LONE_TEXTS[rank::world_size]
    out["bigrams"] = loss_and_grad(tiny_scorer("batch", **BIGRAMS), texts, texts)
    scorer = tiny_scorer("batch").eval()
    if rank == 0:  # eval mode centers locally: scoring on one rank alone must not wait for the others
        with torch.no_grad():
            out["eval_rank0"] = scorer(h, r)
    dist.barrier()
    return out


def metric_worker(rank: int, world_size: int, hyps, refs, corpus) -> dict:
    """``MoverMetric`` (fixed centering) updated twice with this rank's slice, then computed."""
    from torchmover.evaluation.metric import MoverMetric

    scorer = tiny_scorer("fixed").eval().fit_centering(corpus, progress=False)
    metric = MoverMetric(scorer, return_per_sample=True)
    h, r = hyps[rank::world_size], refs[rank::world_size]
    metric.update(h[:1], r[:1])
    metric.update(h[1:], r[1:])
    value = metric.compute()
    return {"score": value["score"], "per_sample": value["per_sample"], "local": torch.cat(metric.scores)}


def batch_metric_worker(rank: int, world_size: int, hyps, refs) -> dict:
    """``MoverMetric`` with batch centering, updated with this rank's slice (two updates), computed."""
    from torchmover.evaluation.metric import MoverMetric

    metric = MoverMetric(tiny_scorer("batch").eval(), return_per_sample=True)
    h, r = hyps[rank::world_size], refs[rank::world_size]
    metric.update(h[:1], r[:1])
    metric.update(h[1:], r[1:])
    value = metric.compute()
    return {"score": value["score"], "per_sample": value["per_sample"], "n_local": len(metric.preds)}


def fit_worker(rank: int, world_size: int, corpus, hyps, refs) -> dict:
    """Every corpus statistic fitted on this rank's share of ``corpus`` (all ranks pass all of it),
    then scores of the whole ``hyps`` / ``refs`` with them."""
    from conftest import tiny_model, tiny_tokenizer
    from torchmover import Encoder, Scorer
    from torchmover.reward.rewards import MoverReward

    scorer = tiny_scorer("fixed").eval()
    scorer.fit_centering(corpus, batch_size=2, progress=False)
    idf_scorer = Scorer(Encoder(tiny_model(), tiny_tokenizer(), layer=2, name="tiny-bert"), centering="none", idf=True)
    idf_scorer.fit_idf(corpus, hyps)
    reward = MoverReward(tiny_scorer("batch").eval()).fit(corpus, batch_size=2)
    out = {"cached": torch.tensor(reward.cache_info().currsize), "reward": reward(hyps, refs),
           "mean": scorer.centering.mean, "num_tokens": scorer.centering.num_tokens,
           "reward_mean": reward.centering.mean,
           "idf_ref": idf_scorer.idf["ref"].to_dict(), "idf_hyp": idf_scorer.idf["hyp"].to_dict(),
           "one_text_mean": tiny_scorer("fixed").eval().fit_centering(corpus[:1], progress=False).centering.mean}
    try:
        scorer.fit_centering(corpus[rank:], progress=False)
    except ValueError as error:
        out["mismatch"] = str(error)
    return out


# --- sharded scoring (Scorer.score(distributed=True)) ---------------------------------------------

SHARDED_CASES = [  # (name, Scorer options): every member, batch centering (joint and separate scopes)
    *[(method, {"method": method, "centering": "batch"}) for method in
      ("twmd", "trwmd", "wmd", "moverscore", "bertscore", "sbert", "cka", "sms", "s+wms", "wms")],
    ("twmd-separate", {"method": "twmd", "centering": "batch", "center_scope": "separate"}),
    ("twmd-none", {"method": "twmd", "centering": "none"}),
]


def sharded_scorer(options: dict):
    from conftest import tiny_model, tiny_tokenizer
    from torchmover import Encoder, Scorer

    return Scorer(Encoder(tiny_model(), tiny_tokenizer(), layer=2, name="tiny-bert"), **options).eval()


def sharded_score_worker(rank: int, world_size: int, hyps, refs, chunk: int) -> dict:
    """Every case of ``SHARDED_CASES`` scored with ``distributed=True`` (``return_all``: every direction),
    in chunks of ``chunk`` pairs; the texts this rank encoded; the error of a rank passing other lists."""
    import torchmover.scorer.corpus as corpus

    corpus.SCORE_CHUNK = chunk
    out = {}
    for name, options in SHARDED_CASES:
        scorer = sharded_scorer(options)
        encoded = []
        forward = scorer.encoder.forward
        scorer.encoder.forward = lambda texts, **kw: encoded.extend(texts) or forward(texts, **kw)
        out[name] = torch.stack(list(scorer.score(hyps, refs, batch_size=2, return_all=True, distributed=True)))
        out[name + ":encoded"] = len(encoded)
    try:
        sharded_scorer(SHARDED_CASES[0][1]).score(hyps[rank:], refs[rank:], distributed=True)
    except ValueError as error:
        out["mismatch"] = str(error)
    return out


REFS_4 = [["the cat sat on the mat"], ["a cat"], ["the dog barked"], ["one bird sang"]]  # none on both ranks
LONE_CALLS = {  # name -> (hyps, refs): the bigram text "a dog" among hypotheses empty or not
    "lone": (["a dog", "", " ", ""], REFS_4),
    "lone, repeated in both shares": (["a dog", "", "a dog", " "], REFS_4),  # counted once, by its owner
    "not lone": (["a dog", "", "the cat", ""], REFS_4),
}


def lone_score_worker(rank: int, world_size: int) -> dict:
    """``batch`` centering of each side apart with bigrams, scored over the ranks: every case of
    ``LONE_CALLS`` with ``distributed=True`` (the same lists on every rank), and with
    ``centering_group`` (each rank its half of the lists: a text on both ranks is counted once)."""
    scorer = sharded_scorer(dict(centering="batch", center_scope="separate", ngram=2))
    out = {}
    for name, (hyps, refs) in LONE_CALLS.items():
        out[name] = scorer.score(hyps, refs, batch_size=2, distributed=True)
        half = slice(2 * rank, 2 * rank + 2)
        out[name + ":group"] = scorer.score(hyps[half], refs[half], batch_size=2, centering_group=dist.group.WORLD)
    return out
