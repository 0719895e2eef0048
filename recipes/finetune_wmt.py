"""Fine-tune the metric on human direct-assessment ratings (the paper's protocol, WMT15-16 DA).

The whole pipeline is trained end to end — encoder -> batch centering -> tempered WMD -> ``Sim`` —
with an L2 loss against the human score through an affine calibration:

    L = mean_i (a · Sim(hyp_i, ref_i) + b − human_i)²          (a, b learned with the encoder)
        [+ w · (1 − r_batch(a·Sim + b, human))]                    (--loss mse+pearson, --loss-weight w)
        [+ w · mean_{human_i > human_j} log(1 + exp(−(ŷ_i − ŷ_j)))] (--loss mse+rank: RankNet on the batch)

Centering: training vs evaluation
---------------------------------
In training, ``forward`` centers each (global) micro-batch on its own mean token (``--centering batch``,
the paper's protocol; ``fixed`` keeps the untuned training texts' mean instead). Under a centering
that depends on other texts (``batch``, ``running``, ``fixed``) every evaluation — untuned baseline,
dev per epoch, final test — and the saved ``final/`` scorer center on a *fixed* mean: the mean token
of the training texts (``--centering-fit-size`` of them, seeded) under the encoder being evaluated,
so a pair's score does not depend on the other pairs scored with it. A centering of each text on its
own (``none``, ``sentence``, ``dimension``) is evaluated and saved as it was trained.

Model selection and seeds
-------------------------
The test set is never used for a choice. With a dev split (``--dev-fraction``, carved from the
training files), dev Pearson r is measured after every epoch; the final model is the best dev epoch,
and ``--patience P`` stops after P epochs without a better one. ``--seeds 0,1,2`` runs the recipe
once per seed (dev split, training subset, data order, dropout) in ``OUTPUT/seed-S`` and writes
``OUTPUT/seeds.md`` / ``seeds.json`` (before / after / Δ per seed and mean ± sd) and ``seeds.png``
(test r per language pair, before and after); a finished seed is not rerun, an interrupted one
resumes (one stopped before its first checkpoint starts over), and ``--overwrite`` reruns them all. ``--layer`` picks the layer read (default: the top one); the blocks above it are cut off
(never computed, so never trained); ``--layer-decay γ`` gives block k of K the learning rate
``lr·γ^(K−k)`` (embeddings ``lr·γ^K``), ``--freeze-below K`` freezes the lowest blocks.

Defaults (chosen for the best absolute dev r on WMT15, never on the test year)
------------------------------------------------------------------------------
Read the encoder's top layer (6 of all-MiniLM-L6-v2, so every block is trained), batch centering while
training, T = 0.15, one epoch, AdamW lr 2e-4 with 10% warm-up then linear decay, MSE + Pearson loss,
fp32. Chosen by a staged rule written before the runs (layer × centering, then T, lr, loss, epochs;
three seeds; a challenger must gain 0.003 mean dev r): none did, the closest being layer 6 without
centering (+0.0025) and two epochs (+0.0016). With them: dev r 0.745 ± 0.055, WMT16 r 0.633 → 0.702 ±
0.007 (+6.9 points; 3 seeds). Reading layer 4 ties on dev and ends higher on WMT16 (0.712); pass
``--layer 4`` for it. Rule and runs: ``bench/results/finetune_defaults.md``,
``bench/studies/choose_finetune_defaults.py``. On a base-size encoder whose top layer is far below its
recorded one, pass that layer: all-mpnet-base-v2 starts at WMT16 r 0.650 at its top layer and ends at
0.722, against 0.742 -> 0.774 with ``--layer 7`` (one seed, ``docs/results.md``).

Why the calibration starts from a least-squares fit
---------------------------------------------------
Human DA scores are z-scores (mean ≈ 0, sd ≈ 0.8 on WMT15-16) while ``Sim`` lives in a narrow band
around 0.3-0.6 with a small spread. Started at ``a = 1, b = 0`` the loss is dominated by that *scale*
mismatch, and the cheapest way for the optimiser to reduce it is to move the encoder so that ``Sim``
itself spreads out and shifts to the z-score range; measured with the default encoder (layer 4,
T = 0.15, batch centering, AdamW, 2 epochs on WMT15-16, tested on a later year) that *lost* 5 Pearson
points. Starting from the least-squares fit of the untuned scores, ``(a₀, b₀) = argmin Σ (a·Sim + b −
human)²``, the initial loss is already the best any affine map of the untuned metric can do, the
gradient reaching the encoder is the *residual* of a calibrated metric, and fine-tuning improves the
ranking: +3.6 Pearson points at lr 2e-5 and +5.4 at 5e-5 in the same setting. This is the default
(``--calibration-init lsq``); ``--calibration-init identity`` reproduces the failing variant. The fit
uses the untuned scorer on training batches shaped like the training ones (same batch size, so the
same batch-centering regime), without dropout, on up to ``--calibration-fit-size`` training pairs.
The calibration has its own learning rate (``--calibration-lr``; 0 freezes it at the fit). An affine
map with ``a > 0`` does not change correlations: it only shapes the training signal. It is saved as
``calibration.json`` next to the model so that ``a·Sim + b`` predicts human z-scores.

Outputs (``--output DIR``)
--------------------------
- ``log.jsonl``: one JSON object per line — ``config``, ``calibration_fit``, ``step`` (loss, lr,
  a, b, pairs/s every ``--log-every`` optimiser steps), ``epoch`` (mean train loss, dev correlations),
  ``eval`` (test correlations before / after), ``done``; after ``--resume``, ``resume``. Each event
  is logged once: a resume drops what the interrupted run logged after its checkpoint, which is
  logged again as it is redone.
- ``curves.png``: training loss per step and dev Pearson r / Kendall τ per epoch (epoch 0 = untuned).
- ``checkpoints/step-XXXXXXX.pt`` and ``checkpoints/latest``: written atomically (temporary file,
  then ``os.replace``) at the end of every epoch and every ``--save-every`` steps; model, optimiser,
  scheduler, grad scaler, calibration, every rank's RNG states, epoch and step, and how many events
  the log held. ``--resume`` continues exactly (same data order, dropout masks, optimiser state, and
  a run that had stopped early stays stopped), read with ``torch.load(weights_only=True)``.
- A directory that already holds a run (any of these outputs) is never overwritten silently: run
  again without ``--resume`` and the recipe refuses before writing anything, naming the two choices,
  ``--resume`` (continue it) and ``--overwrite`` (delete these outputs, other files stay, and start
  over). ``--resume`` of a run stopped before its first checkpoint starts it over, as one line says;
  the temporaries a killed run left (a half-written checkpoint) are removed by the next run.
- ``final/``: the fine-tuned scorer (``Scorer.from_pretrained("DIR/final")``: encoder safetensors,
  ``torchmover.json``, ``centering="fixed"`` with the training texts' mean) and
  ``final/calibration.json`` (``a``, ``b``); ``result.json``: the run's summary. Its signature says
  that it was fine-tuned, on which ratings, and which weights it reads (``finetuned:da:2015:cs-en+...:
  1790-pairs@weights-<hash>``, after the model it started from; ``Scorer.mark_finetuned``). With
  ``--seeds``, ``OUTPUT/final`` is the seed of the best dev r.
- ``test_report.json`` and ``table.txt``: per-language-pair Kendall τ and Pearson r before and after
  fine-tuning (the paper's Table 4 layout), on ``--test`` or, without it, on the dev split.

Distributed
-----------
``torchrun --nproc-per-node W recipes/finetune_wmt.py ...`` runs W data-parallel processes
(initialised from torchrun's environment variables; NCCL on GPUs, gloo on CPUs); a plain ``python``
launch is one process. Each optimiser step sees ``--batch-size`` pairs per process and micro-batch,
times ``--grad-accum`` micro-batches: a global batch of ``W · batch_size · grad_accum`` pairs. Data
are split with a seeded ``DistributedSampler``, so W processes with batch ``B`` draw, at every step,
the same pairs as one process with batch ``W·B``. Batch centering in training mode subtracts the
mean token of the *global* micro-batch through a differentiable all-reduce
(:mod:`torchmover.runtime.distributed`), and the gradients are summed over ranks after backward (the
all-reduce's backward already routes every rank's loss to every rank's tokens), so the global batch
is centred, scored and differentiated as on one process. Evaluation and checkpointing happen on
rank 0.

Cost: on a quiet 2-core CPU the default encoder trains at 8-9.5 pairs/s in fp32 (WMT15 -> WMT16, 2
epochs: 12.8 min); on one busy core 1.3-1.7 pairs/s. ``--precision bf16`` (autocast; evaluation
stays fp32) pays only where the CPU has bf16 matrix units (1.75x faster with AMX); on a CPU without
them it is far slower (a no-grad training-mode forward: 14x), so the default stays fp32.
``--max-train-pairs N`` makes quick runs.
Measurements: ``bench/results/finetune_wmt.md``.

Examples::

    # WMT15+16 minus a 10% dev split, evaluated on the dev split
    python recipes/finetune_wmt.py --output runs/wmt1516 --dev-fraction 0.1
    # train on WMT15, test on WMT16
    python recipes/finetune_wmt.py --train ../shared/data/wmt15-16/wmt15.*.tsv \\
        --test ../shared/data/wmt15-16/wmt16.cs-en.tsv ... --output runs/wmt15
    torchrun --nproc-per-node 4 recipes/finetune_wmt.py --output runs/ddp --precision bf16
    python recipes/finetune_wmt.py --output runs/wmt1516 --resume          # continue after a stop
    python recipes/finetune_wmt.py --output runs/wmt1516 --overwrite       # discard it, start over
    # three seeds and their mean ± sd table; other members under the same protocol
    python recipes/finetune_wmt.py --seeds 0,1,2 --output runs/seeds
    python recipes/finetune_wmt.py --seeds 0,1,2 --method bertscore --direction f1 --output runs/bertscore
"""
# No `from __future__ import annotations`: with string annotations, @dataclass looks this module up in
# sys.modules, where it is not when loaded from its path (importlib.util.spec_from_file_location).
import argparse
import contextlib
import dataclasses
import json
import os
import random
import sys
import time
from pathlib import Path

import torch
from torch import Tensor, nn

import torchmover as tm
from torchmover.evaluation.correlation import Report, correlate
from torchmover.evaluation.data import Rating, read_ratings, split_dev
from torchmover.functional.centering import Centering
from torchmover.functional.members import get_member
from torchmover.runtime.checkpoint import (
    atomic_write_text, latest_checkpoint, load_checkpoint, save_checkpoint, set_rng_state,
)
from torchmover.runtime.distributed import all_reduce_sum

if str(Path(__file__).resolve().parent) not in sys.path:  # recipes/common.py, also when loaded from its path
    sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TRAIN = REPO.parent / "shared" / "data" / "wmt15-16"
CHECKPOINT_FORMAT = 1
PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
# Options that fix the data order, the schedule or the model: --resume refuses to change them.
RESUME_FIXED = ("train", "year", "dev_fraction", "max_train_pairs", "model", "layer", "method", "direction",
                "temperature", "centering", "centering_fit_size", "max_length", "freeze_below", "epochs",
                "batch_size", "grad_accum", "seed", "warmup", "schedule", "calibration_init", "loss",
                "loss_weight", "layer_decay", "patience")
# Centerings under which a text's vectors do not depend on the other texts: evaluated as trained.
SELF_CONTAINED_CENTERINGS = ("none", "sentence", "dimension")
# What a run writes in --output: a directory with any of them holds a run (common.claim_run_directory).
RUN_OUTPUTS = ("checkpoints", "log.jsonl", "final", "result.json", "test_report.json", "table.txt", "curves.png")


# --- command line ----------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    d = p.add_argument_group("data")
    d.add_argument("--train", nargs="+", default=[str(DEFAULT_TRAIN)],
                   help="training ratings: files or directories in any layout torchmover.evaluation.data reads")
    d.add_argument("--test", nargs="+", help="test ratings (any layout); default: the dev split")
    d.add_argument("--year", type=int, help="year of JSON-lines records without a 'year' key")
    d.add_argument("--dev-fraction", type=float, default=0.1,
                   help="share of each language pair held out as dev set (0: none)")
    d.add_argument("--max-train-pairs", type=int, default=0,
                   help="train on a seeded random subset of this many pairs (quick runs; 0: all)")
    m = p.add_argument_group("metric")
    m.add_argument("--model", default=tm.DEFAULT_MODEL, help="hub name or local path")
    m.add_argument("--layer", type=int,
                   help="hidden layer read (default: the model's top layer, so every block is fine-tuned)")
    m.add_argument("--method", default="twmd", choices=("twmd", "trwmd", "bertscore", "sbert", "cka"))
    m.add_argument("--direction", default="recall", choices=("recall", "precision", "f1"))
    m.add_argument("--temperature", type=float, default=0.15,
                   help="T of twmd / trwmd (the other methods have none: not passed to them)")
    m.add_argument("--centering", default="batch", choices=("batch", "fixed", "running", "sentence", "dimension", "none"),
                   help="centering while training. batch: the paper's protocol (synchronised over processes); "
                        "fixed: the mean of the training texts under the untuned encoder, kept. Evaluation "
                        "of batch / running / fixed uses a fixed mean fitted on the training texts (see "
                        "--centering-fit-size); none / sentence / dimension are evaluated as trained")
    m.add_argument("--centering-fit-size", type=int, default=1024,
                   help="training texts (a seeded subset, hypotheses and references) whose mean token is "
                        "the fixed evaluation mean (0: all)")
    m.add_argument("--max-length", type=int, help="encoder window in tokens")
    m.add_argument("--freeze-below", type=int, default=0, metavar="K",
                   help="freeze the embeddings and the first K transformer blocks (faster backward); "
                        "0 trains everything")
    o = p.add_argument_group("optimisation")
    o.add_argument("--epochs", type=int, default=1)
    o.add_argument("--patience", type=int, default=0,
                   help="early stopping: stop after this many epochs without a better dev Pearson r (0: "
                        "train every epoch); with a dev split the final model is always the best dev epoch")
    o.add_argument("--loss", default="mse+pearson", choices=("mse", "mse+pearson", "mse+rank"),
                   help="mse: (a·Sim + b − human)²; +pearson adds w·(1 − r) of each batch; +rank adds w × the "
                        "mean logistic loss of the batch's pairs ordered by the human scores")
    o.add_argument("--loss-weight", type=float, default=1.0, help="w of the correlation term of --loss")
    o.add_argument("--layer-decay", type=float, default=1.0,
                   help="layer-wise lr decay: block k of K (from 1) gets lr·γ^(K−k), the embeddings lr·γ^K")
    o.add_argument("--batch-size", type=int, default=16, help="pairs per process and micro-batch")
    o.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimiser step")
    o.add_argument("--lr", type=float, default=2e-4, help="peak AdamW learning rate of the encoder")
    o.add_argument("--calibration-lr", type=float, help="learning rate of a, b (default: --lr; 0 freezes)")
    o.add_argument("--calibration-init", default="lsq", choices=("lsq", "identity"),
                   help="lsq: least-squares fit of the untuned scores; identity: a=1, b=0")
    o.add_argument("--calibration-fit-size", type=int, default=2048,
                   help="training pairs used for the least-squares fit (0: all)")
    o.add_argument("--weight-decay", type=float, default=0.01, help="AdamW decay (not on biases, norms, a, b)")
    o.add_argument("--warmup", type=float, default=0.1,
                   help="linear warm-up: a fraction of all optimiser steps if < 1, else a number of steps")
    o.add_argument("--schedule", default="linear", choices=("linear", "constant"),
                   help="after warm-up: linear decay to 0, or constant")
    o.add_argument("--max-grad-norm", type=float, default=1.0, help="gradient clipping (0: off)")
    o.add_argument("--precision", default="fp32", choices=tuple(PRECISIONS),
                   help="autocast dtype of the encoder (bf16 on CPU or GPU, fp16 on GPU with loss scaling)")
    o.add_argument("--seed", type=int, default=0, help="seed of the dev split, training subset, data order, dropout")
    o.add_argument("--seeds", help="comma-separated seeds: one run per seed in OUTPUT/seed-S, then the table "
                                   "OUTPUT/seeds.md and seeds.json (mean ± sd); finished seeds are not rerun")
    o.add_argument("--device", help="cpu, cuda, cuda:1 (default: cuda:LOCAL_RANK if available, else cpu)")
    o.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    r = p.add_argument_group("run")
    r.add_argument("--output", default="runs/finetune_wmt", help="run directory")
    again = r.add_mutually_exclusive_group()
    again.add_argument("--resume", nargs="?", const="latest", metavar="CHECKPOINT",
                       help="continue from a checkpoint file, or from the run directory's latest one")
    again.add_argument("--overwrite", action="store_true",
                       help="delete the outputs of the run already in --output, then start over (without "
                            "--resume or --overwrite, a directory that holds a run is refused)")
    r.add_argument("--save-every", type=int, default=0, help="also checkpoint every N optimiser steps")
    r.add_argument("--keep-checkpoints", type=int, default=2, help="checkpoints of this run kept (its highest steps)")
    r.add_argument("--stop-after", type=int, default=0, metavar="STEPS",
                   help="checkpoint and stop after this many optimiser steps (time-limited jobs); 0: never")
    r.add_argument("--eval-batch-size", type=int, default=64, help="batch size of evaluation scoring")
    r.add_argument("--n-boot", type=int, default=1000, help="bootstrap resamples of the final test report")
    r.add_argument("--skip-baseline", action="store_true", help="do not evaluate the untuned metric")
    r.add_argument("--log-every", type=int, default=10, help="log the loss every N optimiser steps")
    r.add_argument("--no-progress", action="store_true", help="no progress bars")
    r.add_argument("--no-plot", action="store_true", help="do not write curves.png")
    return p


# --- the trained objects -----------------------------------------------------------------------------

class Calibration(nn.Module):
    """``a · sim + b``: maps the metric to the human z-score scale inside the L2 loss."""

    def __init__(self, a: float = 1.0, b: float = 0.0):
        super().__init__()
        self.a = nn.Parameter(torch.tensor(float(a)))
        self.b = nn.Parameter(torch.tensor(float(b)))

    def forward(self, sim: Tensor) -> Tensor:
        return self.a * sim + self.b

    def to_dict(self) -> dict[str, float]:
        return {"a": self.a.item(), "b": self.b.item()}

    def extra_repr(self) -> str:
        return f"a={self.a.item():.4f}, b={self.b.item():.4f}"


def least_squares(sx: float, sy: float, sxx: float, sxy: float, n: float) -> tuple[float, float]:
    """``(a, b) = argmin Σ (a x + b − y)²`` from the sums ``Σx, Σy, Σx², Σxy`` and ``n``."""
    var = sxx - sx * sx / n
    if n < 2 or var <= 1e-12 * max(1.0, sxx):
        return 1.0, (sy - sx) / max(n, 1.0)  # constant scores: keep the scale, match the mean
    a = (sxy - sx * sy / n) / var
    return a, (sy - a * sx) / n


def top_layer(model: str) -> int:
    """The top layer of ``model`` (hub name, local path, or the offline default): its block count."""
    from transformers import AutoConfig
    from torchmover.text.encoder import resolve_model_path

    return AutoConfig.from_pretrained(os.path.expanduser(resolve_model_path(model))).num_hidden_layers


def parameter_depths(scorer: tm.Scorer) -> dict[int, int]:
    """``{id(parameter): depth}`` of the encoder: 0 for the embeddings, ``k`` for transformer block
    ``k`` (from 1, up to the scored layer: the blocks above it are cut off and never computed)."""
    model = scorer.encoder.model
    blocks = next((name for name, mod in model.named_modules()
                   if isinstance(mod, nn.ModuleList) and len(mod) == model.config.num_hidden_layers), None)
    if blocks is None:
        raise ValueError(f"cannot find the block list of {type(model).__name__}")
    depths = {}
    for name, param in model.named_parameters():
        if name.startswith(blocks + "."):
            depths[id(param)] = int(name[len(blocks) + 1:].split(".")[0]) + 1
        elif "embeddings" in name.split(".")[0]:
            depths[id(param)] = 0
    return depths


def frozen_parameters(scorer: tm.Scorer, below: int) -> int:
    """Freeze the embeddings and the first ``below`` transformer blocks; returns how many tensors."""
    if below <= 0:
        return 0
    n_blocks = scorer.encoder.model.config.num_hidden_layers
    if below > n_blocks:
        raise ValueError(f"--freeze-below must be at most {n_blocks} (the blocks up to the scored layer), got {below}")
    depths = parameter_depths(scorer)
    frozen = [p for p in scorer.encoder.model.parameters() if depths.get(id(p), n_blocks + 1) <= below]
    for param in frozen:
        param.requires_grad_(False)
    return len(frozen)


def param_groups(scorer: tm.Scorer, calibration: Calibration, args) -> list[dict]:
    """AdamW groups: per encoder depth, weights (decayed) and biases and norms (not), at the
    layer-wise decayed learning rate ``lr·γ^(K − depth)``; then the calibration."""
    if not 0 < args.layer_decay <= 1:
        raise ValueError(f"--layer-decay must be in (0, 1], got {args.layer_decay}")
    n_blocks = scorer.encoder.model.config.num_hidden_layers
    depths = parameter_depths(scorer)
    groups: dict[tuple[int, bool], list] = {}
    for name, param in scorer.named_parameters():
        if param.requires_grad:
            decayed = not (param.ndim < 2 or "norm" in name.lower())
            groups.setdefault((depths.get(id(param), n_blocks), decayed), []).append(param)
    cal_lr = args.lr if args.calibration_lr is None else args.calibration_lr
    out = [{"params": params, "weight_decay": args.weight_decay if decayed else 0.0,
            "lr": args.lr * args.layer_decay ** (n_blocks - depth)}
           for (depth, decayed), params in sorted(groups.items())]
    if cal_lr > 0:
        out.append({"params": list(calibration.parameters()), "weight_decay": 0.0, "lr": cal_lr})
    else:
        calibration.requires_grad_(False)
    return out


# --- data ------------------------------------------------------------------------------------------

def read_all(paths: list[str], year: int | None) -> list[Rating]:
    """The ratings of every path; a missing, malformed or empty one ends the run with a one-line error."""
    try:
        records = [r for path in paths for r in read_ratings(path, year)]
    except (OSError, ValueError, ImportError) as error:
        raise SystemExit(f"finetune_wmt.py: error: {error}") from None
    if not records:
        raise SystemExit(f"finetune_wmt.py: error: no ratings in {' '.join(paths)}")
    return records


def epoch_steps(n: int, epoch: int, args, rank: int, world: int) -> list[list[list[int]]]:
    """This rank's optimiser steps of ``epoch``: lists of micro-batches of record indices.

    A seeded ``DistributedSampler`` (reshuffled per epoch) gives every rank ``ceil(n / W)`` indices,
    so all ranks run the same number of micro-batches and collectives."""
    from torch.utils.data import DistributedSampler

    sampler = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
    sampler.set_epoch(epoch)
    order = list(sampler)
    micro = [order[i:i + args.batch_size] for i in range(0, len(order), args.batch_size)]
    return [micro[i:i + args.grad_accum] for i in range(0, len(micro), args.grad_accum)]


# --- evaluation ------------------------------------------------------------------------------------

def evaluate(scorer: tm.Scorer, records: list[Rating], args, n_boot: int, progress: bool) -> Report:
    """Correlations of ``scorer`` with the human scores of ``records`` (call it inside
    :func:`fixed_centering`: the evaluation rule)."""
    scores = scorer.score([r.hyp for r in records], [r.ref for r in records], batch_size=args.eval_batch_size,
                          progress=progress)
    return correlate(scores, [r.score for r in records], [r.group for r in records], n_boot=n_boot,
                     seed=args.seed, metric=scorer.signature)


def summary(report: Report | dict) -> dict:
    """``{"pearson", "kendall", "groups": {name: {"pearson", "kendall", "n"}}}`` of a report."""
    d = report.to_dict() if isinstance(report, Report) else report
    pick = lambda g: {"pearson": g["pearson"]["value"], "kendall": g["kendall"]["value"], "n": g["n"]}  # noqa: E731
    return {**pick(d["average"]), "groups": {g["group"]: pick(g) for g in d["groups"]}}


def table4(before: dict | None, after: dict, title: str) -> str:
    """Per-group Kendall τ and Pearson r, before and after fine-tuning, with the difference."""
    def cell(s, g, k):
        v = s["groups"][g][k] if g != "average" else s[k]
        return float("nan") if v is None else v

    names = list(after["groups"]) + ["average"]
    w = max(len(n) for n in names)
    head = f"{'pair':<{w}}  {'n':>5}  " + (
        "  τ before  τ after      Δτ  r before  r after      Δr" if before else "   τ after   r after")
    lines = [title, head, "-" * len(head)]
    for g in names:
        n = after["n"] if g == "average" else after["groups"][g]["n"]
        if g == "average":
            lines.append("-" * len(head))
        if before:
            tb, ta, rb, ra = cell(before, g, "kendall"), cell(after, g, "kendall"), cell(before, g, "pearson"), cell(after, g, "pearson")
            lines.append(f"{g:<{w}}  {n:>5}  {tb:9.3f} {ta:8.3f} {ta - tb:+7.3f}  {rb:8.3f} {ra:8.3f} {ra - rb:+7.3f}")
        else:
            lines.append(f"{g:<{w}}  {n:>5}  {cell(after, g, 'kendall'):9.3f} {cell(after, g, 'pearson'):9.3f}")
    return "\n".join(lines)


def _figure_class(out: Path):
    """matplotlib's ``Figure``, or ``None`` (saying that ``out`` is skipped) without matplotlib."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        print(f"{out.name} skipped: matplotlib is not installed (pip install torchmover[plot])", file=sys.stderr)
        return None
    return Figure


def plot_curves(log_path: Path, out: Path) -> Path | None:
    """``curves.png``: loss per optimiser step, and dev Pearson r / Kendall τ per epoch."""
    Figure = _figure_class(out)
    if Figure is None:
        return None
    events = [json.loads(line) for line in log_path.read_text(encoding="utf-8").splitlines() if line.strip()]
    steps = [(e["step"], e["loss"]) for e in events if e["event"] == "step"]
    dev = sorted({e["epoch"]: e["dev"] for e in events if e["event"] == "epoch" and e.get("dev")}.items())
    fig = Figure(figsize=(10, 3.8), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2)
    if steps:
        ax1.plot(*zip(*steps), linewidth=1)
    ax1.set_xlabel("optimiser step")
    ax1.set_ylabel("train loss (MSE, last window)")
    ax1.grid(alpha=0.3)
    if dev:
        epochs = [e for e, _ in dev]
        ax2.plot(epochs, [d["pearson"] for _, d in dev], "o-", label="Pearson r")
        ax2.plot(epochs, [d["kendall"] for _, d in dev], "s-", label="Kendall τ")
        ax2.set_xticks(epochs)
        ax2.legend()
    ax2.set_xlabel("epoch (0 = untuned)")
    ax2.set_ylabel("dev correlation (average over pairs)")
    ax2.grid(alpha=0.3)
    fig.savefig(out, dpi=110)
    return out


def plot_seeds(results: dict[int, dict], out: Path) -> Path | None:
    """``seeds.png``: test Pearson r per group and on average, before and after fine-tuning, as the
    mean over the seeds with their min-max range."""
    runs = [r for r in results.values() if r.get("after")]
    Figure = _figure_class(out) if runs else None
    if Figure is None:
        return None
    groups = sorted(runs[0]["after"]["groups"])
    fig = Figure(figsize=(max(6.0, 1.1 * (len(groups) + 1)), 3.8), layout="constrained")
    ax = fig.subplots()
    for offset, part, label in ((-0.2, "baseline", "untuned"), (0.2, "after", "fine-tuned")):
        per_seed = [[r[part]["groups"][g]["pearson"] for g in groups] + [r[part]["pearson"]] for r in runs if r.get(part)]
        if not per_seed:
            continue
        columns = list(zip(*per_seed))  # one tuple of seeds per group
        mean = [sum(c) / len(c) for c in columns]
        low = [m - min(c) for m, c in zip(mean, columns)]
        high = [max(c) - m for m, c in zip(mean, columns)]
        ax.errorbar([i + offset for i in range(len(mean))], mean, yerr=[low, high], fmt="o", capsize=3, label=label)
    ax.set_xticks(range(len(groups) + 1), groups + ["average"], rotation=30, ha="right")
    ax.set_ylabel(f"test Pearson r (mean of {len(runs)} seeds, min-max)")
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    fig.savefig(out, dpi=110)
    return out


# --- training --------------------------------------------------------------------------------------

def autocast_context(device: torch.device, precision: str):
    dtype = PRECISIONS[precision]
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


@torch.no_grad()
def fit_calibration(scorer: tm.Scorer, records: list[Rating], args, rank: int, world: int,
                    device: torch.device, progress: bool) -> tuple[float, float, int]:
    """Least-squares ``(a, b)`` of the human scores on the untuned scores of up to
    ``--calibration-fit-size`` training pairs, scored in training-shaped batches (batch centering
    over the global micro-batch as in training, dropout off)."""
    from tqdm.auto import tqdm

    n_fit = len(records) if args.calibration_fit_size <= 0 else min(len(records), args.calibration_fit_size)
    subset = sorted(random.Random(args.seed).sample(range(len(records)), n_fit))
    steps = epoch_steps(len(subset), 0, args, rank, world)
    micro = [[subset[i] for i in batch] for step in steps for batch in step]
    scorer.train()  # centering in training mode: the global micro-batch's mean, as in training
    stats = torch.zeros(5, dtype=torch.float64)
    try:
        with common.eval_mode(scorer.encoder):  # no dropout
            for batch in tqdm(micro, desc="calibration fit", disable=not progress):
                with autocast_context(device, args.precision):
                    x = scorer([records[i].hyp for i in batch], [records[i].ref for i in batch]).double().cpu()
                y = torch.tensor([records[i].score for i in batch], dtype=torch.float64)
                stats += torch.stack([x.sum(), y.sum(), (x * x).sum(), (x * y).sum(), torch.tensor(float(len(batch)))])
    finally:
        scorer.eval()
    stats = all_reduce_sum(stats.to(device)).cpu().tolist()
    a, b = least_squares(*stats)
    return a, b, int(stats[4])


def correlation_loss(pred: Tensor, human: Tensor, kind: str) -> Tensor:
    """The correlation term of ``--loss`` on one batch of calibrated predictions ``pred = a·Sim + b``.

    - ``pearson``: ``1 − r(pred, human)`` (invariant to the calibration; 0 for a perfect batch);
    - ``rank``: ``mean_{(i, j): human_i > human_j} log(1 + exp(−(pred_i − pred_j)))`` (RankNet's
      logistic loss on every pair of the batch that the humans order; 0 if no pair is ordered)."""
    if kind == "pearson":
        x, y = pred - pred.mean(), human - human.mean()
        return 1 - (x * y).sum() / (x.norm() * y.norm()).clamp_min(1e-12)
    ordered = human.unsqueeze(1) > human.unsqueeze(0)  # [b, b]: i ranked above j by the humans
    if not ordered.any():
        return pred.sum() * 0
    return nn.functional.softplus(-(pred.unsqueeze(1) - pred.unsqueeze(0))[ordered]).mean()


def centering_texts(records: list[Rating], size: int, seed: int) -> list[str]:
    """The training texts (hypotheses and references, each once) whose mean token is the fixed
    evaluation mean: a seeded subset of ``size`` of them (0: all)."""
    texts = sorted({t for r in records for t in (r.hyp, r.ref)})
    if 0 < size < len(texts):
        texts = random.Random(f"{seed}/centering").sample(texts, size)
    return texts


@contextlib.contextmanager
def fixed_centering(scorer: tm.Scorer, texts: list[str], args, progress: bool):
    """Inside the block, ``scorer`` centers every text on the fixed mean token of ``texts`` (fitted
    now, with the encoder as it is): the evaluation rule, so that a pair's score does not depend on
    the other pairs scored with it. The training centering is restored after the block. A centering
    of each text on its own (``none``, ``sentence``, ``dimension``) already is: it is kept."""
    config, centering = scorer.config, scorer.centering
    if config.centering in SELF_CONTAINED_CENTERINGS:
        yield scorer
        return
    device = next(scorer.parameters()).device
    scorer.config = dataclasses.replace(config, centering="fixed")
    scorer.centering = Centering("fixed", dim=scorer.encoder.hidden_size).to(device)
    try:
        # evaluation runs on the main rank alone: a local fit, not the collective one of torch.distributed
        scorer.fit_centering(texts, batch_size=args.eval_batch_size, progress=progress, distributed=False)
        yield scorer
    finally:
        scorer.config, scorer.centering = config, centering


# --- one run: setup, epochs, evaluation, checkpoints -----------------------------------------------

def main(argv: list[str] | None = None) -> dict:
    """Run the recipe (``--seeds``: once per seed, then the seed table); returns a summary dict
    (final calibration, correlations, paths, throughput; with ``--seeds``: the table's dict)."""
    args = build_parser().parse_args(argv)
    with common.torchrun_process_group(common.local_device(args.device)):
        return run_seeds(args) if args.seeds else train(args)


def train(args: argparse.Namespace) -> dict:
    """One fine-tuning run with the parsed options ``args``: set up (or resume), then epoch by epoch
    train, evaluate on dev and checkpoint, until the last epoch, ``--patience`` or ``--stop-after``;
    then the best dev epoch is saved and tested."""
    run = setup(args)
    stopped_early = patience_exhausted(run)  # resumed from the checkpoint of the epoch it stopped after
    while run.epoch < args.epochs and not stopped_early:
        if not train_epoch(run):
            return stop(run)  # --stop-after, mid-epoch (after a checkpoint)
        end_epoch(run)
        stopped_early = patience_exhausted(run)
        if not stopped_early and args.stop_after and args.stop_after <= run.global_step < run.total_steps:
            return stop(run)
    return finish(run)


@dataclasses.dataclass
class Run:
    """One run: its options and place in the process group, data, trained objects, and where it is
    (``epoch`` epochs done, ``step_in_epoch`` steps into the next; what a checkpoint keeps)."""

    args: argparse.Namespace
    rank: int
    world: int
    device: torch.device
    output: Path
    log: common.JsonLog
    train_set: list[Rating]
    dev_set: list[Rating]
    test_set: list[Rating]  # the dev split itself (the same list) without --test
    eval_texts: list[str]  # whose mean token the evaluations center on
    scorer: tm.Scorer
    calibration: Calibration
    frozen: int  # parameter tensors frozen by --freeze-below
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    trainable: list[nn.Parameter]
    steps_per_epoch: int
    total_steps: int
    warmup_steps: int
    epoch: int = 0
    step_in_epoch: int = 0
    global_step: int = 0
    epoch_losses: list[float] = dataclasses.field(default_factory=list)  # this epoch's, per step
    baseline: dict | None = None  # the untuned metric on the test set
    dev_history: dict = dataclasses.field(default_factory=dict)  # {"epoch": dev summary}, "0" = untuned
    best: dict | None = None  # {"epoch", "pearson", "scorer", "calibration"}: the best dev epoch (CPU states)
    train_seconds: float = 0.0  # this process's, since it started (not checkpointed)
    pairs_seen: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def progress(self) -> bool:
        return self.main and not self.args.no_progress

    def say(self, *text) -> None:
        if self.main:
            print(*text, flush=True)

    def pairs_per_s(self) -> float:
        return self.pairs_seen / max(self.train_seconds, 1e-9)


# setup

def setup(args: argparse.Namespace) -> Run:
    """Everything before the first step: the options checked, the run directory claimed (a run already
    there is refused unless ``--resume`` or ``--overwrite``), the data read, the scorer, calibration,
    optimiser and schedule built identically on every rank; then either the checkpoint of
    ``--resume`` loaded (:func:`resume`) or a new run started (:func:`start`)."""
    check_options(args)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    rank, world = common.rank_and_world()
    device = common.local_device(args.device)
    if args.precision == "fp16" and device.type != "cuda":
        raise ValueError("--precision fp16 needs a GPU; use bf16 on the CPU")
    output = Path(args.output)
    resuming = bool(args.resume) and not common.nothing_to_resume(args.resume, output, RUN_OUTPUTS, main=rank == 0)
    common.claim_run_directory(output, RUN_OUTPUTS, resume=resuming, overwrite=args.overwrite, main=rank == 0)
    if rank == 0:
        output.mkdir(parents=True, exist_ok=True)
    common.barrier()

    train_set, dev_set, test_set = read_data(args)
    eval_texts = centering_texts(train_set, args.centering_fit_size, args.seed)
    if rank == 0 and not test_set and not args.skip_baseline:
        print("no --test and no dev split: the before/after table is skipped", flush=True)
    scorer, frozen = build_scorer(args, device, eval_texts, progress=rank == 0 and not args.no_progress)
    calibration = Calibration().to(device)
    optimizer = torch.optim.AdamW(param_groups(scorer, calibration, args), lr=args.lr)
    steps_per_epoch = len(epoch_steps(len(train_set), 0, args, rank, world))
    total_steps = steps_per_epoch * args.epochs
    warmup = int(round(args.warmup * total_steps)) if args.warmup < 1 else int(args.warmup)
    run = Run(args=args, rank=rank, world=world, device=device, output=output,
              log=common.JsonLog(output / "log.jsonl", enabled=rank == 0),
              train_set=train_set, dev_set=dev_set, test_set=test_set, eval_texts=eval_texts,
              scorer=scorer, calibration=calibration, frozen=frozen, optimizer=optimizer,
              scheduler=common.warmup_schedule(optimizer, warmup, total_steps, args.schedule),
              scaler=torch.amp.GradScaler(device.type, enabled=args.precision == "fp16"),
              trainable=[p for g in optimizer.param_groups for p in g["params"]],
              steps_per_epoch=steps_per_epoch, total_steps=total_steps, warmup_steps=warmup)
    if resuming:
        resume(run)
    else:
        start(run)
    common.broadcast_parameters_(run.scorer)
    common.broadcast_parameters_(run.calibration)
    return run


def check_options(args: argparse.Namespace) -> None:
    """Refuse option values that argparse's types let through."""
    for name in ("epochs", "batch_size", "grad_accum", "eval_batch_size", "log_every"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if not 0 <= args.dev_fraction < 1:
        raise ValueError(f"--dev-fraction must be in [0, 1), got {args.dev_fraction}")
    if args.loss_weight < 0:
        raise ValueError(f"--loss-weight must be non-negative, got {args.loss_weight}")


def read_data(args: argparse.Namespace) -> tuple[list[Rating], list[Rating], list[Rating]]:
    """``(train, dev, test)``: the training ratings minus a stratified, seeded dev split (then a
    seeded subset of ``--max-train-pairs``); the test set by path, else the dev split itself."""
    records = read_all(args.train, args.year)
    train, dev = split_dev(records, args.dev_fraction, seed=args.seed) if args.dev_fraction > 0 else (records, [])
    if 0 < args.max_train_pairs < len(train):
        keep = sorted(random.Random(f"{args.seed}/train").sample(range(len(train)), args.max_train_pairs))
        train = [train[i] for i in keep]
    test = read_all(args.test, args.year) if args.test else dev
    return train, dev, test


def build_scorer(args: argparse.Namespace, device: torch.device, eval_texts: list[str],
                 progress: bool) -> tuple[tm.Scorer, int]:
    """The scorer to train (identical on every rank: seeded) and how many parameter tensors
    ``--freeze-below`` froze."""
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    layer = top_layer(args.model) if args.layer is None else args.layer
    tuned = get_member(args.method).temperature == "tuned"
    scorer = tm.Scorer(args.model, layer=layer, method=args.method, direction=args.direction,
                       temperature=args.temperature if tuned else None, centering=args.centering,
                       max_length=args.max_length, device=device)
    if args.centering == "fixed":
        scorer.fit_centering(eval_texts, batch_size=args.eval_batch_size, progress=progress)
    return scorer, frozen_parameters(scorer, args.freeze_below)


def start(run: Run) -> None:
    """A new run: its configuration logged, the untuned metric evaluated (rank 0: test set, and dev
    as epoch 0), the calibration fitted (``--calibration-init lsq``), each rank's dropout seeded."""
    args, scorer = run.args, run.scorer
    run.log("config", args=vars(args), world_size=run.world, signature=scorer.signature,
            n_train=len(run.train_set), n_dev=len(run.dev_set), n_test=len(run.test_set), frozen=run.frozen,
            steps_per_epoch=run.steps_per_epoch, total_steps=run.total_steps, warmup_steps=run.warmup_steps)
    run.say(f"{scorer.signature}\ntrain {len(run.train_set)} pairs, dev {len(run.dev_set)}, test "
            f"{len(run.test_set)}; {run.world} process(es), {run.total_steps} optimiser steps of "
            f"{args.batch_size * args.grad_accum * run.world} pairs")
    test, dev = run.test_set, run.dev_set
    if run.main and not args.skip_baseline and (test or dev):
        with fixed_centering(scorer, run.eval_texts, args, run.progress):
            if test:
                run.baseline = summary(evaluate(scorer, test, args, args.n_boot, run.progress))
                run.log("eval", split="test", when="before", **run.baseline)
            if dev:
                run.dev_history["0"] = (summary(evaluate(scorer, dev, args, 0, run.progress)) if test is not dev
                                        else run.baseline)
                run.log("epoch", epoch=0, dev=run.dev_history["0"])
    common.barrier()
    if args.calibration_init == "lsq":
        a, b, n_fit = fit_calibration(scorer, run.train_set, args, run.rank, run.world, run.device, run.progress)
        with torch.no_grad():
            run.calibration.a.fill_(a)
            run.calibration.b.fill_(b)
        run.say(f"calibration: least-squares fit on {n_fit} training pairs: a = {a:.4f}, b = {b:.4f}")
        run.log("calibration_fit", a=a, b=b, n=n_fit)
    torch.manual_seed(args.seed + 1000 * run.rank)  # dropout streams differ between ranks
    random.seed(args.seed)


# epochs

def train_epoch(run: Run) -> bool:
    """The optimiser steps of epoch ``run.epoch`` from ``run.step_in_epoch`` on, logged every
    ``--log-every`` steps and checkpointed every ``--save-every``; ``False`` if ``--stop-after`` ended
    the run mid-epoch (after a checkpoint)."""
    from tqdm.auto import tqdm

    args = run.args
    steps = epoch_steps(len(run.train_set), run.epoch, args, run.rank, run.world)
    run.scorer.train()
    window = []
    bar = tqdm(total=len(steps), initial=run.step_in_epoch, desc=f"epoch {run.epoch + 1}/{args.epochs}",
               disable=not run.progress)
    try:
        for k in range(run.step_in_epoch, len(steps)):
            t0 = time.perf_counter()
            loss = optimiser_step(run, steps[k])
            run.train_seconds += time.perf_counter() - t0
            run.pairs_seen += sum(len(b) for b in steps[k]) * run.world
            run.step_in_epoch = k + 1
            run.epoch_losses.append(loss)
            window.append(loss)
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.4f}", a=f"{run.calibration.a.item():.3f}")
            last = k == len(steps) - 1
            if run.global_step % args.log_every == 0 or last:
                run.log("step", epoch=run.epoch + 1, step=run.global_step, loss=sum(window) / len(window),
                        lr=run.scheduler.get_last_lr()[0], a=run.calibration.a.item(), b=run.calibration.b.item(),
                        pairs_per_s=run.pairs_per_s())
                window = []
            if last:
                break  # the end-of-epoch checkpoint follows
            if args.stop_after and run.global_step >= args.stop_after:
                checkpoint(run)
                return False
            if args.save_every and run.global_step % args.save_every == 0:
                checkpoint(run)
    finally:
        bar.close()
    return True


def optimiser_step(run: Run, micro_batches: list[list[int]]) -> float:
    """One optimiser step on this rank's ``micro_batches`` (record indices), gradients summed over
    ranks; returns the loss of the global step (its mean over every pair of every rank)."""
    args, train, device, world = run.args, run.train_set, run.device, run.world
    n_step = sum(len(b) for b in micro_batches)  # this rank's pairs in the step (equal on every rank)
    step_loss = torch.zeros((), dtype=torch.float64)
    for batch in micro_batches:
        hyps, refs = [train[i].hyp for i in batch], [train[i].ref for i in batch]
        human = torch.tensor([train[i].score for i in batch], dtype=torch.float32, device=device)
        with autocast_context(device, args.precision):
            sim = run.scorer(hyps, refs)  # [b], float32 even under autocast
        pred = run.calibration(sim.float())  # [b]
        # Σ_r L_r is the mean over the global step: each rank divides by W · n_step.
        loss = ((pred - human) ** 2).sum() / (n_step * world)
        if args.loss != "mse":  # on the global micro-batch; all_gather's backward sums W copies
            term = correlation_loss(common.all_gather_cat(pred), common.all_gather_cat(human),
                                    args.loss.split("+")[1])
            loss = loss + args.loss_weight * term * len(batch) / (n_step * world)
        run.scaler.scale(loss).backward()
        step_loss += loss.detach().double().cpu()
    common.sum_gradients_(run.trainable)
    run.scaler.unscale_(run.optimizer)
    if args.max_grad_norm > 0:
        torch.nn.utils.clip_grad_norm_(run.trainable, args.max_grad_norm)
    run.scaler.step(run.optimizer)
    run.scaler.update()
    run.optimizer.zero_grad(set_to_none=True)
    run.scheduler.step()
    run.global_step += 1
    return float(all_reduce_sum(step_loss.to(device)).cpu())


def end_epoch(run: Run) -> None:
    """After an epoch's last step: dev correlations (rank 0), the epoch's log line, the best dev epoch
    so far kept (on the CPU), and a checkpoint at the start of the next epoch."""
    args, epoch = run.args, run.epoch + 1  # the epoch just trained, counted from 1
    dev = None
    if run.main and run.dev_set:
        with fixed_centering(run.scorer, run.eval_texts, args, run.progress):
            dev = summary(evaluate(run.scorer, run.dev_set, args, 0, run.progress))
        run.dev_history[str(epoch)] = dev
    train_loss = sum(run.epoch_losses) / max(1, len(run.epoch_losses))
    run.log("epoch", epoch=epoch, step=run.global_step, train_loss=train_loss, dev=dev,
            a=run.calibration.a.item(), b=run.calibration.b.item(), pairs_per_s=run.pairs_per_s(),
            train_seconds=run.train_seconds)
    if dev:
        run.say(f"epoch {epoch}: train loss {train_loss:.4f}, dev Pearson {dev['pearson']:.4f}, "
                f"Kendall {dev['kendall']:.4f}")
        if run.best is None or dev["pearson"] > run.best["pearson"]:
            cpu = lambda module: {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}  # noqa: E731
            run.best = {"epoch": epoch, "pearson": dev["pearson"], "scorer": cpu(run.scorer),
                        "calibration": cpu(run.calibration)}
    run.epoch, run.step_in_epoch, run.epoch_losses = epoch, 0, []
    checkpoint(run)


def patience_exhausted(run: Run) -> bool:
    """Whether ``--patience`` epochs have passed without a better dev Pearson r (and epochs are left)."""
    best_epoch = common.broadcast_object(run.best["epoch"] if run.best else 0)  # rank 0 evaluates dev
    patience = run.args.patience
    if not (patience and best_epoch and run.epoch - best_epoch >= patience and run.epoch < run.args.epochs):
        return False
    run.say(f"early stopping: no better dev Pearson r for {patience} epoch(s) after epoch {best_epoch}")
    run.log("early_stop", epoch=run.epoch, best_epoch=best_epoch)
    return True


# checkpoints

def checkpoint(run: Run) -> Path | None:
    """Save the run where it is: written by rank 0, with every rank's RNG state; its path on rank 0."""
    rngs = common.all_rng_states()
    path = None
    if run.main:
        state = {
            "format": CHECKPOINT_FORMAT, "world_size": run.world, "args": vars(run.args),
            "epoch": run.epoch, "step_in_epoch": run.step_in_epoch, "global_step": run.global_step,
            "scorer": run.scorer.state_dict(), "calibration": run.calibration.state_dict(),
            "optimizer": run.optimizer.state_dict(), "scheduler": run.scheduler.state_dict(),
            "scaler": run.scaler.state_dict(), "rng": rngs, "baseline": run.baseline,
            "dev_history": run.dev_history, "epoch_losses": list(run.epoch_losses), "best": run.best,
            "log_events": run.log.count(),
        }
        path = save_checkpoint(run.output / "checkpoints", state, run.global_step, run.args.keep_checkpoints)
    common.barrier()
    return path


def resume(run: Run) -> None:
    """Continue from the checkpoint ``--resume`` names: trained objects, this rank's RNG state, where
    the run was, and the log as it was then (what an interrupted run logged after the checkpoint is
    dropped, to be logged again as it is redone); refused if it was written by another number of
    processes or with other :data:`RESUME_FIXED` options."""
    args = run.args
    path = common.resume_path(args.resume, run.output / "checkpoints")
    state = load_checkpoint(path)
    if state.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path}: checkpoint format {state.get('format')!r}, expected {CHECKPOINT_FORMAT}")
    if state["world_size"] != run.world:
        raise ValueError(f"{path} was written by {state['world_size']} process(es), this run has {run.world}: "
                         "resume with the same number of processes (the data order depends on it)")
    changed = {k: (state["args"].get(k), getattr(args, k)) for k in RESUME_FIXED
               if state["args"].get(k) != getattr(args, k)}
    if changed:
        raise ValueError(f"{path}: --resume needs the options of the interrupted run; changed: "
                         + ", ".join(f"--{k.replace('_', '-')} {old!r} -> {new!r}" for k, (old, new) in changed.items()))
    run.scorer.load_state_dict(state["scorer"])
    run.calibration.load_state_dict(state["calibration"])
    run.optimizer.load_state_dict(state["optimizer"])
    run.scheduler.load_state_dict(state["scheduler"])
    run.scaler.load_state_dict(state["scaler"])
    set_rng_state(state["rng"][run.rank])
    run.epoch, run.step_in_epoch, run.global_step = state["epoch"], state["step_in_epoch"], state["global_step"]
    run.baseline, run.dev_history, run.best = state.get("baseline"), state.get("dev_history", {}), state.get("best")
    run.epoch_losses = list(state.get("epoch_losses", []))  # this epoch's losses before the stop
    if "log_events" in state:  # what was logged after the checkpoint is redone from here: logged again
        run.log.truncate_to(state["log_events"])
    else:  # a checkpoint of an earlier version of the recipe: the events of later steps
        run.log.truncate_after(run.global_step)
    run.say(f"resumed from {path}: epoch {run.epoch + 1}, step {run.step_in_epoch} of {run.steps_per_epoch}")
    run.log("resume", checkpoint=str(path), epoch=run.epoch, step=run.global_step)


# the end

def run_result(run: Run, stopped: bool) -> dict:
    """The run's summary (``result.json`` without ``final``)."""
    return {"stopped": stopped, "global_step": run.global_step, "calibration": run.calibration.to_dict(),
            "best_epoch": run.best["epoch"] if run.best else None,
            "pairs_per_s": run.pairs_seen / run.train_seconds if run.train_seconds else None,
            "train_seconds": run.train_seconds, "baseline": run.baseline, "dev_history": run.dev_history,
            "output": str(run.output)}


def stop(run: Run) -> dict:
    """A run ended by ``--stop-after`` (its checkpoint written): the summary so far."""
    run.say(f"stopped after {run.global_step} steps (--stop-after); continue with --resume")
    common.barrier()
    return run_result(run, stopped=True)


def finish(run: Run) -> dict:
    """A run's end: the best dev epoch's weights (if there was a dev split) saved to ``final/`` with the
    fixed evaluation centering and the calibration, tested, and the result files written (rank 0)."""
    args, scorer, calibration = run.args, run.scorer, run.calibration
    if run.best is not None:  # rank 0, which evaluates dev (and any rank that resumed it from a checkpoint)
        scorer.load_state_dict(run.best["scorer"])
        calibration.load_state_dict(run.best["calibration"])
        run.say(f"final model: epoch {run.best['epoch']} (best dev Pearson r {run.best['pearson']:.4f})")
    result = run_result(run, stopped=False)
    final = run.output / "final"
    if run.main:
        scorer.eval()
        scorer.mark_finetuned(training_name(run.train_set))  # the signature says what it was trained on
        with fixed_centering(scorer, run.eval_texts, args, run.progress):
            scorer.save_pretrained(final)  # with centering="fixed" and the training texts' mean
            report = evaluate(scorer, run.test_set, args, args.n_boot, run.progress) if run.test_set else None
        atomic_write_text(final / "calibration.json", json.dumps(
            {**calibration.to_dict(), "formula": "a * Sim + b ~ human DA z-score"}, indent=2) + "\n")
        if report is not None:
            result["after"] = write_test_report(run, report)
        run.log("done", step=run.global_step, calibration=calibration.to_dict(), final=str(final))
        atomic_write_text(run.output / "result.json", json.dumps({**result, "final": str(final)}, indent=1) + "\n")
        if not args.no_plot:
            plot_curves(run.output / "log.jsonl", run.output / "curves.png")
    result["final"] = str(final)
    common.barrier()
    return result


def training_name(records: list[Rating]) -> str:
    """The fine-tuning data as the signature names it: human ratings, their years and language pairs,
    and how many pairs, e.g. ``da:2015:cs-en+de-en+fi-en+ru-en:1790-pairs``."""
    years = "+".join(str(y) for y in sorted({r.year for r in records}))
    pairs = "+".join(sorted({r.lp for r in records}))
    return f"da:{years}:{pairs}:{len(records)}-pairs"


def write_test_report(run: Run, report: Report) -> dict:
    """``test_report.json`` and the before/after ``table.txt`` of the final model; its summary."""
    after = summary(report)
    atomic_write_text(run.output / "test_report.json", report.to_json() + "\n")
    run.log("eval", split="test", when="after", **after)
    title = f"{'test' if run.args.test else 'dev'} set: {', '.join(run.args.test or ['dev split'])}"
    text = table4(run.baseline, after, title)
    atomic_write_text(run.output / "table.txt", text + "\n")
    run.say(text)
    return after


# --- seeds -----------------------------------------------------------------------------------------

SEED_COLUMNS = (("best_epoch", "best epoch", "{:.0f}"), ("dev_r", "dev r", "{:.3f}"),
                ("r_before", "r before", "{:.3f}"), ("r_after", "r after", "{:.3f}"), ("delta_r", "Δr", "{:+.3f}"),
                ("tau_before", "τ before", "{:.3f}"), ("tau_after", "τ after", "{:.3f}"), ("delta_tau", "Δτ", "{:+.3f}"))


def run_seeds(args: argparse.Namespace) -> dict:
    """One run per seed of ``--seeds`` in ``OUTPUT/seed-S``, then the seed table.

    Resumable: a seed whose ``result.json`` exists is read, not rerun; one with a checkpoint
    continues from it (``--resume``); one without starts over, as does every seed with
    ``--overwrite``. Writes ``OUTPUT/seeds.md`` and ``OUTPUT/seeds.json``: per seed
    the best dev epoch and its dev r, test Pearson r and Kendall τ before and after fine-tuning, and
    their mean ± sample standard deviation and range over the seeds; and, unless ``--no-plot``,
    ``OUTPUT/seeds.png`` (:func:`plot_seeds`). With a dev split, ``OUTPUT/final`` is the fine-tuned
    metric to keep: the scorer (and calibration) of the seed with the best dev r — chosen on dev,
    never on the test set — which ``Scorer.from_pretrained("OUTPUT/final")`` loads."""
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        raise ValueError(f"--seeds must be comma-separated integers, got {args.seeds!r}") from None
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds has repeated seeds: {args.seeds!r}")
    output, rank = Path(args.output), common.rank_and_world()[0]
    rows, results = [], {}
    for seed in seeds:
        out = output / f"seed-{seed}"
        if args.overwrite or not (out / "result.json").is_file():
            resume = None if args.overwrite else "latest" if latest_checkpoint(out / "checkpoints") else None
            if resume is None and not args.overwrite and out.is_dir() and any(out.iterdir()) and rank == 0:
                print(f"{out} holds no checkpoint to resume: starting the seed over", flush=True)
            result = train(argparse.Namespace(**{**vars(args), "seeds": None, "seed": seed, "output": str(out),
                                                 "resume": resume, "overwrite": resume is None}))
            if result["stopped"]:
                return {"stopped": True, "seed": seed}
        if rank > 0:
            continue  # rank 0 writes the results and the table
        results[seed] = json.loads((out / "result.json").read_text(encoding="utf-8"))
        rows.append(seed_row(seed, results[seed]))
    if rank > 0:
        return {"stopped": False}
    stats = {key: spread([r[key] for r in rows]) for key, _, _ in SEED_COLUMNS}
    table = {"seeds": rows, "stats": stats, "args": {k: v for k, v in vars(args).items() if k != "seed"}}
    best = max((r for r in rows if r["dev_r"] is not None), key=lambda r: r["dev_r"], default=None)
    note = ""
    if best is not None:  # the fine-tuned metric to keep: chosen on dev, never on the test set
        publish_final(output / f"seed-{best['seed']}" / "final", output / "final")
        table["final"] = {"seed": best["seed"], "dev_r": best["dev_r"], "path": str(output / "final")}
        note = f"\n`final/`: the fine-tuned scorer of seed {best['seed']}, the best dev r ({best['dev_r']:.3f}).\n"
    atomic_write_text(output / "seeds.json", json.dumps(table, indent=1) + "\n")
    atomic_write_text(output / "seeds.md", seed_markdown(rows, stats) + note)
    if not args.no_plot:
        plot_seeds(results, output / "seeds.png")
    print(seed_markdown(rows, stats), flush=True)
    return {"stopped": False, **table}


def publish_final(source: Path, target: Path) -> None:
    """Save the fine-tuned scorer and calibration of ``source`` (a seed's ``final/``) to ``target``,
    atomically (``Scorer.save_pretrained``), replacing an earlier copy."""
    scorer, _ = load_finetuned(source)
    scorer.save_pretrained(target)
    atomic_write_text(target / "calibration.json", (source / "calibration.json").read_text(encoding="utf-8"))


def seed_row(seed: int, result: dict) -> dict:
    """One line of the seed table from a run's ``result.json``."""
    pick = lambda part, key: (result.get(part) or {}).get(key)  # noqa: E731
    row = {"seed": seed, "best_epoch": result.get("best_epoch"),
           "dev_r": (result["dev_history"].get(str(result["best_epoch"])) or {}).get("pearson")
           if result.get("best_epoch") else None,
           "r_before": pick("baseline", "pearson"), "r_after": pick("after", "pearson"),
           "tau_before": pick("baseline", "kendall"), "tau_after": pick("after", "kendall")}
    both = lambda a, b: None if a is None or b is None else b - a  # noqa: E731
    row["delta_r"], row["delta_tau"] = both(row["r_before"], row["r_after"]), both(row["tau_before"], row["tau_after"])
    return row


def spread(values: list) -> dict | None:
    """Mean, sample standard deviation (0 for one value), min and max of the non-missing ``values``."""
    v = [x for x in values if x is not None]
    if not v:
        return None
    mean = sum(v) / len(v)
    sd = (sum((x - mean) ** 2 for x in v) / (len(v) - 1)) ** 0.5 if len(v) > 1 else 0.0
    return {"mean": mean, "sd": sd, "min": min(v), "max": max(v), "n": len(v)}


def seed_markdown(rows: list[dict], stats: dict) -> str:
    cell = lambda fmt, x: "–" if x is None else fmt.format(x)  # noqa: E731
    lines = ["| seed | " + " | ".join(name for _, name, _ in SEED_COLUMNS) + " |",
             "|---:|" + "---:|" * len(SEED_COLUMNS)]
    lines += [f"| {r['seed']} | " + " | ".join(cell(fmt, r[key]) for key, _, fmt in SEED_COLUMNS) + " |" for r in rows]
    lines.append(f"| **mean ± sd** (n={len(rows)}) | " + " | ".join(
        "–" if stats[key] is None else f"{cell(fmt, stats[key]['mean'])} ± {stats[key]['sd']:.3f}"
        for key, _, fmt in SEED_COLUMNS) + " |")
    lines.append("| min – max | " + " | ".join(
        "–" if stats[key] is None else f"{cell(fmt, stats[key]['min'])} – {cell(fmt, stats[key]['max'])}"
        for key, _, fmt in SEED_COLUMNS) + " |")
    return "\n".join(lines) + "\n"


def load_finetuned(path: str | os.PathLike) -> tuple[tm.Scorer, Calibration]:
    """The scorer and calibration written to ``DIR/final`` by this recipe."""
    scorer = tm.Scorer.from_pretrained(path)
    cal = json.loads((Path(path) / "calibration.json").read_text(encoding="utf-8"))
    return scorer, Calibration(cal["a"], cal["b"])


if __name__ == "__main__":
    main()
    sys.exit(0)
