"""The verl adapter driven by verl's own code, as a verl job drives it: the user guide's config lines
composed by Hydra from verl's ``ppo_trainer`` config and rewritten as verl's entry point rewrites them,
then verl's reward-loop worker (``RewardLoopWorker`` → ``load_reward_manager`` →
``get_custom_reward_fn``) scoring a batch laid out as verl's trainer lays it out, read from a parquet
file by verl's ``RLHFDataset``. Skipped without verl; CI runs it in a side environment (.ci/run)."""
from __future__ import annotations

import importlib
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

verl = pytest.importorskip("verl")

from conftest import chat_tokenizer, configure_reward_env  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.experimental.reward_loop import RewardLoopManager, RewardLoopWorker  # noqa: E402
from verl.experimental.reward_loop import reward_loop  # noqa: E402
from verl.trainer.ppo import reward as verl_reward  # noqa: E402
from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn  # noqa: E402

from torchmover import Scorer  # noqa: E402
from torchmover.integrations import verl as adapter  # noqa: E402
from torchmover.integrations.configured import process_reward, reset_process_reward  # noqa: E402
from torchmover.reward.rewards import MoverReward  # noqa: E402

# The config lines of docs/guide/rewards.md, verbatim: the keys verl 0.7, 0.8 and 0.9 all read.
GUIDE_LINES = ["reward.custom_reward_function.path=pkg://torchmover.integrations.verl",
               "reward.custom_reward_function.name=compute_score"]
# The top-level keys older guides gave: migrated by main_ppo in 0.7 and 0.8, ignored by 0.9.
LEGACY_LINES = ["custom_reward_function.path=pkg://torchmover.integrations.verl",
                "custom_reward_function.name=compute_score"]

REFS = [["the cat sat on the mat"], ["a dog barked in the house", "the dog barked at home"],
        ["the sun is big and red"], ["we eat good food"]]
PROMPTS = ["Summarise: a cat on a mat.", "Summarise: a dog barks.", "Summarise: the sun.", "Summarise: dinner."]
RESPONSES = ["the cat sat", "a cat on the mat", "a dog barked all day", "the dog", "the red sun", "sun",
             "we ate food", "good food and a cat"]  # two per prompt (rollout.n=2)
ATOL = 1e-5


@pytest.fixture
def env(monkeypatch, tiny_model_dir, tmp_path):
    configure_reward_env(monkeypatch, tiny_model_dir, tmp_path / "references.txt",
                         [r for refs in REFS for r in refs])
    yield monkeypatch
    reset_process_reward()


@pytest.fixture(scope="module")
def policy_tokenizer_dir(tmp_path_factory):
    """The policy's tokenizer (byte-level BPE, ChatML), saved where verl's worker loads it from."""
    path = tmp_path_factory.mktemp("policy")
    chat_tokenizer(*PROMPTS, *RESPONSES).save_pretrained(path)
    return path


def verl_config(lines: list[str], tokenizer_dir: Path):
    """The config verl's entry point (``python -m verl.trainer.main_ppo LINES``) trains with: Hydra's
    composition of verl's ``ppo_trainer`` with the lines, then what ``main`` itself does to it
    (``migrate_legacy_reward_impl`` in 0.7 and 0.8; nothing in 0.9)."""
    config_dir = Path(verl.__file__).parent / "trainer" / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        config = compose("ppo_trainer", overrides=[*lines, f"actor_rollout_ref.model.path={tokenizer_dir}"])
    migrate = getattr(importlib.import_module("verl.trainer.main_ppo"), "migrate_legacy_reward_impl", None)
    return config if migrate is None else migrate(config)


def main_migrates_legacy_keys() -> bool:
    return hasattr(importlib.import_module("verl.trainer.main_ppo"), "migrate_legacy_reward_impl")


def test_the_guides_lines_load_compute_score(env, policy_tokenizer_dir):
    """A key verl ignores leaves get_custom_reward_fn with None (verl then falls back to its own
    scorer): the guide's keys must give torchmover's function on the installed verl."""
    fn = verl_reward.get_custom_reward_fn(verl_config(GUIDE_LINES, policy_tokenizer_dir))
    assert fn is not None and fn.args[0] is adapter.score_sample
    legacy = verl_reward.get_custom_reward_fn(verl_config(LEGACY_LINES, policy_tokenizer_dir))
    assert (legacy is not None) == main_migrates_legacy_keys(), (
        f"verl {verl.__version__}: the legacy top-level custom_reward_function keys "
        f"{'are' if legacy is not None else 'are not'} read; update the guide's table")


# The guide's lines for a running Ray cluster (as the shell passes them: its quotes removed). Hydra reads
# an unquoted 1 or true as a number or a boolean, which Ray refuses as an environment value: quoted.
RAY_ENV_LINES = ["+ray_kwargs.ray_init.runtime_env.env_vars.TORCHMOVER_FIT_REFERENCES=/data/train_references.txt",
                 '+ray_kwargs.ray_init.runtime_env.env_vars.TORCHMOVER_STRIP_REASONING="1"']


class RayInitCalled(Exception):
    pass


def test_the_guides_ray_line_puts_a_setting_in_every_workers_environment(env, policy_tokenizer_dir, monkeypatch):
    """On a running Ray cluster the workers do not see the driver's variables: the guide passes them in
    Ray's runtime environment, which verl's run_ppo hands to ray.init."""
    import ray

    main_ppo = importlib.import_module("verl.trainer.main_ppo")
    config = verl_config([*GUIDE_LINES, *RAY_ENV_LINES], policy_tokenizer_dir)
    calls = []

    def init(**kwargs):
        calls.append(kwargs)
        raise RayInitCalled

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    with pytest.raises(RayInitCalled):
        main_ppo.run_ppo(config, None)
    env_vars = calls[0]["runtime_env"]["env_vars"]
    assert env_vars["TORCHMOVER_FIT_REFERENCES"] == "/data/train_references.txt"
    assert env_vars["TORCHMOVER_STRIP_REASONING"] == "1"  # a str, as Ray requires


def test_the_reward_loop_has_no_batch_manager(env, policy_tokenizer_dir):
    config = verl_config(GUIDE_LINES, policy_tokenizer_dir)
    assert config.reward.reward_manager.name == "naive"  # the default, which calls compute_score per sample
    with pytest.raises(ValueError, match="Unknown reward manager: batch"):
        verl_reward.load_reward_manager(verl_config([*GUIDE_LINES, "reward.reward_manager.name=batch"],
                                                    policy_tokenizer_dir), tokenizer=None)


def trainer_batch(tokenizer, parquet: Path, cache_dir: Path) -> DataProto:
    """A batch as verl's trainer hands it to the reward: the dataset read back from parquet by verl's
    RLHFDataset and collated, repeated for rollout.n=2, prompts left-padded, responses (EOS, then
    padding) right-padded, and the attention mask over both."""
    dataset = RLHFDataset([str(parquet)], tokenizer, OmegaConf.create(
        {"cache_dir": str(cache_dir), "filter_overlong_prompts": False, "max_prompt_length": 64}))
    rows = collate_fn([dataset[i] for i in range(len(dataset))])
    non_tensors = {k: v for k, v in rows.items() if isinstance(v, np.ndarray)}
    batch = DataProto.from_dict(tensors={"dummy_tensor": rows["dummy_tensor"]}, non_tensors=non_tensors)
    batch = batch.repeat(repeat_times=2, interleave=True)
    prompt_ids = [tokenizer(text=tokenizer.apply_chat_template(list(p), add_generation_prompt=True, tokenize=False),
                            add_special_tokens=False)["input_ids"] for p in batch.non_tensor_batch["raw_prompt"]]
    response_ids = [tokenizer(text=r, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for r in RESPONSES]
    width_p, width_r = max(map(len, prompt_ids)), max(map(len, response_ids)) + 3
    pad = tokenizer.pad_token_id
    prompts = torch.tensor([[pad] * (width_p - len(p)) + p for p in prompt_ids])
    responses = torch.tensor([r + [pad] * (width_r - len(r)) for r in response_ids])
    mask = torch.cat([torch.tensor([[0] * (width_p - len(p)) + [1] * len(p) for p in prompt_ids]),
                      torch.tensor([[1] * len(r) + [0] * (width_r - len(r)) for r in response_ids])], dim=1)
    batch.batch = DataProto.from_dict(tensors={"prompts": prompts, "responses": responses, "attention_mask": mask,
                                               "input_ids": torch.cat([prompts, responses], dim=1)}).batch
    return batch


class InProcessActor:
    """A reward-loop worker where RewardLoopManager holds a Ray actor handle: ``.compute_score_batch
    .remote(chunk)`` runs the worker's coroutine on its reward manager's event loop (``ray.get``: the identity)."""

    def __init__(self, worker: RewardLoopWorker):
        self.compute_score_batch = SimpleNamespace(
            remote=lambda chunk: worker.reward_manager.loop.run_until_complete(worker.compute_score_batch(chunk)))


def rm_scores(config, data: DataProto, monkeypatch):
    """RewardLoopManager.compute_rm_score (verl's own: split across ``reward.num_workers`` workers,
    gather, put each score at its response's last valid token) with its workers in this process: no
    Ray cluster."""
    manager = object.__new__(RewardLoopManager)  # its __init__ starts the workers as Ray actors
    manager.config, manager.reward_model_manager = config, None
    if hasattr(verl_reward, "resolve_reward_manager_cls"):  # verl >= 0.8
        manager.reward_manager_cls = verl_reward.resolve_reward_manager_cls(config)
    manager.reward_loop_workers = [InProcessActor(RewardLoopWorker(config)) for _ in range(config.reward.num_workers)]
    monkeypatch.setattr(reward_loop.ray, "get", lambda refs: refs)
    return manager.compute_rm_score(data).batch["rm_scores"]


def test_the_reward_loop_puts_torchmovers_scores_at_the_last_response_token(
        env, policy_tokenizer_dir, tiny_model_dir, tmp_path):
    parquet = tmp_path / "train.parquet"
    pd.DataFrame({  # references as list[str] in every row (Arrow holds one type per column)
        "data_source": ["summaries"] * 4,
        "prompt": [[{"role": "user", "content": p}] for p in PROMPTS],
        "reward_model": [{"style": "model", "ground_truth": refs} for refs in REFS],
        "extra_info": [{"index": i, "split": "train"} for i in range(4)],
    }).to_parquet(parquet)
    tokenizer = chat_tokenizer(*PROMPTS, *RESPONSES)
    data = trainer_batch(tokenizer, parquet, tmp_path / "cache")
    config = verl_config([*GUIDE_LINES, "reward.num_workers=2"], policy_tokenizer_dir)  # the guide's knob

    scores = rm_scores(config, data, env)

    direct = MoverReward(Scorer(str(tiny_model_dir), layer=2)).fit([r for refs in REFS for r in refs])
    refs = [REFS[i // 2] for i in range(len(RESPONSES))]
    expected = direct.score(RESPONSES, refs)
    last = data.batch["attention_mask"][:, data.batch["prompts"].shape[1]:].sum(1) - 1
    torch.testing.assert_close(scores[torch.arange(len(RESPONSES)), last], expected, atol=ATOL, rtol=0)
    torch.testing.assert_close(scores.sum(1), expected, atol=ATOL, rtol=0)  # nothing anywhere else
    stats = process_reward().batched.stats()
    assert stats["pairs"] == len(RESPONSES) and stats["batches"] < len(RESPONSES)  # the thread pool's calls, batched


def test_a_sample_without_reference_fails_the_reward_step(env, policy_tokenizer_dir, tmp_path):
    """verl does not catch a reward function's exception: the step fails, naming the sample."""
    parquet = tmp_path / "train.parquet"
    pd.DataFrame({"data_source": ["summaries"] * 4, "prompt": [[{"role": "user", "content": p}] for p in PROMPTS],
                  "reward_model": [{"style": "model", "ground_truth": refs} for refs in [*REFS[:3], []]],
                  "extra_info": [{"index": i} for i in range(4)]}).to_parquet(parquet)
    data = trainer_batch(chat_tokenizer(*PROMPTS, *RESPONSES), parquet, tmp_path / "cache")
    with pytest.raises(ValueError, match="data_source='summaries'.*no reference"):
        rm_scores(verl_config(GUIDE_LINES, policy_tokenizer_dir), data, env)
    assert process_reward().failures >= 1  # the step stops at the first failure; the other may not have run
