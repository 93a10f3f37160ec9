"""MkDocs hooks: the command-line reference generated from elmokit's argparse parser, and files
from outside docs/ (the shipped model's card) included where a page asks for them.

A page asks with one HTML comment on a line of its own:

- ``<!-- cli-reference -->``: every ``elmokit`` command, its usage and its options, generated
  from ``elmokit.cli.commands.build_parser()`` at build time, so the reference is never written twice;
- ``<!-- include: PATH -->``: the Markdown file PATH (relative to the repository root) in its
  place; images beside it are published next to the page.

Every built page is then checked: a raw ``<S>``, ``</S>``, ``<UNK>``, ``<bos>`` or ``<eos>`` in its
HTML (a token written outside backticks, which the browser reads as a tag and hides or turns into
strike-through text) fails the build.
"""

from __future__ import annotations

import argparse
import html
import os
import re
import sys
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

__all__ = ["check_html", "cli_reference", "on_files", "on_page_markdown", "on_post_page", "raw_tags"]

ROOT = Path(__file__).resolve().parents[2]
INCLUDE = re.compile(r"^<!-- include: (\S+) -->$", flags=re.M)
CLI = "<!-- cli-reference -->"
# The images of included files, published at the root of the site (where the pages including
# them are): name -> the file in the repository.
INCLUDED_IMAGES = {"learning-curve.png": ROOT / "src/elmokit/models/elmo-news-512/learning-curve.png"}
# ELMo's special tokens as HTML elements: what a page shows when one is written unescaped.
RAW_TAG = re.compile(r"<\s*/?\s*(?:s|unk|bos|eos)\s*/?\s*>", flags=re.I)
CODE_SPAN = re.compile(r"(`[^`]*`)")


def _parser() -> argparse.ArgumentParser:
    """elmokit's parser, from this checkout's source (not from whatever elmokit is installed)."""
    source = str(ROOT / "src")
    if source not in sys.path:
        sys.path.insert(0, source)
    from elmokit.cli.commands import build_parser

    return build_parser()


def _cell(text: str) -> str:
    """One table cell: one line, ``|`` escaped, and ``<``, ``>``, ``&`` escaped outside code spans
    (a help text's ``<S>`` shows as written)."""
    parts = CODE_SPAN.split(" ".join(text.split()))
    escaped = (part if i % 2 else html.escape(part, quote=False) for i, part in enumerate(parts))
    return "".join(escaped).replace("|", "\\|")


def _option(action: argparse.Action, formatter: argparse.HelpFormatter) -> str:
    if not action.option_strings:
        return f"`{formatter._format_args(action, action.dest)}`"
    value = "" if action.nargs == 0 else " " + formatter._format_args(action, action.dest.upper())
    return ", ".join(f"`{name}{value}`" for name in action.option_strings)


def _command(name: str, parser: argparse.ArgumentParser, summary: str, level: int) -> list[str]:
    formatter = parser._get_formatter()
    lines = [f"{'#' * level} `{name}`", ""]
    if summary:
        lines += [_cell(summary)[0].upper() + _cell(summary)[1:] + ".", ""]
    lines += ["```text", parser.format_usage().strip(), "```", ""]
    rows = []
    children: list[tuple[str, argparse.ArgumentParser, str]] = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            children += [(f"{name} {sub}", p, helps.get(sub, "")) for sub, p in action.choices.items()]
            continue
        if action.help == argparse.SUPPRESS:
            continue
        helptext = formatter._expand_help(action) if action.help else ""
        if action.default not in (None, False, argparse.SUPPRESS) and "%(default)" not in (action.help or ""):
            helptext += f" (default: {action.default})"
        rows.append(f"| {_option(action, formatter)} | {_cell(helptext)} |")
    if rows:
        lines += ["| argument | what it does |", "|---|---|", *rows, ""]
    for child in children:
        lines += _command(*child, level=level + 1)
    return lines


def cli_reference() -> str:
    """The Markdown reference of every ``elmokit`` command, from the parser itself."""
    os.environ.setdefault("COLUMNS", "100")  # argparse wraps the usage lines to this width
    parser = _parser()
    lines = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, sub in action.choices.items():
                lines += _command(f"elmokit {name}", sub, helps.get(name, ""), level=2)
    return "\n".join(lines)


def _include(match: re.Match[str]) -> str:
    path = ROOT / match.group(1)
    if not path.is_file():
        raise FileNotFoundError(f"docs: {match.group(0)} names no file ({path})")
    return path.read_text(encoding="utf-8")


def on_page_markdown(markdown: str, **kwargs: object) -> str:
    if CLI in markdown:
        markdown = markdown.replace(CLI, cli_reference())
    return INCLUDE.sub(_include, markdown)


def raw_tags(page_html: str) -> list[str]:
    """The ``<S>``, ``</S>``, ``<UNK>``, ``<bos>``, ``<eos>`` elements of ``page_html`` (any case)."""
    return [match.group(0) for match in RAW_TAG.finditer(page_html)]


def check_html(page_html: str, where: str) -> None:
    """Raise ``PluginError`` when the page ``where`` holds a raw special-token tag."""
    found = raw_tags(page_html)
    if found:
        line = page_html.count("\n", 0, page_html.index(found[0])) + 1
        raise PluginError(
            f"{where}: {len(found)} raw tag(s) {sorted(set(found))} in the HTML (first on line {line}); "
            "write the token in backticks or as &lt;S&gt;"
        )


def on_post_page(output: str, page: object, **kwargs: object) -> str:
    check_html(output, str(getattr(getattr(page, "file", None), "src_uri", page)))
    return output


def on_files(files: Files, config: object, **kwargs: object) -> Files:
    for name, path in INCLUDED_IMAGES.items():
        files.append(File.generated(config, name, abs_src_path=str(path)))  # type: ignore[arg-type]
    return files
