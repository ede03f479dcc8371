"""The client's tools: a request's ``tools`` and ``tool_choice`` checked, and what they mean for the agent's run.

A client declares OpenAI function tools; the served model lists them with the server's own tools through its chat
template (the native dialect: :mod:`agentic_rag.rollout.native`), and a turn that calls one ends the agent's run:
the reply hands the calls to the client (``tool_calls``, finish_reason ``tool_calls``) to run and send back as
``tool`` messages. The server's own tools (its search) still run inside the agent. Only the native dialect can do this:
a model trained on a tag dialect never saw a tool list, so a request with ``tools`` is refused there (400, naming the
dialect and the fix).

``tool_choice`` (:class:`ToolPlan`):

* ``auto`` (the default): the model may call the client's tools or not;
* ``none``: the client's tools are not listed and a call of one is not handed over: the engine answers it as a call of
  a tool it does not have (an error the model reads), and the model goes on to answer. A client that says "no calls
  now" wants an answer, which this gives it, rather than the text of a call it refused. The server's own tools stay:
  they are how the agent works, not calls the client sees;
* ``required`` or ``{"type": "function", "function": {"name": N}}``: the server writes the opening of the call itself
  (``forced``, taken as the model's own first tokens): ``<tool_call>\\n{"name": "`` for ``required``, or
  ``<tool_call>\\n{"name": "N", "arguments": `` for a named function (a Llama 3 template's ``{"name": ...,
  "parameters": `` likewise), so that even an untrained model makes a call. ``required`` with one client tool is
  that tool named: no other call satisfies it. A forcing request runs one model turn (:attr:`ToolPlan.single_turn`):
  the reply is that turn's call, read leniently when the model did not finish it cleanly (:mod:`.reply_calls`).
  With several client tools, ``required`` cannot make an untrained model name one of them (no constrained decoding):
  a turn that names none is answered as text.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..rollout.native import template_family
from .errors import bad_request
from .messages import FUNCTION_NAME

CHOICES = ("auto", "none", "required")
MAX_TOOLS = 128  # OpenAI's limit


@dataclass(frozen=True)
class ToolPlan:
    """A request's client tools (as schemas: ``name``, ``description``, ``parameters``) and its ``tool_choice``:
    ``auto``, ``none``, ``required`` or ``function`` (with ``function`` naming it)."""

    tools: tuple[dict[str, Any], ...] = ()
    choice: str = "auto"
    function: str | None = None

    @property
    def names(self) -> frozenset[str]:
        return frozenset(t["name"] for t in self.tools)

    @property
    def listed(self) -> list[dict[str, Any]]:
        """The client's tools the prompt lists (none under ``tool_choice: none``)."""
        return [] if self.choice == "none" else list(self.tools)

    @property
    def handed_over(self) -> frozenset[str]:
        """The tools whose calls end the run and go to the client (the engine's ``client_tools``)."""
        return frozenset() if self.choice == "none" else self.names

    @property
    def forced_function(self) -> str | None:
        """The function whose call the server opens by name: the named one, or ``required``'s only tool."""
        if self.choice == "function":
            return self.function
        if self.choice == "required" and len(self.tools) == 1:
            return self.tools[0]["name"]
        return None

    @property
    def single_turn(self) -> bool:
        """A forced call is the whole reply: the run stops after the model's first turn."""
        return self.choice in ("required", "function")

    def forced_text(self, family: str = "hermes") -> str:
        """The opening of the forced call in the template's format, or "" when nothing is forced."""
        if not self.single_turn:
            return ""
        head = "<tool_call>\n" if family != "llama3" else ""
        name = self.forced_function
        if name is None:
            return head + '{"name": "'
        return head + '{"name": ' + json.dumps(name) + (', "parameters": ' if family == "llama3" else
                                                        ', "arguments": ')

    def forced_ids(self, tokenizer: Any) -> list[int]:
        """:meth:`forced_text` as the model's own tokens (its control tokens recognised: Qwen's ``<tool_call>`` is
        one token), for the engine's ``forced``."""
        text = self.forced_text(template_family(getattr(tokenizer, "chat_template", None)))
        return list(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []


def plan_tools(tools: Sequence[Any] | None, tool_choice: Any, *, refusal: str | None,
               server_tools: Sequence[str] = ()) -> ToolPlan:
    """The checked ``tools`` (pydantic :class:`~.schema.ToolDef` s) and ``tool_choice``. ``refusal``: why the model
    cannot call client tools (a tag dialect), else None; ``server_tools``: names a client tool may not take."""
    tools = tools or []
    if tools and refusal:
        raise bad_request(f"tools are not supported by this model: {refusal}", "tools")
    if refusal and tool_choice not in (None, "auto", "none"):
        raise bad_request(f"tool_choice {tool_choice!r} is not supported by this model: {refusal}", "tool_choice")
    if len(tools) > MAX_TOOLS:
        raise bad_request(f"{len(tools)} tools; the limit is {MAX_TOOLS}", "tools")
    schemas: list[dict[str, Any]] = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if tool.type != "function":
            raise bad_request(f"{where}.type must be 'function', got {tool.type!r}", f"{where}.type")
        name = tool.function.name
        if not FUNCTION_NAME.fullmatch(name):
            raise bad_request(f"{where}.function.name must be 1 to 64 letters, digits, underscores or dashes, got "
                              f"{name[:80]!r}", f"{where}.function.name")
        if name in server_tools:
            raise bad_request(f"{where}: the client tool {name!r} has the name of one of this server's own tools "
                              f"({', '.join(server_tools)}), which the agent runs itself: give yours another name",
                              f"{where}.function.name")
        if any(s["name"] == name for s in schemas):
            raise bad_request(f"{where}: two tools are named {name!r}", f"{where}.function.name")
        parameters = tool.function.parameters
        if parameters is not None and parameters.get("type", "object") != "object":
            raise bad_request(f"{where}.function.parameters must be a JSON schema of type 'object'",
                              f"{where}.function.parameters")
        schemas.append({"name": name, "description": tool.function.description or "",
                        "parameters": parameters or {"type": "object", "properties": {}}})
    choice, function = _choice(tool_choice, schemas, server_tools)
    if choice == "required" and not schemas:
        raise bad_request("tool_choice 'required' needs tools: declare the tools the model must call", "tool_choice")
    return ToolPlan(tuple(schemas), choice, function)


def _choice(tool_choice: Any, schemas: list[dict[str, Any]], server_tools: Sequence[str]) -> tuple[str, str | None]:
    if tool_choice is None:
        return "auto", None
    if isinstance(tool_choice, str):
        if tool_choice not in CHOICES:
            raise bad_request(f"tool_choice must be 'auto', 'none', 'required' or "
                              f'{{"type": "function", "function": {{"name": ...}}}}, got {tool_choice[:40]!r}',
                              "tool_choice")
        return tool_choice, None
    function = tool_choice.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    if tool_choice.get("type") != "function" or not isinstance(name, str):
        raise bad_request('tool_choice as an object must be {"type": "function", "function": {"name": ...}}',
                          "tool_choice")
    if name not in {s["name"] for s in schemas}:
        known = ", ".join(s["name"] for s in schemas) or "none declared"
        why = (f"{name!r} is one of this server's own tools, which the agent calls by itself" if name in server_tools
               else f"no tool is named {name!r}")
        raise bad_request(f"tool_choice names a function that is not among the tools ({known}): {why}",
                          "tool_choice")
    return "function", name
