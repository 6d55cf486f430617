"""Step-wise episodes: History policies, per-turn contexts rendered by the real template, one token-exact sample per
turn, and a history-rewriting (Qwen3-style) template used as it is at inference."""

import pytest
from rollout_checks import assert_sample_token_exact, step_samples_of
from toy_envs import CountingEnv
from transformers import AutoModelForCausalLM, AutoTokenizer

from trl_multiturn.rollout import ChatTokenBuilder, EpisodeRunner
from trl_multiturn.rollout.generation import CachedGenerator, hf_generate_fn
from trl_multiturn.rollout.history import full, get_history, window
from trl_multiturn.rollout.rules import EpisodeRules


def load(path):
    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


def play(model, tokenizer, history, generate=None, rows=({"target": 4}, {"target": 2}), **rules):
    """Play `rows` step-wise with the `history` policy (None: the trajectory format) under these rules."""
    rules = {"max_turns": 5, "max_completion_length": 6, "action_parser": lambda reply: "go", **rules}
    if history is not None:
        rules.update(episode_format="stepwise", history=history)
    runner = EpisodeRunner(CountingEnv, tokenizer, generate or hf_generate_fn(model, tokenizer),
                           EpisodeRules(**rules))
    try:
        return runner([dict(r) for r in rows])
    finally:
        runner.close()


@pytest.mark.parametrize("history", ["full", "window:1", "window:2"])
def test_every_step_is_a_token_exact_sample_of_its_own_context(tiny_model, history):
    model, tokenizer = load(tiny_model)
    episodes = play(model, tokenizer, get_history(history))
    assert [ep.num_turns for ep in episodes] == [4, 2]
    samples = step_samples_of(episodes)
    assert [(s.episode, s.turn) for s in samples] == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1)]
    for sample in samples:
        assert_sample_token_exact(model, sample)


def test_the_cached_generation_backend_gives_token_exact_steps(tiny_chatml_model):
    model, tokenizer = load(tiny_chatml_model)
    cached = CachedGenerator(model, tokenizer)
    plain = play(model, tokenizer, window(1))
    for history in (window(1), full):
        episodes = play(model, tokenizer, history, generate=cached)
        for sample in step_samples_of(episodes):
            assert_sample_token_exact(model, sample)
    assert [ep.completion_ids for ep in play(model, tokenizer, window(1), generate=cached)] == [
        ep.completion_ids for ep in plain]


def test_each_context_is_the_templates_render_of_the_opening_and_the_windowed_turns(tiny_model):
    model, tokenizer = load(tiny_model)
    builder = ChatTokenBuilder(tokenizer)
    ep = play(model, tokenizer, window(2), rows=[{"target": 5}], system_prompt="You count.")[0]
    assert len(ep.step_contexts) == ep.num_turns == 5
    turns = [[{"role": "assistant", "content": ep.replies[k]}, {"role": "user", "content": ep.observations[k]}]
             for k in range(ep.num_turns)]
    for k, context in enumerate(ep.step_contexts):
        kept = [m for turn in turns[max(0, k - 2): k] for m in turn]
        assert context == builder.render([*ep.prompt_messages, *kept], add_generation_prompt=True)
    # the window bounds the context: turn 4 sees turns 2 and 3 only, and still the task
    text = tokenizer.decode(ep.step_contexts[4])
    assert "Observation number 2." not in text and "Observation number 4." in text and "Count to 5." in text


def test_full_history_contexts_are_the_trajectory_formats_tokens(tiny_model):
    """With a prefix-preserving template and replies that re-encode to themselves (the template's own tokens for
    them), step-wise `full` shows the model what the trajectory format does. (A reply cut mid-way, or one that
    tokenises differently once decoded, is re-rendered from its text in step-wise contexts.)"""
    model, tokenizer = load(tiny_model)
    builder = ChatTokenBuilder(tokenizer)

    def scripted(contexts, max_new_tokens):
        return [builder.assistant_content_ids("go north") for _ in contexts], None

    trajectory = play(model, tokenizer, None, generate=scripted, rows=[{"target": 3}], max_completion_length=50)[0]
    stepwise = play(model, tokenizer, full, generate=scripted, rows=[{"target": 3}], max_completion_length=50)[0]
    assert stepwise.completion_ids == [t for t, m in zip(trajectory.completion_ids, trajectory.env_mask) if m]
    for k, (start, _) in enumerate(trajectory.turn_spans):
        assert stepwise.step_contexts[k] == trajectory.prompt_ids + trajectory.completion_ids[:start]


# Qwen3's rule in miniature: an assistant turn before the last user message loses its <think> block.
STRIPPING_TEMPLATE = (
    "{% set last_user = namespace(i=0) %}{% for m in messages %}{% if m.role == 'user' %}"
    "{% set last_user.i = loop.index0 %}{% endif %}{% endfor %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.role == 'assistant' and loop.index0 < last_user.i and '</think>' in m.content %}"
    "{{ m.content.split('</think>')[-1].lstrip() }}{% else %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_a_template_that_strips_earlier_reasoning_is_used_as_at_inference(tiny_chatml_model):
    model, tokenizer = load(tiny_chatml_model)
    tokenizer.chat_template = STRIPPING_TEMPLATE
    builder = ChatTokenBuilder(tokenizer, extend_turns=False)
    reasoning = iter(["<think>secret plan A</think> go", "<think>secret plan B</think> go", "<think>c</think> go"])

    def thinking(contexts, max_new_tokens):
        return [tokenizer.encode(next(reasoning), add_special_tokens=False) + [tokenizer.eos_token_id]
                for _ in contexts], None

    ep = play(model, tokenizer, full, generate=thinking, rows=[{"target": 3}], max_completion_length=50)[0]
    assert ep.num_turns == 3
    for k in range(1, 3):
        text = tokenizer.decode(ep.step_contexts[k])
        assert "secret plan" not in text and text.count("go<|im_end|>") == k  # reasoning gone, actions kept
        messages = [*ep.prompt_messages, *[m for j in range(k) for m in (
            {"role": "assistant", "content": ep.replies[j]}, {"role": "user", "content": ep.observations[j]})]]
        assert ep.step_contexts[k] == builder.render(messages, add_generation_prompt=True)
    # the reply sampled at each step is trained with its reasoning, exactly as sampled
    first = step_samples_of([ep])[0]
    assert tokenizer.decode(first.completion_ids, skip_special_tokens=True) == "<think>secret plan A</think> go"


def test_the_episode_token_cap_bounds_each_step_not_the_episode(tiny_chatml_model):
    model, tokenizer = load(tiny_chatml_model)
    trajectory = play(model, tokenizer, None, rows=[{"target": 8}], max_turns=8, max_episode_tokens=160)[0]
    stepwise = play(model, tokenizer, window(1), rows=[{"target": 8}], max_turns=8, max_episode_tokens=160)[0]
    assert trajectory.truncated and trajectory.num_turns < 8
    assert stepwise.won and stepwise.num_turns == 8
    assert all(len(s.prompt_ids) + len(s.completion_ids) <= 160 for s in step_samples_of([stepwise]))


@pytest.mark.parametrize("spec, message", [
    ("window:0", "window:0.*>= 1"), ("window:two", "number of turns"), ("last", "'full', 'window:K'"),
    ("no_such_module_xyz:f", "cannot load it"), (3, "give 'full'"),
])
def test_a_bad_history_is_refused_by_name(spec, message):
    with pytest.raises(ValueError, match=f"history={spec!r}" if not isinstance(spec, str) else message):
        get_history(spec)


def test_a_users_history_callable_is_used(tiny_chatml_model):
    model, tokenizer = load(tiny_chatml_model)
    seen = []

    def last_observation_only(opening, turns):
        seen.append(len(turns))
        return [*opening, *turns[-1][1:]] if turns else list(opening)

    ep = play(model, tokenizer, get_history(last_observation_only), rows=[{"target": 3}])[0]
    assert seen == [1, 2]
    builder = ChatTokenBuilder(tokenizer)
    last = {"role": "user", "content": ep.observations[1]}
    assert ep.step_contexts[2] == builder.render([*ep.prompt_messages, last], add_generation_prompt=True)
