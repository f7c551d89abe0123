"""Tool calling's plain data: the tools a request offers, its tool choice, and the calls parsed from an output.

``ToolDef`` is an OpenAI ``{"type": "function", "function": {"name", "description", "parameters"}}`` entry;
``ToolCall`` one parsed call, ``arguments`` the JSON text of the call's arguments (as OpenAI returns it).
``tool_choice``: ``"auto"`` (the model decides), ``"none"`` (no tools in the prompt, plain text out),
``"required"`` (at least one call, constrained), or a tool's name (exactly that function, constrained; the
prompt still lists every tool).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ToolCall", "ToolDef", "new_call_id", "resolve_tool_choice"]


@dataclass(frozen=True)
class ToolDef:
    """One function the model may call; ``parameters`` is its arguments' JSON schema."""

    name: str
    description: str | None = None
    parameters: Mapping[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError("tools: a function needs a non-empty name")
        if not isinstance(self.parameters, Mapping):
            raise ValueError(f"tools: the parameters of {self.name!r} must be a JSON schema object")

    @staticmethod
    def from_openai(tool: Mapping[str, Any]) -> ToolDef:
        """``{"type": "function", "function": {...}}`` (or the inner ``function`` object) → ToolDef."""
        fn = tool.get("function", tool)
        return ToolDef(fn["name"], fn.get("description"),
                       fn.get("parameters") or {"type": "object", "properties": {}})

    def to_openai(self) -> dict[str, Any]:
        fn: dict[str, Any] = {"name": self.name, "parameters": dict(self.parameters)}
        if self.description is not None:
            fn["description"] = self.description
        return {"type": "function", "function": fn}


@dataclass(frozen=True)
class ToolCall:
    """A parsed call: ``arguments`` is JSON text (an object)."""

    id: str
    name: str
    arguments: str

    def to_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}

    def parsed_arguments(self) -> Any:
        return json.loads(self.arguments)


def new_call_id() -> str:
    """A fresh OpenAI-style call id (``call_`` + 24 hex digits)."""
    return "call_" + uuid.uuid4().hex[:24]


def resolve_tool_choice(tools: Sequence[ToolDef], choice: str | None) -> tuple[str, list[ToolDef]]:
    """(mode, the tools a call may name): mode "auto" / "none" (no tools) / "required" / "named" (the one tool).

    Raises
    ------
    ValueError
        A choice other than those, "required" or a name without tools, or a name no tool has.
    """
    choice = choice or "auto"
    if choice in ("auto", "none"):
        return (choice if tools else "none"), (list(tools) if choice == "auto" else [])
    if not tools:
        raise ValueError(f"tool_choice {choice!r} needs tools")
    if choice == "required":
        return "required", list(tools)
    named = [t for t in tools if t.name == choice]
    if not named:
        raise ValueError(f"tool_choice names {choice!r}, which is not among the tools {[t.name for t in tools]}")
    return "named", named
