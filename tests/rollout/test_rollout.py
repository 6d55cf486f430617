"""The episode runner's invariants: token-in-token-out, env_mask, per-turn rewards, budgets and failures."""

import pytest
from rollout_checks import assert_env_mask_exact, assert_token_exact
from toy_envs import CountingEnv, FlakyEnv, ScoringOnFinishEnv
from transformers import AutoModelForCausalLM, AutoTokenizer

from trl_multiturn.credit import shape_turn_rewards
from trl_multiturn.rollout import ChatTemplateError, ChatTokenBuilder, EpisodeRunner
from trl_multiturn.rollout.generation import hf_generate_fn
from trl_multiturn.rollout.parsing import first_line, get_action_parser, think_then_act
from trl_multiturn.rollout.rules import RULES, EpisodeRules


def load(path):
    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


def always_reply(text: str):
    """A parser that reads every reply (random tiny models rarely write a clean first line)."""
    return lambda reply: text


def make_runner(path, env_factory=CountingEnv, **kwargs):
    """A runner of `EpisodeRules` with these defaults and the keywords that name rules; the other keywords say how
    it executes."""
    model, tokenizer = load(path)
    rules = {"action_parser": always_reply("go"), "max_turns": 4, "max_completion_length": 6}
    rules.update({name: kwargs.pop(name) for name in RULES if name in kwargs})
    calls = []
    generate = hf_generate_fn(model, tokenizer)

    def counted(contexts, max_new_tokens):
        calls.append(len(contexts))
        return generate(contexts, max_new_tokens)

    runner = EpisodeRunner(env_factory, tokenizer, counted, EpisodeRules(**rules), **kwargs)
    return runner, model, tokenizer, calls


def test_token_in_token_out_and_env_mask(tiny_model):
    runner, model, tokenizer, _ = make_runner(tiny_model)
    episodes = runner([{"target": 3}, {"target": 1}, {"target": 5}])
    assert [ep.num_turns for ep in episodes] == [3, 1, 4]
    for ep in episodes:
        assert_token_exact(model, ep)
        assert_env_mask_exact(tokenizer, ep)


def test_history_is_the_template_delta_between_turns(tiny_model):
    runner, _, tokenizer, _ = make_runner(tiny_model)
    ep = runner([{"target": 3}])[0]
    builder = runner.tokens
    for k in range(ep.num_turns - 1):
        end, next_start = ep.turn_spans[k][1], ep.turn_spans[k + 1][0]
        reply = ep.completion_ids[ep.turn_spans[k][0]:end]
        expected = builder.close_ids(reply) + builder.observation_ids(ep.observations[k])
        assert ep.completion_ids[end:next_start] == expected


def test_scripted_episode_equals_the_templates_own_rendering(tiny_model):
    """Replies given as the template's assistant tokens: the whole episode equals one render of the chat."""
    _, tokenizer = load(tiny_model)
    builder = ChatTokenBuilder(tokenizer)
    actions = ["go north", "take key", "open door"]

    replies = iter(actions)

    def scripted(contexts, max_new_tokens):
        action = next(replies)
        return [builder.assistant_content_ids(action) for _ in contexts], None

    runner = EpisodeRunner(CountingEnv, tokenizer, scripted, EpisodeRules(
        max_turns=5, max_completion_length=50, system_prompt="You play a text game."))
    ep = runner([{"target": 3}])[0]
    messages = list(ep.prompt_messages)
    assert messages[0] == {"role": "system", "content": "You play a text game."}
    for k in range(3):
        messages.append({"role": "assistant", "content": actions[k]})
        if k < 2:
            messages.append({"role": "user", "content": ep.observations[k]})
    assert ep.prompt_ids + ep.completion_ids == builder.render(messages, add_generation_prompt=False)[: ep.num_tokens]
    assert ep.actions == actions and ep.won


def test_per_turn_rewards_land_on_their_turn_and_sparse_on_the_final_turn(tiny_chatml_model):
    runner, *_ = make_runner(tiny_chatml_model)
    ep = runner([{"target": 3}])[0]
    assert ep.turn_rewards == [1.0, 2.0, 3.0] and ep.won and ep.done and not ep.truncated
    assert shape_turn_rewards(ep.turn_rewards, ep.won, "sparse") == [0.0, 0.0, 1.0]
    assert shape_turn_rewards(ep.turn_rewards, ep.won, "dense") == [1.0, 2.0, 3.0]
    assert shape_turn_rewards(ep.turn_rewards, ep.won, "shaped", success_reward=10) == [1.0, 2.0, 13.0]


def test_a_lost_game_is_not_a_win(tiny_chatml_model):
    runner, *_ = make_runner(tiny_chatml_model, action_parser=always_reply("lose"))
    ep = runner([{"target": 3}])[0]
    assert ep.done and not ep.won and ep.num_turns == 1
    assert shape_turn_rewards(ep.turn_rewards, ep.won, "sparse") == [0.0]


def test_max_turns_truncates_and_every_turn_is_one_generate_call(tiny_chatml_model):
    runner, _, _, calls = make_runner(tiny_chatml_model, max_turns=2)
    episodes = runner([{"target": 5}, {"target": 1}])
    assert [ep.num_turns for ep in episodes] == [2, 1]
    assert episodes[0].truncated and not episodes[0].won
    assert calls == [2, 1]  # one call per turn, for the live episodes only


def test_episode_token_budget_is_never_exceeded(tiny_chatml_model):
    runner, *_ = make_runner(tiny_chatml_model, max_turns=10, max_episode_tokens=120)
    for ep in runner([{"target": 9}, {"target": 9}]):
        assert ep.num_tokens <= 120
        assert ep.truncated and not ep.won


def test_a_reply_cut_at_the_cap_is_closed_by_an_unsampled_end_token(tiny_chatml_model):
    runner, _, tokenizer, _ = make_runner(tiny_chatml_model, max_completion_length=3)
    cut = 0
    for ep in runner([{"target": 4}] * 3):
        for _, end in ep.turn_spans[:-1]:
            if ep.completion_ids[end - 1] not in runner.eos_token_ids:
                cut += 1
                assert ep.completion_ids[end] == runner.tokens.end_of_turn_id
                assert ep.env_mask[end] == 0
    assert cut > 0  # a random tiny model rarely ends a reply within 3 tokens


def test_finish_scores_an_episode_cut_by_the_rollout(tiny_chatml_model):
    runner, *_ = make_runner(tiny_chatml_model, env_factory=ScoringOnFinishEnv, max_turns=2)
    ep = runner([{"target": 1}])[0]
    assert ep.truncated and ep.won and ep.turn_rewards == [0.0, 5.0]


@pytest.mark.parametrize("mode", ["inline", "thread", "process"])
def test_a_crashing_environment_fails_its_episode_not_the_run(tiny_chatml_model, mode):
    runner, *_ = make_runner(tiny_chatml_model, env_factory=FlakyEnv, env_mode=mode)
    episodes = runner([{"target": 2, "mode": "raise"}, {"target": 2}])
    assert episodes[0].failed and "engine crashed" in episodes[0].failure
    assert not episodes[1].failed and episodes[1].won
    # The pool recovers: the same slot plays a healthy task next.
    again = runner([{"target": 1}, {"target": 1}])
    assert all(ep.won and not ep.failed for ep in again)
    runner.close()


def test_hanging_and_dying_workers_fail_their_episodes(tiny_chatml_model):
    runner, *_ = make_runner(tiny_chatml_model, env_factory=FlakyEnv, env_mode="process", env_timeout=2.0)
    episodes = runner([{"target": 2, "mode": "hang"}, {"target": 2, "mode": "exit"}, {"target": 2}])
    assert episodes[0].failed and "timed out" in episodes[0].failure
    assert episodes[1].failed and "died" in episodes[1].failure
    assert episodes[2].won and not episodes[2].failed
    assert all(ep.won for ep in runner([{"target": 1}] * 3))
    runner.close()


def test_a_template_that_rewrites_history_is_refused_by_name(tiny_chatml_model):
    _, tokenizer = load(tiny_chatml_model)
    # Renders only the last two messages: appending a turn changes the tokens before it.
    tokenizer.chat_template = (
        "{% for m in messages[-2:] %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    tokenizer.name_or_path = "my-org/history-dropping-model"
    with pytest.raises(ChatTemplateError, match="my-org/history-dropping-model.*cannot be extended token-exactly"):
        ChatTokenBuilder(tokenizer)


def test_a_tokenizer_without_chat_template_is_refused(tiny_chatml_model):
    _, tokenizer = load(tiny_chatml_model)
    tokenizer.chat_template = None
    with pytest.raises(ChatTemplateError, match="has no chat template"):
        ChatTokenBuilder(tokenizer)


def test_action_parsers():
    assert first_line("\n  go north \nbecause it is dark") == "go north"
    assert first_line("   \n") is None
    assert think_then_act("I think.\n<action>open door</action>") == "open door"
    assert think_then_act("Thought: dark.\nAction: go west") == "go west"
    assert think_then_act("no action here") is None
    assert get_action_parser("first_line") is first_line
    assert get_action_parser("trl_multiturn.rollout.parsing:think_then_act") is think_then_act
    with pytest.raises(ValueError, match="action_parser='nope'"):
        get_action_parser("nope")
