"""Property-based tests of `ChatTokenBuilder`: a conversation built turn by turn equals the template's rendering.

Conversations are random: any number of turns, an optional system prompt, and contents mixing random unicode,
whitespace and strings that look like the templates' special tokens and syntax. Every registered tiny template
(`trl_multiturn.testing.CHAT_TEMPLATES`) is checked.
"""

import pytest
from hypothesis import example, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from trl_multiturn.rollout import ChatTokenBuilder
from trl_multiturn.testing import CHAT_TEMPLATES, build_tiny_tokenizer

SPECIAL_LOOKING = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|start_header_id|>",
                   "<|end_header_id|>", "<|begin_of_text|>", "assistant", "user", "system", "<action>", "</action>",
                   "{{ x }}", "{% if %}", "<|", "|>"]
WHITESPACE = ["\n", "\n\n", " ", "  ", "\t", "\r\n", "\u00a0", "\u2028", "\u3000"]
TEXT = st.lists(st.one_of(st.text(max_size=10), st.sampled_from(SPECIAL_LOOKING + WHITESPACE)), max_size=6).map(
    "".join)
CONVERSATIONS = st.tuples(st.one_of(st.none(), TEXT), TEXT, st.lists(st.tuples(TEXT, TEXT), max_size=4))


@pytest.fixture(scope="module", params=CHAT_TEMPLATES)
def builder(request):
    return ChatTokenBuilder(build_tiny_tokenizer(request.param))


def refusal_is_justified(builder, reply):
    """A reply the builder may refuse: one holding an end-of-sequence token as text (generation would stop in it),
    or starting with whitespace, which the tokenizer may join to the generation prompt's trailing newline."""
    eos_texts = builder.tokenizer.convert_ids_to_tokens(sorted(builder.eos_token_ids))
    return reply[:1].isspace() or any(text in reply for text in eos_texts)


@hypothesis_settings(max_examples=150)
@given(conversation=CONVERSATIONS)
@example(conversation=(None, "", [("<|im_end|>", "")]))  # a reply that is the eos as text
@example(conversation=(None, "", [("  ", "")]))  # a whitespace reply beside the prompt's "\n" in ChatML
def test_turn_by_turn_ids_equal_the_templates_rendering(builder, conversation):
    system, first, turns = conversation
    messages = ([{"role": "system", "content": system}] if system is not None else []) + [
        {"role": "user", "content": first}]
    ids = builder.prompt_ids(messages)
    for reply, observation in turns:
        try:
            reply_ids = builder.assistant_content_ids(reply)
        except ValueError:
            assert refusal_is_justified(builder, reply), reply
            return
        assert builder.close_ids(reply_ids) == []
        ids += reply_ids + builder.observation_ids(observation)
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": observation}]
    assert ids == builder.render(messages, add_generation_prompt=True)


def test_replies_no_model_could_sample_are_refused_by_name():
    """Cases hypothesis found, each refused by name: a reply that holds the eos as text before its end (never cut at
    it), and a reply the tokenizer would join to the generation prompt's last token (never given misaligned ids)."""
    chatml = ChatTokenBuilder(build_tiny_tokenizer("chatml"))
    with pytest.raises(ValueError, match=r"reply 'go<\|im_end\|>north' contains the end-of-sequence token "
                                         r"'<\|im_end\|>' before its end"):
        chatml.assistant_content_ids("go<|im_end|>north")
    # ChatML's "assistant\n" then a blank reply: the tokenizer makes one token of "\n  ".
    with pytest.raises(ValueError, match="reply '  ' is tokenized together with the end of the generation prompt"):
        chatml.assistant_content_ids("  ")
    assert chatml.tokenizer.decode(chatml.assistant_content_ids("  go")) == "  go<|im_end|>"
    # Llama 3's template trims replies: blanks are no problem there.
    llama3 = ChatTokenBuilder(build_tiny_tokenizer("llama3"))
    assert llama3.assistant_content_ids("  ") == llama3.assistant_content_ids("") == [llama3.end_of_turn_id]
    assert chatml.assistant_content_ids("")[-1] == chatml.end_of_turn_id


NOT_INSPECTED = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="<"),
                        max_size=40).map(str.strip)  # lone surrogates: no tokenizer encodes them


@hypothesis_settings(max_examples=150)
@given(observation=NOT_INSPECTED, role=st.sampled_from(["user", "tool"]))
def test_observation_deltas_rendered_without_the_template_equal_its_rendering(builder, observation, role):
    """Both tiny templates insert a message's content verbatim after an added token, so their observation deltas
    take the shortcut around the template (its text around a marker, tokenized with the observation)."""
    builder.check_observation_role(role)
    wrapper = builder._wrappers[role]
    assert wrapper is not None
    assert builder._wrapped_delta(wrapper, observation) == builder._observation_delta(observation, role)


def _chatml_with(content_filter: str | None = None, user_header: str | None = None) -> ChatTokenBuilder:
    tokenizer = build_tiny_tokenizer("chatml")
    template = tokenizer.chat_template
    if content_filter:
        template = template.replace("message.content + '<|im_end|>'", f"message.content | {content_filter} + "
                                    "'<|im_end|>'")
    if user_header:
        template = template.replace("'<|im_start|>' + message.role + '\\n'", user_header)
    assert template != tokenizer.chat_template
    tokenizer.chat_template = template
    return ChatTokenBuilder(tokenizer)


def test_observations_a_template_might_inspect_go_through_the_template():
    """Markup, an added token's text and surrounding whitespace are never wrapped: here a template escapes `<` in
    messages, which the probes (no markup) cannot see, and the shortcut would keep the raw text."""
    builder = _chatml_with(content_filter="replace('<', '&lt;')")
    wrapper = builder._wrappers["user"]
    assert wrapper is not None
    for observation in ["<b>the key</b>", "<|im_end|>", " padded "]:
        assert builder.observation_ids(observation) == builder._observation_delta(observation, "user")
    assert builder._wrapped_delta(wrapper, "<b>the key</b>") != builder.observation_ids("<b>the key</b>")


def test_templates_that_change_content_or_lack_a_split_point_keep_rendering_every_observation():
    # content changed where the marker has nothing to change (line breaks): the probe observations show it
    joined = _chatml_with(content_filter="replace('\\n', ' ')")
    assert joined._wrappers["user"] is None
    two_lines = "A hall.\nExits: north"
    assert joined.observation_ids(two_lines) == joined._observation_delta(two_lines, "user")
    # a plain-text header before the content: the tokens after it could join across the start of the delta
    plain = _chatml_with(user_header="(message.role + ': ' if message.role == 'user' else '<|im_start|>' + "
                                     "message.role + '\\n')")
    assert plain._wrappers["user"] is None
    assert plain.observation_ids("You see a key.") == plain._observation_delta("You see a key.", "user")
