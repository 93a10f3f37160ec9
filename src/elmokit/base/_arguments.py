"""Command-line options generated from a dataclass's fields, so that each option's default and
help are written once, in its field.

A field offered on the command line carries an ``OptionSpec`` in its metadata (``spec(help,
...)``): its help, how its text is read, the values it allows. ``add_options`` adds the options
of a configuration class (``TrainConfig``, ``ServeConfig``, ``TaskConfig``, ...) to an argparse
parser, and ``option_values`` reads the parsed values back as the class's keyword arguments. A
help text may show the field's default where it likes with ``{default}`` (a format field:
``{default:g}``, ``{default:,}``); otherwise the default is added by the parser's formatter, or,
for options whose argparse default is None (``defaults=False``), as ``(default X)``.

``ranged`` and ``checked`` are the argparse types that refuse a value in one line ("must be at
least 1, got 0"), for the options that are no field's too.

Used by the front ends and the products' configurations; so it sits in the base layer.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator, Sequence
from dataclasses import MISSING, Field, dataclass, fields
from typing import Any

__all__ = [
    "OptionSpec",
    "Range",
    "add_options",
    "checked",
    "field_default",
    "field_option",
    "field_spec",
    "offered_fields",
    "option_values",
    "ranged",
    "spec",
]

OPTION = "option"  # the metadata key of a field's OptionSpec


@dataclass(frozen=True)
class Range:
    """The values a numeric option allows: from ``low`` (``low`` itself when ``low_allowed``) up
    to ``high`` (inclusive; None = no bound)."""

    low: float
    low_allowed: bool = True
    high: float | None = None

    def problem(self, value: float) -> str | None:
        """Why ``value`` is outside the range, or None."""
        if value < self.low or (value == self.low and not self.low_allowed):
            bound = "at least" if self.low_allowed else "greater than"
            return f"must be {bound} {self.low:g}, got {value:g}"
        if self.high is not None and value > self.high:
            return f"must be at most {self.high:g}, got {value:g}"
        return None


@dataclass(frozen=True)
class OptionSpec:
    """How the command line offers a field: its help (``{default}`` shows the field's default),
    the values it allows, and how its text is read. A bool field is a flag (``--name`` sets
    it; with ``invert``, a flag of its own name that clears a field whose default is True, such
    as ``--quiet`` for ``progress``)."""

    help: str
    kind: Callable[[str], Any] = str  # int, float, parse_duration, ...
    range: Range | None = None
    choices: tuple[str, ...] | None = None
    option: str | None = None  # the option's name when it is not the field's ("task": a positional)
    metavar: str | None = None
    group: str | None = None  # an argument group's title
    required: bool = False
    default_text: str | None = None  # the default shown, when not the field's own
    invert: bool = False


def spec(help: str, **kw: Any) -> dict[str, OptionSpec]:
    """A field's metadata offering it on the command line: ``field(metadata=spec(...))``."""
    return {OPTION: OptionSpec(help, **kw)}


def field_spec(f: Field[Any]) -> OptionSpec | None:
    """The OptionSpec of field ``f``, or None when the command line does not offer it."""
    return f.metadata.get(OPTION)


def field_option(f: Field[Any]) -> str:
    """The command-line option of field ``f``: its spec's, else ``--`` and its name with dashes."""
    found = field_spec(f)
    if found is not None and found.option is not None:
        return found.option
    return "--" + f.name.replace("_", "-")


def field_default(f: Field[Any]) -> Any:
    """The default of field ``f`` (its factory's value), or None when it has none."""
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return None


def offered_fields(cls: type, names: Sequence[str] | None = None) -> Iterator[tuple[Field[Any], OptionSpec]]:
    """The fields of dataclass ``cls`` the command line offers, with their specs: those named
    in ``names``, in that order (each must have a spec), or all of them in field order."""
    by_name = {f.name: f for f in fields(cls)}
    chosen = list(by_name.values()) if names is None else [by_name[name] for name in names]
    for f in chosen:
        found = field_spec(f)
        if found is not None:
            yield f, found
        elif names is not None:
            raise ValueError(f"{cls.__name__}.{f.name} has no OptionSpec")


def checked(kind: Callable[[str], Any], problem: Callable[[Any], str | None]) -> Callable[[str], Any]:
    """An argparse type: ``kind(text)``, refused with the reason ``problem(value)`` gives."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError as err:
            what = {int: "an integer", float: "a number"}.get(kind)  # type: ignore[call-overload]
            raise argparse.ArgumentTypeError(f"not {what}: {text!r}" if what else str(err)) from None
        why = problem(value)
        if why:
            raise argparse.ArgumentTypeError(why)
        return value

    return parse


def ranged(kind: Callable[[str], Any], low: float) -> Callable[[str], Any]:
    """An argparse type: ``kind(text)``, at least ``low`` (as ``Range(low)`` says)."""
    return checked(kind, Range(low).problem)


def _help(option: OptionSpec, default: Any, shown_by_parser: bool) -> str:
    """The help of an option: its spec's, with ``{default}`` filled in, or with ``(default X)``
    added when the parser's formatter will not add it (no argparse default, not in a group)."""
    if "{default" in option.help:
        return option.help.format(default=default)
    shown = option.default_text
    if shown is None and default is not None and not isinstance(default, bool):
        shown = f"{default:g}" if isinstance(default, float) else str(default)
    if shown is None or option.group or shown_by_parser:
        return option.help
    return f"{option.help} (default {shown})"


def _problem(
    name: str, option: str, found: OptionSpec, check: Callable[[str, Any], None] | None
) -> Callable[[Any], str | None]:
    """Why a parsed value of field ``name`` is refused: ``check(name, value)``'s ValueError
    (its message without the option's name, which argparse adds), or outside the spec's range."""

    def problem(value: Any) -> str | None:
        if check is not None:
            try:
                check(name, value)
            except ValueError as err:
                return str(err).removeprefix(option + " ")
            return None
        return found.range.problem(value) if found.range is not None else None

    return problem


def add_options(
    parser: Any,
    cls: type,
    names: Sequence[str] | None = None,
    *,
    defaults: bool = True,
    check: Callable[[str, Any], None] | None = None,
    groups: dict[str, Any] | None = None,
) -> None:
    """Add the options of dataclass ``cls``'s fields (``names``, in that order, else every
    field with a spec) to ``parser`` (a parser, an argument group or a mutually exclusive
    group), each under its field's name (``dest``). With ``defaults`` each option's argparse
    default is its field's; without, None (not given: the caller decides). ``check(name,
    value)``, when given, refuses a parsed value with a ValueError whose message starts with
    the option's name; else a value outside the spec's range is refused. An option with a
    ``group`` goes into the argument group of that title (``groups`` keeps them, by title)."""
    groups = {} if groups is None else groups
    for f, found in offered_fields(cls, names):
        target = parser
        if found.group:
            if found.group not in groups:
                groups[found.group] = parser.add_argument_group(found.group)
            target = groups[found.group]
        default = field_default(f)
        option = field_option(f)
        kwargs: dict[str, Any] = {"help": _help(found, default, defaults)}
        if isinstance(default, bool) and f.type in ("bool", bool):
            kwargs["action"] = "store_true"  # with invert, the flag clears the field (option_values)
        else:
            if found.kind is not str or found.range is not None:
                kwargs["type"] = found.kind
                if check is not None or found.range is not None:
                    kwargs["type"] = checked(found.kind, _problem(f.name, option, found, check))
            kwargs.update(choices=found.choices, metavar=found.metavar, default=default if defaults else None)
        if option.startswith("-"):
            kwargs.update(dest=_dest(f, found), required=found.required)
        target.add_argument(option, **kwargs)


def _dest(f: Field[Any], found: OptionSpec) -> str:
    """Where argparse keeps field ``f``'s option: the field's name; an inverted flag's own name
    (``--quiet``: ``quiet``)."""
    return field_option(f).lstrip("-").replace("-", "_") if found.invert else f.name


def option_values(args: argparse.Namespace, cls: type, names: Sequence[str] | None = None) -> dict[str, Any]:
    """The values parsed for ``cls``'s options (``names``, else every field with a spec): field
    name -> value, the keyword arguments of ``cls`` (or of the caller's own merge)."""
    values = {}
    for f, found in offered_fields(cls, names):
        value = getattr(args, _dest(f, found))
        values[f.name] = not value if found.invert else value
    return values
