"""Where the compatibility layers find models: AllenNLP's (options_file, weight_file) pair or
any spec ``elmokit.hub`` resolves, given where AllenNLP took the options file."""

from __future__ import annotations

import os
from pathlib import Path

from ..hub import resolve_model
from ..hub.file_kinds import sniff
from ..hub.resolve import resolve_file
from ..model.bilm import BiLM

__all__ = ["resolve_model_file"]

SPECS = "a shipped or known model's name, a model folder, an NLPL .zip, an http(s) URL or hf://owner/name"


def resolve_model_file(path_or_url: str | os.PathLike | None, what: str = "model file") -> Path:
    """The local file for ``path_or_url`` (an options.json or an HDF5 weight file).

    A local path must name an existing file. A URL (http, https, s3), as AllenNLP and flair pass
    them for the published models, is downloaded into elmokit's cache on first use (checked to
    be JSON or HDF5; ``ELMOKIT_OFFLINE=1`` allows only what is cached): see elmokit.hub.transport."""
    if path_or_url is None:
        raise ValueError(f"no {what} given: pass a local path or a URL")
    return resolve_file(path_or_url, what)


def load_bilm(
    options_file: str | os.PathLike | None, weight_file: str | os.PathLike | None, *, stateful: bool = False
) -> BiLM:
    """The biLM (eval mode) of a model given as AllenNLP takes it, ``(options_file,
    weight_file)`` (each a path or a URL), or as one spec in ``options_file`` with
    ``weight_file=None``: a shipped or known model's name, a model folder (bilm-tf, AllenNLP or
    ELMoForManyLangs layout), an NLPL .zip, an http(s) URL of one, ``hf://owner/name``.
    Errors are one line; a model (archive, folder, name) given beside a weight file is named."""
    if options_file is None:
        if weight_file is not None:
            raise ValueError(f"a weight file needs its options file ({os.fspath(weight_file)!s})")
        raise ValueError(f"no model given: pass {SPECS}, or an options file and a weight file")
    if weight_file is None:
        return BiLM.from_pretrained(options_file, stateful=stateful)
    options, weights = resolve_model(options_file, weight_file).files()
    if options.is_file() and sniff(options) == "zip":
        raise ValueError(
            f"{os.fspath(options_file)} is a model archive, not an options file: give it alone as the "
            "model (weight_file=None)"
        )
    return BiLM.load(options, weights, stateful=stateful)
