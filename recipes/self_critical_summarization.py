"""Self-critical policy-gradient training of a summarizer with the torchmover reward.

The mixed objective of the sentence-mover paper (Clark et al., 2019, §5; after Paulus et al., 2018)
with the self-critical baseline of Rennie et al. (2017):

    L = γ · L_RL + (1 − γ) · L_MLE
    L_RL  = −(r(ŷ) − r(ỹ)) · Σ_t log p(ŷ_t | ŷ_<t, x)               (mean over the batch)
    L_MLE = −(1/|y|) Σ_t log p(y_t | y_<t, x)                          (teacher forcing)

``ŷ`` is a summary sampled from the model (pure ancestral sampling: no top-k/top-p, temperature 1,
and none of the forced, suppressed or banned tokens, repetition or length rules that the model's
generation config may set: :func:`generation_config`),
``ỹ`` the greedy summary, ``y`` the reference and ``r`` the reward: the :class:`torchmover.Scorer`
similarity of a summary to its reference (TWMD by default), through
:class:`torchmover.reward.SelfCriticalReward`, which centers every text on a fixed mean fitted once
on the training references (so ``r(ŷ)`` does not depend on ``ỹ`` or on the rest of the batch) and
returns ``advantage = r(ŷ) − r(ỹ)`` without a graph. ``γ = 0`` is plain MLE. ``log p(ŷ)`` is the
sum over the sampled tokens through the first end-of-sequence token (``--logprob mean`` divides it by
``|ŷ|``), computed like the samples with dropout off, so that it is the log-probability under the
policy that drew them; the MLE term keeps dropout.

Any Hugging Face encoder-decoder works (``AutoModelForSeq2SeqLM``, e.g. ``t5-small`` or
``facebook/bart-base``), with data from a ``datasets`` hub name (``--text-column`` /
``--summary-column``; ``datasets`` is imported only then) or a local JSONL file with ``document`` and
``summary`` fields. ``--model tiny`` builds a small randomly initialised T5 in-process, with a
word-level tokenizer over the training data's vocabulary, for the shipped toy task
(``recipes/data/toy_summarization.jsonl``, written by :func:`make_toy_dataset`; ``--make-toy-data``
rewrites it): 200 synthetic news-like documents of 2-4 sentences with a one-sentence summary; each of
the 160 training documents comes with four reference summaries, one of them from a careless annotator
(wrong name and city), and the 40 held-out documents with their correct summary.

Phases. ``--warmup-epochs N`` first trains with MLE alone at ``--warmup-lr`` (the warm start, phase
``warmstart``; ``0`` skips it, e.g. for a pretrained summarizer, and with a pretrained model pass a
smaller ``--lr`` such as 2e-5); each
run then starts from the warm start's final weights with a fresh optimiser: ``mixed`` (γ = ``--gamma``)
and, with ``--compare-mle``, ``mle`` (γ = 0) on the same data order and seed. Every
``--eval-every`` steps (and at step 0) each run samples ``--eval-samples`` summaries per document of
the held-out split and of a fixed subset of the training documents, under a fixed seed that does not
touch the training RNG, and logs their mean reward and the greedy summaries' mean reward.

Outputs (``--output-dir DIR``):

- ``DIR/<phase>/log.jsonl``: ``config``, ``step`` (loss, L_RL, L_MLE, batch rewards, advantage, lr,
  gradient norm), ``eval`` and ``done`` events, one JSON object per line; after ``--resume``, ``resume``.
  Each event is logged once: a resume drops what the interrupted run logged after its checkpoint,
  which is logged again as it is redone;
- ``DIR/<phase>/checkpoints/step-XXXXXXX.pt`` and ``latest``: every ``--save-every`` steps and at the end
  of the phase, written atomically (temporary file, fsync, ``os.replace``): model, optimiser and
  scheduler state dicts, the step, the Python and torch RNG states, and how many events the log held
  (read back with ``torch.load(weights_only=True)``). ``--resume`` continues each unfinished phase from
  its latest checkpoint with the same data order, RNG states and optimiser state; its rewards match the
  uninterrupted run's to float32 rounding only (the reward's reference cache starts empty, and a
  self-term computed beside other batch-mates rounds differently), so the resumed run agrees with it
  to rounding, not to the bit. Before anything runs, it refuses in one line (exit status 2), naming
  each option with its old and new value, a run any phase of which, finished or not, was started with
  other options than the command's, but those that cannot change the numbers (:data:`RESUME_FREE`:
  ``--resume``, ``--overwrite``, ``--stop-after-steps``, ``--save-every``, ``--keep-checkpoints``,
  ``--output-dir``, ``--quiet``); ``--stop-after-steps`` counts the steps of this invocation;
- ``DIR/<phase>/final/``: the trained model and tokenizer (``save_pretrained``), and
  ``DIR/<phase>/done.json`` (written atomically): the finished phase's summary;
- ``DIR/summary.json`` (written atomically) and ``DIR/reward_curves.png`` (matplotlib, if installed):
  the sampled and greedy rewards of every run over training; ``summary.json`` also holds the options
  and the provenance (:func:`torchmover.runtime.provenance.run_provenance`: the command line as run,
  the versions of Python, torchmover, torch and transformers, the commit of the code's git checkout
  and whether it had uncommitted changes, the device, and the data file with its size and SHA-256).

A directory that already holds a run (a phase directory, ``summary.json`` or the plot) is never
overwritten silently: run again without ``--resume`` and the recipe refuses before writing anything,
naming the two choices, ``--resume`` (continue it) and ``--overwrite`` (delete those outputs, other
files stay, and start over).

Examples::

    # the toy comparison (CPU, about 2 minutes of one core; bench/studies/self_critical_toy.py runs it
    # over four seeds into bench/results/self_critical_toy.md): 15 epochs of MLE at lr 1e-3, then 3
    # epochs of MLE alone vs mixed γ = 0.9, both at lr 1e-4
    python recipes/self_critical_summarization.py --model tiny --output-dir runs/toy_scst \\
        --compare-mle --max-target-length 24 --threads 1
    python recipes/self_critical_summarization.py ... --resume      # continue after a stop
    python recipes/self_critical_summarization.py ... --overwrite   # discard the run, start over
    # a pretrained model on CNN/DailyMail
    python recipes/self_critical_summarization.py --model t5-small --dataset cnn_dailymail \\
        --dataset-config 3.0.0 --text-column article --summary-column highlights \\
        --eval-split validation --max-train-examples 20000 --epochs 1 --lr 2e-5 --gamma 0.9 \\
        --output-dir runs/t5_cnndm
"""
from __future__ import annotations

import argparse
import contextlib
import json
import random
import sys
import time
from pathlib import Path

import torch
from torch import Tensor, nn

from torchmover.runtime.checkpoint import (
    atomic_write_text, latest_checkpoint, load_checkpoint, rng_state, save_checkpoint, set_rng_state,
)
from torchmover.runtime.provenance import run_provenance

if str(Path(__file__).resolve().parent) not in sys.path:  # recipes/common.py, also when loaded from its path
    sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

PROG = "self_critical_summarization.py"
REPO = Path(__file__).resolve().parents[1]
TOY_DATA = REPO / "recipes" / "data" / "toy_summarization.jsonl"
# What a run writes in --output-dir: a directory with any of them holds a run (common.claim_run_directory).
PHASES = ("warmstart", "mle", "mixed")
RUN_OUTPUTS = (*PHASES, "summary.json", "reward_curves.png")
# The options that cannot change a run's numbers, so --resume accepts them changed: how this invocation
# claims the directory (--resume, --overwrite), where it stops (--stop-after-steps), how often and how
# many checkpoints it keeps (--save-every, --keep-checkpoints: a checkpoint reads the RNG states, never
# draws from them), where it writes (--output-dir) and whether it shows progress bars (--quiet). Every
# other option (γ, lengths, seed, learning rates, data, model, reward, --threads, --device, the
# evaluation options, ...) is refused changed for every phase, finished or not, before anything runs.
RESUME_FREE = ("resume", "overwrite", "stop_after_steps", "save_every", "keep_checkpoints", "output_dir", "quiet")


# --- the toy task ------------------------------------------------------------------------------------

NAMES = "Anna Ben Carla David Elena Frank Grace Hugo Irene Jonas Karl Lucy".split()
JOBS = "farmer doctor teacher baker pilot painter nurse driver".split()
VERBS = "found bought sold painted built repaired lost cleaned delivered stole".split()
ADJECTIVES = "red brown small large green broken shiny wooden blue heavy".split()
OBJECTS = "car boat house bicycle piano clock bridge table lamp wagon".split()
CITIES = "Paris London Berlin Rome Madrid Vienna Oslo Lisbon Prague Dublin".split()
DAYS = "Monday Tuesday Wednesday Thursday Friday Saturday Sunday".split()
WEATHER = "cold warm rainy sunny windy grey".split()


def make_toy_examples(n: int = 200, seed: int = 0) -> list[dict]:
    """``n`` synthetic news items: a key sentence (who did what to which object where, on which day)
    among 1-3 distractor sentences, and the one-sentence summary ``"<name> <verb> a <adj> <object> in
    <city>."``. Deterministic for a given ``seed``."""
    rng = random.Random(seed)
    opinions = ["a big surprise", "a good day", "very strange", "not important"]
    rows = []
    for _ in range(n):
        name, job, verb = rng.choice(NAMES), rng.choice(JOBS), rng.choice(VERBS)
        adj, obj, city, day = rng.choice(ADJECTIVES), rng.choice(OBJECTS), rng.choice(CITIES), rng.choice(DAYS)
        other = rng.choice([x for x in NAMES if x != name])
        if rng.random() < 0.5:
            key = f"On {day}, {name} the {job} {verb} a {adj} {obj} in {city}."
        else:
            key = f"{name}, a {job}, {verb} a {adj} {obj} in {city} on {day}."
        distractors = [
            f"The weather in {rng.choice(CITIES)} was {rng.choice(WEATHER)} that day.",
            f"{other}, a friend of {name}, said it was {rng.choice(opinions)}.",
            f"The police in {city} did not comment.",
            f"A {rng.choice(ADJECTIVES)} {rng.choice(OBJECTS)} was also seen nearby.",
            f"People said the {obj} cost {rng.choice(['ten', 'twenty', 'fifty', 'a hundred'])} euros.",
        ]
        rng.shuffle(distractors)
        sentences = distractors[:rng.randint(1, 3)]
        sentences.insert(0 if rng.random() < 0.7 else 1, key)
        rows.append({"document": " ".join(sentences), "summary": f"{name} {verb} a {adj} {obj} in {city}."})
    return rows


def make_toy_dataset(n: int = 200, eval_examples: int = 40, copies: int = 4, seed: int = 0) -> list[dict]:
    """The shipped toy data set: :func:`make_toy_examples` ``n`` items, of which the first
    ``n − eval_examples`` are training documents, each given ``copies`` times with one careless
    annotator's summary among them (wrong name and wrong city), shuffled; then the held-out documents,
    once each with their correct summary (the recipe holds out the last ``--eval-examples`` rows).

    The noisy references are what separates the two objectives: MLE fits the annotators'
    distribution, so its sampled summaries name a wrong person or place about one time in ``copies``;
    the reward is highest for the summary most annotators agree on, so the RL term learns to avoid the
    noise (the greedy summary, the mode, is mostly right under both)."""
    rng = random.Random(seed + 1)
    rows = make_toy_examples(n, seed)
    train, held_out = rows[:n - eval_examples], rows[n - eval_examples:]
    noisy = []
    for row in train:
        name, *middle, city = row["summary"].rstrip(".").split()
        wrong_name = rng.choice([x for x in NAMES if x != name])
        wrong_city = rng.choice([x for x in CITIES if x != city])
        noisy.append({"document": row["document"], "summary": " ".join([wrong_name, *middle, wrong_city]) + "."})
        noisy += [dict(row) for _ in range(copies - 1)]
    rng.shuffle(noisy)
    return noisy + held_out


# --- data ----------------------------------------------------------------------------------------------

def read_jsonl(path: Path, text_column: str, summary_column: str) -> list[dict]:
    rows = []
    with open(path, encoding="utf-8") as fh:
        for i, line in enumerate(fh, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            missing = [c for c in (text_column, summary_column) if c not in row]
            if missing:
                raise ValueError(f"{path}:{i}: missing field(s) {missing}; found {sorted(row)} "
                                 "(set --text-column / --summary-column)")
            rows.append({"document": str(row[text_column]), "summary": str(row[summary_column])})
    return rows


def read_hub(name: str, config: str | None, split: str, text_column: str, summary_column: str,
             limit: int | None) -> list[dict]:
    try:
        import datasets
    except ImportError as e:
        raise SystemExit(f"--dataset {name!r} is not a local file; reading it from the hub needs "
                         "`pip install datasets`") from e
    data = datasets.load_dataset(name, config, split=split)
    for column in (text_column, summary_column):
        if column not in data.column_names:
            raise SystemExit(f"--dataset {name!r} split {split!r} has no column {column!r}; "
                             f"columns: {data.column_names}")
    if limit is not None:
        data = data.select(range(min(limit, len(data))))
    return [{"document": d, "summary": s} for d, s in zip(data[text_column], data[summary_column])]


def load_data(args) -> tuple[list[dict], list[dict]]:
    """(train, eval) examples: ``--eval-split`` of a hub data set, else the last ``--eval-examples``."""
    path = Path(args.dataset)
    if path.suffix == ".jsonl" or path.is_file():
        if not path.is_file():
            raise SystemExit(f"--dataset {path}: no such file")
        rows = read_jsonl(path, args.text_column, args.summary_column)
        evaluation = None
    else:
        rows = read_hub(args.dataset, args.dataset_config, args.split, args.text_column, args.summary_column,
                        args.max_train_examples)
        evaluation = None if args.eval_split is None else read_hub(
            args.dataset, args.dataset_config, args.eval_split, args.text_column, args.summary_column,
            args.eval_examples)
    if evaluation is None:
        if len(rows) <= args.eval_examples:
            raise SystemExit(f"--dataset has {len(rows)} examples: too few to hold out --eval-examples "
                             f"{args.eval_examples}")
        rows, evaluation = rows[:-args.eval_examples], rows[-args.eval_examples:]
    if args.max_train_examples is not None:
        rows = rows[:args.max_train_examples]
    return rows, evaluation[:args.eval_examples]


# --- model ---------------------------------------------------------------------------------------------

def tiny_tokenizer(texts: list[str]):
    """A fast word-level tokenizer (lower-cased words and punctuation) over the words of ``texts``."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    normalizer, pre = normalizers.Lowercase(), pre_tokenizers.Whitespace()
    words = sorted({w for t in texts for w, _ in pre.pre_tokenize_str(normalizer.normalize_str(t))})
    vocab = {w: i for i, w in enumerate(["<pad>", "</s>", "<unk>"] + words)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.normalizer, backend.pre_tokenizer = normalizer, pre
    backend.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="</s>",
                                   unk_token="<unk>", model_max_length=512,
                                   model_input_names=["input_ids", "attention_mask"])  # T5's: no type ids


def tiny_model(tokenizer, seed: int):
    """A randomly initialised 2+2-layer T5 (d_model 128) for ``tokenizer``'s vocabulary."""
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(vocab_size=len(tokenizer), d_model=128, d_kv=32, d_ff=256, num_layers=2,
                      num_decoder_layers=2, num_heads=4, dropout_rate=0.1, relative_attention_num_buckets=16,
                      pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                      decoder_start_token_id=tokenizer.pad_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return T5ForConditionalGeneration(config)


def load_model(args, train: list[dict]):
    """(model, tokenizer): ``--model tiny`` or any ``AutoModelForSeq2SeqLM`` name or path."""
    if args.model == "tiny":
        tokenizer = tiny_tokenizer([r["document"] for r in train] + [r["summary"] for r in train])
        return tiny_model(tokenizer, args.seed), tokenizer
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    return AutoModelForSeq2SeqLM.from_pretrained(args.model), AutoTokenizer.from_pretrained(args.model)


# What generation_config() keeps of the model's generation config: the special tokens, which say where
# a sequence starts and ends and how it is padded. Every other option is left at GenerationConfig's
# default (off), among them each one that would draw ŷ from another distribution than p: forced
# tokens (forced_bos/eos_token_id), suppressed or banned tokens (suppress_tokens,
# begin_suppress_tokens, bad_words_ids, sequence_bias), repetition and length rules
# (no_repeat_ngram_size, repetition_penalty, min_length, min_new_tokens, exponential_decay_length_penalty),
# warpers (top_k, top_p, min_p, typical_p, epsilon/eta cutoffs, temperature), renormalize_logits,
# guidance_scale, watermarking, stop_strings and max_time, beams and assisted decoding.
GENERATION_TOKENS = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")


def generation_config(model, max_new_tokens: int, sample: bool):
    """A generation config that draws ``ŷ`` from ``p`` itself: the model's special tokens
    (:data:`GENERATION_TOKENS`) and nothing else of its generation config, then pure ancestral sampling
    (``sample``: temperature 1, no top-k/top-p) or greedy search, one beam, at most ``max_new_tokens``
    tokens. Used through :func:`only_generation_config`, ``generate`` applies no logits processor, so
    each token is drawn from (or is the argmax of) the policy's softmax, the distribution whose
    log-probability :func:`sequence_logprob` sums."""
    from transformers import GenerationConfig

    tokens = {name: getattr(model.generation_config, name) for name in GENERATION_TOKENS}
    return GenerationConfig(**tokens, do_sample=sample, num_beams=1, top_k=0 if sample else None, top_p=1.0,
                            temperature=1.0, max_new_tokens=max_new_tokens)


@contextlib.contextmanager
def only_generation_config(model, config):
    """Inside the block, ``config`` is ``model.generation_config`` too: ``generate`` fills each option
    that the config it is given leaves unset (``None``) from the model's own, which would bring back
    the forced and suppressed tokens :func:`generation_config` leaves out. Restored after the block."""
    own = model.generation_config
    model.generation_config = config
    try:
        yield config
    finally:
        model.generation_config = own


# --- the objective -------------------------------------------------------------------------------------

class Batch:
    """Tokenized documents (``input_ids``, ``attention_mask``), references and MLE labels (pad = −100)."""

    def __init__(self, rows: list[dict], tokenizer, args):
        docs = [args.source_prefix + r["document"] for r in rows]
        self.references = [r["summary"] for r in rows]
        self.inputs = tokenizer(docs, padding=True, truncation=True, max_length=args.max_source_length,
                                return_tensors="pt")
        labels = tokenizer(text_target=self.references, padding=True, truncation=True,
                           max_length=args.max_target_length, return_tensors="pt")["input_ids"]
        self.labels = labels.masked_fill(labels == tokenizer.pad_token_id, -100)  # [B, T]

    def to(self, device) -> "Batch":
        self.inputs = self.inputs.to(device)
        self.labels = self.labels.to(device)
        return self


@torch.no_grad()
def decode(model, tokenizer, inputs, max_new_tokens: int, sample: bool) -> tuple[Tensor, list[str]]:
    """Sampled or greedy summaries (dropout off): ids ``[B, T]`` starting with the decoder start
    token, and their texts."""
    config = generation_config(model, max_new_tokens, sample)
    with common.eval_mode(model), only_generation_config(model, config):
        ids = model.generate(**inputs, generation_config=config)
    return ids, tokenizer.batch_decode(ids, skip_special_tokens=True)


def sequence_logprob(model, inputs, ids: Tensor, eos_id: int, reduce: str = "sum") -> Tensor:
    """``Σ_t log p(ŷ_t | ŷ_<t, x)`` (``reduce="sum"``) or ``(1/|ŷ|) Σ_t ...`` (``"mean"``) ``[B]`` of
    generated ``ids`` (``[B, T]``, decoder start token first), through the first end-of-sequence token;
    the padding ``generate`` puts after it is ignored."""
    decoder_input, target = ids[:, :-1], ids[:, 1:]  # [B, T-1]
    is_eos = (target == eos_id).long()
    valid = (is_eos.cumsum(1) - is_eos) == 0  # [B, T-1]: up to and including the first EOS
    logits = model(**inputs, decoder_input_ids=decoder_input).logits  # [B, T-1, V]
    logp = torch.log_softmax(logits.float(), -1).gather(-1, target.unsqueeze(-1)).squeeze(-1)  # [B, T-1]
    total = (logp * valid).sum(1)  # [B]
    return total if reduce == "sum" else total / valid.sum(1).clamp_min(1)


def training_loss(model, tokenizer, batch: Batch, reward, gamma: float, args) -> tuple[Tensor, dict]:
    """``γ · L_RL + (1 − γ) · L_MLE`` and the numbers to log."""
    stats = {}
    loss = torch.zeros((), device=batch.labels.device)
    if gamma < 1:
        l_mle = model(**batch.inputs, labels=batch.labels).loss  # mean token cross-entropy
        loss = loss + (1 - gamma) * l_mle
        stats["l_mle"] = l_mle.item()
    if gamma > 0:
        sampled_ids, sampled = decode(model, tokenizer, batch.inputs, args.max_target_length, sample=True)
        _, greedy = decode(model, tokenizer, batch.inputs, args.max_target_length, sample=False)
        r = reward(sampled, greedy, batch.references)  # no graph
        with common.eval_mode(model):  # log p of the policy the samples were drawn from: dropout off, as in decode
            logp = sequence_logprob(model, batch.inputs, sampled_ids, tokenizer.eos_token_id, args.logprob)  # [B]
        l_rl = -(r.advantage.to(logp) * logp).mean()
        loss = loss + gamma * l_rl
        stats.update(l_rl=l_rl.item(), reward_sampled=r.sampled.mean().item(),
                     reward_greedy=r.greedy.mean().item(), advantage=r.advantage.mean().item(),
                     sampled_tokens=(sampled_ids[:, 1:] != tokenizer.pad_token_id).sum(1).float().mean().item())
    return loss, stats


@torch.no_grad()
def evaluate(model, tokenizer, rows: list[dict], reward, args) -> dict:
    """Mean reward of ``--eval-samples`` sampled summaries per document and of the greedy summary,
    under a fixed seed; the training RNG is left untouched."""
    sampled_rewards, greedy_rewards, shown = [], [], []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(args.seed + 12345)
        for start in range(0, len(rows), args.batch_size):
            chunk = rows[start:start + args.batch_size]
            batch = Batch(chunk, tokenizer, args).to(args.device)
            _, greedy = decode(model, tokenizer, batch.inputs, args.max_target_length, sample=False)
            greedy_rewards += reward.score(greedy, batch.references).tolist()
            for _ in range(args.eval_samples):
                _, sampled = decode(model, tokenizer, batch.inputs, args.max_target_length, sample=True)
                sampled_rewards += reward.score(sampled, batch.references).tolist()
            if not shown:
                shown = [{"greedy": g, "reference": r} for g, r in zip(greedy[:2], batch.references[:2])]
    return {"reward_sampled": sum(sampled_rewards) / len(sampled_rewards),
            "reward_greedy": sum(greedy_rewards) / len(greedy_rewards), "examples": shown}


# --- a training phase ----------------------------------------------------------------------------------

class Interrupted(Exception):
    """Raised after ``--stop-after-steps`` optimiser steps (a simulated preemption)."""


def batch_indices(n: int, batch_size: int, seed: int, step: int) -> list[int]:
    """The examples of optimiser step ``step``: epoch ``step // steps_per_epoch`` is a permutation
    seeded by ``(seed, epoch)``, cut into full batches (the last partial batch is dropped)."""
    per_epoch = max(1, n // batch_size)
    epoch, i = divmod(step, per_epoch)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 100_003 + epoch)).tolist()
    return order[i * batch_size:(i + 1) * batch_size]


def run_phase(name: str, model, tokenizer, train, evaluation, reward, args, gamma: float,
              epochs: int, lr: float, budget: dict) -> dict:
    """Train ``model`` for ``epochs`` epochs with ``γ = gamma`` and learning rate ``lr`` in
    ``output_dir/name`` (with ``--resume``, from its latest checkpoint if there is one), evaluating
    every ``--eval-every`` steps and checkpointing every ``--save-every``; returns the phase's summary.
    ``budget["steps"]`` counts the optimiser steps left before a simulated interruption."""
    from tqdm.auto import tqdm

    run_dir = args.output_dir / name
    if (run_dir / "done.json").is_file():  # finished before: its final weights start the next phase
        model.load_state_dict(load_checkpoint(latest_checkpoint(run_dir / "checkpoints"))["model"])
        return json.loads((run_dir / "done.json").read_text(encoding="utf-8"))
    log = common.JsonLog(run_dir / "log.jsonl")
    steps_per_epoch = max(1, len(train) // args.batch_size)
    total = epochs * steps_per_epoch
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=args.weight_decay)
    scheduler = common.warmup_schedule(optimizer, args.lr_warmup_steps, total, args.schedule)
    step = start_phase(name, gamma, total, run_dir, log, model, optimizer, scheduler, args)

    def checkpoint() -> None:
        save_checkpoint(run_dir / "checkpoints", {
            "step": step, "total_steps": total, "gamma": gamma, "model": model.state_dict(),
            "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "rng": rng_state(),
            "log_events": log.count(),
        }, step, args.keep_checkpoints)

    def run_eval() -> None:
        for split, rows in (("eval", evaluation), ("train", train[:args.eval_examples])):
            log("eval", step=step, phase=name, split=split, **evaluate(model, tokenizer, rows, reward, args))

    evaluated = args.eval_every and name != "warmstart"  # the runs, which the report compares
    if evaluated and step == 0:
        run_eval()
    model.train()
    bar = tqdm(total=total, initial=step, desc=f"{name} (γ={gamma:g})", unit="step", disable=args.quiet)
    window: list[dict] = []
    while step < total:
        if budget["steps"] == 0:
            bar.close()
            raise Interrupted(f"stopped after --stop-after-steps, in phase {name} at step {step}")
        t0 = time.perf_counter()
        batch = Batch([train[i] for i in batch_indices(len(train), args.batch_size, args.seed, step)],
                      tokenizer, args).to(args.device)
        loss, stats = training_loss(model, tokenizer, batch, reward, gamma, args)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"{name}: non-finite loss {loss.item()} at step {step}: {stats}")
        stats.update(optimiser_step(model, loss, optimizer, scheduler, args.max_grad_norm))
        stats["seconds"] = time.perf_counter() - t0
        step += 1
        budget["steps"] -= 1
        window.append(stats)
        if step % args.log_every == 0 or step == total:
            mean = {k: sum(s[k] for s in window) / len(window) for k in window[0]}
            log("step", step=step, phase=name, epoch=step / steps_per_epoch, **mean)
            bar.set_postfix({k: f"{mean[k]:.3f}" for k in ("loss", "reward_sampled") if k in mean})
            window = []
        if evaluated and (step % args.eval_every == 0 or step == total):
            run_eval()
        if step % args.save_every == 0 or step == total or budget["steps"] == 0:
            checkpoint()
        bar.update()
    bar.close()
    return finish_phase(name, gamma, total, run_dir, log, model, tokenizer)


def start_phase(name: str, gamma: float, total: int, run_dir: Path, log: common.JsonLog, model,
                optimizer, scheduler, args) -> int:
    """The step the phase starts at. With ``--resume`` and a checkpoint: its step, with the model,
    optimiser, schedule and RNG states restored and the log cut back to the events it held then (what
    an interrupted run logged after the checkpoint is dropped, to be logged again as it is redone;
    refused if the checkpoint was written for another length or γ: the options are checked before
    (:func:`check_resume_options`), so this is data that changed under the same path). Otherwise 0: a
    fresh log, the RNGs seeded with ``--seed``."""
    path = latest_checkpoint(run_dir / "checkpoints") if args.resume else None
    if path is None:
        run_dir.mkdir(parents=True, exist_ok=True)
        log.path.unlink(missing_ok=True)
        torch.manual_seed(args.seed)
        random.seed(args.seed)
        log("config", step=0, phase=name, gamma=gamma, total_steps=total, args=common.options_record(args))
        return 0
    state = load_checkpoint(path)
    if state["total_steps"] != total or state["gamma"] != gamma:
        raise SystemExit(f"--resume: {path} was written for {state['total_steps']} steps with gamma "
                         f"{state['gamma']}; this run asks for {total} steps with gamma {gamma}")
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])
    if "log_events" in state:  # what was logged after the checkpoint is redone from here: logged again
        log.truncate_to(state["log_events"])
    else:  # a checkpoint of an earlier version of the recipe: the events of later steps
        log.truncate_after(state["step"])
    log("resume", step=state["step"], checkpoint=path.name)
    return state["step"]


def optimiser_step(model, loss: Tensor, optimizer, scheduler, max_grad_norm: float) -> dict:
    """Backward, clip, step; the numbers to log (loss, gradient norm before clipping, learning rate)."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    scheduler.step()
    return {"loss": loss.item(), "grad_norm": grad_norm.item(), "lr": scheduler.get_last_lr()[0]}


def finish_phase(name: str, gamma: float, total: int, run_dir: Path, log: common.JsonLog, model,
                 tokenizer) -> dict:
    """Save the phase's model and tokenizer in ``final/`` and mark it done (``done.json``: its summary,
    with every evaluation); returns the summary."""
    final = run_dir / "final"
    model.save_pretrained(final)
    tokenizer.save_pretrained(final)
    summary = {"phase": name, "gamma": gamma, "steps": total,
               "eval": [{k: e[k] for k in ("step", "split", "reward_sampled", "reward_greedy")}
                        for e in log.events("eval")]}
    log("done", step=total, phase=name)
    atomic_write_text(run_dir / "done.json", json.dumps(summary, indent=1))
    return summary


# --- report --------------------------------------------------------------------------------------------

def plot_rewards(summaries: dict, out: Path) -> Path | None:
    """``reward_curves.png``: sampled (left) and greedy (right) mean reward of every run over training."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        print(f"{out.name} skipped: matplotlib is not installed (pip install torchmover[plot])", file=sys.stderr)
        return None
    fig = Figure(figsize=(10, 3.8), layout="constrained")
    axes = fig.subplots(1, 2, sharey=True)
    colors = {"mle": "tab:blue", "mixed": "tab:red"}
    for name, summary in summaries.items():
        for split, style in (("eval", "-"), ("train", ":")):
            points = [e for e in summary["eval"] if e["split"] == split]
            for ax, key in zip(axes, ("reward_sampled", "reward_greedy")):
                ax.plot([e["step"] for e in points], [e[key] for e in points], style, marker="o", markersize=3,
                        color=colors.get(name), label=f"{name} (γ={summary['gamma']:g}), {split} docs")
    for ax, title in zip(axes, ("sampled summaries", "greedy summaries")):
        ax.set_title(f"mean reward of {title}")
        ax.set_xlabel("optimiser step after the MLE warm start")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("reward (torchmover similarity to the reference)")
    axes[1].legend(fontsize=8)
    fig.savefig(out, dpi=110)
    return out


# --- main ----------------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    data = p.add_argument_group("data")
    data.add_argument("--dataset", default=str(TOY_DATA),
                      help="local JSONL file or a `datasets` hub name (default: the toy task)")
    data.add_argument("--dataset-config", default=None, help="hub data set configuration, e.g. 3.0.0")
    data.add_argument("--split", default="train", help="hub split to train on (default: %(default)s)")
    data.add_argument("--eval-split", default=None,
                      help="hub split to evaluate on (default: hold out the last --eval-examples)")
    data.add_argument("--text-column", default="document", help="document field (default: %(default)s)")
    data.add_argument("--summary-column", default="summary", help="reference field (default: %(default)s)")
    data.add_argument("--eval-examples", type=int, default=40, help="held-out documents (default: %(default)s)")
    data.add_argument("--max-train-examples", type=int, default=None, help="use at most this many")
    data.add_argument("--source-prefix", default=None,
                      help='prepended to each document (default: "summarize: " for T5 models, else "")')
    data.add_argument("--max-source-length", type=int, default=512, help="document tokens (default: %(default)s)")
    data.add_argument("--max-target-length", type=int, default=64,
                      help="summary tokens, also the generation limit (default: %(default)s)")
    data.add_argument("--make-toy-data", action="store_true",
                      help=f"rewrite {TOY_DATA.relative_to(REPO)} with make_toy_dataset() and exit")
    model = p.add_argument_group("model and reward")
    model.add_argument("--model", default="tiny", help="'tiny' or an AutoModelForSeq2SeqLM name/path")
    model.add_argument("--scorer-model", default=None, help="reward encoder (default: torchmover's default)")
    model.add_argument("--scorer-layer", type=int, default=None, help="reward encoder layer")
    model.add_argument("--scorer-method", default="twmd", help="reward: twmd, trwmd, wmd, bertscore, ...")
    model.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    model.add_argument("--threads", type=int, default=None,
                       help="torch CPU threads (default: torch's own; 1 is much faster on a shared CPU)")
    train = p.add_argument_group("training")
    train.add_argument("--gamma", type=float, default=0.9, help="γ of γ·L_RL + (1−γ)·L_MLE (default: %(default)s)")
    train.add_argument("--compare-mle", action="store_true", help="also train γ=0 from the same warm start")
    train.add_argument("--warmup-epochs", type=int, default=15,
                       help="MLE-only warm start epochs (default: %(default)s, for the toy task)")
    train.add_argument("--epochs", type=int, default=3,
                       help="epochs of each run after the warm start (default: %(default)s)")
    train.add_argument("--logprob", choices=("sum", "mean"), default="sum",
                       help="log p(ŷ) in L_RL: sum over the sampled tokens, or their mean (default: %(default)s)")
    train.add_argument("--batch-size", type=int, default=16)
    train.add_argument("--lr", type=float, default=1e-4,
                       help="learning rate of the runs after the warm start (default: %(default)s)")
    train.add_argument("--warmup-lr", type=float, default=1e-3,
                       help="learning rate of the warm start (default: %(default)s)")
    train.add_argument("--weight-decay", type=float, default=0.01)
    train.add_argument("--schedule", choices=("constant", "linear"), default="constant",
                       help="learning rate after --lr-warmup-steps: kept, or decayed linearly to 0 at the end "
                            "of each phase (default: %(default)s)")
    train.add_argument("--lr-warmup-steps", type=int, default=0,
                       help="linear warm-up of each phase: step s < N at (s + 1) / (N + 1) of the learning rate "
                            "(default: %(default)s)")
    train.add_argument("--max-grad-norm", type=float, default=1.0, help="gradient clipping (default: %(default)s)")
    train.add_argument("--seed", type=int, default=0)
    out = p.add_argument_group("output")
    out.add_argument("--output-dir", type=Path, required=True)
    again = out.add_mutually_exclusive_group()
    again.add_argument("--resume", action="store_true",
                       help="continue every unfinished phase from its latest checkpoint")
    again.add_argument("--overwrite", action="store_true",
                       help="delete the outputs of the run already in --output-dir, then start over (without "
                            "--resume or --overwrite, a directory that holds a run is refused)")
    out.add_argument("--save-every", type=int, default=50, help="checkpoint every N steps (default: %(default)s)")
    out.add_argument("--keep-checkpoints", type=int, default=2)
    out.add_argument("--log-every", type=int, default=10, help="log the mean of every N steps (default: %(default)s)")
    out.add_argument("--eval-every", type=int, default=25, help="evaluate every N steps; 0 = never (default: %(default)s)")
    out.add_argument("--eval-samples", type=int, default=4, help="samples per document in evaluation (default: %(default)s)")
    out.add_argument("--stop-after-steps", type=int, default=None,
                     help="exit after this many optimiser steps, with a checkpoint (simulates a preemption)")
    out.add_argument("--quiet", action="store_true", help="no progress bars")
    return p


def main(argv: list[str] | None = None, scorer=None) -> dict:
    """Run the recipe with command-line ``argv``; ``scorer``: a ready :class:`torchmover.Scorer` for the
    reward instead of building one from ``--scorer-*`` (e.g. to share one across calls)."""
    args = build_parser().parse_args(argv)
    if args.make_toy_data:
        TOY_DATA.parent.mkdir(parents=True, exist_ok=True)
        TOY_DATA.write_text("".join(json.dumps(r) + "\n" for r in make_toy_dataset()), encoding="utf-8")
        print(f"wrote {TOY_DATA}")
        return {}
    if not 0 <= args.gamma <= 1:
        raise SystemExit(f"--gamma must be in [0, 1], got {args.gamma}")
    if args.source_prefix is None:
        args.source_prefix = "summarize: " if "t5" in args.model.lower() else ""
    threads = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        return _run(args, scorer)
    finally:
        torch.set_num_threads(threads)


def recorded_options(run_dir: Path) -> dict | None:
    """The options a phase in ``run_dir`` was started with (the ``config`` event, its log's first line),
    or ``None`` where it logged none whole (a later line that a kill cut short is not read)."""
    path = run_dir / "log.jsonl"
    if not path.is_file():
        return None
    try:
        first = json.loads(path.read_text(encoding="utf-8").split("\n", 1)[0])
    except ValueError:
        return None
    return first.get("args") if first.get("event") == "config" else None


def check_resume_options(args) -> None:
    """``--resume``: refuse, before anything runs and in one line, a run any of whose phases (finished
    or not) was started with other options than ``args``, the :data:`RESUME_FREE` ones apart, naming
    each with its old and new value (:func:`common.refuse_changed_options`)."""
    for name in PHASES:
        recorded = recorded_options(args.output_dir / name)
        if recorded is not None:
            common.refuse_changed_options(PROG, f"--resume: phase {name} in {args.output_dir}", recorded, args,
                                          RESUME_FREE)


def _run(args, scorer) -> dict:
    started = time.perf_counter()
    if args.resume:
        check_resume_options(args)
    common.claim_run_directory(args.output_dir, RUN_OUTPUTS, resume=args.resume, overwrite=args.overwrite)

    from torchmover import Scorer
    from torchmover.text.encoder import DEFAULT_MODEL
    from torchmover.reward.rewards import SelfCriticalReward

    train, evaluation = load_data(args)
    model, tokenizer = load_model(args, train)
    model.to(args.device)
    if scorer is None:
        scorer = Scorer(args.scorer_model or DEFAULT_MODEL, layer=args.scorer_layer, method=args.scorer_method,
                        device=args.device)
    reward = SelfCriticalReward(scorer).fit([r["summary"] for r in train], centering="fixed")  # on the references
    args.output_dir.mkdir(parents=True, exist_ok=True)
    try:
        summaries = run_phases(model, tokenizer, train, evaluation, reward, args)
    except Interrupted as stop:
        print(f"{stop}; continue with --resume", file=sys.stderr)
        return {"interrupted": str(stop)}
    return write_summary(summaries, reward.signature, time.perf_counter() - started, args)


def run_phases(model, tokenizer, train, evaluation, reward, args) -> dict[str, dict]:
    """The MLE warm start (unless ``--warmup-epochs 0``), then every run from its final weights with a
    fresh optimiser: ``mle`` (γ = 0, with ``--compare-mle``) and ``mixed`` (γ = ``--gamma``); the
    runs' summaries by name. Raises :class:`Interrupted` after ``--stop-after-steps`` steps."""
    budget = {"steps": -1 if args.stop_after_steps is None else args.stop_after_steps}
    runs = ([("mle", 0.0)] if args.compare_mle else []) + [("mixed" if args.gamma > 0 else "mle", args.gamma)]
    if args.warmup_epochs:
        run_phase("warmstart", model, tokenizer, train, evaluation, reward, args, 0.0, args.warmup_epochs,
                  args.lr if args.warmup_lr is None else args.warmup_lr, budget)
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    summaries = {}
    for name, gamma in dict(runs).items():
        model.load_state_dict(start)
        summaries[name] = run_phase(name, model, tokenizer, train, evaluation, reward, args, gamma,
                                    args.epochs, args.lr, budget)
    return summaries


def write_summary(summaries: dict[str, dict], reward_signature: str, wall_seconds: float, args) -> dict:
    """``summary.json`` (written atomically, and printed): each run's held-out rewards at its start and
    end, the options, this invocation's provenance (command, versions, commit, device, the data file);
    and the plot."""
    result = {"wall_seconds": wall_seconds, "reward": reward_signature, "runs": {},
              "args": common.options_record(args), "provenance": run_provenance(REPO, args.device, [args.dataset])}
    for name, summary in summaries.items():
        evals = [e for e in summary["eval"] if e["split"] == "eval"]
        if evals:
            first, last = evals[0], evals[-1]
            result["runs"][name] = {"gamma": summary["gamma"], "steps": summary["steps"],
                                    **{f"{k}_start": first[k] for k in ("reward_sampled", "reward_greedy")},
                                    **{f"{k}_end": last[k] for k in ("reward_sampled", "reward_greedy")}}
    plot = plot_rewards(summaries, args.output_dir / "reward_curves.png")
    result["plot"] = None if plot is None else str(plot)
    atomic_write_text(args.output_dir / "summary.json", json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    sys.exit(common.run_command(main))
