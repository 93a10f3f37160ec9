"""Proteins in a FASTA file -> the HDF5 files of bio_embeddings' embed stage (SeqVec).

``embed_fasta`` writes what bio_embeddings 0.2.2 writes with the ``seqvec`` protocol
(``bio_embeddings/embed/pipeline.py``), so that its downstream code reads the files unchanged:

- the embeddings file: one float32 dataset (num_layers, L, dim) per protein, one residue a token;
- the reduced file, on request: one float32 dataset (dim,) per protein, ``reduce_per_protein``
  (the sum over the layers, then the mean over the residues);
- each dataset named by the MD5 of its sequence (hex), or with ``simple_remapping`` by its
  position in the pipeline's order, with the FASTA id (the header's first word, as Biopython
  reads it) in ``attrs["original_id"]``.

The numbers are those of bio_embeddings' calls on AllenNLP's stateful ``ElmoEmbedder``, which
elmokit's stateful mode reproduces: ``SeqVecEmbedder`` first embeds a warm-up protein 4 times,
then the pipeline embeds the proteins longest first (equal lengths in file order), in batches
of fewer than ``max_amino_acids`` residues (15,000 for SeqVec; a longer protein alone), each
batch row starting from the states its row ended with in the batch before. A batch is computed
one protein at a time from those states, which gives the batched numbers with the memory of one
protein, and long proteins run through the LSTMs in windows with the states carried across. An
``Embedder`` in mode "warm" or "zero" gives instead every protein from a fixed start, so that
its vectors depend on it alone.

The FASTA reader is elmokit's own: it keeps the sequences (one byte a residue) and refuses what
bio_embeddings refuses (a residue that is not a letter A-Z or a-z, two identical sequences when
datasets are named by MD5), and also what would give a file it cannot mean: text before the
first header, a header without an id, a record without residues, a line or protein longer than
``MAX_RESIDUES``, with a ValueError naming the file and the line.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch

from ..base.atomic import atomic_path, check_output, raise_if_signalled
from ..base.textfiles import standard_input
from ..model.bilm import BiLM
from ..model.lstm import LstmState
from ..model.weights import create_hdf5
from .embedder import Embedder

__all__ = ["embed_fasta"]

logger = logging.getLogger(__name__)

# bio_embeddings' DEFAULT_MAX_AMINO_ACIDS["seqvec"]: the residues of one batch stay below it
DEFAULT_MAX_AMINO_ACIDS = 15_000
# SeqVecEmbedder's warm-up protein (T0922 from CASP) and how often it is embedded first
WARMUP_SEQUENCE = (
    "MGSSHHHHHHSSGLVPRGSHMASVQKFPGDANCDGIVDISDAVLIMQTMANPSKYQMTDKGRINADVTGNSDGVTVLDAQFIQSYCLGLVELPPVE"
)
WARMUP_ROUNDS = 4
# the longest line and the longest protein read (titin, the longest known, has about 35,000)
MAX_RESIDUES = 1_000_000
_RESIDUES = re.compile(r"[A-Za-z]*")
_ESCAPED = re.compile("[\udc80-\udcff]")  # what surrogateescape makes of bytes that are not UTF-8


@dataclass(frozen=True)
class FastaRecord:
    """One protein: ``id`` the header's first word (Biopython's ``record.id``), ``sequence``
    its residues, ``line`` the header's line number (from 1)."""

    id: str
    sequence: str
    line: int


@dataclass
class FastaSummary:
    """What an ``embed_fasta`` run did."""

    proteins: int
    residues: int
    seconds: float
    output: str
    reduced_output: str | None


def _lines(path: str | os.PathLike, text: IO[str]) -> Iterator[tuple[int, str]]:
    """(line number, line without its end), each line read at most ``MAX_RESIDUES`` + 2
    characters at a time (so a file of one endless line is refused, not read whole)."""
    number = 0
    while True:
        line = text.readline(MAX_RESIDUES + 2)
        if not line:
            return
        number += 1
        if not line.endswith("\n") and len(line) >= MAX_RESIDUES + 2:
            raise ValueError(
                f"{path}: line {number} is longer than {MAX_RESIDUES:,} characters (a FASTA line is a "
                "header or a part of one protein's sequence)"
            )
        yield number, line.rstrip("\n")


def read_fasta(path: str | os.PathLike) -> Iterator[FastaRecord]:
    """The records of a FASTA file (UTF-8, universal newlines; ``-`` reads standard input), in
    file order. A record is a header line ``>ID [description]`` and the sequence lines under it
    (spaces dropped, blank lines skipped). Malformed input is a ValueError naming the file and
    the line."""
    stdin = str(path) == "-"
    raw = standard_input() if stdin else open(path, "rb")  # noqa: SIM115
    text = io.TextIOWrapper(raw, encoding="utf-8-sig", errors="surrogateescape", newline=None)
    try:
        header: tuple[str, int] | None = None
        parts: list[str] = []
        size = 0
        for number, line in _lines(path, text):
            if line.startswith(">"):
                if header is not None:
                    yield _record(path, header, parts)
                if _ESCAPED.search(line):
                    raise ValueError(f"{path}: line {number} is not valid UTF-8")
                words = line[1:].split(None, 1)
                if not words:
                    raise ValueError(f"{path}: line {number}: the header '>' has no id after it")
                header, parts, size = (words[0], number), [], 0
                continue
            residues = line.replace(" ", "").strip()
            if not residues:
                continue
            if header is None:
                raise ValueError(
                    f"{path}: line {number}: a FASTA file starts with a header line '>ID', not {_shown(line)}"
                )
            if _RESIDUES.fullmatch(residues) is None:
                bad = next(c for c in residues if not ("A" <= c <= "Z" or "a" <= c <= "z"))
                raise ValueError(
                    f"{path}: line {number}: {_shown(bad)} in the sequence of {header[0]!r} is not a "
                    "residue: only single-letter codes A-Z are (bio_embeddings refuses it too)"
                )
            size += len(residues)
            if size > MAX_RESIDUES:
                raise ValueError(
                    f"{path}: line {header[1]}: the protein {header[0]!r} has more than "
                    f"{MAX_RESIDUES:,} residues"
                )
            parts.append(residues)
        if header is None:
            raise ValueError(f"{path}: no FASTA record (a header line '>ID' and its sequence) in the file")
        yield _record(path, header, parts)
    finally:
        if stdin:
            text.detach()
        else:
            text.close()


def _shown(text: str) -> str:
    """A character or line as an error message shows it: quoted, at most 40 characters."""
    if _ESCAPED.search(text):
        return "bytes that are not UTF-8"
    return repr(text if len(text) <= 40 else text[:40] + "...")


def _record(path: str | os.PathLike, header: tuple[str, int], parts: list[str]) -> FastaRecord:
    name, line = header
    if not parts:
        raise ValueError(f"{path}: line {line}: the record {name!r} has no residues")
    return FastaRecord(name, "".join(parts), line)


def reduce_per_protein(embedding: np.ndarray) -> np.ndarray:
    """SeqVecEmbedder.reduce_per_protein: (num_layers, L, dim) -> (dim,), the sum over the
    layers then the mean over the residues."""
    return embedding.sum(0).mean(0)


def pipeline_batches(lengths: Sequence[int], max_amino_acids: int | None) -> Iterator[list[int]]:
    """The batches of bio_embeddings' ``embed_many`` over proteins of these lengths (already in
    the pipeline's order), as lists of positions: a batch holds fewer than ``max_amino_acids``
    residues, a longer protein makes a batch of its own; None: one protein a batch."""
    if max_amino_acids is None:
        yield from ([i] for i in range(len(lengths)))
        return
    batch: list[int] = []
    total = 0
    for i, n in enumerate(lengths):
        if n > max_amino_acids:
            yield [i]
            continue
        if total + n >= max_amino_acids:
            if batch:
                yield batch
            batch, total = [], 0
        batch.append(i)
        total += n
    if batch:
        yield batch


def _remapped(
    records: list[FastaRecord], simple: bool, path: str | os.PathLike
) -> list[tuple[str, FastaRecord]]:
    """(dataset name, record) in the pipeline's order: longest first, equal lengths in file
    order; named by the MD5 of the sequence, or by position with ``simple``."""
    ordered = sorted(records, key=lambda record: -len(record.sequence))
    if simple:
        return [(str(i), record) for i, record in enumerate(ordered)]
    named: dict[str, FastaRecord] = {}
    out = []
    for record in ordered:
        name = hashlib.md5(record.sequence.encode()).hexdigest()
        first = named.setdefault(name, record)
        if first is not record:
            a, b = sorted((first, record), key=lambda r: r.line)
            raise ValueError(
                f"{path}: the records {a.id!r} (line {a.line}) and {b.id!r} (line {b.line}) have the same "
                "sequence; datasets are named by the MD5 of their sequence, as in bio_embeddings, so "
                "remove the copies (e.g. with cd-hit) or name them by position (--simple-remapping)"
            )
        out.append((name, record))
    return out


def _warn_about(records: list[FastaRecord], path: str | os.PathLike) -> None:
    lower = [r for r in records if not r.sequence.isupper()]
    if lower:
        logger.warning(
            "%s: %d record(s) have lower-case residues (the first: %r, line %d); protein models are "
            "trained on upper-case single-letter codes, so their vectors are not meaningful",
            path,
            len(lower),
            lower[0].id,
            lower[0].line,
        )
    seen: dict[str, FastaRecord] = {}
    for record in records:
        first = seen.setdefault(record.id, record)
        if first is not record:
            logger.warning(
                "%s: the id %r names the records of lines %d and %d; both are kept, each under the "
                "MD5 name of its sequence, with this id in attrs['original_id'] (as bio_embeddings does)",
                path,
                record.id,
                first.line,
                record.line,
            )
            break


class _Rows:
    """A batch computed one protein at a time with the states a batched call gives each row:
    row r starts from the carried states of row r (zeros for a row never seen), and the rows'
    final states become the carried states, the rows beyond the batch kept."""

    def __init__(self, embedder: Embedder, size: int) -> None:
        self.embedder = embedder
        carried = embedder.carried
        self.before = None if carried is None else carried.state
        self.start: LstmState | None = None
        if carried is not None:
            self.start = carried.initial(embedder.bilm, size, next(embedder.bilm.parameters()))
        self.finals: list[LstmState] = []

    def embed(self, row: int, sequence: str) -> np.ndarray:
        carried = self.embedder.carried
        if carried is None or self.start is None:
            return self.embedder.embed_batch([list(sequence)])[0]
        carried.state = LstmState(self.start.h[:, :, row : row + 1], self.start.c[:, :, row : row + 1])
        array = self.embedder.embed_batch([list(sequence)])[0]
        assert carried.state is not None
        self.finals.append(carried.state)
        return array

    def close(self) -> None:
        carried = self.embedder.carried
        if carried is None or not self.finals:
            return
        carried.state = self.before
        carried.update(
            LstmState(
                torch.cat([s.h for s in self.finals], dim=2), torch.cat([s.c for s in self.finals], dim=2)
            )
        )


def embed_fasta(
    fasta: str | os.PathLike,
    output: str | os.PathLike,
    model: Embedder | BiLM | str | os.PathLike | None = None,
    *,
    reduced_output: str | os.PathLike | None = None,
    max_amino_acids: int | None = DEFAULT_MAX_AMINO_ACIDS,
    warmup_rounds: int = WARMUP_ROUNDS,
    simple_remapping: bool = False,
    overwrite: bool = False,
) -> FastaSummary:
    """Embed the proteins of ``fasta`` into ``output`` (and their per-protein vectors into
    ``reduced_output``) as bio_embeddings' embed stage does with SeqVec (see the module).

    ``model``: an ``Embedder`` (used in its mode; its carried states are reset first), or a
    model in any form ``Embedder`` takes (e.g. "seqvec"), run in stateful mode. ``warmup_rounds``:
    how often the warm-up protein is embedded first (stateful mode only). Both files appear
    when complete, never over an input; an existing one needs ``overwrite``."""
    if max_amino_acids is not None and max_amino_acids < 1:
        raise ValueError(f"max_amino_acids must be at least 1 (or None), got {max_amino_acids}")
    if warmup_rounds < 0:
        raise ValueError(f"warmup_rounds must be at least 0, got {warmup_rounds}")
    outputs = [Path(output), *([] if reduced_output is None else [Path(reduced_output)])]
    if len(outputs) == 2 and os.path.abspath(outputs[0]) == os.path.abspath(outputs[1]):
        raise ValueError(f"the embeddings and the reduced embeddings would both be written to {outputs[0]}")
    for path in outputs:
        check_output(path, overwrite, [fasta])  # before the model is read
    embedder = model if isinstance(model, Embedder) else Embedder(model, mode="stateful")
    for path in outputs:
        check_output(path, overwrite, [fasta, *embedder.source_files])
    records = list(read_fasta(fasta))
    _warn_about(records, fasta)
    named = _remapped(records, simple_remapping, fasta)
    start = time.perf_counter()
    embedder.reset_states()
    if embedder.carried is not None:
        for _ in range(warmup_rounds):
            embedder.embed_batch([list(WARMUP_SEQUENCE)])
    with atomic_path(outputs[0], overwrite) as tmp, create_hdf5(tmp) as out:
        if len(outputs) == 2:
            with atomic_path(outputs[1], overwrite) as tmp_reduced, create_hdf5(tmp_reduced) as reduced:
                _write(embedder, named, max_amino_acids, out, reduced)
        else:
            _write(embedder, named, max_amino_acids, out, None)
    residues = sum(len(r.sequence) for r in records)
    seconds = time.perf_counter() - start
    logger.info("%d proteins, %d residues in %.1f s -> %s", len(records), residues, seconds, outputs[0])
    return FastaSummary(
        len(records), residues, seconds, str(outputs[0]), None if reduced_output is None else str(outputs[1])
    )


def _write(
    embedder: Embedder,
    named: list[tuple[str, FastaRecord]],
    max_amino_acids: int | None,
    out: Any,
    reduced: Any,
) -> None:
    """The datasets of every protein, batch by batch in the pipeline's order."""
    for batch in pipeline_batches([len(record.sequence) for _, record in named], max_amino_acids):
        rows = _Rows(embedder, len(batch))
        for row, i in enumerate(batch):
            raise_if_signalled()
            name, record = named[i]
            embedding = rows.embed(row, record.sequence)
            dataset = out.create_dataset(name, data=embedding)
            dataset.attrs["original_id"] = record.id
            if reduced is not None:
                dataset = reduced.create_dataset(name, data=reduce_per_protein(embedding))
                dataset.attrs["original_id"] = record.id
        rows.close()
