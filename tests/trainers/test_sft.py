"""Multi-turn SFT: every assistant turn is trained and nothing else, the SFT tokens are the rollout's tokens, and an
SFT checkpoint starts RL as is. Real TextWorld games, tiny offline models."""

from functools import partial

import datasets
import pytest
import torch
from conftest import tiny_rl_args
from transformers import AutoModelForCausalLM, AutoTokenizer

import trl_multiturn
from trl_multiturn import EpisodeRunner, MultiTurnSFTConfig, MultiTurnSFTTrainer
from trl_multiturn.envs import TextWorldEnv
from trl_multiturn.expert import ExpertTrajectoryError, conversation_token_ids, expert_trajectories, split_conversation
from trl_multiturn.rollout import ChatTokenBuilder
from trl_multiturn.rollout.rules import EpisodeRules

pytestmark = pytest.mark.filterwarnings("ignore::jericho.UnsupportedGameWarning")

SYSTEM = "You play a text game. Reply with one command."


@pytest.fixture(scope="session")
def tasks(textworld_train_tasks):
    """Two multi-turn games (4-step quests in two rooms), shared with the other TextWorld tests."""
    return list(textworld_train_tasks)


@pytest.fixture(scope="session")
def env_factory(textworld_games_dir):
    return partial(TextWorldEnv, games_dir=str(textworld_games_dir))


@pytest.fixture(scope="session")
def walkthroughs(env_factory, tasks):
    env = env_factory()
    try:
        return [env.expert_actions(task) for task in tasks]
    finally:
        env.close()


def _sft_args(tmp_path, **overrides):
    defaults = dict(output_dir=str(tmp_path / "sft"), max_steps=2, per_device_train_batch_size=2, use_cpu=True,
                    bf16=False, report_to="none", save_strategy="no", logging_steps=1, learning_rate=1e-2,
                    max_length=None, system_prompt=SYSTEM)
    return MultiTurnSFTConfig(**{**defaults, **overrides})


def _label_runs(labels):
    """The maximal runs of trained (non -100) positions, as lists of token ids."""
    runs, current = [], []
    for token in labels:
        if token == -100:
            if current:
                runs.append(current)
            current = []
        else:
            current.append(token)
    return runs + ([current] if current else [])


@pytest.fixture(scope="module")
def sft_run(tiny_chatml_model, env_factory, tasks, tmp_path_factory):
    """MultiTurnSFTTrainer built from task rows and trained for 2 steps; its checkpoint saved."""
    out = tmp_path_factory.mktemp("sft-run")
    trainer = MultiTurnSFTTrainer(
        tiny_chatml_model, args=_sft_args(out), train_dataset=datasets.Dataset.from_list(tasks),
        environment_factory=env_factory,
    )
    before = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    trainer.train()
    trainer.save_model(str(out / "checkpoint"))
    return trainer, before, str(out / "checkpoint")


def test_labels_are_every_assistant_turn_with_its_end_token_and_nothing_else(sft_run, tasks, walkthroughs):
    trainer, _, _ = sft_run
    tokenizer = trainer.processing_class
    eos = tokenizer.eos_token_id
    rows = {tuple(row["task"].items()): row for row in trainer.train_dataset}
    for task, actions in zip(tasks, walkthroughs):
        row = rows[tuple(task.items())]
        assert len(actions) >= 4 and row["num_turns"] == len(actions)
        runs = _label_runs(row["labels"])
        # One trained run per turn: the action's own tokens, then the end-of-turn token.
        assert len(runs) == len(actions)
        for run, action in zip(runs, actions):
            assert run[-1] == eos and eos not in run[:-1]
            assert tokenizer.decode(run) == action + tokenizer.eos_token
        # Every trained position is a label of its own input token, and the episode ends on the last reply.
        assert all(label in (-100, token) for label, token in zip(row["labels"], row["input_ids"]))
        assert row["labels"][-1] == eos
        # The ids are the template's own rendering of the whole conversation (up to the closing turn's tail).
        rendered = tokenizer.apply_chat_template(row["messages"], tokenize=True, return_dict=True)["input_ids"]
        assert rendered[: len(row["input_ids"])] == row["input_ids"]
        assert row["messages"][0] == {"role": "system", "content": SYSTEM}


def test_trains_two_steps_on_textworld_games(sft_run):
    trainer, before, _ = sft_run
    assert trainer.state.global_step == 2
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))
    after = trainer.model.state_dict()
    assert any(not torch.equal(before[k], after[k].cpu()) for k in before)


@pytest.mark.parametrize("system_prompt", [None, SYSTEM])
def test_sft_ids_equal_the_runners_ids_for_the_replayed_expert(tiny_model, env_factory, tasks, walkthroughs,
                                                                 system_prompt):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    sft = expert_trajectories(env_factory, tasks, tokenizer, system_prompt=system_prompt)
    builder = ChatTokenBuilder(tokenizer)
    for task, actions, row in zip(tasks, walkthroughs, sft):
        replies = [builder.assistant_content_ids(action) for action in actions]
        calls = []

        def generate(contexts, max_new_tokens, replies=replies, calls=calls):
            calls.append(contexts)
            return [replies[len(calls) - 1]], None

        runner = EpisodeRunner(env_factory, tokenizer, generate, EpisodeRules(
            max_turns=len(actions) + 2, max_completion_length=64, system_prompt=system_prompt))
        try:
            (episode,) = runner([task])
        finally:
            runner.close()
        assert episode.won and episode.actions == actions and len(calls) == len(actions)
        assert episode.prompt_ids + episode.completion_ids == row["input_ids"]
        assert [0] * len(episode.prompt_ids) + episode.env_mask == row["assistant_masks"]
        # The runner also records the winning step's observation, which no reply follows.
        assert episode.messages()[: len(row["messages"])] == row["messages"]


def test_messages_rows_are_tokenized_like_expert_trajectories(tiny_chatml_model, env_factory, tasks, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(tiny_chatml_model)
    conversations = expert_trajectories(env_factory, tasks, system_prompt=SYSTEM)
    assert "input_ids" not in conversations.column_names
    tokenized = expert_trajectories(env_factory, tasks, tokenizer, system_prompt=SYSTEM)
    trainer = MultiTurnSFTTrainer(tiny_chatml_model, args=_sft_args(tmp_path, shuffle_dataset=False),
                                  train_dataset=conversations.select_columns(["messages"]))
    prepared = trainer.train_dataset
    assert prepared["input_ids"] == tokenized["input_ids"]
    expected_labels = [[t if m else -100 for t, m in zip(ids, mask)]
                       for ids, mask in zip(tokenized["input_ids"], tokenized["assistant_masks"])]
    assert prepared["labels"] == expected_labels


@pytest.mark.parametrize("algorithm", ["GRPO", "RLOO", "PPO"])
def test_sft_checkpoint_starts_rl_as_is(sft_run, env_factory, algorithm, tmp_path):
    trainer, _, checkpoint = sft_run
    sft_row = trainer.train_dataset[0]
    rl_trainer = getattr(trl_multiturn, f"MultiTurn{algorithm}Trainer")
    rl_config = getattr(trl_multiturn, f"MultiTurn{algorithm}Config")
    rl = rl_trainer(
        model=checkpoint,
        args=tiny_rl_args(rl_config, tmp_path, max_turns=2, per_device_train_batch_size=2, max_steps=1,
                          remove_unused_columns=False, system_prompt=SYSTEM),
        environment_factory=env_factory,
        train_dataset=datasets.Dataset.from_list([sft_row["task"]]),
    )
    # The weights RL starts from are the SFT weights, loaded without conversion (PPO's model is policy and critic in
    # one module: its policy).
    sft_weights = trainer.model.state_dict()
    rl_weights = (rl.model.policy if algorithm == "PPO" else rl.model).state_dict()
    assert sft_weights.keys() == rl_weights.keys()
    assert all(torch.equal(sft_weights[k].cpu(), rl_weights[k].cpu()) for k in sft_weights)
    # The RL rollout builds the very tokens SFT trained on: prompt, replies and observation deltas.
    opening, _, _ = split_conversation(sft_row["messages"])
    assert opening == rl.episode_runner.opening_messages(opening[-1]["content"])
    assert conversation_token_ids(rl.episode_runner.tokens, sft_row["messages"])[0] == sft_row["input_ids"]
    rl.train()
    assert rl.state.global_step == 1


def test_the_saved_checkpoint_is_a_plain_causal_lm(sft_run):
    trainer, _, checkpoint = sft_run
    model = AutoModelForCausalLM.from_pretrained(checkpoint)
    assert type(model).__name__ == type(trainer.model).__name__
    assert AutoTokenizer.from_pretrained(checkpoint).chat_template == trainer.processing_class.chat_template


class _ShortExpertEnv(TextWorldEnv):
    """A TextWorld game whose expert stops one action short of winning."""

    def expert_actions(self, task):
        return super().expert_actions(task)[:-1]


class _MultiLineExpertEnv(TextWorldEnv):
    """An expert whose actions a `first_line` parser would cut."""

    def expert_actions(self, task):
        first, *rest = super().expert_actions(task)
        return [f"{first}\nplease", *rest]


def test_an_expert_that_does_not_win_is_refused_or_skipped(textworld_games_dir, tasks):
    env = partial(_ShortExpertEnv, games_dir=str(textworld_games_dir))
    with pytest.raises(ExpertTrajectoryError, match="does not finish the game"):
        expert_trajectories(env, tasks[:1])
    with pytest.raises(ExpertTrajectoryError, match="no task yielded a won expert episode"):
        expert_trajectories(env, tasks[:1], skip_failures=True)


def test_an_action_the_rollout_would_read_differently_is_refused(textworld_games_dir, tasks):
    env = partial(_MultiLineExpertEnv, games_dir=str(textworld_games_dir))
    with pytest.raises(ExpertTrajectoryError, match="reads back as"):
        expert_trajectories(env, tasks[:1])


def test_bad_conversations_are_refused_by_message_index(tiny_chatml_model):
    builder = ChatTokenBuilder(AutoTokenizer.from_pretrained(tiny_chatml_model))
    with pytest.raises(ValueError, match="no assistant message"):
        conversation_token_ids(builder, [{"role": "user", "content": "hi"}])
    with pytest.raises(ValueError, match="message 2 has role 'assistant' where 'user' is expected"):
        conversation_token_ids(builder, [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                                         {"role": "assistant", "content": "c"}])
    with pytest.raises(ValueError, match="ends with a 'user' message"):
        conversation_token_ids(builder, [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                                         {"role": "user", "content": "c"}])


def test_task_rows_without_an_environment_are_refused(tiny_chatml_model, textworld_train_tasks, tmp_path):
    with pytest.raises(ValueError, match="pass `environment_factory`"):
        MultiTurnSFTTrainer(tiny_chatml_model, args=_sft_args(tmp_path), train_dataset=textworld_train_tasks)


def test_pretokenized_rows_without_a_mask_are_refused(tiny_chatml_model, tmp_path):
    rows = datasets.Dataset.from_list([{"input_ids": [1, 2, 3]}])
    with pytest.raises(ValueError, match="neither `assistant_masks` nor `labels`"):
        MultiTurnSFTTrainer(tiny_chatml_model, args=_sft_args(tmp_path), train_dataset=rows)


def test_a_trainer_built_from_task_rows_is_freed_with_its_last_reference(tiny_chatml_model, env_factory, tasks,
                                                                         tmp_path):
    """TextWorld's parser memoises failed parses whose tracebacks reach the frames that replayed the expert: the
    replay must not keep the trainer being built (its model, its optimizer) alive through the next stage of a run."""
    import gc
    import weakref

    def build():
        trainer = MultiTurnSFTTrainer(tiny_chatml_model, args=_sft_args(tmp_path),
                                      train_dataset=datasets.Dataset.from_list(tasks), environment_factory=env_factory)
        return weakref.ref(trainer), weakref.ref(trainer.model)

    refs = build()
    gc.collect()
    assert [ref() for ref in refs] == [None, None]


def test_ctrl_c_during_the_expert_replay_stops_it_after_the_current_task(ctrl_c_raises):
    """The replay runs on a thread of its own; a Ctrl-C in the main thread must end it, not wait for every task."""
    import os
    import signal
    import threading

    from toy_envs import CountingEnv

    played, closed, interrupted = [], [], threading.Event()

    def ctrl_c(signum, frame):
        interrupted.set()
        signal.default_int_handler(signum, frame)  # Python's KeyboardInterrupt, in the main thread

    class InterruptedEnv(CountingEnv):
        def reset(self, task):
            played.append(task)
            if len(played) == 1:
                os.kill(os.getpid(), signal.SIGINT)  # the user's Ctrl-C, delivered to the main thread
            # The next tasks wait until the main thread has the interrupt, so that it arrives with 199 left.
            assert interrupted.wait(120), "the Ctrl-C never reached the main thread"
            return super().reset(task)

        def close(self):
            closed.append(True)

    signal.signal(signal.SIGINT, ctrl_c)  # (the fixture restores the handler it found)
    with pytest.raises(KeyboardInterrupt):
        expert_trajectories(InterruptedEnv, [{"target": 1}] * 200)
    assert interrupted.is_set() and len(played) < 200
    assert closed == [True]
