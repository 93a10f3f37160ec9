"""Vectors of files: ``elmokit embed`` (sentences into HDF5 or Parquet, proteins with --fasta,
the local engine or Ray's) and ``elmokit tokens`` (context-independent token vectors)."""

from __future__ import annotations

import argparse
import os
import sys

from ..base._arguments import ranged
from ..base._console import say
from ..hub import DEFAULT_MODEL
from ._options import MODEL_HELP, _load_model


def _embedder(args: argparse.Namespace):
    from ..base.devices import process_device, this_process
    from ..embed.embedder import Embedder

    model = _load_model(args) if (args.options or args.weights) else args.model
    shared = this_process().distributed
    return Embedder(
        model,
        batch_size=args.batch_size,
        device=process_device(args.device) if shared else args.device,  # cuda:LOCAL_RANK
        mode=args.mode if args.command == "embed" else None,  # token vectors have no LSTM state
        max_tokens_per_batch=getattr(args, "max_tokens_per_batch", None),
        dtype=args.dtype,
        backend=getattr(args, "backend", "torch"),
        onnx_file=getattr(args, "onnx", None),
    )


def embed_command(args: argparse.Namespace) -> int:
    """Embed a file of sentences into HDF5 (the layout of `allennlp elmo`) or Parquet; with
    --nproc N or under torchrun the processes share the lines (``Embedder.embed_file(processes=N)``)."""
    from ..base.atomic import check_output
    from ..base.devices import this_process
    from ..base.textfiles import check_input
    from ..embed.parquet_file import output_format, require_pyarrow

    if args.fasta is not None or args.reduced_output is not None:
        return _embed_fasta(args)
    if args.input is None:
        # one file named and no --fasta: argparse's own error, as when INPUT was required
        say("elmokit: error: the following arguments are required: output; see 'elmokit embed --help'")
        raise SystemExit(2)
    args.mode = args.mode or "warm"
    check_input(args.input)  # before the model is read
    if args.shard_sentences is None:
        if output_format(args.output, args.format) == "parquet":  # before the model is read
            require_pyarrow()
        check_output(args.output, args.overwrite, [args.input])
    elif os.path.lexists(args.output) and not os.path.isdir(args.output):
        raise NotADirectoryError(
            f"output {args.output} is a file; with --shard-sentences the output is a folder"
        )
    elif args.format == "parquet":
        require_pyarrow()
    if args.engine == "ray":
        if args.shard_sentences is not None:
            raise ValueError("--shard-sentences goes with the local engine (--nproc, torchrun), not ray")
        return _embed_on_ray(args)
    if args.address is not None or args.workers is not None:
        raise ValueError("--address and --workers go with --engine ray (the local engine takes --nproc)")
    summary = _embedder(args).embed_file(
        args.input,
        args.output,
        layers=args.layers,
        overwrite=args.overwrite,
        sentence_index=not args.no_sentence_index,
        tokenize=args.tokenize,
        progress=not args.quiet,
        pooling=args.pooling,
        processes=args.nproc,
        shard_sentences=args.shard_sentences,
        format=args.format,
    )
    if not args.quiet and this_process().is_main:  # said once under torchrun
        shared = ""
        if summary.processes > 1 and args.shard_sentences is None:
            shared = f", {summary.processes} processes, merge {summary.merge_seconds:.1f} s"
        elif summary.processes > 1:
            shared = f", {summary.processes} processes"
        if args.shard_sentences is not None:
            done = f", {summary.skipped_parts:,} done before and skipped" if summary.skipped_parts else ""
            shared += f"; {summary.parts:,} parts{done}"
        print(
            f"{summary.sentences:,} sentences ({summary.empty:,} empty), {summary.tokens:,} tokens "
            f"in {summary.seconds:.1f} s ({summary.tokens_per_second:,.0f} tokens/s, mode "
            f"{args.mode}{shared}) -> {summary.output}",
            file=sys.stderr,
        )
    return 0


def _add_embed_parser(sub: argparse._SubParsersAction) -> None:
    """`elmokit embed`'s parser."""
    p = sub.add_parser(
        "embed",
        help="embed a file of sentences into HDF5 or Parquet",
        description="Embed a file of sentences, one whitespace-tokenized sentence per line (or raw "
        'text with --tokenize), into HDF5 in the layout of `allennlp elmo`: dataset "i" holds line '
        "i's vectors, and sentence_to_index maps each sentence to its line number. A repeated line "
        "keeps only its last line number there, as in AllenNLP (-v says how many repeat). With "
        "--fasta FILE (and no INPUT), the proteins of a FASTA file into the files of bio_embeddings' "
        "embed stage (SeqVec). An OUTPUT named .parquet (or --format parquet) is a Parquet file instead: "
        "one row per line with its index, its tokens and one column of vectors per layer "
        "(docs/embedding.md).",
    )
    p.add_argument("input", nargs="?", help="one whitespace-tokenized sentence per line; - for stdin")
    p.add_argument(
        "output",
        help="HDF5 or Parquet file to write (the format from its suffix); with --shard-sentences a folder",
    )
    p.add_argument(
        "--format",
        choices=["hdf5", "parquet"],
        default=None,
        help="the output's format (default: parquet for a .parquet or .pq OUTPUT, else hdf5; "
        "parquet needs elmokit[parquet])",
    )
    _model_arguments(p)
    p.set_defaults(mode=None)  # warm for sentences, stateful for --fasta
    _add_fasta_arguments(p)
    p.add_argument(
        "--layers",
        choices=["all", "top", "average"],
        default="all",
        help="all: every layer, (3, n_tokens, dim) per line; top: the top biLSTM layer; average: "
        "the mean of the layers ((n_tokens, dim) per line)",
    )
    p.add_argument(
        "--pooling",
        choices=["mean", "max"],
        default=None,
        help="one vector per line: the mean or max over its tokens (dataset 'embedding', row i = line i)",
    )
    p.add_argument(
        "--max-tokens-per-batch",
        type=ranged(int, low=1),
        default=None,
        help="also cap each batch at this many tokens, so long lines make smaller batches (default: "
        "no cap, --batch-size lines)",
    )
    p.add_argument(
        "--tokenize", action="store_true", help="INPUT is raw text: tokenize it as the training corpus was"
    )
    p.add_argument(
        "--no-sentence-index", action="store_true", help="do not write the sentence_to_index dataset"
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar or summary")
    p.add_argument(
        "--backend",
        choices=["torch", "onnxruntime"],
        default="torch",
        help="onnxruntime: run an ONNX export of the model on the CPU (needs elmokit[onnx])",
    )
    p.add_argument("--onnx", help="with --backend onnxruntime: the model's file from export-onnx")
    p.add_argument(
        "--shard-sentences",
        type=ranged(int, low=1),
        default=None,
        metavar="N",
        help="a resumable run: OUTPUT is a folder of part files of N lines each plus manifest.json; "
        "the same command after a crash skips the finished parts (docs/embedding.md)",
    )
    _nproc_argument(p)
    p.add_argument(
        "--engine",
        choices=["local", "ray"],
        default="local",
        help="ray: Ray Data's actors embed the lines, one model each, and this process writes the "
        "Parquet OUTPUT (needs elmokit[ray]; docs/ray.md)",
    )
    p.add_argument(
        "--address",
        default=None,
        help="with --engine ray: a running Ray cluster's address (default: a local one)",
    )
    p.add_argument(
        "--workers", type=ranged(int, low=1), default=None, help="with --engine ray: the actors (default: 2)"
    )
    p.set_defaults(func=embed_command)


def _add_fasta_arguments(p: argparse.ArgumentParser) -> None:
    """`elmokit embed --fasta`'s arguments: proteins into bio_embeddings' files."""
    fasta = p.add_argument_group("proteins (--fasta)")
    fasta.add_argument(
        "--fasta",
        metavar="FILE",
        help="embed the proteins of FILE (FASTA; - for stdin), one residue a token, as bio_embeddings' "
        "embed stage does with SeqVec: one dataset (3, L, dim) per protein in OUTPUT, named by the MD5 "
        "of its sequence, its FASTA id in attrs['original_id']; in mode stateful (bio_embeddings' "
        "numbers) unless --mode says otherwise",
    )
    fasta.add_argument(
        "--reduced-output",
        metavar="FILE",
        help="with --fasta: also write one vector (dim,) per protein, the sum over the layers averaged "
        "over the residues (bio_embeddings' reduced_embeddings_file)",
    )
    fasta.add_argument(
        "--max-amino-acids",
        type=ranged(int, low=1),
        default=15000,
        help="with --fasta: the residues of one batch stay below this (bio_embeddings' max_amino_acids; "
        "in stateful mode it decides which states each protein starts from; default 15000)",
    )
    fasta.add_argument(
        "--simple-remapping",
        action="store_true",
        help="with --fasta: name the datasets 0, 1, ... (longest protein first) instead of by MD5",
    )


def _embed_on_ray(args: argparse.Namespace) -> int:
    """``elmokit embed --engine ray``: the lines embedded by Ray Data's actors
    (``elmokit.integrations.ray.embed_file``)."""
    from ..integrations.ray import embed_file, require_ray

    require_ray()
    if args.nproc != 1:
        raise ValueError("--engine ray takes --workers N (Ray's actors), not --nproc")
    if args.options or args.weights or args.backend != "torch" or args.max_tokens_per_batch is not None:
        raise ValueError(
            "--engine ray takes --model (not --options/--weights), the torch backend and no "
            "--max-tokens-per-batch"
        )
    if args.dtype == "int8":
        raise ValueError("--engine ray runs float32 or bfloat16")
    summary = embed_file(
        args.input,
        args.output,
        model=args.model,
        layers=args.layers,
        pooling=args.pooling,
        mode=args.mode,
        dtype=args.dtype,
        device=args.device,
        batch_size=args.batch_size,
        tokenize=args.tokenize,
        overwrite=args.overwrite,
        workers=2 if args.workers is None else args.workers,
        address=args.address,
        progress=not args.quiet,
        format=args.format,
    )
    if not args.quiet:
        print(
            f"{summary.sentences:,} sentences ({summary.empty:,} empty), {summary.tokens:,} tokens "
            f"in {summary.seconds:.1f} s ({summary.tokens_per_second:,.0f} tokens/s, mode {args.mode}, "
            f"ray, {summary.processes} workers) -> {summary.output}",
            file=sys.stderr,
        )
    return 0


def _embed_fasta(args: argparse.Namespace) -> int:
    """embed --fasta: the proteins of a FASTA file into bio_embeddings' HDF5 files."""
    from ..base.atomic import check_output
    from ..embed.fasta import embed_fasta

    if args.fasta is None:
        raise ValueError("--reduced-output goes with --fasta FILE")
    if args.input is not None:
        raise ValueError(
            f"give the proteins' FASTA file as --fasta or the sentences {args.input} as INPUT, not both"
        )
    other = [
        name
        for name, given in (
            ("--layers", args.layers != "all"),
            ("--pooling", args.pooling is not None),
            ("--tokenize", args.tokenize),
            ("--no-sentence-index", args.no_sentence_index),
            ("--max-tokens-per-batch", args.max_tokens_per_batch is not None),
            ("--nproc", args.nproc != 1),
            ("--format parquet", args.format == "parquet" or str(args.output).endswith((".parquet", ".pq"))),
            ("--engine ray", args.engine != "local"),
            ("--shard-sentences", args.shard_sentences is not None),
        )
        if given
    ]
    if other:
        raise ValueError(
            f"{other[0]} does not go with --fasta (it writes bio_embeddings' layout, all layers)"
        )
    args.mode = args.mode or "stateful"
    inputs = [args.fasta]
    for path in (args.output, args.reduced_output):  # before the model is read
        if path is not None:
            check_output(path, args.overwrite, inputs)
    summary = embed_fasta(
        args.fasta,
        args.output,
        _embedder(args),
        reduced_output=args.reduced_output,
        max_amino_acids=args.max_amino_acids,
        simple_remapping=args.simple_remapping,
        overwrite=args.overwrite,
    )
    if not args.quiet:
        reduced = "" if summary.reduced_output is None else f" and {summary.reduced_output}"
        print(
            f"{summary.proteins:,} proteins, {summary.residues:,} residues in {summary.seconds:.1f} s "
            f"(mode {args.mode}) -> {summary.output}{reduced}",
            file=sys.stderr,
        )
    return 0


def tokens_command(args: argparse.Namespace) -> int:
    """Context-independent token vectors for every line of a vocabulary file (shared by the
    processes with --nproc N or under torchrun)."""
    from ..base.atomic import check_output
    from ..base.devices import this_process
    from ..base.textfiles import check_input

    check_input(args.vocab)  # before the model is read
    check_output(args.output, args.overwrite, [args.vocab])
    embedder = _embedder(args)
    n = embedder.embed_tokens_file(args.vocab, args.output, overwrite=args.overwrite, processes=args.nproc)
    if this_process().is_main:
        print(f"{n:,} token vectors -> {args.output} (dataset 'embedding')", file=sys.stderr)
    return 0


def _add_tokens_parser(sub: argparse._SubParsersAction) -> None:
    """`elmokit tokens`'s parser."""
    p = sub.add_parser("tokens", help="context-independent token vectors of a vocabulary file")
    p.add_argument("vocab", help="one token per line")
    p.add_argument("output", help="HDF5 file to write (dataset 'embedding')")
    _model_arguments(p)
    _nproc_argument(p)
    p.set_defaults(func=tokens_command)


def _model_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=DEFAULT_MODEL, help=MODEL_HELP)
    p.add_argument("--options", help="options.json (with --weights, instead of --model)")
    p.add_argument("--weights", help="weights HDF5 in the original layout")
    p.add_argument("--batch-size", type=ranged(int, low=1), default=64, help="sentences embedded together")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda if present)")
    p.add_argument(
        "--mode",
        choices=["warm", "zero", "stateful"],
        default="warm",
        help="warm: every sentence starts from the model's start state (default); "
        "zero: from zero states; stateful: states carried between batches (bilm-tf)",
    )
    p.add_argument(
        "--dtype",
        choices=["float32", "bfloat16", "int8"],
        default="float32",
        help="bfloat16: 1.8-2.1x as fast at batch 64 on CPUs with AVX-512 bf16 (slower at batch 1), "
        "cosine 0.9999 to float32; int8: int8 matmuls on the CPU, approximate (cosine about 0.999 "
        "to float32), also with --backend onnxruntime (docs/export.md)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace OUTPUT if it exists")


def _nproc_argument(p: argparse.ArgumentParser) -> None:
    """--nproc of the commands whose work the Embedder shares between processes."""
    p.add_argument(
        "--nproc",
        type=ranged(int, low=1),
        default=1,
        help="share the work between N processes on this machine (as torchrun --standalone "
        "--nproc-per-node N; each on cuda:LOCAL_RANK with CUDA)",
    )
