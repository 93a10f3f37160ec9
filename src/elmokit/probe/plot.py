"""The probe's figure: each layer's score with its spread over seeds, one panel per probe.

Reads the records that ``elmokit probe --json`` writes (``probe_files``' second result), so a
figure can be drawn from a run or from saved JSON files (``elmokit probe plot``). Needs matplotlib
(the ``plots`` extra)."""

from __future__ import annotations

import io
import os
from collections.abc import Mapping, Sequence
from typing import Any

from ..base.atomic import write_bytes

__all__: list[str] = []


def probe_title(record: Mapping[str, Any]) -> str:
    """A panel's title: the training file's folder and the label column, e.g. ``conll2000, column 1``."""
    train = str(record.get("data", {}).get("train", ""))
    parent = os.path.basename(os.path.dirname(train)) or os.path.basename(train) or "probe"
    return f"{parent}, column {record.get('column')}"


def _headline(record: Mapping[str, Any], layer: str) -> tuple[float, float, float, float]:
    """(mean, std, min, max) of the test metric the record names for one layer."""
    figures = record["layers"][layer]["test"][record["metric"]]
    return figures["mean"], figures["std"], figures["min"], figures["max"]


def plot_probes(
    records: Sequence[Mapping[str, Any]],
    out: str | os.PathLike,
    titles: Sequence[str] | None = None,
    overwrite: bool = False,
) -> None:
    """Draw one panel per probe record: a bar per layer (mean test score over seeds) with a line
    from the lowest to the highest seed, the value written above it; write a PNG to ``out``."""
    try:
        import matplotlib
    except ImportError:
        raise ImportError("the probe's plot needs matplotlib: pip install 'elmokit[plots]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not records:
        raise ValueError("no probe records to plot")
    titles = list(titles) if titles is not None else [probe_title(r) for r in records]
    if len(titles) != len(records):
        raise ValueError(f"{len(titles)} titles for {len(records)} probe records")
    fig, axes = plt.subplots(1, len(records), figsize=(3.2 * len(records), 3.2), squeeze=False)
    for ax, record, title in zip(axes[0], records, titles):
        layers = list(record["layers"])
        stats = [_headline(record, layer) for layer in layers]
        means = [s[0] for s in stats]
        low, high = min(s[2] for s in stats), max(s[3] for s in stats)
        ax.bar(range(len(layers)), means, color="#4c72b0", width=0.6)
        ax.vlines(range(len(layers)), [s[2] for s in stats], [s[3] for s in stats], color="black")
        for i, (mean, _, _, top) in enumerate(stats):
            ax.text(i, top + (high - low) * 0.03, f"{mean:.2f}", ha="center", fontsize=7)
        margin = max(high - low, 0.5)
        ax.set_ylim(low - margin * 0.6, high + margin * 0.4)
        ax.set_xticks(range(len(layers)), [f"layer {x}" if x.isdigit() else x for x in layers], fontsize=7)
        metric = "span F1" if record["metric"] == "f1" else record["metric"]
        n = len(record.get("seeds", [])) or "?"
        ax.set_title(f"{title}\n{metric}, {n} seeds (bar: mean; line: min-max)", fontsize=8)
        ax.tick_params(axis="y", labelsize=7)
    hidden = records[0].get("settings", {}).get("hidden", 0)
    kind = f"MLP probe ({hidden} hidden units)" if hidden else "linear probe"
    fig.suptitle(f"{kind} per layer: {records[0].get('model', '')}", fontsize=9)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120)
    plt.close(fig)
    write_bytes(out, buffer.getvalue(), overwrite=overwrite)
