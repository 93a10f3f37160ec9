"""``elmokit probe`` (a classifier per layer on token labels), ``probe plot`` and ``probe wsd``."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..base._arguments import ranged
from ..base.atomic import write_json
from ..hub import DEFAULT_MODEL
from ._options import MODEL_HELP, _model_inputs


def probe_command(args: argparse.Namespace) -> int:
    """What each layer holds: a linear probe per layer (elmokit.probe), a table and a JSON file."""
    from ..base.atomic import check_output
    from ..probe.tagging import ProbeSettings, probe_files

    if args.train is None or args.test is None or args.column is None:
        raise ValueError("probe needs --train, --test and --column (or: elmokit probe wsd ...)")
    inputs = [f for f in (args.train, args.dev, args.test) if f is not None]
    if args.json is not None or args.plot is not None:
        inputs += _model_inputs(args.model)
    for out in (args.json, args.plot):
        if out is not None:
            check_output(out, args.overwrite, inputs)
    if (
        args.json is not None
        and args.plot is not None
        and Path(args.json).resolve() == Path(args.plot).resolve()
    ):
        raise ValueError(f"--json and --plot name the same file: {args.json}")
    result, record = probe_files(
        args.model,
        args.train,
        args.test,
        args.format,
        args.column,
        dev=args.dev,
        layers=args.layers,
        seeds=args.seeds,
        max_sentences=args.max_sentences,
        settings=ProbeSettings(hidden=args.hidden),
    )
    print(result.table())
    if args.json is not None:
        write_json(args.json, record, overwrite=args.overwrite)
    if args.plot is not None:
        from ..probe.plot import plot_probes

        plot_probes([record], args.plot, overwrite=args.overwrite)
    return 0


def _add_probe_parser(sub: argparse._SubParsersAction) -> None:
    """`elmokit probe`'s parser."""
    p = sub.add_parser(
        "probe",
        help="what each layer holds: a linear classifier per layer on token labels (POS, chunks, NER)",
        description="Train a linear classifier on each layer's frozen vectors (0, 1, 2, their average, "
        "a learned scalar mix), one per seed, on the label column of a CoNLL or CoNLL-U file; print "
        "accuracy (and span F1 for IOB labels) per layer with the spread over seeds (docs/probe.md).",
    )
    p.add_argument("--model", default=DEFAULT_MODEL, help=MODEL_HELP)
    p.add_argument("--train", help="training sentences (labelled)")
    p.add_argument("--dev", help="dev sentences: each probe keeps its epoch with the best dev score")
    p.add_argument("--test", help="test sentences (labelled)")
    p.add_argument("--format", choices=["conll", "conllu"], default="conll", help="default: conll")
    p.add_argument(
        "--column",
        type=ranged(int, low=0),
        help="label column, 0 = word: CoNLL-2000 1 POS, 2 chunk; CoNLL-2003 3 NER; CoNLL-U 3 UPOS",
    )
    p.add_argument("--seeds", type=ranged(int, low=1), default=3, help="probes per layer (default 3)")
    p.add_argument("--layers", default="0,1,2,average,mix", help="default: 0,1,2,average,mix")
    p.add_argument("--max-sentences", type=ranged(int, low=1), help="the first N training sentences")
    p.add_argument(
        "--hidden",
        type=ranged(int, low=0),
        default=0,
        metavar="N",
        help="0: a linear probe (default); N: an MLP with one hidden layer of N ReLU units",
    )
    p.add_argument("--json", metavar="OUT", help="write the scores, model, files and command as JSON")
    p.add_argument("--plot", metavar="PNG", help="draw the scores per layer (needs matplotlib)")
    p.add_argument("--overwrite", action="store_true", help="replace OUT or PNG if it exists")
    p.set_defaults(func=probe_command)
    probe_tasks = p.add_subparsers(dest="probe_task", required=False, metavar="wsd|plot")
    plot = probe_tasks.add_parser(
        "plot",
        help="draw saved probe results (--json files), one panel each, into one PNG",
        description="Draw the records written by `elmokit probe --json`: one panel per file, a bar "
        "per layer (the mean test score) with a line from the lowest to the highest seed.",
    )
    plot.add_argument("records", nargs="+", metavar="JSON", help="files written by elmokit probe --json")
    plot.add_argument("--out", required=True, metavar="PNG", help="the figure to write")
    plot.add_argument("--titles", help="the panels' titles, comma-separated (default: data folder, column)")
    plot.add_argument("--overwrite", action="store_true", help="replace PNG if it exists")
    plot.set_defaults(func=probe_plot_command)
    wsd = probe_tasks.add_parser(
        "wsd",
        help="word senses by 1-nearest-neighbour per layer (the unified WSD framework's XML + gold keys)",
        description="A sense's vector is the mean of its training occurrences' vectors; a test word "
        "takes the nearest (cosine) sense of its lemma seen in training; an unseen lemma takes "
        "WordNet's first sense from --index-sense (docs/probe.md).",
    )
    wsd.add_argument("--model", default=DEFAULT_MODEL, help=MODEL_HELP)
    wsd.add_argument("--train", required=True, help="NAME.data.xml with sense-tagged instances (SemCor)")
    wsd.add_argument("--train-key", help="its gold keys (default: NAME.gold.key.txt beside it)")
    wsd.add_argument("--test", required=True, help="NAME.data.xml to disambiguate")
    wsd.add_argument("--test-key", help="its gold keys (default: NAME.gold.key.txt beside it)")
    wsd.add_argument("--index-sense", help="WordNet 3.0's index.sense, for the first-sense fallback")
    wsd.add_argument("--layers", default="0,1,2,average", help="default: 0,1,2,average")
    wsd.add_argument("--json", metavar="OUT", help="write the scores, model, files and command as JSON")
    wsd.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    wsd.set_defaults(func=probe_wsd_command)


def probe_plot_command(args: argparse.Namespace) -> int:
    """Draw saved probe records (``elmokit probe --json``) into one PNG."""
    from ..base.atomic import check_output
    from ..base.jsonfiles import read_json
    from ..probe.plot import plot_probes

    check_output(args.out, args.overwrite, args.records)
    records = []
    for path in args.records:
        try:
            record = read_json(path)
        except ValueError as err:  # its one line names the file
            raise ValueError(f"a probe record is not JSON: {err}") from None
        if not isinstance(record, dict) or not {"layers", "metric"} <= record.keys():
            raise ValueError(f"{path} is not a record written by elmokit probe --json")
        records.append(record)
    titles = None if args.titles is None else [t.strip() for t in args.titles.split(",")]
    plot_probes(records, args.out, titles, overwrite=args.overwrite)
    print(f"wrote {args.out}")
    return 0


def probe_wsd_command(args: argparse.Namespace) -> int:
    """Word senses per layer by 1-NN (elmokit.probe.wsd), a table and a JSON file."""
    from ..base.atomic import check_output
    from ..probe.wsd import wsd_files, wsd_table

    files = [args.train, args.train_key, args.test, args.test_key, args.index_sense]
    if args.json is not None:
        inputs = [*(f for f in files if f is not None), *_model_inputs(args.model)]
        check_output(args.json, args.overwrite, inputs)
    record = wsd_files(
        args.model, args.train, args.test, args.index_sense, args.train_key, args.test_key, args.layers
    )
    print(wsd_table(record))
    if args.json is not None:
        write_json(args.json, record, overwrite=args.overwrite)
    return 0
