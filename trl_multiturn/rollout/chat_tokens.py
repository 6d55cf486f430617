"""Token-exact conversation building from a chat template.

The history of an episode is never decoded and re-encoded. The prompt is rendered once; after that the sequence
only grows by (a) the tokens the model sampled and (b) the template's *delta* for a new user turn: the tokens that
follow the assistant's end-of-turn token up to and including the next generation prompt. The delta is taken from
a probe conversation, so it relies on the template rendering a new user turn the same way whatever came before;
`ChatTokenBuilder` checks that on a three-turn round trip when it is built and refuses templates that fail it.

An observation can also be a tool result (`role="tool"`, for environments whose `observation_role` is "tool"): its
delta is the template's rendering of a tool message after the reply, checked the same way on first use.

Rendering a delta through the template costs a Jinja call and the tokenization of the whole probe conversation for
every observation. Where the template inserts a message's content verbatim, the delta is instead the tokenization of
the template's own text around the content (found once with a marker) with the observation in between. That text
must start with an added token (the tokenizer splits the input at added tokens before anything else, so the tokens
after it do not depend on what came before), and the shortcut is checked against the template on probe observations
when first used. Observations a template might inspect rather than insert (markup such as `<tool_response>`, an added
token's text, surrounding whitespace some templates trim) always go through the template.
"""

from __future__ import annotations

import re
from collections.abc import Sequence


class ChatTemplateError(ValueError):
    """The tokenizer's chat template cannot be extended turn by turn with token-exact results."""


OBSERVATION_ROLES = ("user", "tool")
_PROBE_USER = "probe observation"
_PROBE_REPLY = "probe reply"
_MARKER = "probe observation marker 12345"
# Observations the wrapper shortcut must reproduce before it is used: prose, lines, digits, quotes, braces, unicode.
_WRAPPER_PROBES = ("You are in a hall.", "Taken.", "-= Kitchen =-\nYou see a chest.\n\nExits: north, east",
                   "score 3/10 'key' \"door\" {x} [y] (z) 100%", "caf\u00e9 \u00fc\u00df \u2192 \u6f22\u5b57",
                   "a  b\t\tc")


class ChatTokenBuilder:
    """Builds prompt ids, observation deltas and turn-closing tokens for one tokenizer and chat template.

    Args:
        tokenizer: a tokenizer with a chat template.
        eos_token_ids: the token ids that end a sampled reply (the trainer's `eos_token_ids`); defaults to the
            tokenizer's eos and the model's generation-config eos.
        chat_template_kwargs: extra keyword arguments for `apply_chat_template` (e.g. `enable_thinking`).
        extend_turns: probe and check the template for extending a conversation turn by turn (the trajectory
            format). False for step-wise rollouts, which render each context whole (`render`, `prompt_ids`): any
            template works then, one that rewrites history (Qwen3's) included, and the delta methods are unusable.
    """

    def __init__(self, tokenizer, eos_token_ids: Sequence[int] | None = None,
                 chat_template_kwargs: dict | None = None, extend_turns: bool = True):
        if not getattr(tokenizer, "chat_template", None):
            raise ChatTemplateError(
                f"The tokenizer {tokenizer.name_or_path!r} has no chat template. Set `tokenizer.chat_template` (for "
                "example to TRL's templates in `trl/chat_templates/`) before building multi-turn rollouts."
            )
        self.tokenizer = tokenizer
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.eos_token_ids = set(eos_token_ids if eos_token_ids is not None else [tokenizer.eos_token_id])
        self._name = tokenizer.name_or_path or type(tokenizer).__name__
        if not extend_turns:
            return
        self._probe_prompt_ids = self.render(self._probe_messages()[:1], add_generation_prompt=True)
        self._probe_closed_ids = self.render(self._probe_messages(), add_generation_prompt=False)
        self.end_of_turn_id, self._turn_tail = self._probe_turn_close()
        self._checked_roles = {"user"}
        self._check_round_trip()
        self._added_texts = sorted((t.content for t in tokenizer.added_tokens_decoder.values()), key=len, reverse=True)
        self._inspected = re.compile("|".join(["<", *map(re.escape, self._added_texts)]))
        self._wrappers = {"user": self._text_wrapper("user")}

    def render(self, messages: list[dict], add_generation_prompt: bool) -> list[int]:
        out = self.tokenizer.apply_chat_template(
            messages,
            add_generation_prompt=add_generation_prompt,
            tokenize=True,
            return_dict=True,
            **self.chat_template_kwargs,
        )
        return list(out["input_ids"])

    def _render_text(self, messages: list[dict], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                                  tokenize=False, **self.chat_template_kwargs)

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        """Tokens of the opening messages followed by the generation prompt for the first reply."""
        return self.render(messages, add_generation_prompt=True)

    def observation_ids(self, observation: str, role: str = "user") -> list[int]:
        """Tokens that follow a reply's end-of-turn token: the rest of the turn's closing, the new `role` message
        ("user", or "tool" for a tool result) with `observation`, and the generation prompt for the next reply."""
        if role not in self._checked_roles:
            self.check_observation_role(role)
        wrapper = self._wrappers[role]
        if wrapper is not None and observation == observation.strip() and not self._inspected.search(observation):
            return self._wrapped_delta(wrapper, observation)
        return self._observation_delta(observation, role)

    def _wrapped_delta(self, wrapper: tuple[str, str], observation: str) -> list[int]:
        prefix, suffix = wrapper
        return self._turn_tail + self.tokenizer.encode(prefix + observation + suffix, add_special_tokens=False)

    def _text_wrapper(self, role: str) -> tuple[str, str] | None:
        """The template's text before and after a new `role` message's content (through the next generation
        prompt), or None where tokenizing it around an observation might differ from the template's own tokens."""
        closed = self._render_text(self._probe_messages(), add_generation_prompt=False)
        marked = self._render_text([*self._probe_messages(), {"role": role, "content": _MARKER}], True)
        delta = marked[len(closed):]
        if not marked.startswith(closed) or delta.count(_MARKER) != 1:
            return None
        wrapper = tuple(delta.split(_MARKER))
        if not wrapper[0].startswith(tuple(self._added_texts)):
            return None
        exact = all(self._wrapped_delta(wrapper, obs) == self._observation_delta(obs, role) for obs in _WRAPPER_PROBES)
        return wrapper if exact else None

    def _observation_delta(self, observation: str, role: str) -> list[int]:
        base = self._probe_messages()
        with_obs = self.render([*base, {"role": role, "content": observation}], add_generation_prompt=True)
        closed = self._probe_closed_ids
        if with_obs[: len(closed)] != closed:
            raise self._error(f"appending a {role} message changes the tokens of the turns before it")
        return self._turn_tail + with_obs[len(closed):]

    def close_ids(self, reply_ids: Sequence[int]) -> list[int]:
        """Tokens to append after a reply that stopped without sampling an end-of-turn token (cut at the per-turn
        cap): the template's end-of-turn token, which the trainers keep under mask 0. Empty for a closed reply."""
        if reply_ids and reply_ids[-1] in self.eos_token_ids:
            return []
        return [self.end_of_turn_id]

    def assistant_content_ids(self, content: str) -> list[int]:
        """The tokens the template gives an assistant reply's content, end-of-turn token included (for SFT).

        They are the tokens a model could sample after `prompt_ids`: the rendering of the reply must extend the
        generation prompt, and hold an end-of-sequence token only at its end (generation stops at the first one).
        A reply that breaks either is refused with a ValueError naming it, instead of being cut or misaligned.
        """
        prompt = self._probe_prompt_ids
        full = self.render(
            [{"role": "user", "content": _PROBE_USER}, {"role": "assistant", "content": content}],
            add_generation_prompt=False,
        )
        end = len(full) - len(self._turn_tail)  # the reply ends where the template's closing of a turn begins
        if full[end:] != self._turn_tail or full[end - 1] != self.end_of_turn_id:
            raise self._error("an assistant turn's closing tokens depend on the reply")
        if full[: len(prompt)] != prompt:
            raise ValueError(
                f"The assistant reply {content!r} is tokenized together with the end of the generation prompt (it "
                f"starts with characters the tokenizer joins to the prompt's last token), so no reply sampled after "
                "the prompt has these tokens: strip the reply."
            )
        reply = full[len(prompt): end]
        early = [token for token in reply[:-1] if token in self.eos_token_ids]
        if early:
            raise ValueError(
                f"The assistant reply {content!r} contains the end-of-sequence token "
                f"{self.tokenizer.convert_ids_to_tokens(early[0])!r} before its end, where generation would stop: "
                "remove it from the reply."
            )
        return reply

    # -- probing ---------------------------------------------------------------------------------------------------

    def _probe_messages(self) -> list[dict]:
        return [{"role": "user", "content": _PROBE_USER}, {"role": "assistant", "content": _PROBE_REPLY}]

    def _probe_turn_close(self) -> tuple[int, list[int]]:
        prompt, closed = self._probe_prompt_ids, self._probe_closed_ids
        if closed[: len(prompt)] != prompt:
            raise self._error("an assistant turn does not extend the generation prompt token by token")
        eot = self._end_of_turn_index(closed, len(prompt))
        return closed[eot], closed[eot + 1:]

    def _end_of_turn_index(self, ids: list[int], start: int) -> int:
        for i in range(start, len(ids)):
            if ids[i] in self.eos_token_ids:
                return i
        names = sorted(self.tokenizer.convert_ids_to_tokens(list(self.eos_token_ids)))
        raise self._error(
            f"the assistant turn is not closed by any end-of-sequence token the model can sample ({names})"
        )

    def check_observation_role(self, role: str) -> None:
        """Refuse an observation role the template does not render as its own message: the template raises on it,
        or leaves its content out; then check the round trip with it."""
        if role not in OBSERVATION_ROLES:
            raise ValueError(f"observation role {role!r}: an environment's observation_role is one of "
                             f"{OBSERVATION_ROLES}")
        marker = "probe tool result 12345"
        failure = "it leaves the message out"
        try:
            rendered = self.render([*self._probe_messages(), {"role": role, "content": marker}],
                                   add_generation_prompt=True)
        except Exception as exc:  # noqa: BLE001 - a Jinja template refuses a role by raising anything
            rendered, failure = [], f"it raises {type(exc).__name__}: {exc}"
        if marker not in self.tokenizer.decode(rendered):
            raise ChatTemplateError(
                f"The chat template of {self._name!r} cannot render {role!r} messages ({failure}), and this "
                f"environment's observations are {role} results (its observation_role is {role!r}). Use a template "
                "with tool-message support (a tool-calling model such as Qwen2.5/Qwen3 or Llama 3.1, or "
                "`chat_template_path` pointing at one), or set the environment's `observation_role = \"user\"` to "
                "send the results as user messages."
            )
        self._check_round_trip(role)
        self._wrappers[role] = self._text_wrapper(role)
        self._checked_roles.add(role)

    def _check_round_trip(self, role: str = "user") -> None:
        """Build a three-turn conversation incrementally, with observations as `role` messages, and compare it with
        the template's own rendering."""
        messages = [{"role": "user", "content": "first observation"}]
        ids = self.prompt_ids(messages)
        for reply, obs in [("go north", "You are in a hall."), ("take key", "Taken.")]:
            ids += self.assistant_content_ids(reply)
            ids += self._observation_delta(obs, role)
            messages += [{"role": "assistant", "content": reply}, {"role": role, "content": obs}]
        expected = self.render(messages, add_generation_prompt=True)
        if ids != expected:
            raise self._error("building the conversation turn by turn does not give the template's own tokens")

    def _error(self, what: str) -> ChatTemplateError:
        return ChatTemplateError(
            f"The chat template of {self._name!r} cannot be extended token-exactly: {what}. Multi-turn rollouts need "
            "a prefix-preserving template (each turn only appends tokens). The trainers' "
            "`use_training_chat_template=True` switches to TRL's training version of known templates; "
            "`chat_template_path` gives one (e.g. one of the `*_training.jinja` templates in `trl/chat_templates/`); "
            "`episode_format='stepwise'` renders each turn's context whole and takes any template."
        )
