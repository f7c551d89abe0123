"""Structured outputs: the specs a request's output may be constrained to (:mod:`.spec`)."""

from .spec import Choice, Grammar, JsonObject, JsonSchema, Regex, StructuredOutput

__all__ = ["Choice", "Grammar", "JsonObject", "JsonSchema", "Regex", "StructuredOutput"]
