"""The sizes elmokit accepts, checked before anything is allocated: one place for every ceiling.

A model file is data from anywhere, so its numbers are bounded before a module is built:
- each size field has a documented ceiling (``CEILINGS``), far above every published model;
- the whole model (``parameter_count``, at 4 bytes a parameter) and the activations of one token
  must fit in the memory this process may use (``memory_limit``: this machine's, or less under a
  cgroup's limit or ``ulimit -v``);
- a training run's batch (``check_training_size``: ``batch_size * unroll_steps`` positions in
  both directions, each with its LSTM activations and sampled-softmax logits) must fit too,
  with the weights, their gradients and the optimizer's state;
- JSON model files (``read_json``) are UTF-8, at most ``MAX_JSON_BYTES``, nested at most
  ``MAX_JSON_DEPTH`` deep, and hold no integer of more than ``MAX_JSON_DIGITS`` digits;
- an HDF5 weight file holds at most ``MAX_HDF5_OBJECTS`` groups and datasets.

The estimates are lower bounds (the softmax of a training run and framework overheads are not
counted): what they refuse could never run here; what they accept may still be too large.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from . import jsonfiles
from .jsonfiles import JsonLimits

__all__: list[str] = []

# Ceilings of single fields (the original model: 262 characters, 50 per token, 2 layers, 2
# highway layers, 7 filter widths, 4096 cells).
MAX_CHARACTERS = 2_000_000  # n_characters / char.dic entries: more than Unicode has code points
MAX_CHARACTERS_PER_TOKEN = 1000
MAX_WORDS = 100_000_000  # ids of ELMoForManyLangs' word.dic (a word embedding row each)
MAX_DIM = 1_000_000  # every width: embeddings, filters of one width and in all, cells, projection
MAX_LAYERS = 100  # LSTM layers
MAX_HIGHWAY = 100  # highway layers
MAX_FILTER_WIDTHS = 100  # entries of the filters list
MAX_UNROLL_STEPS = 1000  # training window (bilm-tf: 20); longer windows never reach a step

# When this machine's memory cannot be read (not Linux or macOS), it is taken to be this.
FALLBACK_MEMORY_BYTES = 64 << 30

MAX_JSON_BYTES = 1 << 20  # options.json is under 1 KB
MAX_JSON_DEPTH = 32  # options.json nests 3 deep
MAX_JSON_DIGITS = 4000  # longer integers are refused while parsing (Python reads up to 4300)
_JSON_LIMITS = JsonLimits(MAX_JSON_BYTES, MAX_JSON_DEPTH, MAX_JSON_DIGITS)
MAX_HDF5_OBJECTS = 10_000  # the largest model within the ceilings has under 2,000

FLOAT_BYTES = 4  # parameters and activations are float32


class _CharSizes(Protocol):
    @property
    def n_characters(self) -> int: ...
    @property
    def max_characters_per_token(self) -> int: ...
    @property
    def embedding_dim(self) -> int: ...
    @property
    def filters(self) -> Sequence[tuple[int, int]]: ...
    @property
    def n_filters(self) -> int: ...
    @property
    def n_highway(self) -> int: ...


class _LstmSizes(Protocol):
    @property
    def dim(self) -> int: ...
    @property
    def projection_dim(self) -> int: ...
    @property
    def n_layers(self) -> int: ...
    @property
    def always_project(self) -> bool: ...
    @property
    def has_projection(self) -> bool: ...


class ModelSizes(Protocol):
    """The sizes of a biLM the checks read (``options.BiLMOptions`` has them): this module sits
    below the model's options and never imports them."""

    @property
    def char_cnn(self) -> _CharSizes: ...
    @property
    def lstm(self) -> _LstmSizes: ...


class SizeError(ValueError):
    """A model or a run larger than the ceilings or than this machine's memory."""


def _physical_memory_bytes() -> int:
    """This machine's physical memory in bytes (``FALLBACK_MEMORY_BYTES`` when unknown)."""
    try:
        pages, page = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return FALLBACK_MEMORY_BYTES
    return pages * page if pages > 0 and page > 0 else FALLBACK_MEMORY_BYTES


def _read_number(path: Path) -> int | None:
    """The integer a cgroup file holds (None for "max", an absent file or a value meaning none)."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() and int(text) < 1 << 62 else None


def _cgroup_files(name_v2: str, name_v1: str) -> list[Path]:
    """This process's cgroup file ``name`` (v2) or ``name_v1`` (v1, the memory controller), and
    those of the cgroups above it (a limit on any of them holds)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    files = []
    for line in lines:
        _, controllers, group = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "":
            root, name = Path("/sys/fs/cgroup"), name_v2
        elif "memory" in controllers.split(","):
            root, name = Path("/sys/fs/cgroup/memory"), name_v1
        else:
            continue
        folder = root / group.strip("/")
        files += [parent / name for parent in (folder, *folder.parents) if parent.is_relative_to(root)]
    return files


def _cgroup_limit() -> tuple[int, int] | None:
    """This process's cgroup memory limit and the cgroup's usage now, in bytes (None without one)."""
    limits = [n for n in map(_read_number, _cgroup_files("memory.max", "memory.limit_in_bytes")) if n]
    if not limits:
        return None
    usages = [n for n in map(_read_number, _cgroup_files("memory.current", "memory.usage_in_bytes")) if n]
    return min(limits), (usages[0] if usages else 0)


def _address_space_limit() -> tuple[int, int] | None:
    """This process's address-space limit (``ulimit -v``, RLIMIT_AS) and its size now, in bytes."""
    try:
        import resource
    except ImportError:  # not POSIX
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY or soft <= 0:
        return None
    try:
        status = Path("/proc/self/status").read_text()
        used = int(status.split("VmSize:", 1)[1].split()[0]) * 1024
    except (OSError, IndexError, ValueError):
        used = 0
    return soft, used


def memory_limit() -> tuple[int, str]:
    """The memory this process may use in bytes, and what sets it for a message: the least of this
    machine's physical memory, its cgroup's limit (a container's) and its address-space limit."""
    limits = [(_physical_memory_bytes(), "this machine's memory")]
    cgroup = _cgroup_limit()
    if cgroup is not None:
        limits.append((cgroup[0], "this process's cgroup memory limit"))
    address_space = _address_space_limit()
    if address_space is not None:
        limits.append((address_space[0], "this process's address-space limit set by ulimit -v"))
    return min(limits)


def memory_bytes() -> int:
    """The memory this process may use in bytes (``memory_limit``'s number)."""
    return memory_limit()[0]


def available_memory_bytes() -> int | None:
    """Bytes of memory this process can still take now: the least of this machine's free pages,
    what its cgroup's limit leaves and what its address-space limit leaves (None when it cannot
    tell)."""
    free: list[int] = []
    try:
        free.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        pass
    for limit in (_cgroup_limit(), _address_space_limit()):
        if limit is not None:
            free.append(max(0, limit[0] - limit[1]))
    return min(free) if free else None


def shown_bytes(n: int) -> str:
    """A byte count for a message: 1.5 GiB, 32.0 TiB."""
    value = float(n)
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if value < 1024 or unit == "PiB":
            return f"{n:,} bytes" if unit == "bytes" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError  # pragma: no cover


def shown_number(value: int) -> str:
    """An integer for a message: 1,000,000 or, past 20 digits, "an integer of 401 digits"
    (Python refuses to print integers of more than 4300 digits)."""
    if abs(value) < 10**20:
        return f"{value:,}"
    try:
        return f"an integer of {len(str(abs(value))):,} digits"
    except ValueError:
        return f"an integer of about {int(value.bit_length() * math.log10(2)) + 1:,} digits"


def ceiling(value: int, high: int, source: str, name: str) -> None:
    """Refuse a size field above its ceiling, naming the field."""
    if value > high:
        raise SizeError(f"{source}: {name} must be at most {high:,}, got {shown_number(value)}")


# -- a model's size ------------------------------------------------------------------------------
def parameter_count(options: ModelSizes, word_embedding: tuple[int, int] | None = None) -> int:
    """The parameters of the biLM ``options`` describe (and of a word embedding of (rows, dim),
    ELMoForManyLangs'), counted as its modules will hold them."""
    cnn, lstm = options.char_cnn, options.lstm
    n_filters = cnn.n_filters
    count = cnn.n_characters * cnn.embedding_dim
    count += sum(n * (cnn.embedding_dim * width + 1) for width, n in cnn.filters)
    count += cnn.n_highway * 2 * (n_filters * n_filters + n_filters)
    features = n_filters
    if word_embedding is not None:
        count += word_embedding[0] * word_embedding[1]
        features += word_embedding[1]
    if lstm.always_project or features != lstm.projection_dim:
        count += lstm.projection_dim * (features + 1)
    per_layer = 2 * (2 * lstm.projection_dim * 4 * lstm.dim + 4 * lstm.dim)
    if lstm.has_projection:
        per_layer += 2 * lstm.dim * lstm.projection_dim
    return count + lstm.n_layers * per_layer


def token_floats(options: ModelSizes) -> int:
    """The activations of encoding one distinct token: embedded characters, convolution
    outputs and highway layers (the char CNN runs once per distinct token of a batch)."""
    cnn = options.char_cnn
    chars = cnn.max_characters_per_token
    floats = chars * cnn.embedding_dim
    floats += sum(n * max(chars - width + 1, 1) for width, n in cnn.filters)
    return floats + cnn.n_highway * 4 * cnn.n_filters


def position_floats(options: ModelSizes, n_negative_samples: int = 0) -> int:
    """The activations one position of one direction keeps for the backward pass (a lower
    bound): its token vector, each LSTM layer's gates, cell and outputs, and the sampled
    softmax's logits (``n_negative_samples`` + 1; none for embedding)."""
    lstm = options.lstm
    floats = lstm.projection_dim + lstm.n_layers * (7 * lstm.dim + lstm.projection_dim)
    return floats + (n_negative_samples + 1 if n_negative_samples else 0)


def check_model_size(options: ModelSizes, source: str, word_embedding: tuple[int, int] | None = None) -> int:
    """Refuse a model with a size above its ceiling (a backstop: options files are checked
    field by field as they are read), or whose parameters and the activations of one token
    would not fit in this machine's memory, before anything is built; returns the parameter
    count."""
    cnn, lstm = options.char_cnn, options.lstm
    for name, value, high in (
        ("n_characters", cnn.n_characters, MAX_CHARACTERS),
        ("max_characters_per_token", cnn.max_characters_per_token, MAX_CHARACTERS_PER_TOKEN),
        ("the character embedding's dim", cnn.embedding_dim, MAX_DIM),
        ("the number of filter widths", len(cnn.filters), MAX_FILTER_WIDTHS),
        ("the number of filters", cnn.n_filters, MAX_DIM),
        ("n_highway", cnn.n_highway, MAX_HIGHWAY),
        ("the LSTM's dim", lstm.dim, MAX_DIM),
        ("projection_dim", lstm.projection_dim, MAX_DIM),
        ("n_layers", lstm.n_layers, MAX_LAYERS),
    ):
        ceiling(value, high, source, name)
    count = parameter_count(options, word_embedding)
    needed = FLOAT_BYTES * (count + token_floats(options) + 2 * position_floats(options))
    memory, limited_by = memory_limit()
    if needed > memory:
        raise SizeError(
            f"{source}: the model it describes has {count:,} parameters and needs at least "
            f"{shown_bytes(needed)}, more than {limited_by} ({shown_bytes(memory)})"
        )
    return count


def check_training_size(
    options: ModelSizes, batch_size: int, unroll_steps: int, n_negative_samples: int
) -> None:
    """Refuse a training batch that cannot fit: ``unroll_steps`` above its ceiling, or the
    weights (with their gradients and the optimizer's state) and the activations of
    ``batch_size * unroll_steps`` positions in both directions beyond this machine's memory."""
    if unroll_steps > MAX_UNROLL_STEPS:
        raise SizeError(f"--unroll-steps must be at most {MAX_UNROLL_STEPS:,}, got {unroll_steps:,}")
    weights = 3 * FLOAT_BYTES * parameter_count(options)
    positions = 2 * batch_size * unroll_steps
    activations = FLOAT_BYTES * positions * position_floats(options, n_negative_samples)
    memory, limited_by = memory_limit()
    if weights + activations > memory:
        raise SizeError(
            f"--batch-size {batch_size:,} with --unroll-steps {unroll_steps:,} and --n-negative-samples "
            f"{n_negative_samples:,} needs at least {shown_bytes(weights + activations)} "
            f"({shown_bytes(activations)} of activations for {positions:,} positions), more than "
            f"{limited_by} ({shown_bytes(memory)}); lower --batch-size, --unroll-steps or "
            "--n-negative-samples"
        )


# -- JSON model files ----------------------------------------------------------------------------
def read_json(path: str | Path, error: type[ValueError] = ValueError, what: str = "JSON file") -> Any:
    """A small JSON model file (options.json, an ELMoForManyLangs config), read with the ceilings
    (``elmokit.base.jsonfiles.read_json`` with them as its limits): at most ``MAX_JSON_BYTES``,
    UTF-8 (a UTF-8 byte-order mark is allowed), nested at most ``MAX_JSON_DEPTH`` deep, no
    integer longer than ``MAX_JSON_DIGITS`` digits. Every problem is one ``error`` naming the
    file and the cause (``what`` names a missing file)."""
    return jsonfiles.read_json(path, error, what, _JSON_LIMITS)
