"""Tool calling: the tools' data (:mod:`.spec`), the models' call formats and the grammar forcing a call
(:mod:`.formats`), prompts with tools (:mod:`.prompt`) and parsing calls out of outputs (:mod:`.parsing`)."""

from .formats import ToolFormat, call_grammar, tool_format
from .parsing import ParsedOutput, ToolStreamParser, parse_tool_calls
from .prompt import chat_prompt_ids, fallback_messages, template_reads_tools
from .spec import ToolCall, ToolDef, new_call_id, resolve_tool_choice

__all__ = ["ParsedOutput", "ToolCall", "ToolDef", "ToolFormat", "ToolStreamParser", "call_grammar",
           "chat_prompt_ids", "fallback_messages", "new_call_id", "parse_tool_calls", "resolve_tool_choice",
           "template_reads_tools", "tool_format"]
