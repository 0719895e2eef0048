"""The TRL adapter against the real ``trl`` package: the reward-function contract, then one real
GRPOTrainer and one RLOOTrainer step with a tiny random causal LM (a few seconds on CPU)."""
from __future__ import annotations

import pytest
import torch

trl = pytest.importorskip("trl")

from conftest import tiny_model, tiny_tokenizer  # noqa: E402

from torchmover import Encoder, Scorer  # noqa: E402
from torchmover.integrations.trl import as_trl_reward  # noqa: E402
from torchmover.reward.rewards import GroupReward, MoverReward  # noqa: E402

REFS = ["the cat sat on the mat", "a dog barked", "the sun is big and red", "we eat good food"]
PROMPTS = ["the cat", "a dog", "the sun", "we eat"]


@pytest.fixture
def reward():
    scorer = Scorer(Encoder(tiny_model(), tiny_tokenizer(), layer=2, name="tiny-bert"))
    return MoverReward(scorer).fit(REFS)


def test_callable_as_trl_sees_it(reward):
    from trl.trainer import utils  # the helpers below exist in recent TRL only (the floor uses __name__)

    f = as_trl_reward(reward)
    name_of = getattr(utils, "get_callable_name", lambda g: g.__name__)
    assert name_of(f) == "torchmover_twmd_recall"
    assert name_of(as_trl_reward(reward, name="mover_f1")) == "mover_f1"
    assert not getattr(utils, "is_async_callable", lambda g: False)(f)
    assert not isinstance(f, torch.nn.Module)  # called as a function


def test_plain_completions(reward):
    f = as_trl_reward(reward)
    completions = ["the cat sat", "a dog", "", "food"]
    out = f(prompts=PROMPTS, completions=completions, completion_ids=[[0]] * 4, reference=REFS,
            trainer_state=None, log_extra=lambda *a: None, log_metric=lambda *a: None)
    assert isinstance(out, list) and len(out) == 4 and all(isinstance(x, float) for x in out)
    assert out == pytest.approx(reward(completions, REFS).tolist(), abs=1e-6)
    assert out[2] == 0.0


def test_conversational_completions(reward):
    f = as_trl_reward(reward, reference_column="answer")
    prompts = [[{"role": "user", "content": p}] for p in PROMPTS[:3]]
    completions = [
        [{"role": "assistant", "content": "the cat sat"}],
        [{"role": "assistant", "content": "let me look", "tool_calls": []},
         {"role": "tool", "content": "dog: barks"}, {"role": "assistant", "content": "a dog barked"}],
        [{"role": "assistant", "content": [{"type": "text", "text": "the sun "}, {"type": "text", "text": "is red"}]}],
    ]
    out = f(prompts=prompts, completions=completions, answer=REFS[:3])
    expected = reward(["the cat sat", "a dog barked", "the sun is red"], REFS[:3]).tolist()
    assert out == pytest.approx(expected, abs=1e-6)


def test_several_and_missing_references(reward):
    f = as_trl_reward(reward)
    refs = [[REFS[0], REFS[1]], None, [], [None, REFS[3]]]
    out = f(prompts=PROMPTS, completions=["a dog barked"] * 4, reference=refs)
    assert out[1] is None and out[2] is None
    assert out[0] == pytest.approx(reward(["a dog barked"], [REFS[:2]]).item(), abs=1e-6)
    assert out[3] == pytest.approx(reward(["a dog barked"], [REFS[3]]).item(), abs=1e-6)
    assert f(prompts=PROMPTS[:2], completions=["a", "b"], reference=[None, None]) == [None, None]


def test_contract_errors(reward):
    f = as_trl_reward(reward)
    with pytest.raises(KeyError, match="'reference'.*\\['answer'\\]"):
        f(prompts=PROMPTS, completions=["a"] * 4, answer=REFS, trainer_state=None)
    with pytest.raises(ValueError, match="4 completions but 3"):
        f(prompts=PROMPTS, completions=["a"] * 4, reference=REFS[:3])
    with pytest.raises(TypeError, match="completions\\[0\\]"):
        f(prompts=PROMPTS[:1], completions=[3], reference=REFS[:1])
    with pytest.raises(TypeError, match="reference\\[0\\]"):
        f(prompts=PROMPTS[:1], completions=["a"], reference=[3])
    with pytest.raises(TypeError, match="Scorer or MoverReward"):
        as_trl_reward(lambda x: x)


def test_batch_centered_scorer_is_refused_until_fitted():
    scorer = Scorer(Encoder(tiny_model(), tiny_tokenizer(), layer=2, name="tiny-bert"))
    with pytest.raises(RuntimeError, match="centering='batch'"):
        as_trl_reward(scorer)(prompts=PROMPTS[:1], completions=["a"], reference=REFS[:1])


def tiny_causal_lm():
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = tiny_tokenizer()
    tokenizer.bos_token, tokenizer.eos_token = "[CLS]", "[SEP]"
    tokenizer.model_input_names = ["input_ids", "attention_mask"]  # no BERT token_type_ids into generate()
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    return LlamaForCausalLM(config), tokenizer


def trl_version() -> tuple[int, ...]:
    from importlib.metadata import version

    return tuple(int(p) for p in version("trl").split(".")[:2])


@pytest.mark.parametrize("trainer_name", ["GRPO", "RLOO"])
def test_one_real_trainer_step(reward, tmp_path, trainer_name):
    """Also run by CI against the floor (TRL 0.16, see .ci/run): GRPO calls reward functions since
    0.16 (None -> NaN), RLOO since 0.22; the reward is logged as rewards/<name>/mean since 0.17."""
    from datasets import Dataset

    if trainer_name == "RLOO" and trl_version() < (0, 22):
        pytest.skip("RLOOTrainer takes reward functions since TRL 0.22")

    config_cls, trainer_cls = {"GRPO": (trl.GRPOConfig, trl.GRPOTrainer),
                               "RLOO": (trl.RLOOConfig, trl.RLOOTrainer)}[trainer_name]
    model, tokenizer = tiny_causal_lm()
    calls = []
    score = reward.score

    def recording_score(hyps, refs):  # spy on what the trainer makes the reward score
        out = score(hyps, refs)
        calls.append((list(hyps), refs, out.tolist()))
        return out

    reward.score = recording_score
    f = as_trl_reward(reward)
    args = config_cls(
        output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=2, max_completion_length=4,
        max_steps=1, learning_rate=1e-2, report_to="none", use_cpu=True, logging_steps=1, save_strategy="no",
        dataloader_num_workers=0, seed=0, beta=0.0,  # beta=0: no reference model (it would be loaded by name)
    )
    dataset = Dataset.from_dict({"prompt": PROMPTS, "reference": REFS})
    trainer = trainer_cls(model=model, reward_funcs=[f], args=args, train_dataset=dataset, processing_class=tokenizer)
    before = [p.detach().clone() for p in model.parameters()]
    trainer.train()

    assert calls, "the trainer never called the reward"
    hyps, refs, rewards = calls[0]
    assert len(hyps) == 4 and all(isinstance(h, str) for h in hyps)  # 2 prompts x G=2 completions
    assert {r[0] for r in refs} <= set(REFS) and refs[0] == refs[1]  # a prompt's reference, repeated G times
    logged = trainer.state.log_history[0][f"rewards/{f.__name__}" + ("/mean" if trl_version() >= (0, 17) else "")]
    assert logged == pytest.approx(sum(rewards) / len(rewards), abs=1e-5)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))  # the policy moved
    assert reward.cache_info().misses == len(REFS)  # references were all encoded by fit(), then cached


def test_a_real_grpo_step_on_conversational_rows_with_missing_references(reward, tmp_path):
    """Chat prompts, and a references column of list[str] in every row (Arrow holds one type per
    column) where one row has none: its completions get None, which TRL turns into NaN and leaves out
    of the logged mean; the conversational completions are scored by their assistant text."""
    from datasets import Dataset

    model, tokenizer = tiny_causal_lm()
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    calls = []
    score = reward.score

    def recording_score(hyps, refs):
        out = score(hyps, refs)
        calls.append((list(hyps), refs, out.tolist()))
        return out

    reward.score = recording_score
    f = as_trl_reward(reward)
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": p}] for p in PROMPTS[:2]],
                                 "reference": [[REFS[0], REFS[2]], None]})
    assert dataset.features["reference"].feature.dtype == "string"
    args = trl.GRPOConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=2, max_completion_length=4,
        max_steps=1, learning_rate=1e-2, report_to="none", use_cpu=True, logging_steps=1, save_strategy="no",
        dataloader_num_workers=0, seed=0, beta=0.0)
    trainer = trl.GRPOTrainer(model=model, reward_funcs=[f], args=args, train_dataset=dataset, processing_class=tokenizer)
    trainer.train()

    hyps, refs, rewards = calls[0]
    assert len(hyps) == 2 and refs == [[REFS[0], REFS[2]]] * 2  # only the row with references was scored
    logged = trainer.state.log_history[0][f"rewards/{f.__name__}" + ("/mean" if trl_version() >= (0, 17) else "")]
    assert logged == pytest.approx(sum(rewards) / 2, abs=1e-5)


def test_group_reward_matches_trl_advantages(reward):
    """GroupReward's baseline="mean" without std scaling is what GRPO does with scale_rewards="none"."""
    group = GroupReward(reward.scorer).fit(REFS)
    completions = [["the cat", "a cat sat"], ["a dog", "the dog barked"]]
    out = group(completions, REFS[:2])
    flat = torch.tensor(as_trl_reward(group)(PROMPTS[:1] * 4, [c for g in completions for c in g],
                                             reference=[REFS[0]] * 2 + [REFS[1]] * 2))
    torch.testing.assert_close(out.rewards.flatten(), flat, atol=1e-6, rtol=0)
    grouped = flat.view(-1, 2)
    torch.testing.assert_close(out.advantages, grouped - grouped.mean(1, keepdim=True), atol=1e-6, rtol=0)
