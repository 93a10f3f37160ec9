"""A training run's configuration: ``TrainConfig``, frozen and validated in one place.

Each field carries what the command line needs to offer it (``OptionSpec`` in the field's
metadata: its help, the values it allows, how to parse it; ``elmokit.base._arguments``), so that
``elmokit train``'s options and their help are generated from the fields (``train_options``,
``base._arguments.add_options``) and a value is checked by the
same rule whether it came from the command line, a Python caller or a resumed run's stored
train_config.json (``TrainConfig.__post_init__``).

A configuration comes from a new run's options (``config_from_options``) or from the stored
configuration of the run being resumed with the changes given (``resume_config``); ``prepare_run``
then makes its paths absolute and checks the save dir, once, before any process starts.
"""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import Field, asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from ..base._arguments import OptionSpec, Range, field_default, field_option, field_spec, offered_fields, spec
from ..base.atomic import write_json
from ..base.bounds import check_training_size
from ..base.devices import resolve_device
from ..lm.checkpoints import CONFIG_FILE, VOCAB_FILE, SaveFolder, read_json
from ..lm.vocabulary import Vocabulary
from ..model.options import BiLMOptions

__all__ = ["TrainConfig"]


class TrainingError(RuntimeError):
    """A training run that cannot start or go on (bad data, non-finite loss, ...)."""


def parse_duration(text: str) -> float:
    """Seconds in "90", "90s", "45m", "2h" or "1.5h"."""
    units = {"s": 1, "m": 60, "h": 3600}
    text = text.strip().lower()
    try:
        if text and text[-1] in units:
            return float(text[:-1]) * units[text[-1]]
        return float(text)
    except ValueError:
        raise ValueError(f"not a duration: {text!r} (e.g. 90m, 2h)") from None


def parse_gpus(text: str) -> tuple[int, ...]:
    """GPU numbers in "0,1,2"."""
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"not a list of GPU numbers: {text!r} (e.g. 0,1)") from None


DEFAULT_EPOCHS = 10.0  # when no limit is given
STOP = f"when to stop (default: {DEFAULT_EPOCHS:g} epochs)"
PRECISIONS = ("fp32", "bf16")


@dataclass(frozen=True)
class TrainConfig:
    """Everything a training run needs; saved as train_config.json in the save dir, without
    ``save_dir`` and ``gpus`` (a run dir can be moved or copied, and resumed on other GPUs; both
    are always the ones given). The data paths are stored absolute; a stored file may name none
    (null), and its resume gives them. A value outside what its option allows is a ValueError
    naming the option."""

    train: str = field(metadata=spec("glob of training text files (required unless --resume)"))
    vocab: str | None = field(metadata=spec("vocabulary file, elmokit vocab (required unless --resume)"))
    save_dir: str = field(metadata=spec("the run's folder: checkpoints, logs, configuration", required=True))
    options: dict[str, Any] = field(
        metadata=spec(
            "preset (tiny, small, medium, original) or a bilm-tf options .json",
            option="--config",
            metavar="CONFIG",
            default_text="small",
        )
    )
    heldout: str | None = field(
        default=None, metadata=spec("glob of held-out files (evaluated at each checkpoint)")
    )
    epochs: float | None = field(
        default=None, metadata=spec("passes over the corpus", kind=float, range=Range(0, False), group=STOP)
    )
    max_steps: int | None = field(
        default=None, metadata=spec("in all, resumed steps included", kind=int, range=Range(1), group=STOP)
    )
    max_time: float | None = field(  # seconds
        default=None,
        metadata=spec("e.g. 90m, 2h (this session)", kind=parse_duration, range=Range(0, False), group=STOP),
    )
    batch_size: int = field(default=128, metadata=spec("per process", kind=int, range=Range(1)))
    unroll_steps: int = field(default=20, metadata=spec("tokens per window", kind=int, range=Range(1)))
    n_negative_samples: int = field(
        default=8192, metadata=spec("sampled softmax classes", kind=int, range=Range(1))
    )
    lr: float = field(default=0.2, metadata=spec("Adagrad learning rate", kind=float, range=Range(0, False)))
    dropout: float = field(default=0.1, metadata=spec("dropout", kind=float, range=Range(0, high=1)))
    clip_norm: float = field(default=10.0, metadata={"range": Range(0, False)})
    seed: int = field(default=0, metadata=spec("random seed", kind=int, range=Range(0)))
    device: str = field(default="cpu", metadata=spec("cpu, cuda or cuda:N"))
    gpus: tuple[int, ...] = field(
        default=(),
        metadata=spec(
            "start one process per listed GPU, e.g. 0,1,2 (NCCL DDP)", kind=parse_gpus, default_text="none"
        ),
    )
    checkpoint_minutes: float = field(
        default=10.0, metadata=spec("minutes between checkpoints", kind=float, range=Range(0))
    )
    log_every: int = field(default=10, metadata={"range": Range(1)})
    init_from: str | None = field(
        default=None, metadata=spec("model folder to fine-tune from (new vocabulary allowed)")
    )
    n_train_tokens: int | None = None  # counted from the corpus when None
    precision: str = field(
        default="fp32",
        metadata=spec(
            "bf16 autocasts the forward pass (GPUs and CPUs with bf16 support)", choices=PRECISIONS
        ),
    )
    # 0 = the original recipe, which starts from zero only at step 0. A small value teaches the
    # model to start from the zero state, as stateless inference and bilm-tf's evaluation do.
    state_reset: float = field(
        default=0.0,
        metadata=spec(
            "probability of zeroing a row's carried LSTM state before a window "
            "(0 = original recipe; 0.01 teaches the model to start from zero)",
            kind=float,
            range=Range(0, high=1),
        ),
    )
    keep_checkpoints: int = field(
        default=1,
        metadata=spec(
            "keep the newest N checkpoints (besides the best), e.g. for export --average N",
            kind=int,
            range=Range(1),
            metavar="N",
        ),
    )

    def __post_init__(self) -> None:
        """The one check of every value: each option within its range, of its kind and among
        its choices, the GPUs and the device on this machine (``devices.resolve_device``), the
        batch within this machine's memory (``bounds.check_training_size``)."""
        for f in fields(self):
            _check_value(f, getattr(self, f.name))
        if self.gpus:
            if self.device != "cuda":
                raise ValueError(
                    f"--gpus places each process on its GPU: leave out --device (given {self.device!r})"
                )
            for gpu in self.gpus:
                resolve_device(f"cuda:{gpu}")
        else:
            resolve_device(self.device)
        if self.options:  # empty until --init-from's model is read
            check_training_size(
                BiLMOptions.from_dict(self.options, source="--config"),
                self.batch_size,
                self.unroll_steps,
                self.n_negative_samples,
            )


def _check_value(f: Field[Any], value: Any) -> None:
    """Raise ValueError naming the option of field ``f`` when ``value`` is not of its kind, outside
    its range or not among its choices (None: not given, always allowed)."""
    if value is None:
        return
    option = field_spec(f)
    allowed = f.metadata.get("range") or (option.range if option else None)
    if allowed is not None:
        whole = f.type in ("int", "int | None")
        if isinstance(value, bool) or not isinstance(value, int if whole else (int, float)):
            kind = "a whole number" if whole else "a number"
            raise ValueError(f"{option_name(f.name)} must be {kind}, got {value!r}")
        problem = allowed.problem(value)
        if problem:
            raise ValueError(f"{option_name(f.name)} {problem}")
    if option is not None and option.choices is not None and value not in option.choices:
        raise ValueError(f"{option_name(f.name)} must be one of {', '.join(option.choices)}, got {value!r}")
    if f.name == "gpus":
        if not isinstance(value, tuple) or not all(
            isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in value
        ):
            raise ValueError(f"--gpus must be GPU numbers, e.g. 0,1, got {value!r}")
        if len(set(value)) != len(value):
            raise ValueError(f"--gpus names a GPU twice: {','.join(map(str, value))}")


def check_option(name: str, value: Any) -> None:
    """Raise ValueError naming the option when ``value`` is not allowed for field ``name``."""
    _check_value(_FIELDS[name], value)


_FIELDS = {f.name: f for f in fields(TrainConfig)}

# Not stored in train_config.json: the run's folder and the GPUs of this session.
SESSION = ("save_dir", "gpus")

# What a resumed run may change; everything else (the model, the data order, the optimizer)
# stays the run's. The three limits are replaced together when any of them is given.
RESUMABLE = (
    "train",
    "vocab",
    "heldout",
    "epochs",
    "max_steps",
    "max_time",
    "device",
    "checkpoint_minutes",
    "keep_checkpoints",
    "precision",
)
LIMITS = ("epochs", "max_steps", "max_time")
DATA_PATHS = ("train", "vocab", "heldout")


def option_name(field_name: str) -> str:
    """The command-line option of a TrainConfig field."""
    return field_option(_FIELDS[field_name])


def train_options() -> Iterator[tuple[str, OptionSpec, Any]]:
    """The TrainConfig fields that ``elmokit train`` offers: (field name, spec, default; None
    when the field has none)."""
    for f, option in offered_fields(TrainConfig):
        yield f.name, option, field_default(f)


def save_config(config: TrainConfig) -> None:
    """Write train_config.json into the run's save dir (all fields but the session's)."""
    stored = {k: v for k, v in asdict(config).items() if k not in SESSION}
    write_json(Path(config.save_dir) / CONFIG_FILE, stored)


def training_options(options: dict[str, Any], source: str = "--config") -> dict[str, Any]:
    """The options a run trains with and stores, checked; bilm-tf's training value of
    ``n_characters`` (261: char ids 0..260 without a padding row) is written as 262, elmokit's
    layout (ids shifted by 1, 0 = padding) and bilm-tf's own value for inference."""
    cnn = options.get("char_cnn") if isinstance(options, dict) else None
    if isinstance(cnn, dict) and cnn.get("n_characters") == 261:
        options = {**options, "char_cnn": {**cnn, "n_characters": 262}}
    BiLMOptions.from_dict(options, source=source)
    return options


def _absolute(path: str) -> str:
    """A data path or glob made absolute, so that the run can be resumed from anywhere."""
    return os.path.abspath(os.path.expanduser(path))


def _resolved(path: str | None) -> str | None:
    """``_absolute(path)``, or None."""
    return None if path is None else _absolute(path)


def _given(values: Mapping[str, Any]) -> dict[str, Any]:
    """The values given (None, or ``{}`` for options, = not given); ``--gpus`` without
    ``--device`` means ``cuda``."""
    given = {k: v for k, v in values.items() if v is not None and v != {}}
    if given.get("gpus") and "device" not in given:
        given["device"] = "cuda"
    return given


def config_from_options(values: Mapping[str, Any]) -> TrainConfig:
    """A new run's configuration from the options given (field name -> value, None = not
    given); with no limit given, ``DEFAULT_EPOCHS`` epochs."""
    given = _given(values)
    if not any(k in given for k in LIMITS):
        given["epochs"] = DEFAULT_EPOCHS
    given.setdefault("options", {})
    return TrainConfig(**given)


def resume_config(save_dir: str | Path, values: Mapping[str, Any]) -> TrainConfig:
    """The configuration of the run in ``save_dir`` (its train_config.json) with the changes
    ``values`` asks for (field name -> value; None, or ``{}`` for options, = not given).

    The fields in RESUMABLE are applied, and those of the session (``save_dir``, ``gpus``); a
    given value of any other field must equal the run's, else TrainingError names its option.
    A changed ``--train`` has its tokens counted again; a changed ``--vocab`` must hold the
    run's vocabulary (the run reads its own copy). A stored value outside what its option
    allows is a TrainingError naming the file and the option."""
    folder = Path(save_dir)
    path = folder / CONFIG_FILE
    if not path.is_file():
        raise TrainingError(f"--resume: {folder} holds no run (no {CONFIG_FILE}); start it without --resume")
    known = {f.name for f in fields(TrainConfig)} - set(SESSION)
    stored = read_json(path)
    if not isinstance(stored, dict):
        raise TrainingError(f"{path}: not a run's configuration (a JSON object)")
    stored = {k: v for k, v in stored.items() if k in known}  # older versions wrote save_dir
    given = {k: v for k, v in _given(values).items() if k not in SESSION}
    for name in DATA_PATHS:
        if name in given:
            given[name] = _resolved(given[name])
    for name, value in given.items():
        if name in RESUMABLE or name == "n_train_tokens":  # the count follows --train
            continue
        ours = stored.get(name)
        if name == "options":
            same = isinstance(ours, dict) and (
                BiLMOptions.from_dict(training_options(value)) == BiLMOptions.from_dict(ours)
            )
        else:
            same = value == ours
        if not same:
            shown = "" if name == "options" else f" (the run's is {ours!r}, given {value!r})"
            raise TrainingError(
                f"{option_name(name)} cannot change when resuming{shown}; a resumed run may change "
                f"only {', '.join(option_name(n) for n in RESUMABLE)}"
            )
    changes = {k: v for k, v in given.items() if k in RESUMABLE}
    if any(k in changes for k in LIMITS):
        changes = {**{k: None for k in LIMITS}, **changes}
    if changes.get("train", stored.get("train")) != stored.get("train"):
        changes["n_train_tokens"] = None
    own = folder / VOCAB_FILE
    if changes.get("vocab", stored.get("vocab")) != stored.get("vocab") and own.is_file():
        if Vocabulary.from_file(changes["vocab"]).tokens != Vocabulary.from_file(own).tokens:
            raise TrainingError(
                f"--vocab {changes['vocab']} is not the run's vocabulary ({own}); a resumed run keeps it"
            )
    session = {k: v for k, v in _given(values).items() if k in SESSION}
    for name, value in {**changes, **session}.items():  # a given value: its option's own message
        check_option(name, value)
    merged = {**stored, **changes, **session, "save_dir": str(folder)}
    if merged.get("train") is None:
        raise TrainingError(f"{path} names no training data: pass --train")
    if isinstance(merged.get("gpus"), list):
        merged["gpus"] = tuple(merged["gpus"])
    if "device" in changes and not merged.get("gpus"):
        resolve_device(changes["device"])
    try:
        return TrainConfig(**merged)
    except TypeError as err:  # a field missing from the file
        raise TrainingError(f"{path}: not a run's configuration ({err})") from None
    except ValueError as err:
        raise TrainingError(f"{path}: {err}") from None


def _source_options(model_dir: str | Path) -> dict[str, Any]:
    """The options of a model to fine-tune from (a training save dir or an exported folder)."""
    folder = Path(model_dir)
    if SaveFolder(folder).latest_checkpoint() is not None:
        return read_json(folder / CONFIG_FILE)["options"]
    return BiLMOptions.from_file(folder / "options.json").to_dict()


def prepare_run(
    config: TrainConfig, resume: bool, new_data: bool = False, resume_from: str | None = None
) -> TrainConfig:
    """The configuration to run with, and the save dir checked (writable or makeable; no other
    run's checkpoint unless resuming), once, before any process starts. A new run has its data
    paths made absolute and its options checked (or read from ``--init-from``'s model); a resumed
    one (``config`` from ``resume_config``) has the checkpoint to continue from checked
    (``SaveFolder.resume_point``). A save dir whose run stopped before its first checkpoint
    may be started afresh, or resumed from step 0 with its stored configuration."""
    if new_data and not resume:
        raise ValueError("--new-data continues a run: give it with --resume")
    if resume_from is not None and not resume:
        raise ValueError("--resume-from continues a run: give it with --resume")
    save_dir = Path(config.save_dir)
    if resume:
        SaveFolder(save_dir).resume_point(resume_from)
    else:
        if SaveFolder(save_dir).latest_checkpoint() is not None:
            raise TrainingError(
                f"{save_dir} holds another run; pass --resume to continue it or choose another --save-dir"
            )
        options = _source_options(config.init_from) if config.init_from else config.options
        config = replace(
            config,
            train=_absolute(config.train),
            vocab=_resolved(config.vocab),
            heldout=_resolved(config.heldout),
            options=training_options(options),
        )
    _check_writable(save_dir)
    return config


def _check_writable(save_dir: Path) -> None:
    """Raise TrainingError unless files can be written in ``save_dir``, or it can be made (it is
    not made here: a run that fails its checks leaves nothing behind)."""
    try:
        if save_dir.exists():
            with tempfile.TemporaryFile(dir=save_dir):
                pass
            return
        parent = save_dir.parent
        while not parent.exists():
            parent = parent.parent
        if not parent.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR))
        if not os.access(parent, os.W_OK | os.X_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
    except OSError as err:
        raise TrainingError(f"cannot write to --save-dir {save_dir}: {err.strerror or err}") from None
