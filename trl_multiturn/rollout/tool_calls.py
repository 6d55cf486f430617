"""The `tool_calls` action parser: reads a reply's tool calls with TRL's own response parsing.

TRL parses a completion with `trl.chat_template_utils.parse_response` and the tokenizer's response template (set by
`add_response_schema` for the chat templates TRL knows: Qwen2.5/3, Llama 3.1/3.2, GLM-4, gpt-oss, ...). This parser
does the same for one reply and returns its tool calls as the action, a JSON list:

    [{"name": "go", "arguments": {"direction": "north"}}, ...]

which `trl_multiturn.envs.tools.ToolEnvironment` executes. A reply with no tool call, or a malformed one (TRL's
parser then falls back to plain text), gives None: a format error (`format_penalty`), as for any unreadable reply.
"""

from __future__ import annotations

import json


class ToolCallParser:
    """`reply -> JSON list of tool calls | None`. Registered unbound under the name "tool_calls"; the rollout binds
    it to the policy's tokenizer (`bind`), whose chat template must support tool calling."""

    def __init__(self, tokenizer=None):
        self.tokenizer = tokenizer
        self._prefix: list[int] = []
        if tokenizer is not None:
            self._prefix = _prepare(tokenizer)

    def bind(self, tokenizer) -> ToolCallParser:
        """A parser reading replies of `tokenizer`'s chat template."""
        return ToolCallParser(tokenizer)

    def __call__(self, reply: str) -> str | None:
        from trl.chat_template_utils import parse_response

        if self.tokenizer is None:
            raise ValueError("action_parser='tool_calls' reads replies with the policy's tokenizer: build it with "
                             "get_action_parser('tool_calls', tokenizer) (the trainers and evaluate do).")
        if not reply.strip():
            return None
        ids = self.tokenizer(reply, add_special_tokens=False)["input_ids"]
        parsed = parse_response(self.tokenizer, ids, prefix=self._prefix)
        calls = parsed.get("tool_calls") if isinstance(parsed, dict) else None
        actions = [{"name": call["function"]["name"], "arguments": call["function"].get("arguments", {})}
                   for call in calls or [] if isinstance(call, dict) and call.get("type", "function") == "function"
                   and isinstance(call.get("function"), dict) and isinstance(call["function"].get("name"), str)]
        return json.dumps(actions) if actions else None


def _prepare(tokenizer) -> list[int]:
    """Give `tokenizer` TRL's response template (as `GRPOTrainer` does for tools) and return the generation prompt
    that replies are parsed after."""
    from trl.chat_template_utils import add_response_schema, supports_tool_calling

    if not supports_tool_calling(tokenizer):
        raise ValueError(f"action_parser='tool_calls': the chat template of {tokenizer.name_or_path!r} cannot render "
                         "tool calls, so the model cannot be shown its tools. Use a model whose template supports "
                         "tools (e.g. Qwen2.5/Qwen3, Llama 3.1), or set chat_template_path to one.")
    if getattr(tokenizer, "response_template", None) is None and getattr(tokenizer, "response_schema", None) is None:
        try:
            add_response_schema(tokenizer)
        except ValueError as exc:
            raise ValueError(f"action_parser='tool_calls': {exc}") from None
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": ""}], add_generation_prompt=True,
                                           tokenize=True, return_dict=True)
    return list(prompt["input_ids"])
