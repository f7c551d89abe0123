"""Command-line flags generated from the fields of a dataclass (:class:`~.sampling_params.SamplingParams`,
:class:`~.engine_args.EngineArgs`): a flag is defined once, on its field.

Field metadata:

==========  ==========================================================================================
key         meaning
==========  ==========================================================================================
``help``    the flag's help text (required: it is the field's documentation too)
``flag``    the flag's name (default: ``--`` + the field name with ``-`` for ``_``)
``choices`` the allowed values
``parse``   text → one value, where the type's constructor does not parse it (e.g. ``"5=-100"`` → (5, -100.0))
==========  ==========================================================================================

The field's type gives the flag's kind: ``bool`` → a switch (``--x``; with a True default ``--x`` /
``--no-x``), ``tuple[T, ...]`` → a repeatable flag (one item each time), ``int`` / ``float`` / ``str``
(optionally ``| None``) → one value. Each value is checked when parsed by ``check(name, value)`` (the
dataclass's own validation), so a bad value is an argparse error naming the flag.

Example: ``top_k: int = field(default=0, metadata={"help": "keep the k most likely tokens (0 = off)"})``
→ ``--top-k INT``, ``args.top_k``.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Callable, Collection
from typing import Any

__all__ = ["add_fields", "field_flags", "values_from"]

Check = Callable[[str, Any], None]


def field_flags(cls: type) -> dict[str, str]:
    """Field name → its flag (``--top-k``), for every field of ``cls`` in order."""
    return {f.name: f.metadata.get("flag", "--" + f.name.replace("_", "-")) for f in dataclasses.fields(cls)}


def _kind(hint: Any) -> tuple[str, type]:
    """("switch" | "repeat" | "value", item type) of a field's type hint."""
    if hint is bool:
        return "switch", bool
    if typing.get_origin(hint) is tuple:
        return "repeat", typing.get_args(hint)[0]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return "value", args[0]
    if hint in (int, float, str):
        return "value", hint
    raise TypeError(f"dataclass_cli: no flag for a field of type {hint!r}")


def _parser(name: str, item: Any, kind: str, check: Check | None,
            convert: Callable[[str], Any] | None = None) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = (convert or item)(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid {getattr(item, '__name__', name)} value: {text!r}") from None
        if check is not None:
            try:
                check(name, (value,) if kind == "repeat" else value)
            except ValueError as e:
                raise argparse.ArgumentTypeError(str(e)) from None
        return value
    parse.__name__ = getattr(item, "__name__", name)
    return parse


def add_fields(parser: argparse.ArgumentParser | argparse._ArgumentGroup, cls: type, *,
               check: Check | None = None, only: Collection[str] | None = None) -> None:
    """Add one flag per field of ``cls`` (or the fields named in ``only``) to ``parser``; ``args.<field>``
    holds its value (the field's default when absent; a repeatable flag: a list)."""
    hints = typing.get_type_hints(cls)
    flags = field_flags(cls)
    for f in dataclasses.fields(cls):
        if only is not None and f.name not in only:
            continue
        if "help" not in f.metadata:
            raise TypeError(f"dataclass_cli: {cls.__name__}.{f.name} has no help metadata")
        kind, item = _kind(hints[f.name])
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        kw: dict[str, Any] = {"dest": f.name, "help": f.metadata["help"]}
        if kind == "switch":
            action = argparse.BooleanOptionalAction if default else "store_true"
            parser.add_argument(flags[f.name], action=action, default=default, **kw)
            continue
        kw["type"] = _parser(f.name, item, kind, check, f.metadata.get("parse"))
        if "choices" in f.metadata:
            kw["choices"] = f.metadata["choices"]
        if kind == "repeat":
            parser.add_argument(flags[f.name], action="append", default=list(default), **kw)
        else:
            parser.add_argument(flags[f.name], default=default, **kw)


def values_from(cls: type, args: argparse.Namespace, only: Collection[str] | None = None) -> dict[str, Any]:
    """The fields of ``cls`` found on ``args`` (repeatable flags as tuples), as keyword arguments."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if (only is None or f.name in only) and hasattr(args, f.name):
            value = getattr(args, f.name)
            out[f.name] = tuple(value) if isinstance(value, list) else value
    return out
