"""The ``native`` dialect: the model's own tool-call format, as its chat template defines it.

What the model sees and writes is what the stacks it is deployed on (vLLM, SGLang, llama.cpp, any OpenAI-compatible
framework) speak for that model family:

* the tools are listed by the chat template itself (``apply_chat_template(tools=...)``, the OpenAI function shape);
* a call is Hermes/Qwen JSON, ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` (Qwen2.5, Qwen3,
  Hermes, and :data:`SHIPPED_TEMPLATE` for ChatML models whose template knows no tools, such as SmolLM2), or a
  Llama 3.x JSON object ``{"name": ..., "parameters": {...}}`` as the whole turn (after an optional
  ``<|python_tag|>``). Several calls in one turn are several blocks (or JSON objects separated by ``;`` or lines),
  and the turn ends at the model's end-of-turn token, as these templates expect;
* results come back through the template's tool role (:func:`tool_turn`), environment tokens, each result's text
  encoded as untrusted text;
* the final answer is ``<answer> ... </answer>``, as in the tag dialects, so the rewards read it the same way.

Differences from TRL 1.16's tool loop: a result that does not fit the room left is cut with a visible notice instead
of being dropped with the call rolled back; a malformed call (bad JSON, no name, unknown tool, wrong arguments)
becomes an error result the model sees, counted, not a crash nor a silent end.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any

from .protocol import Action, ActionKind, Call, Dialect, ToolTag

log = logging.getLogger(__name__)

SHIPPED_TEMPLATE = "chatml_tools.jinja"  # resources/chat_templates/: ChatML with Hermes-style tool calls

_EN = ("Answer the question. Call the tools you are given to find what you need, as many times as you need. "
       "When you know the answer, write it, a short phrase, once inside <answer> </answer>, and write nothing "
       "after it.")
_ZH = ("回答问题。调用提供给你的工具查找所需信息，可以多次调用。"
       "知道答案后，把简短的答案写在 <answer> </answer> 中，只写一次，之后不要再写任何内容。")

_BLOCK = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.S)


class NativeDialect(Dialect):
    """The model's own tool-call format (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__(name="native", tool_tags=[ToolTag("<tool_call>", "</tool_call>", "")],
                         observation_open="<tool_response>", observation_close="</tool_response>",
                         content_tags=[("<think>", "</think>")], query_separators=(), max_queries_per_search=1,
                         prompts={"en": _EN, "zh": _ZH}, native=True)

    @property
    def stop_strings(self) -> list[str]:
        """Only the answer's close: a turn with calls ends at the model's end-of-turn token (EOS), so that several
        calls fit in one turn."""
        return [self.answer_close]

    def parse_turn(self, text: str) -> Action:
        """The turn's calls (a ``tool`` action, every call in order, malformed ones with their ``error``), else its
        answer, else nothing."""
        calls = parse_calls(text)
        if calls:
            return Action(ActionKind.TOOL, text.strip(), tuple(q for c in calls for q in c.queries),
                          calls[0].tool, calls=tuple(calls))
        answer = self.extract_answer(text)
        return Action(ActionKind.ANSWER, answer) if answer is not None else Action(ActionKind.NONE)

    def write_call(self, tool: str, arguments: Mapping[str, Any]) -> str:
        return "<tool_call>\n" + json.dumps({"name": tool, "arguments": dict(arguments)}, ensure_ascii=False) + \
            "\n</tool_call>"


def _call(obj: Any, raw: str) -> Call:
    """A call from one parsed JSON value (Hermes ``arguments`` or Llama ``parameters``, an object or its JSON)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"].strip():
        return Call("", error='a tool call is a JSON object with a "name" and its "arguments"', raw=raw)
    name = obj["name"].strip()
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            return Call(name, error="the arguments are not valid JSON", raw=raw)
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return Call(name, error="the arguments must be a JSON object", raw=raw)
    query = args.get("query")
    return Call(name, args, (query,) if isinstance(query, str) and query.strip() else (), raw=raw)


def _json_call(raw: str) -> Call:
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as exc:
        return Call("", error=f"the call is not valid JSON ({exc.msg} at character {exc.pos})", raw=raw)
    return _call(obj, raw)


def parse_calls(text: str) -> list[Call]:
    """Every tool call in a turn's text: Hermes ``<tool_call>`` blocks (one left open at the end of the turn is a
    malformed call), or, with none, a Llama 3.x turn that is nothing but JSON call objects."""
    blocks = list(_BLOCK.finditer(text))
    if blocks:
        calls = []
        for m in blocks:
            raw = m.group(1).strip()
            if not m.group(2):
                calls.append(Call("", error="the <tool_call> block was never closed", raw=raw))
            else:
                calls.append(_json_call(raw))
        return calls
    body = text.replace("<|python_tag|>", "")
    for end in ("<|eom_id|>", "<|eot_id|>"):
        body = body.replace(end, "")
    body = body.strip()
    if not body.startswith("{"):
        return []
    decoder = json.JSONDecoder()
    calls, pos = [], 0
    while pos < len(body):
        try:
            obj, end = decoder.raw_decode(body, pos)
        except json.JSONDecodeError:
            return calls + [_json_call(body[pos:])] if calls else []
        if not (isinstance(obj, dict) and "name" in obj):
            return calls
        calls.append(_call(obj, body[pos:end]))
        pos = end
        while pos < len(body) and body[pos] in " \n\t;":
            pos += 1
    return calls


# ------------------------------------------------------------------------------------------- chat templates

def shipped_template() -> str:
    """The ChatML template with tool calls that the package ships (``resources/chat_templates``)."""
    return (resources.files("agentic_rag") / "resources" / "chat_templates" / SHIPPED_TEMPLATE).read_text()


def template_family(template: str | None) -> str:
    """``hermes`` (``<tool_call>`` JSON), ``llama3`` (JSON with the ``ipython`` tool role) or ``""`` (the template
    knows no tools)."""
    template = template or ""
    if "<tool_call>" in template:
        return "hermes"
    if "<|start_header_id|>" in template and "ipython" in template:
        return "llama3"
    return ""


def prepare_tokenizer(tokenizer: Any, *, name: str = "") -> str:
    """Make ``tokenizer`` speak tool calls: its own template when that knows tools, else the shipped ChatML one
    (installed on the tokenizer, so prompts, results and a saved adapter's tokenizer all carry it; logged). Returns
    the family (:func:`template_family`). A template that knows no tools and is not ChatML is refused: there is no
    format to train that the model's stack would speak."""
    template = getattr(tokenizer, "chat_template", None)
    family = template_family(template)
    if family:
        return family
    if template and "<|im_start|>" not in template:
        raise ValueError(f"the chat template of {name or 'this tokenizer'} knows no tools and is not ChatML: the "
                         f"native dialect needs a template with tool calls (give one with the tokenizer), or use a "
                         f"tag dialect (rollout.dialect: agentic)")
    tokenizer.chat_template = shipped_template()
    log.info("the chat template of %s knows no tools: using agentic-rag's %s (ChatML with <tool_call> JSON)",
             name or "the tokenizer", SHIPPED_TEMPLATE)
    return "hermes"


def openai_tools(schemas: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Tool schemas (``name``, ``description``, ``parameters``) in the OpenAI function shape chat templates read."""
    return [{"type": "function", "function": {"name": s["name"], "description": s.get("description", ""),
                                              "parameters": s.get("parameters") or {"type": "object",
                                                                                    "properties": {}}}}
            for s in schemas]


_MARK = "\ue002"
_SLOT = "\ue003{}\ue004"
_SLOTS = re.compile("\ue003(\\d+)\ue004")


def tool_turn(tokenizer: Any, contents: Sequence[str], *, eot: str | None = None) -> list[tuple[str, bool]]:
    """The environment's text after a model turn that made ``len(contents)`` calls, as ``(text, trusted)`` pieces: the
    template's tool-role wrapper (trusted: its control tokens are the template's) around each result (untrusted),
    through the opening of the model's next turn. It starts right after the model's end-of-turn token ``eot``
    (the tokenizer's EOS by default), which the model wrote itself."""
    eot = tokenizer.eos_token if eot is None else eot
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
                {"role": "assistant", "content": _MARK}]
    messages += [{"role": "tool", "content": _SLOT.format(i)} for i in range(len(contents))]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if rendered.count(_MARK) != 1:
        raise ValueError("the chat template must write the assistant's content exactly once")
    tail = rendered.split(_MARK, 1)[1]
    if eot and tail.startswith(eot):
        tail = tail[len(eot):]
    parts = _SLOTS.split(tail)
    found = [int(i) for i in parts[1::2]]
    if found != list(range(len(contents))):
        raise ValueError(f"the chat template must write each tool result once, in order (wrote {found})")
    return [(part, True) if k % 2 == 0 else (contents[int(part)], False) for k, part in enumerate(parts)]
