"""ELMo vectors on Ray Data: ``EmbedBatches``, a callable class for ``Dataset.map_batches`` (each
actor loads the model once, in ``__init__``), and ``embed_file``, what ``elmokit embed --engine
ray`` runs for users who write no Ray code. Needs ``pip install 'elmokit[ray]'``.

The idiomatic pipeline::

    import ray
    from elmokit.integrations.ray import EmbedBatches

    ds = ray.data.read_text("corpus.txt")                       # a column "text"
    ds = ds.map_batches(
        EmbedBatches,
        fn_constructor_kwargs={"model": "elmo-news-512", "layers": "top"},
        batch_format="pyarrow",
        batch_size=512,
        concurrency=4,                                          # actors, one model each
    )
    ds.write_parquet("vectors/")

The output columns are those of elmokit's Parquet files (``elmokit.embed.parquet_file``), built
by the same code: ``tokens`` and a column of vectors per chosen layer; the input's other columns
(an ``id``, an ``index``) are kept. In warm and zero mode a sentence's vectors do not depend on
its batch, so they equal the one-process Embedder's whatever the blocks, actors and retries.
"""

from __future__ import annotations

import inspect
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ..base.atomic import check_output
from ..base.textfiles import count_lines, line_splitter
from ..embed.embedder import Embedder, EmbedSummary
from ..embed.parquet_file import output_format, require_pyarrow, write_parquet_tables
from ..embed.vectors_file import check_layers, output_array
from ..hub.resolve import resolve_model

__all__ = ["EmbedBatches"]

EXTRA_HINT = "pip install 'elmokit[ray]'"
_log = logging.getLogger(__name__)


def require_ray(what: str = "the ray engine") -> Any:
    """ray (with Ray Data), or a one-line ImportError naming the extra."""
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError:
        raise ImportError(f"{what} needs the package ray: {EXTRA_HINT}") from None
    return ray


class EmbedBatches:
    """A callable class for ``ray.data.Dataset.map_batches``: batch -> the batch's vectors.

    The input holds a column ``text`` (a line: split on whitespace, or with ``tokenize`` by the
    training corpus's tokenizer) or ``tokens`` (a list of strings a row); ``column`` names
    another. The output (a ``pyarrow.Table``) holds ``tokens`` and one column of vectors per
    chosen layer as ``elmokit.embed.parquet_file.ParquetLayout`` lays them out: ``layer_0`` ...
    (``layers="all"``), ``top`` or ``average``; per token list<fixed_size_list<float32, dim>>,
    or with ``pooling`` "mean" or "max" one fixed_size_list<float32, dim> a row. The input's
    other columns come first, unchanged. ``model``, ``mode``, ``dtype``, ``device`` and
    ``batch_size`` are the Embedder's; ``threads`` sets torch's threads in the actor (default:
    the CPUs Ray gave it, at least 1)."""

    def __init__(
        self,
        model: str | os.PathLike | None = None,
        layers: str = "all",
        pooling: str | None = None,
        mode: str | None = None,
        dtype: str = "float32",
        device: str | None = None,
        batch_size: int = 64,
        tokenize: bool = False,
        column: str | None = None,
        threads: int | None = None,
    ) -> None:
        import torch

        require_pyarrow("elmokit's Ray batches")
        check_layers(layers, pooling)
        if threads is None:
            threads = _ray_cpus()
        if threads is not None:
            torch.set_num_threads(max(1, threads))
        self.embedder = Embedder(model, batch_size=batch_size, device=device, mode=mode, dtype=dtype)
        self.layers, self.pooling, self.column = layers, pooling, column
        self.layout = self.embedder.parquet_layout(layers, pooling)
        self.split = line_splitter(tokenize, warn=False)

    def __call__(self, batch: Any) -> Any:
        """A batch (a ``pyarrow.Table``, a dict of columns, or a pandas DataFrame) -> a
        ``pyarrow.Table`` of the same rows with the vectors."""
        pa = require_pyarrow()
        table = batch if isinstance(batch, pa.Table) else _as_table(pa, batch)
        name = self.column or ("tokens" if "tokens" in table.column_names else "text")
        if name not in table.column_names:
            raise ValueError(
                f"the batch has no column {name!r} (its columns: {', '.join(table.column_names)}); "
                "give a column text (a line) or tokens (a list of strings), or pass column="
            )
        values = table.column(name).to_pylist()
        tokens = [self.split(v) if isinstance(v, str) else list(v) for v in values]
        arrays = [output_array(a, self.layers, self.pooling) for a in self.embedder.embed_sentences(tokens)]
        vectors = self.layout.table(tokens, arrays, first_index=None)
        kept = [c for c in table.column_names if c not in ("text", name, *vectors.column_names)]
        out = table.select(kept)
        for field, column in zip(vectors.schema, vectors.columns):
            out = out.append_column(field, column)
        return out.replace_schema_metadata(vectors.schema.metadata)


def _as_table(pa: Any, batch: Any) -> Any:
    if isinstance(batch, dict):
        # numpy batches hold lists of tokens as object arrays
        return pa.table({k: list(v) if np.asarray(v).dtype == object else v for k, v in batch.items()})
    return pa.Table.from_pandas(batch, preserve_index=False)


def _ray_cpus() -> int | None:
    """The CPUs Ray gave this actor, if it runs in one."""
    try:
        import ray

        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU")
    except Exception:  # noqa: BLE001 (not in a Ray worker)
        return None
    return None if cpus is None else max(1, int(cpus))


def embed_file(
    input_path: str | os.PathLike,
    output_path: str | os.PathLike,
    *,
    overwrite: bool = False,
    workers: int = 2,
    address: str | None = None,
    num_gpus: float | None = None,
    progress: bool = True,
    format: str | None = None,
    **embed_options: Any,
) -> EmbedSummary:
    """A file of sentences (a line each) -> a Parquet file, on Ray Data: ``read_text`` ->
    ``map_batches(EmbedBatches, concurrency=workers)`` -> rows streamed back in line order into
    OUTPUT, written as ``Embedder.embed_file`` writes it (a temporary file renamed when
    complete; the same columns, index and vectors in warm and zero mode). ``embed_options``
    are the actors' ``EmbedBatches`` options ``model``, ``layers``, ``pooling``, ``mode``,
    ``dtype``, ``device``, ``batch_size`` and ``tokenize``, with its defaults. ``address``: a
    running cluster's (``ray start --head``), else the one ``ray.init`` already connected to,
    else a local one. The workers read INPUT themselves (a path they can see: a shared folder
    on a cluster) and need the model where they run; OUTPUT is written by this process only.
    A worker that dies is restarted by Ray and its batch retried."""
    options = _actor_options(embed_options)
    ray = require_ray()
    model, layers, pooling, mode = options["model"], options["layers"], options["pooling"], options["mode"]
    if output_format(output_path, format) != "parquet":
        raise ValueError(f"--engine ray writes Parquet: name the output {Path(output_path).stem}.parquet")
    check_layers(layers, pooling)
    if mode == "stateful":
        raise ValueError(
            "--mode stateful carries states from batch to batch; the ray engine runs warm or zero mode"
        )
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    source = Path(input_path)
    model_files = resolve_model(model).input_files()
    output = check_output(output_path, overwrite, [source, *model_files])
    total = count_lines(source)
    if total is None:
        raise ValueError(f"{source} can be read only once; the ray engine needs a file its workers can read")
    layout = Embedder(model, device="cpu", mode=mode).parquet_layout(layers, pooling)  # the columns
    start = time.perf_counter()
    if not ray.is_initialized():
        ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
    context = ray.data.DataContext.get_current()
    context.execution_options.preserve_order = True  # rows come back in line order
    context.enable_progress_bars = progress
    chunk = 8 * options["batch_size"]  # as the Embedder batches: within chunks of 8 x batch_size lines
    # the read takes no CPU of its own: the actors hold one each (N workers on N CPUs), and a
    # read waiting for a CPU that an idle actor holds would wait for ever
    dataset = ray.data.read_text(
        os.fspath(source.resolve()),
        drop_empty_lines=False,
        encoding="utf-8-sig",
        num_cpus=0,
    )
    remote: dict[str, Any] = {"num_cpus": 1}
    if num_gpus is not None:
        remote["num_gpus"] = num_gpus
    dataset = dataset.map_batches(
        EmbedBatches,
        fn_constructor_kwargs={**options, "model": None if model is None else os.fspath(model)},
        batch_format="pyarrow",
        batch_size=chunk,
        concurrency=workers,
        **remote,
    )
    stats = {"sentences": 0, "tokens": 0, "empty": 0}

    def tables() -> Iterator[Any]:
        for table in dataset.iter_batches(batch_format="pyarrow", batch_size=None):
            lengths = np.asarray(table.column("tokens").combine_chunks().value_lengths())
            stats["sentences"] += table.num_rows
            stats["tokens"] += int(lengths.sum())
            stats["empty"] += int((lengths == 0).sum())
            yield table

    written = write_parquet_tables(output, overwrite, _checked(tables(), total, source), layout)
    _log.info("%s rows from %s workers -> %s", written, workers, output)
    return EmbedSummary(**stats, seconds=time.perf_counter() - start, output=str(output), processes=workers)


_ACTOR_OPTIONS = ("model", "layers", "pooling", "mode", "dtype", "device", "batch_size", "tokenize")


def _actor_options(options: dict[str, Any]) -> dict[str, Any]:
    """``embed_file``'s options of the actors' ``EmbedBatches``, each with its default when not
    given; a TypeError for a name that is not one of them."""
    for name in options:
        if name not in _ACTOR_OPTIONS:
            raise TypeError(f"embed_file() got an unexpected keyword argument {name!r}")
    defaults = inspect.signature(EmbedBatches).parameters
    return {name: options.get(name, defaults[name].default) for name in _ACTOR_OPTIONS}


def _checked(tables: Iterator[Any], total: int, source: Path) -> Iterator[Any]:
    """The tables, refused (before OUTPUT is renamed into place) when Ray's lines are not the
    input's: ``read_text`` also breaks lines at \\v, \\f, \\x1c-\\x1e, \\x85 and \\u2028-9."""
    rows = 0
    for table in tables:
        rows += table.num_rows
        if rows > total:
            break
        yield table
    if rows != total:
        raise ValueError(
            f"Ray's read_text found {'more' if rows > total else rows} lines in {source}, which has "
            f"{total} (it also breaks lines at \\v, \\f and Unicode line separators); run without "
            "--engine ray"
        )
