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
and ``--patience P`` stops after P epochs without a better one. Without ``--test`` the before/after
report is on that dev split, which chose the epoch, so it is not held out: it is ``dev_report.json``
(not ``test_report.json``), ``result.json`` says ``"report": {"split": "dev", "held_out": false}``,
and the table, the log and the console name it the dev split. ``--seeds 0,1,2`` runs the recipe
once per seed (dev split, training subset, data order, dropout) in ``OUTPUT/seed-S`` and writes
``OUTPUT/seeds.md`` / ``seeds.json`` (before / after / Δ per seed and mean ± sd, the options each seed
recorded) and ``seeds.png`` (r per language pair, before and after); a finished seed is reused when
the options it recorded equal the command's (but those :data:`RESUME_FREE` names), else the command
is refused before any seed runs; an interrupted one resumes (one stopped before its first checkpoint
starts over), and ``--overwrite`` reruns them all. ``--layer`` picks the layer read (default: the top
one); the blocks above it are cut off
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
- ``log.jsonl``: one JSON object per line — ``config`` (the options, the provenance below),
  ``calibration_fit``, ``step`` (loss, lr, a, b, pairs/s every ``--log-every`` optimiser steps),
  ``epoch`` (mean train loss, dev correlations), ``eval`` (the report set's correlations before /
  after, ``split`` ``test`` or ``dev``), ``done``; after ``--resume``, ``resume`` (with the resuming
  invocation's provenance). Each event is logged once: a resume drops what the interrupted run
  logged after its checkpoint, which is logged again as it is redone.
- Provenance, in ``config``, ``result.json``, the report, ``seeds.json``
  (:func:`torchmover.runtime.provenance.run_provenance`): the command line as run, the versions of
  Python, torchmover, torch and transformers, the commit of the code's git checkout and whether it had
  uncommitted changes (``null`` outside a checkout), the resolved device, and every ``--train`` /
  ``--test`` data file with its size and SHA-256.
- ``curves.png``: the training loss as ``--loss`` defines it (its y-label names it) per step and dev
  Pearson r / Kendall τ per epoch (epoch 0 = untuned).
- ``checkpoints/step-XXXXXXX.pt`` and ``checkpoints/latest``: written atomically (temporary file,
  then ``os.replace``) at the end of every epoch and every ``--save-every`` steps; model, optimiser,
  scheduler, grad scaler, calibration, every rank's RNG states, epoch and step, and how many events
  the log held, and the run's options. ``--resume`` continues exactly (same data order, dropout masks,
  optimiser state, and a run that had stopped early stays stopped), read with
  ``torch.load(weights_only=True)``. It refuses, before writing anything and in one line naming each
  option with its old and new value, any option that differs from the checkpoint's but those that
  cannot change the numbers (:data:`RESUME_FREE`: ``--resume``, ``--overwrite``, ``--stop-after``,
  ``--save-every``, ``--keep-checkpoints``, ``--output``, ``--no-progress``, ``--no-plot``).
- ``--stop-after N`` checkpoints and stops after N optimiser steps of this invocation (over all the
  seeds of ``--seeds``): a time-limited job resubmits the same command with ``--resume`` and each
  job advances N steps; the result is the uninterrupted run's.
- A directory that already holds a run (any of these outputs) is never overwritten silently: run
  again without ``--resume`` and the recipe refuses before writing anything, naming the two choices,
  ``--resume`` (continue it) and ``--overwrite`` (delete these outputs, other files stay, and start
  over). ``--resume`` of a run stopped before its first checkpoint starts it over, as one line says;
  the temporaries a killed run left (a half-written checkpoint) are removed by the next run.
- ``final/``: the fine-tuned scorer (``Scorer.from_pretrained("DIR/final")``: encoder safetensors,
  ``torchmover.json``, ``centering="fixed"`` with the training texts' mean) and
  ``final/calibration.json`` (``a``, ``b``); ``result.json``: the run's summary (with its options,
  the report's set and the provenance). The scorer's signature says
  that it was fine-tuned, on which ratings, and which weights it reads (``finetuned:da:2015:cs-en+...:
  1790-pairs@weights-<hash>``, after the model it started from; ``Scorer.mark_finetuned``). With
  ``--seeds``, ``OUTPUT/final`` is the seed of the best dev r.
- ``test_report.json`` (``dev_report.json`` without ``--test``) and ``table.txt``: per-language-pair
  Kendall τ and Pearson r before and after fine-tuning (the paper's Table 4 layout), on ``--test`` or,
  without it, on the dev split that chose the epoch (the table's title says so).
- Errors: a bad option value, a missing ``--model`` path, an ``--output`` that is a file or lies inside
  a saved scorer (``torchmover.json``) or another run's directory, an unreadable ratings file, a dev
  split that holds out nothing, leaves no training rating or holds a single rating of a language
  pair, and a ``--test`` language pair of fewer than 2 ratings each stop the recipe with one line
  (exit status 2) before anything is written. Training ratings with an empty hypothesis or reference
  are kept (their ``Sim`` is 0), with one warning that counts them.

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
import re
import sys
import time
from collections import Counter
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
from torchmover.runtime.provenance import run_provenance

if str(Path(__file__).resolve().parent) not in sys.path:  # recipes/common.py, also when loaded from its path
    sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

PROG = "finetune_wmt.py"
REPO = Path(__file__).resolve().parents[1]
DEFAULT_TRAIN = REPO.parent / "shared" / "data" / "wmt15-16"
CHECKPOINT_FORMAT = 1
PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
# The options that cannot change a run's numbers, so --resume (and a finished seed of --seeds) accepts
# them changed: how this invocation claims the directory (--resume, --overwrite), where it stops
# (--stop-after), how often and how many checkpoints it keeps (--save-every, --keep-checkpoints: a
# checkpoint reads the RNG states, never draws from them), where it writes (--output: a checkpoint
# named by path may continue in another directory), and what it shows (--no-progress, --no-plot).
# Every other option is refused changed, naming its old and new value: the data (--train, --test,
# --year, ...), the model, the optimisation (--lr, --weight-decay, --max-grad-norm, --precision,
# --calibration-lr, --seed, ...), and also --threads, --device, --eval-batch-size, --n-boot,
# --skip-baseline and --log-every, which change float rounding or the numbers reported and logged.
RESUME_FREE = ("resume", "overwrite", "stop_after", "save_every", "keep_checkpoints", "output", "no_progress",
               "no_plot")
# Centerings under which a text's vectors do not depend on the other texts: evaluated as trained.
SELF_CONTAINED_CENTERINGS = ("none", "sentence", "dimension")
# What a run writes in --output: a directory with any of them holds a run (common.claim_run_directory).
RUN_OUTPUTS = ("checkpoints", "log.jsonl", "final", "result.json", "test_report.json", "dev_report.json",
               "table.txt", "curves.png")
# A directory above --output holding one of these holds another run (or --seeds table): refused.
RUN_MARKERS = ("checkpoints", "log.jsonl", "result.json", "seeds.json")
# A hub model name: NAME or ORG/NAME; any other --model is a local path, which must exist.
HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")


# --- command line ----------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    d = p.add_argument_group("data")
    d.add_argument("--train", nargs="+", default=[str(DEFAULT_TRAIN)],
                   help="training ratings: files or directories in any layout torchmover.evaluation.data reads")
    d.add_argument("--test", nargs="+", help="test ratings (any layout); default: the dev split, which also "
                                             "chose the epoch (its report is dev_report.json, not held out)")
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
                   help="checkpoint and stop after this many optimiser steps of this invocation (a "
                        "time-limited job resubmits the same command with --resume); 0: never")
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

def refuse(message: str) -> common.UsageError:
    """The recipe's one-line error (exit status 2 at the command line): raise what it returns."""
    return common.UsageError(f"{PROG}: error: {message}")


def read_all(paths: list[str], year: int | None) -> list[Rating]:
    """The ratings of every path; a missing, malformed or empty one ends the run with a one-line error."""
    try:
        records = [r for path in paths for r in read_ratings(path, year)]
    except (OSError, ValueError, ImportError) as error:
        raise refuse(str(error)) from None
    if not records:
        raise refuse(f"no ratings in {' '.join(paths)}")
    return records


def read_test(paths: list[str], year: int | None) -> list[Rating]:
    """The ratings of the ``--test`` paths; a language pair (and year) with fewer than 2 of them, which
    has no correlation, ends the run with a one-line error naming it and its file(s)."""
    by_path = {path: read_all([path], year) for path in paths}
    records = [r for rs in by_path.values() for r in rs]
    for group, n in too_small_groups(records).items():
        files = " ".join(path for path, rs in by_path.items() if any(r.group == group for r in rs))
        raise refuse(f"--test {files}: language pair {group} has {n} rating; a correlation needs at least 2")
    return records


def too_small_groups(records: list[Rating]) -> dict[str, int]:
    """``{group: count}`` of the language pairs (and years) of ``records`` with fewer than 2 ratings."""
    return {group: n for group, n in Counter(r.group for r in records).items() if n < 2}


def dev_split(records: list[Rating], fraction: float, seed: int) -> tuple[list[Rating], list[Rating]]:
    """``(train, dev)``: :func:`split_dev` of ``records`` (no dev split for ``fraction`` 0), refused in
    one line naming ``--dev-fraction`` and the counts when it holds out nothing (each group's share
    rounds to 0), when it leaves no training rating, or when it puts a single rating of a language
    pair in the dev split (no correlation)."""
    if fraction == 0:
        return records, []
    train, dev = split_dev(records, fraction, seed=seed)
    counts = f"{len(dev)} of {len(records)} ratings in {len({r.group for r in records})} language pair(s) held out"
    if not dev:
        raise refuse(f"--dev-fraction {fraction} holds out no rating ({counts}: each pair's share rounds to 0); "
                     "raise it, or pass --dev-fraction 0 for no dev split")
    if not train:
        raise refuse(f"--dev-fraction {fraction} leaves no training rating ({counts}; the ratings of one "
                     "reference stay together); lower it")
    for group, n in too_small_groups(dev).items():
        raise refuse(f"--dev-fraction {fraction} puts {n} rating of {group} in the dev split ({counts}); a "
                     "correlation needs at least 2: change --dev-fraction")
    return train, dev


def warn_empty_texts(records: list[Rating], main: bool) -> int:
    """How many training ratings have an empty hypothesis or reference (they train on ``Sim = 0``), said
    once on stderr by the ``main`` process when there are any."""
    n = sum(1 for r in records if not r.hyp.strip() or not r.ref.strip())
    if n and main:
        print(f"{PROG}: warning: {n} of {len(records)} training ratings have an empty hypothesis or reference "
              "(their Sim is 0)", file=sys.stderr, flush=True)
    return n


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


def loss_label(options: dict) -> str:
    """The training loss as ``curves.png`` names it, from the run's options: ``--loss`` and, with a
    correlation term, ``--loss-weight``."""
    if options["loss"] == "mse":
        return "MSE"
    return f"MSE + {options['loss_weight']:g} × {options['loss'].split('+')[1]} term"


def plot_curves(log_path: Path, out: Path) -> Path | None:
    """``curves.png``: the training loss (as ``--loss`` defines it, the mean of each ``--log-every``
    window) per optimiser step, and dev Pearson r / Kendall τ per epoch."""
    Figure = _figure_class(out)
    if Figure is None:
        return None
    events = [json.loads(line) for line in log_path.read_text(encoding="utf-8").splitlines() if line.strip()]
    options = next(e["args"] for e in events if e["event"] == "config")
    steps = [(e["step"], e["loss"]) for e in events if e["event"] == "step"]
    dev = sorted({e["epoch"]: e["dev"] for e in events if e["event"] == "epoch" and e.get("dev")}.items())
    fig = Figure(figsize=(10, 3.8), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2)
    if steps:
        ax1.plot(*zip(*steps), linewidth=1)
    ax1.set_xlabel("optimiser step")
    ax1.set_ylabel(f"train loss ({loss_label(options)})")
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


def plot_seeds(results: dict[int, dict], out: Path, split: str) -> Path | None:
    """``seeds.png``: Pearson r on the report's ``split`` (``test``, or ``dev``: each seed's dev split)
    per group and on average, before and after fine-tuning, as the mean over the seeds with their
    min-max range."""
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
    ax.set_ylabel(f"{split} Pearson r (mean of {len(runs)} seeds, min-max)")
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
    check_options(args)
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
        if not stopped_early and run.stop_at is not None and run.stop_at <= run.global_step < run.total_steps:
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
    provenance: dict | None  # what produced the run's files (rank 0; None on the others)
    epoch: int = 0
    step_in_epoch: int = 0
    global_step: int = 0
    start_step: int = 0  # where this invocation started (a resumed one: the checkpoint's step)
    stop_at: int | None = None  # --stop-after: the global step this invocation stops at
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
    """Everything before the first step: the data read and every input checked, the checkpoint of
    ``--resume`` read and its options compared (:func:`resume_state`), the run directory claimed (a
    run already there is refused unless ``--resume`` or ``--overwrite``) — all before anything is
    written —, the scorer, calibration, optimiser and schedule built identically on every rank; then
    the output directory made and either the checkpoint restored (:func:`resume`) or a new run started
    (:func:`start`)."""
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    rank, world = common.rank_and_world()
    device = common.local_device(args.device)
    if args.precision == "fp16" and device.type != "cuda":
        raise refuse("--precision fp16 needs a GPU; use bf16 on the CPU")
    train_set, dev_set, test_set = read_data(args, main=rank == 0)
    output = Path(args.output)
    resuming = bool(args.resume) and not common.nothing_to_resume(args.resume, output, RUN_OUTPUTS, main=rank == 0)
    state = resume_state(args, output, world) if resuming else None
    common.claim_run_directory(output, RUN_OUTPUTS, resume=resuming, overwrite=args.overwrite, main=rank == 0)

    eval_texts = centering_texts(train_set, args.centering_fit_size, args.seed)
    if rank == 0 and not test_set and not args.skip_baseline:
        print("no --test and no dev split: the before/after table is skipped", flush=True)
    elif rank == 0 and not args.test:
        print("no --test: the before/after report (dev_report.json, table.txt) is on the dev split, which "
              "chooses the epoch: it is not held out", flush=True)
    scorer, frozen = build_scorer(args, device, eval_texts, progress=rank == 0 and not args.no_progress)
    calibration = Calibration().to(device)
    optimizer = torch.optim.AdamW(param_groups(scorer, calibration, args), lr=args.lr)
    steps_per_epoch = len(epoch_steps(len(train_set), 0, args, rank, world))
    total_steps = steps_per_epoch * args.epochs
    warmup = int(round(args.warmup * total_steps)) if args.warmup < 1 else int(args.warmup)
    if rank == 0:
        output.mkdir(parents=True, exist_ok=True)
    common.barrier()
    run = Run(args=args, rank=rank, world=world, device=device, output=output,
              log=common.JsonLog(output / "log.jsonl", enabled=rank == 0),
              train_set=train_set, dev_set=dev_set, test_set=test_set, eval_texts=eval_texts,
              scorer=scorer, calibration=calibration, frozen=frozen, optimizer=optimizer,
              scheduler=common.warmup_schedule(optimizer, warmup, total_steps, args.schedule),
              scaler=torch.amp.GradScaler(device.type, enabled=args.precision == "fp16"),
              trainable=[p for g in optimizer.param_groups for p in g["params"]],
              steps_per_epoch=steps_per_epoch, total_steps=total_steps, warmup_steps=warmup,
              provenance=run_provenance(REPO, str(device), data_files(args)) if rank == 0 else None)
    if resuming:
        resume(run, state)
    else:
        start(run)
    run.start_step = run.global_step
    run.stop_at = run.global_step + args.stop_after if args.stop_after else None
    common.broadcast_parameters_(run.scorer)
    common.broadcast_parameters_(run.calibration)
    return run


def data_files(args: argparse.Namespace) -> list[str]:
    """The ratings files a run reads (``--train``, then ``--test``): what its provenance hashes."""
    return [*args.train, *(args.test or [])]


def check_options(args: argparse.Namespace) -> None:
    """Refuse, in one line (:func:`refuse`), option values that argparse's types let through, a local
    ``--model`` path that does not exist, and an ``--output`` that is a file or lies inside a saved
    scorer or another run's directory (:func:`common.enclosing_run`)."""
    for name in ("epochs", "batch_size", "grad_accum", "eval_batch_size", "log_every"):
        if getattr(args, name) < 1:
            raise refuse(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if not 0 <= args.dev_fraction < 1:
        raise refuse(f"--dev-fraction must be in [0, 1), got {args.dev_fraction}")
    if args.loss_weight < 0:
        raise refuse(f"--loss-weight must be non-negative, got {args.loss_weight}")
    check_model(args.model)
    check_output(Path(args.output))


def check_model(model: str) -> None:
    """Refuse a ``--model`` that is neither a hub name nor an existing local path."""
    from torchmover.text.encoder import resolve_model_path

    if not (Path(os.path.expanduser(resolve_model_path(model))).exists() or HUB_NAME.fullmatch(model)):
        raise refuse(f"--model {model}: no such directory (a hub name is NAME or ORG/NAME)")


def check_output(output: Path) -> None:
    """Refuse an ``--output`` that is a file, or that lies inside a saved scorer (``torchmover.json``) or
    inside the directory of another run (:data:`RUN_MARKERS`)."""
    if output.exists() and not output.is_dir():
        raise refuse(f"--output {output} is a file, not a directory")
    owner = common.enclosing_run(output, RUN_MARKERS)
    if owner is not None:
        what = "a saved scorer" if (owner / "torchmover.json").is_file() else "another run"
        raise refuse(f"--output {output} is inside {owner}, which holds {what}: choose a directory outside it")


def read_data(args: argparse.Namespace, main: bool) -> tuple[list[Rating], list[Rating], list[Rating]]:
    """``(train, dev, test)``: the training ratings minus a stratified, seeded dev split (then a
    seeded subset of ``--max-train-pairs``); the test set by path, else the dev split itself. Every
    input problem is a one-line error (:func:`read_all`, :func:`dev_split`, :func:`read_test`)."""
    records = read_all(args.train, args.year)
    train, dev = dev_split(records, args.dev_fraction, args.seed)
    if 0 < args.max_train_pairs < len(train):
        keep = sorted(random.Random(f"{args.seed}/train").sample(range(len(train)), args.max_train_pairs))
        train = [train[i] for i in keep]
    test = read_test(args.test, args.year) if args.test else dev
    warn_empty_texts(train, main)
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
    run.log("config", args=common.options_record(args), provenance=run.provenance, world_size=run.world,
            signature=scorer.signature,
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
                run.log("eval", split=report_split(args), when="before", **run.baseline)
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
            if run.stop_at is not None and run.global_step >= run.stop_at:
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
            "format": CHECKPOINT_FORMAT, "world_size": run.world, "args": common.options_record(run.args),
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


def resume_state(args: argparse.Namespace, output: Path, world: int) -> dict:
    """The checkpoint ``--resume`` names, read and checked before anything is written: refused in one
    line if it is of another format, was written by another number of processes, or if any option
    but the :data:`RESUME_FREE` ones differs from those it recorded (each named with its old and new
    value), so that the resumed run is the interrupted one: same data, test set (and so the same
    baseline), model and optimisation. The state has its path under ``"path"``."""
    path = common.resume_path(args.resume, output / "checkpoints")
    state = load_checkpoint(path)
    if state.get("format") != CHECKPOINT_FORMAT:
        raise refuse(f"{path}: checkpoint format {state.get('format')!r}, expected {CHECKPOINT_FORMAT}")
    if state["world_size"] != world:
        raise refuse(f"{path} was written by {state['world_size']} process(es), this run has {world}: "
                     "resume with the same number of processes (the data order depends on it)")
    common.refuse_changed_options(PROG, f"--resume: {path}", state["args"], args, RESUME_FREE)
    return {**state, "path": path}


def resume(run: Run, state: dict) -> None:
    """Continue from the checkpoint ``state`` (:func:`resume_state`): trained objects, this rank's RNG
    state, where the run was, and the log as it was then (what an interrupted run logged after the
    checkpoint is dropped, to be logged again as it is redone); the ``resume`` event records this
    invocation's provenance."""
    path = state["path"]
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
    run.log("resume", checkpoint=str(path), epoch=run.epoch, step=run.global_step, provenance=run.provenance)


# the end

def run_result(run: Run, stopped: bool) -> dict:
    """The run's summary (``result.json`` without ``final``): where it stopped, the calibration, the
    best dev epoch, the before/after report's ``report`` set (:func:`report_set`), its options and
    provenance."""
    return {"stopped": stopped, "global_step": run.global_step, "steps_run": run.global_step - run.start_step,
            "calibration": run.calibration.to_dict(), "best_epoch": run.best["epoch"] if run.best else None,
            "pairs_per_s": run.pairs_seen / run.train_seconds if run.train_seconds else None,
            "train_seconds": run.train_seconds, "report": report_set(run.args), "baseline": run.baseline,
            "dev_history": run.dev_history, "output": str(run.output), "args": common.options_record(run.args),
            "provenance": run.provenance}


def stop(run: Run) -> dict:
    """A run ended by ``--stop-after`` (its checkpoint written): the summary so far."""
    run.say(f"stopped after {run.global_step - run.start_step} steps of this invocation (--stop-after), at "
            f"step {run.global_step} of {run.total_steps}; continue with --resume")
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


def report_split(args: argparse.Namespace) -> str:
    """The set of the before/after report: ``"test"`` (``--test``), else ``"dev"``: the dev split,
    which chose the epoch, so not held out."""
    return "test" if args.test else "dev"


def report_set(args: argparse.Namespace) -> dict:
    """How the outputs name the before/after report's set: ``split`` (:func:`report_split`), whether
    it is ``held_out`` (never used for a choice), its ``file`` and the ``title`` of ``table.txt``."""
    split = report_split(args)
    title = (f"test set: {', '.join(args.test)}" if args.test else
             f"dev split (--dev-fraction {args.dev_fraction} of the training ratings; it chose the epoch, "
             "so it is not held out)")
    return {"split": split, "held_out": split == "test", "file": f"{split}_report.json", "title": title}


def write_test_report(run: Run, report: Report) -> dict:
    """The report file (``test_report.json``, or ``dev_report.json`` without ``--test``: :func:`report_set`)
    with the run's provenance, and the before/after ``table.txt`` of the final model; its summary."""
    after, named = summary(report), report_set(run.args)
    atomic_write_text(run.output / named["file"], json.dumps(
        {**report.to_dict(), "provenance": run.provenance}, indent=2, ensure_ascii=False) + "\n")
    run.log("eval", split=named["split"], when="after", **after)
    text = table4(run.baseline, after, named["title"])
    atomic_write_text(run.output / "table.txt", text + "\n")
    run.say(text)
    return after


# --- seeds -----------------------------------------------------------------------------------------

SEED_COLUMNS = (("best_epoch", "best epoch", "{:.0f}"), ("dev_r", "dev r", "{:.3f}"),
                ("r_before", "r before", "{:.3f}"), ("r_after", "r after", "{:.3f}"), ("delta_r", "Δr", "{:+.3f}"),
                ("tau_before", "τ before", "{:.3f}"), ("tau_after", "τ after", "{:.3f}"), ("delta_tau", "Δτ", "{:+.3f}"))


def run_seeds(args: argparse.Namespace) -> dict:
    """One run per seed of ``--seeds`` in ``OUTPUT/seed-S``, then the seed table (:func:`write_seed_table`).

    Resumable: a finished seed (its ``result.json`` exists) is read, not rerun, when the options it
    recorded equal this command's but the :data:`RESUME_FREE` ones (else the command is refused
    before any seed runs: :func:`check_finished_seeds`); one with a checkpoint continues from it
    (``--resume``, under the same rule); one without starts over, as does every seed with
    ``--overwrite``. ``--stop-after N`` counts the steps of this invocation over all its seeds."""
    seeds = parse_seeds(args.seeds)
    rank = common.rank_and_world()[0]
    check_finished_seeds(args, seeds)
    budget = args.stop_after  # steps this invocation may still run (--stop-after; 0: no limit)
    for seed in seeds:
        out = Path(args.output) / f"seed-{seed}"
        if not args.overwrite and (out / "result.json").is_file():
            continue
        if args.stop_after and budget <= 0:
            if rank == 0:
                print(f"stopped after {args.stop_after} steps (--stop-after), before seed {seed}; continue "
                      "with the same command", flush=True)
            return {"stopped": True, "seed": seed}
        result = train(seed_options(args, seed, **seed_start(args, out, rank), stop_after=budget))
        if result["stopped"]:
            return {"stopped": True, "seed": seed}
        if args.stop_after:
            budget -= result["steps_run"]
    if rank > 0:
        return {"stopped": False}  # rank 0 writes the results and the table
    return write_seed_table(args, seeds)


def parse_seeds(text: str) -> list[int]:
    """The seeds of ``--seeds`` (comma-separated, distinct integers), else a one-line error."""
    try:
        seeds = [int(s) for s in text.split(",")]
    except ValueError:
        raise refuse(f"--seeds must be comma-separated integers, got {text!r}") from None
    if len(set(seeds)) != len(seeds):
        raise refuse(f"--seeds has repeated seeds: {text!r}")
    return seeds


def seed_options(args: argparse.Namespace, seed: int, **run) -> argparse.Namespace:
    """The options of seed ``seed``'s run: the command's, with ``--seed S`` in ``OUTPUT/seed-S`` and no
    ``--seeds``, and ``run`` (how this invocation runs it: ``resume``, ``overwrite``, ``stop_after``)."""
    return argparse.Namespace(**{**vars(args), "seeds": None, "seed": seed,
                                 "output": str(Path(args.output) / f"seed-{seed}"), **run})


def seed_start(args: argparse.Namespace, out: Path, rank: int) -> dict:
    """How an unfinished seed in ``out`` runs: from its latest checkpoint (``resume``), else over
    (``overwrite``, said in one line where ``out`` holds files); every seed over with ``--overwrite``."""
    resume = None if args.overwrite else "latest" if latest_checkpoint(out / "checkpoints") else None
    if resume is None and not args.overwrite and out.is_dir() and any(out.iterdir()) and rank == 0:
        print(f"{out} holds no checkpoint to resume: starting the seed over", flush=True)
    return {"resume": resume, "overwrite": resume is None}


def check_finished_seeds(args: argparse.Namespace, seeds: list[int]) -> None:
    """Refuse, before any seed runs, a finished seed whose ``result.json`` records other options than
    this command gives it (:func:`seed_options`), the :data:`RESUME_FREE` ones apart, or records none
    (naming each option with its old and new value); nothing with ``--overwrite``, which reruns them."""
    if args.overwrite:
        return
    for seed in seeds:
        path = Path(args.output) / f"seed-{seed}" / "result.json"
        if not path.is_file():
            continue
        recorded = json.loads(path.read_text(encoding="utf-8")).get("args")
        if recorded is None:
            raise refuse(f"{path} records no options, so seed {seed} cannot be reused: pass --overwrite to rerun")
        common.refuse_changed_options(PROG, f"seed {seed} ({path})", recorded, seed_options(args, seed),
                                      RESUME_FREE)


def write_seed_table(args: argparse.Namespace, seeds: list[int]) -> dict:
    """Rank 0, after every seed finished: ``OUTPUT/seeds.md`` and ``OUTPUT/seeds.json``, per seed the
    best dev epoch and its dev r, Pearson r and Kendall τ before and after fine-tuning on the report's
    set (:func:`report_set`: the test set, or each seed's dev split, which chose its epoch), and their
    mean ± sample standard deviation and range; the options each seed recorded in its ``result.json``
    and this invocation's provenance. Unless ``--no-plot``, ``OUTPUT/seeds.png`` (:func:`plot_seeds`).
    With a dev split, ``OUTPUT/final`` is the fine-tuned metric to keep: the scorer (and calibration)
    of the seed with the best dev r — chosen on dev, never on the test set — which
    ``Scorer.from_pretrained("OUTPUT/final")`` loads."""
    output, named = Path(args.output), report_set(args)
    results = {seed: json.loads((output / f"seed-{seed}" / "result.json").read_text(encoding="utf-8"))
               for seed in seeds}
    rows = [seed_row(seed, results[seed]) for seed in seeds]
    stats = {key: spread([r[key] for r in rows]) for key, _, _ in SEED_COLUMNS}
    table = {"seeds": rows, "stats": stats, "report": named,
             "options": {str(seed): results[seed]["args"] for seed in seeds},
             "provenance": run_provenance(REPO, str(common.local_device(args.device)), data_files(args))}
    best = max((r for r in rows if r["dev_r"] is not None), key=lambda r: r["dev_r"], default=None)
    notes = [f"r and τ before / after: {named['title']}.",
             f"Options of every seed (from its result.json; `seed` apart): {options_text(results[seeds[0]]['args'])}."]
    if best is not None:  # the fine-tuned metric to keep: chosen on dev, never on the test set
        publish_final(output / f"seed-{best['seed']}" / "final", output / "final")
        table["final"] = {"seed": best["seed"], "dev_r": best["dev_r"], "path": str(output / "final")}
        notes.append(f"`final/`: the fine-tuned scorer of seed {best['seed']}, the best dev r ({best['dev_r']:.3f}).")
    atomic_write_text(output / "seeds.json", json.dumps(table, indent=1) + "\n")
    atomic_write_text(output / "seeds.md", seed_markdown(rows, stats) + "".join(f"\n{n}\n" for n in notes))
    if not args.no_plot:
        plot_seeds(results, output / "seeds.png", named["split"])
    print(named["title"] + "\n" + seed_markdown(rows, stats), flush=True)
    return {"stopped": False, **table}


def options_text(recorded: dict) -> str:
    """The options a seed recorded, as ``name=value`` (JSON values), but the :data:`RESUME_FREE` ones
    and those that name the seed (``seed``, ``seeds``)."""
    skip = {*RESUME_FREE, "seed", "seeds"}
    return ", ".join(f"`{name}={json.dumps(value)}`" for name, value in recorded.items() if name not in skip)


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
    sys.exit(common.run_command(main))
