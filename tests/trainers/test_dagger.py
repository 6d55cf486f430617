"""DAgger from the environment's expert: the mixing schedule, the student's states labelled with the expert's actions
token for token, only those actions trained, and an environment without an expert refused. Real TextWorld games,
tiny offline models."""

import random
from functools import partial

import datasets
import pytest
import torch
from toy_envs import CountingEnv
from transformers import AutoTokenizer

from trl_multiturn import MultiTurnDAggerConfig, MultiTurnDAggerTrainer
from trl_multiturn.envs import TextWorldEnv
from trl_multiturn.expert import dagger_beta, dagger_episodes
from trl_multiturn.rollout import ChatTokenBuilder

pytestmark = pytest.mark.filterwarnings("ignore::jericho.UnsupportedGameWarning")

SYSTEM = "You play a text game. Reply with one command."


@pytest.fixture(scope="module")
def textworld(textworld_train_tasks, textworld_games_dir):
    """The session's two TextWorld games as task rows, and a factory of environments over their cache."""
    return list(textworld_train_tasks), partial(TextWorldEnv, games_dir=str(textworld_games_dir))


def _args(tmp_path, **overrides):
    defaults = dict(output_dir=str(tmp_path / "dagger"), max_steps=1, per_device_train_batch_size=4, use_cpu=True,
                    bf16=False, report_to="none", save_strategy="no", logging_steps=1, learning_rate=1e-2,
                    max_length=None, system_prompt=SYSTEM, max_turns=3, max_completion_length=8,
                    dagger_iterations=1, dagger_beta_0=0.0)
    return MultiTurnDAggerConfig(**{**defaults, **overrides})


def _expert_after(env, task, actions):
    """The expert's action once `actions` (None: a reply without an action, which never reaches the game) are
    played from the start of `task`."""
    env.reset(task)
    for action in actions:
        if action is not None:
            env.step(action)
    return env.expert_action()


def test_the_schedule_decays_geometrically_from_beta_0():
    assert [dagger_beta(i, 1.0, 0.5) for i in range(4)] == [1.0, 0.5, 0.25, 0.125]
    assert [dagger_beta(i, 0.8, 0.0) for i in range(3)] == [0.8, 0.0, 0.0]  # the paper's beta_i = I(i = 1)
    assert dagger_beta(5, 0.3, 1.0) == 0.3
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        dagger_beta(0, 1.5, 0.5)
    with pytest.raises(ValueError, match="count from 0"):
        dagger_beta(-1, 1.0, 0.5)


@pytest.mark.parametrize("field, value", [("dagger_beta_0", 1.5), ("dagger_beta_decay", -0.1),
                                          ("dagger_iterations", 0), ("dagger_max_examples", 0),
                                          ("dagger_temperature", -1.0)])
def test_bad_values_are_refused_when_the_config_is_built(tmp_path, field, value):
    with pytest.raises(ValueError, match=field):
        _args(tmp_path, **{field: value})


def test_the_students_states_are_labelled_with_the_experts_action_token_for_token(tiny_chatml_model, textworld):
    """A scripted student (beta=0) first plays the walkthrough's first action, then one the game refuses, then
    waits: every state it reaches is labelled with the expert's action from that state, the context is the
    episode's tokens with the student's ids as sampled, and only the label's tokens are trained."""
    tasks, env_factory = textworld
    tokenizer = AutoTokenizer.from_pretrained(tiny_chatml_model)
    builder = ChatTokenBuilder(tokenizer)
    env = env_factory()
    walkthrough = env.expert_actions(tasks[0])
    script = [walkthrough[0], "dance wildly", "wait"]
    sampled = [builder.assistant_content_ids(action) for action in script]
    sampled[1] = sampled[1][:-1]  # cut before its end-of-turn token, as the per-turn cap cuts a reply
    calls = []

    def generate(contexts, max_new_tokens):
        calls.append(contexts[0])
        return [sampled[len(calls) - 1]], None

    try:
        rows, stats = dagger_episodes(env, tasks[:1], generate, builder, beta=0.0, rng=random.Random(0),
                                      max_turns=3, max_completion_length=64, system_prompt=SYSTEM)
        assert [row["actor"] for row in rows] == ["student"] * 3 and [row["played"] for row in rows] == script
        assert stats == {"episodes": 1, "won": 0, "turns": 3, "student_turns": 3, "student_agreed": 1}
        labels = [row["messages"][-1]["content"] for row in rows]
        for turn, (row, label) in enumerate(zip(rows, labels)):
            assert label == _expert_after(env, tasks[0], script[:turn])
            context = calls[turn]
            label_ids = builder.assistant_content_ids(label)
            assert row["input_ids"] == context + label_ids
            assert row["assistant_masks"] == [0] * len(context) + [1] * len(label_ids)
            if turn:  # the context grew by the student's sampled ids (closed where cut), then the observation
                previous = calls[turn - 1]
                reply = sampled[turn - 1] + builder.close_ids(sampled[turn - 1])
                assert context[: len(previous) + len(reply)] == previous + reply
        # The student's first action moved it on: the label changed with the state it reached.
        assert labels[0] == walkthrough[0] and labels[1] == walkthrough[1] and labels[2] == labels[1]

        # With beta=1 the expert acts at every turn and its plan wins the game.
        rows, stats = dagger_episodes(env, tasks[:1], generate, builder, beta=1.0, rng=random.Random(0),
                                      max_turns=10, max_completion_length=64)
        assert stats["won"] == 1 and stats["student_turns"] == 0
        assert [row["played"] for row in rows] == walkthrough and len(calls) == 3
    finally:
        env.close()


@pytest.fixture(scope="module")
def dagger_run(tiny_chatml_model, textworld, tmp_path_factory):
    """One DAgger iteration with the student alone (beta_0=0) on two games, one training step."""
    tasks, env_factory = textworld
    trainer = MultiTurnDAggerTrainer(tiny_chatml_model, args=_args(tmp_path_factory.mktemp("dagger")),
                                     train_dataset=datasets.Dataset.from_list(tasks),
                                     environment_factory=env_factory)
    before = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    trainer.train()
    return trainer, before


def test_one_iteration_trains_on_the_students_states_with_the_experts_actions(dagger_run, textworld):
    trainer, before = dagger_run
    tasks, env_factory = textworld
    tokenizer = trainer.processing_class
    rows = list(trainer.train_dataset)
    assert {row["actor"] for row in rows} == {"student"} and {row["episode"] for row in rows} == {0, 1}
    [record] = trainer.dagger_log
    assert record["beta"] == 0.0 and record["episodes"] == 2 and record["examples"] == len(rows) >= 2
    [logged] = [log for log in trainer.state.log_history if "dagger/iteration" in log]
    assert logged["dagger/examples"] == len(rows) and logged["dagger/student_turns"] == record["turns"]
    env = env_factory()
    try:
        for row in rows:
            played = [r["played"] for r in rows if r["episode"] == row["episode"] and r["turn"] < row["turn"]]
            label = _expert_after(env, tasks[row["episode"]], played)
            assert row["messages"][-1] == {"role": "assistant", "content": label}
            trained = [token for token, label_id in zip(row["input_ids"], row["labels"]) if label_id != -100]
            # Only the expert action's tokens and the end-of-turn token after them, at the end of the row.
            assert tokenizer.decode(trained) == label + tokenizer.eos_token
            assert row["labels"][-len(trained):] == trained
    finally:
        env.close()
    assert trainer.state.global_step == 1
    after = trainer.model.state_dict()
    assert any(not torch.equal(before[k], after[k].cpu()) for k in before)


class _NoExpertEnv(CountingEnv):
    pass


def test_an_environment_without_an_expert_is_refused_in_one_line(tiny_chatml_model, textworld, tmp_path):
    tasks, _ = textworld
    with pytest.raises(ValueError, match=r"^_NoExpertEnv has no per-state expert.*implement "
                                         r"`_NoExpertEnv.expert_action\(\)`[^\n]*$"):
        MultiTurnDAggerTrainer(tiny_chatml_model, args=_args(tmp_path),
                               train_dataset=datasets.Dataset.from_list(tasks), environment_factory=_NoExpertEnv)
