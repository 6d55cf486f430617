"""Property-based tests of the action parsers: any reply, however malformed, gives None or a clean action."""

import pytest
from hypothesis import example, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from trl_multiturn.rollout.parsing import ACTION_PARSERS, first_line, get_action_parser, think_then_act, whole_reply
from trl_multiturn.testing import build_tiny_tokenizer

# Every parser as a rollout uses it: bound to a tokenizer (ChatML's, which supports tool calls) where it reads one.
BOUND_PARSERS = {name: get_action_parser(name, build_tiny_tokenizer("chatml")) for name in ACTION_PARSERS}

# Replies mixing random unicode with the pieces the parsers look for.
PIECES = ["<action>", "</action>", "<ACTION>", "</Action>", "Action:", "action :", "ACTION:", "\n", "\r\n", " ",
          "\t", "\u2028", "\u00a0", "go north", "take key", "<", ">", ":", "<tool_call>", "</tool_call>",
          '{"name": "go", "arguments": {"to": 1}}', '{"name": ', "<|im_end|>"]
REPLIES = st.lists(st.one_of(st.text(max_size=8), st.sampled_from(PIECES)), max_size=12).map("".join)
INNER = st.text(max_size=20).filter(lambda text: "action>" not in text.lower())


@hypothesis_settings(max_examples=300)
@given(reply=REPLIES)
@example(reply="ACTION:\r")  # a blank last "Action:" line reads as no action (None), not ""
def test_parsers_never_raise_and_give_none_or_a_stripped_action(reply):
    for name, parser in BOUND_PARSERS.items():
        action = parser(reply)
        assert action is None or (isinstance(action, str) and action and action == action.strip()), (name, action)


@hypothesis_settings(max_examples=300)
@given(reply=REPLIES)
def test_first_line_is_the_first_non_blank_line(reply):
    lines = reply.splitlines()
    action = first_line(reply)
    if action is None:
        assert all(not line.strip() for line in lines)
    else:
        index = next(k for k, line in enumerate(lines) if line.strip())
        assert action == lines[index].strip()


@hypothesis_settings(max_examples=300)
@given(before=REPLIES, inner=INNER, after=REPLIES.filter(lambda text: "<action>" not in text.lower()),
       open_tag=st.sampled_from(["<action>", "<Action>", "<ACTION>"]))
@example(before="<ACTION>", inner="go north", after="", open_tag="<action>")  # an earlier unclosed tag does not
# swallow the last one ("<ACTION><action>go north" reads "go north")
def test_think_then_act_reads_the_last_action_tag(before, inner, after, open_tag):
    """Whatever comes before it (unclosed tags, other tags, Action: lines), the last tag's content is the action."""
    reply = before + open_tag + inner + "</action>" + after
    assert think_then_act(reply) == (inner.strip() or None)


ONE_LINE = st.text(alphabet=st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp")), min_size=1).filter(
    lambda text: text.strip() and "action>" not in text.lower())


@hypothesis_settings(max_examples=200)
@given(before=REPLIES.filter(lambda text: "</action>" not in text.lower()), action=ONE_LINE,
       after=REPLIES.filter(lambda text: "action" not in text.lower()))
def test_think_then_act_falls_back_to_the_last_action_line(before, action, after):
    assert think_then_act(f"{before}\nAction: {action}\n{after}") == action.strip()
    assert think_then_act(f"{before}\nAction:\n\n{action}\n{after}") == action.strip()  # on the next line


def test_whole_reply_is_the_stripped_reply():
    assert whole_reply("  <bash>ls</bash>\n") == "<bash>ls</bash>"
    assert whole_reply(" \n\t") is None


@hypothesis_settings(max_examples=100)
@given(spec=st.text(max_size=30).filter(lambda text: ":" not in text))  # no paths: importing runs arbitrary modules
def test_a_bad_parser_name_is_a_value_error_naming_the_field(spec):
    if spec in ACTION_PARSERS:
        assert get_action_parser(spec) is ACTION_PARSERS[spec]
    else:
        with pytest.raises(ValueError, match="action_parser="):
            get_action_parser(spec)


def test_a_parser_path_that_does_not_import_names_the_field():
    with pytest.raises(ValueError, match=r"action_parser='no_such_module:parse'.*No module named 'no_such_module'"):
        get_action_parser("no_such_module:parse")
    with pytest.raises(ValueError, match=r"parsing:nope' cannot be loaded \(AttributeError"):
        get_action_parser("trl_multiturn.rollout.parsing:nope")
    with pytest.raises(ValueError, match=r"action_parser=':first_line' cannot be loaded"):
        get_action_parser(":first_line")
    assert get_action_parser("trl_multiturn.rollout.parsing:first_line") is first_line
