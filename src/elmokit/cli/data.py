"""`elmokit data list|sample|fetch`: the probe and task data sets (``elmokit.hub.datasets``).

Wire it into a parser with ``add_data_parser(subparsers)``; each subcommand's handler is its
``func``. Errors are raised (OSError, ValueError) for the command line to print in one line.
"""

from __future__ import annotations

import argparse
import json

from ..hub import datasets

__all__: list[str] = []


def add_data_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``data`` and its subcommands on an argparse subparsers object."""
    names = [d.name for d in datasets.DATA_SETS]
    p = subparsers.add_parser(
        "data",
        help="the data sets of the probes and tasks: list them, copy a shipped sample, download one",
        description="The labelled data sets that `elmokit probe` and `elmokit task` are shown with "
        "(docs/probe.md, docs/tasks.md): a small sample of each is shipped, the full data sets are "
        "downloaded from their publishers, verified, into a folder of your choice.",
    )
    commands = p.add_subparsers(dest="data_command", required=True, metavar="list|sample|fetch")
    listing = commands.add_parser(
        "list", help="the data sets: size, shipped sample, licence, publisher's page"
    )
    listing.add_argument("--json", action="store_true", help="everything known of each, with URLs and hashes")
    listing.set_defaults(func=list_command)

    sample = commands.add_parser(
        "sample",
        help="copy the shipped sample of a data set (the first sentences of each file) into DIR",
        description="Copy the sample shipped with elmokit (the first sentences of each of the data "
        "set's files, byte for byte, and SOURCE.md: where they come from and their licence).",
    )
    fetch = commands.add_parser(
        "fetch",
        help="download a data set from its publisher into DIR, verified",
        description="Download the full data set from its publisher's URL (pinned to a release or "
        "commit where there is one) through the download cache, check each file against the "
        "checksums known for it, and only then write the data files into DIR: all of them or none.",
    )
    for sub in (sample, fetch):
        sub.add_argument("name", choices=names, metavar="NAME", help=f"one of {', '.join(names)}")
        sub.add_argument("dir", metavar="DIR", help="the folder to write the files into (made if missing)")
        sub.add_argument("--overwrite", action="store_true", help="replace files already in DIR")
    fetch.add_argument("--force", action="store_true", help="download again what is in the cache")
    fetch.add_argument("--quiet", action="store_true", help="no progress bar")
    sample.set_defaults(func=sample_command)
    fetch.set_defaults(func=fetch_command)
    return p


def list_command(args: argparse.Namespace) -> int:
    rows = datasets.data_rows()
    print(json.dumps(rows, indent=2, ensure_ascii=False) if args.json else datasets.format_data_sets(rows))
    return 0


def sample_command(args: argparse.Namespace) -> int:
    written = datasets.copy_sample(args.name, args.dir, overwrite=args.overwrite)
    data_set = datasets.find_data_set(args.name)
    for path in written:
        print(path)
    print(f"{args.name}: the shipped sample of {data_set.title}; licence: {data_set.licence} ({written[-1]})")
    return 0


def fetch_command(args: argparse.Namespace) -> int:
    progress = False if args.quiet else None
    written = datasets.fetch_data(
        args.name, args.dir, overwrite=args.overwrite, force=args.force, progress=progress
    )
    data_set = datasets.find_data_set(args.name)
    for path in written:
        print(path)
    print(f"{args.name}: {data_set.title}; licence: {data_set.licence}; see {data_set.homepage}")
    return 0
