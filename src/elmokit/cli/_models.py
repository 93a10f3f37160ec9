"""Model files: ``models`` (what elmokit ships and downloads), ``download``, ``convert`` (a TF-Hub
module in bilm-tf's layout) and ``export-onnx``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..base.atomic import make_folders, remove_made_folders
from ..hub import resolve_model
from ._options import MODEL_HELP


def models_command(args: argparse.Namespace) -> int:
    """The models elmokit ships and can download, with their sources and whether they are cached."""
    from ..hub.registry import format_models, model_rows

    rows = model_rows()
    print(json.dumps(rows, indent=2, ensure_ascii=False) if args.json else format_models(rows))
    return 0


def _add_models_parser(sub: argparse._SubParsersAction) -> None:
    """`elmokit models`'s parser."""
    p = sub.add_parser(
        "models",
        help="list the models elmokit ships and can download (name, language, size, source, cached)",
        description="The shipped models and the public models elmokit downloads by name (AllenNLP, "
        "NLPL repository, SeqVec, ELMoForManyLangs), with their URLs and whether they are in the "
        "cache ($ELMOKIT_CACHE, else the user cache folder). Any --model also takes a folder, a "
        ".zip archive, a URL or hf://owner/name[@revision].",
    )
    p.add_argument("--json", action="store_true", help="everything known of each model, as JSON")
    p.set_defaults(func=models_command)


def download_command(args: argparse.Namespace) -> int:
    """Download a known model or a URL into the cache, verified; say where it went."""
    from ..hub import download_model
    from ..model.options import BiLMOptions
    from ..model.weights import open_hdf5

    lines, source = download_model(args.model, force=args.force, progress=False if args.quiet else None)
    if source is not None and source.kind == "bilm":  # what can be checked without building the model
        options, weights = source.files()
        BiLMOptions.from_file(options)
        open_hdf5(weights).close()
    for line in lines:
        print(line)
    return 0


def _add_download_parser(sub: argparse._SubParsersAction) -> None:
    """`elmokit download`'s parser."""
    p = sub.add_parser(
        "download",
        help="download a known model, a URL or an hf:// repository into the cache (verified) and print "
        "where it went",
    )
    p.add_argument(
        "model",
        metavar="NAME|URL|hf://owner/name[@revision]",
        help="a name from `elmokit models`, a URL, or a Hugging Face Hub repository",
    )
    p.add_argument("--force", action="store_true", help="download again even if it is cached")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=download_command)


def convert_command(args: argparse.Namespace) -> int:
    """Write a TF-Hub module folder once in bilm-tf's layout (options.json + weights.hdf5)."""
    from ..base.atomic import check_outputs_in
    from ..model.bilm import BiLM

    source = resolve_model(args.module)
    if source.kind != "tfhub" or source.folder is None:
        raise ValueError(
            f"{args.module} is not a TF-Hub module folder (saved_model.pb + variables/); convert writes "
            "a TF-Hub module in bilm-tf's layout, every other model is used as it is"
        )
    module, out = source.folder.resolve(), Path(args.out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out} exists and is not a folder")
    if out.resolve() == module or module in out.resolve().parents:
        raise ValueError(f"{out} is inside the module folder {module}; write to another folder")
    names = ("options.json", "weights.hdf5")
    inputs = [p for p in module.rglob("*") if p.is_file()]
    check_outputs_in(out, names, args.overwrite, inputs)
    bilm = BiLM.from_tfhub(module)
    new = [name for name in names if not (out / name).exists()]
    made = make_folders(out)
    try:
        bilm.save(out / names[0], out / names[1])
    except BaseException:
        for name in new:  # what this command wrote, nothing else
            (out / name).unlink(missing_ok=True)
        remove_made_folders(made)
        raise
    print(f"wrote {out}/options.json, weights.hdf5 (bilm-tf's layout) from the TF-Hub module {module}")
    return 0


def _add_convert_parser(sub: argparse._SubParsersAction) -> None:
    """`elmokit convert`'s parser."""
    p = sub.add_parser(
        "convert",
        help="write a TF-Hub module folder in bilm-tf's layout (options.json + weights.hdf5)",
    )
    p.add_argument("module", help="a TF-Hub ELMo module folder (saved_model.pb + variables/)")
    p.add_argument("out_dir", help="folder to write options.json and weights.hdf5 into")
    p.add_argument("--overwrite", action="store_true", help="replace the model files already in OUT_DIR")
    p.set_defaults(func=convert_command)


def export_onnx_command(args: argparse.Namespace) -> int:
    """Write a model as one ONNX graph (elmokit.embed.onnx_export): dynamic batch and length, state in
    and out, the start state inside."""
    from ..base.atomic import check_output
    from ..embed.onnx_export import export_onnx, require_onnx
    from ..model.bilm import BiLM

    require_onnx("export-onnx")
    check_output(args.output, args.overwrite, [args.model])  # before the model is read
    # export_onnx refuses an output that is one of the model's files (its weights, its archive)
    data = export_onnx(BiLM.from_pretrained(args.model), args.output, args.overwrite, int8=args.int8)
    print(f"wrote {args.output} ({len(data):,} bytes)", file=sys.stderr)
    return 0


def _add_export_onnx_parser(sub: argparse._SubParsersAction) -> None:
    """`elmokit export-onnx`'s parser."""
    p = sub.add_parser("export-onnx", help="write a model as one ONNX graph (dynamic shapes, LSTM state)")
    p.add_argument("model", help=MODEL_HELP)
    p.add_argument("output", help="the .onnx file to write")
    p.add_argument("--int8", action="store_true", help="int8 matmuls (approximate; docs/export.md)")
    p.add_argument("--overwrite", action="store_true", help="replace OUTPUT if it exists")
    p.set_defaults(func=export_onnx_command)
