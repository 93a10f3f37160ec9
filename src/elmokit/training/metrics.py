"""The CSV logs of a training run's save dir: metrics.csv (the training curve, one row every
``log_every`` steps) and heldout.csv (the held-out perplexity at each checkpoint).

A metrics.csv from an older version without some columns gets them, empty in its old rows; a
resumed run drops the rows of the steps it repeats (``truncate_log``); a log that is not CSV text
stops the run before it writes anything (``check_logs``)."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from ..base.atomic import atomic_path
from ..lm.checkpoints import METRICS_FILES
from .config import TrainingError
from .evaluate import Perplexity

__all__: list[str] = []

HELDOUT_FIELDS = ["step", "tokens", "forward", "backward", "average", "predictions"]


class MetricsLog:
    """Append rows to metrics.csv (header written once; a file from an older version without
    some columns gets them, empty in its old rows). ``after``: drop the rows of later steps."""

    FIELDS = [
        "step",
        "tokens",
        "seconds",
        "loss_forward",
        "loss_backward",
        "perplexity",
        "tokens_per_second",
        "grad_norm",  # global gradient norm before clipping (of the logged step)
    ]

    def __init__(self, path: Path, after: int | None = None) -> None:
        self.path = path
        rows = read_log(path) if path.exists() else []
        lines = [self.FIELDS]
        if rows:
            old = rows[0]
            lines += [[dict(zip(old, r)).get(k, "") for k in self.FIELDS] for r in rows[1:]]
        if after is not None:
            lines = _up_to(lines, after)
        if lines != rows:
            _write_csv(path, lines)

    def write(self, **row: Any) -> None:
        with self.path.open("a", newline="") as f:
            csv.writer(f).writerow([row[k] for k in self.FIELDS])


def append_heldout(path: Path, step: int, tokens: int, result: Perplexity) -> None:
    """Append the held-out perplexity of ``step`` to heldout.csv (its header first when the file
    is new), rounded to 3 decimals."""
    new = not path.exists()
    with path.open("a", newline="") as f:
        writer = csv.writer(f)
        if new:
            writer.writerow(HELDOUT_FIELDS)
        writer.writerow(
            [
                step,
                tokens,
                round(result.forward, 3),
                round(result.backward, 3),
                round(result.average, 3),
                result.tokens,
            ]
        )


def truncate_log(path: Path, step: int) -> None:
    """Drop the rows of a CSV log (header, then rows whose first column is a step) after
    ``step``, atomically, so that the steps a resumed run repeats are logged once."""
    if path.exists():
        rows = read_log(path)
        kept = _up_to(rows, step)
        if kept != rows:
            _write_csv(path, kept)


def check_logs(save_dir: Path) -> None:
    """Read each CSV log of ``save_dir`` that exists (``read_log``), so that one the run cannot
    read stops it before it writes anything."""
    for log in METRICS_FILES:
        if (save_dir / log).exists():
            read_log(save_dir / log)


def read_log(path: Path) -> list[list[str]]:
    """The rows of a CSV log of the save dir; one that is not CSV text is a TrainingError that
    names it (the run does not write over it)."""
    try:
        with path.open(newline="", encoding="utf-8") as f:
            return list(csv.reader(f))
    except (UnicodeDecodeError, csv.Error) as err:
        cause = "its bytes are not UTF-8 text" if isinstance(err, UnicodeDecodeError) else str(err)
        raise TrainingError(
            f"{path}: not a CSV log ({cause}); move it away and the run starts a new one"
        ) from None


def _up_to(rows: list[list[str]], step: int) -> list[list[str]]:
    """The header and the rows of steps up to ``step`` (a row without a step number is kept)."""
    return rows[:1] + [r for r in rows[1:] if not (r and r[0].isdigit() and int(r[0]) > step)]


def _write_csv(path: Path, rows: list[list[str]]) -> None:
    with atomic_path(path) as tmp, tmp.open("w", newline="") as f:
        csv.writer(f).writerows(rows)
