"""What the Embedder runs each batch through: a runner, ``runner(char_ids, state) -> BiLMOutput``.

Three runners: ``TorchRunner`` (the model's own forward, float32 or bfloat16, on any device),
``Int8Runner`` (``elmokit.model.int8``'s form of the model, on the CPU) and ``OnnxRunner`` (an ONNX
export run by onnxruntime, ``elmokit.embed.onnx_export``). ``make_runner`` is the one place that
turns the Embedder's ``model``, ``device``, ``dtype``, ``backend`` and ``onnx_file`` into a
runner. Each runner carries its ``recipe``, a small frozen dataclass that pickles: a worker
process (``embed_file`` with ``processes=N``) rebuilds the same runner with
``recipe.build(runner.bilm, device)``.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

import torch

from ..base.devices import resolve_device
from ..model.bilm import BiLM, BiLMOutput
from ..model.int8 import check_int8, quantize_bilm
from ..model.lstm import LstmState

__all__: list[str] = []

BACKENDS = ("torch", "onnxruntime")
DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


class Runner(Protocol):
    """``runner(char_ids, state) -> BiLMOutput``: char_ids (batch, timesteps, max_chars) as
    ``bilm.batch_to_ids`` gives them (on the CPU), ``state`` an LstmState for the batch or None
    (the model's start state, zeros when it has none); the output as ``BiLM.forward``'s."""

    recipe: Recipe  # how to build the same runner again (in a worker process)
    bilm: BiLM  # the model in torch: its input ids, layers, states and token encoder
    model_name: str  # the model as it was given (a name, a folder, a URL): Parquet's metadata
    source_files: tuple[Path, ...]  # the files read (the model's, the ONNX file): never outputs

    @property
    def like(self) -> torch.Tensor:
        """A tensor of the device and dtype that the states handed to ``__call__`` are made in."""
        ...

    def __call__(self, char_ids: torch.Tensor, state: LstmState | None) -> BiLMOutput: ...


@contextmanager
def evaluating(module: torch.nn.Module) -> Iterator[None]:
    """Run ``module`` in eval mode (no dropout) and give it back in the mode it had. A module
    already in eval mode throughout is left alone: setting the mode and back walks every
    submodule twice, which one sentence per call pays at every call."""
    if not any(m.training for m in module.modules()):
        yield
        return
    was_training = module.training
    module.eval()
    try:
        yield
    finally:
        module.train(was_training)


@dataclass(frozen=True)
class Recipe:
    """How a runner is built: ``backend`` "torch" or "onnxruntime", ``dtype`` "float32",
    "bfloat16" or "int8" (one name for each), ``onnx_file`` (onnxruntime: the exported file, or
    None: the model exported in memory) and the model's name as given."""

    backend: str = "torch"
    dtype: str = "float32"
    onnx_file: str | None = None
    model_name: str = ""

    @classmethod
    def of(
        cls,
        dtype: str | torch.dtype = torch.float32,
        backend: str = "torch",
        onnx_file: str | os.PathLike | None = None,
        model_name: str = "",
    ) -> Recipe:
        """The recipe of the Embedder's arguments; a bad ``dtype`` is a one-line ValueError."""
        if dtype == "int8":
            name = "int8"
        else:
            if isinstance(dtype, str):
                if dtype not in DTYPES:
                    raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
                dtype = DTYPES[dtype]
            if dtype not in (torch.float32, torch.bfloat16):
                raise ValueError(f"dtype must be torch.float32 or torch.bfloat16, got {dtype}")
            name = str(dtype).removeprefix("torch.")
        return cls(backend, name, None if onnx_file is None else os.fspath(onnx_file), model_name)

    @property
    def torch_dtype(self) -> torch.dtype:
        """The dtype the torch model runs in (the int8 form: float32 between its int8 matmuls)."""
        return torch.bfloat16 if self.dtype == "bfloat16" else torch.float32

    def build(
        self, model: BiLM | str | os.PathLike | None, device: str | torch.device | None = None
    ) -> Runner:
        """The runner: ``model`` a BiLM (never changed: a copy runs where it must move) or any form
        ``BiLM.from_pretrained`` takes; ``device`` None is cuda when there is a GPU (torch
        backend, not int8), else the model's device."""
        int8 = self.dtype == "int8"
        torch_int8 = int8 and self.backend == "torch"
        if torch_int8:
            check_int8("cpu" if device is None else device)  # before any device is looked for
        bilm = model if isinstance(model, BiLM) else BiLM.from_pretrained(model)
        recipe = replace(self, model_name=self.model_name or _model_name(model, bilm))
        if device is None:
            gpu = torch.cuda.is_available() and self.backend == "torch" and not int8
            device = "cuda" if gpu else next(bilm.parameters()).device
        device = resolve_device(device)
        onnx = self.backend != "torch" or self.onnx_file is not None
        if torch_int8 and not onnx:
            return Int8Runner(bilm, recipe)
        moved = _moved(bilm, device, recipe.torch_dtype, bilm is model)
        if moved is not model:
            moved.eval()
        return OnnxRunner(moved, recipe) if onnx else TorchRunner(moved, recipe)


def make_runner(
    model: BiLM | str | os.PathLike | None = None,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype = torch.float32,
    backend: str = "torch",
    onnx_file: str | os.PathLike | None = None,
) -> Runner:
    """The runner of the Embedder's arguments of the same names (see ``Embedder``): the torch
    model, its int8 form (``dtype`` "int8"), or onnxruntime (``backend`` "onnxruntime")."""
    return Recipe.of(dtype, backend, onnx_file).build(model, device)


def _moved(bilm: BiLM, device: torch.device, dtype: torch.dtype, handed_in: bool) -> BiLM:
    """``bilm`` on ``device`` in ``dtype``: a model handed in is never changed (a copy moves),
    one loaded here moves itself."""
    weight = next(bilm.parameters())
    if weight.device == device and weight.dtype == dtype:
        return bilm
    return (copy.deepcopy(bilm) if handed_in else bilm).to(device=device, dtype=dtype)


def _model_name(model: object, bilm: BiLM) -> str:
    """The model as it was given (a name, a folder, a URL), or the folder of a BiLM's files."""
    if isinstance(model, (str, os.PathLike)):
        return os.fspath(model)
    if bilm.source_files:
        return bilm.source_files[0].parent.name
    return ""


class TorchRunner:
    """The model's own forward, in eval mode for the duration of a batch, on its device: its
    token encodings come through its one token cache, and its vectors equal
    ``bilm(bilm.batch_to_ids(batch))``'s bit for bit."""

    def __init__(self, bilm: BiLM, recipe: Recipe) -> None:
        self.bilm, self.recipe = bilm, recipe
        self.model_name = recipe.model_name
        self.source_files: tuple[Path, ...] = tuple(bilm.source_files)

    @property
    def like(self) -> torch.Tensor:
        return next(self.bilm.parameters())

    def __call__(self, char_ids: torch.Tensor, state: LstmState | None) -> BiLMOutput:
        with evaluating(self.bilm):
            return self.bilm(char_ids.to(self.like.device), state)


class Int8Runner(TorchRunner):
    """``TorchRunner`` of the int8 form of the model (``elmokit.model.int8.quantize_bilm``: a copy
    on the CPU; a model already in that form runs as it is)."""

    def __init__(self, bilm: BiLM, recipe: Recipe) -> None:
        super().__init__(quantize_bilm(bilm), recipe)


class OnnxRunner:
    """An ONNX export of ``bilm`` run by onnxruntime on the CPU in float32 (or its int8 graph):
    ``recipe.onnx_file`` (checked against ``bilm``'s weights), or ``bilm`` exported in memory.
    The warm start state (``state`` None) is the one held in the file."""

    def __init__(self, bilm: BiLM, recipe: Recipe) -> None:
        backend, onnx_file, int8 = recipe.backend, recipe.onnx_file, recipe.dtype == "int8"
        if backend not in BACKENDS:
            raise ValueError(f"backend must be torch or onnxruntime, got {backend!r}")
        if backend != "onnxruntime":
            raise ValueError(
                f"onnx_file {onnx_file} runs on the onnxruntime backend: pass backend='onnxruntime'"
            )
        weight = next(bilm.parameters())
        if weight.device.type != "cpu" or weight.dtype != torch.float32:
            raise ValueError("backend onnxruntime runs on the CPU in float32 or int8: pass device='cpu'")
        from .onnx_export import OnnxBiLM, export_onnx, quantize_int8

        data = export_onnx(bilm, int8=int8) if onnx_file is None else onnx_file
        session = OnnxBiLM(data, bilm)
        if session.dtype != ("int8" if int8 else "float32"):
            if not int8 or onnx_file is None:
                raise ValueError(f"{onnx_file} is an {session.dtype} export: pass dtype='int8' to run it")
            session = OnnxBiLM(quantize_int8(Path(onnx_file).read_bytes()), bilm)
        self.bilm, self.recipe, self.session = bilm, recipe, session
        self.model_name = recipe.model_name
        extra = () if onnx_file is None else (Path(onnx_file),)
        self.source_files: tuple[Path, ...] = (*bilm.source_files, *extra)

    @property
    def like(self) -> torch.Tensor:
        return torch.zeros(0)

    def __call__(self, char_ids: torch.Tensor, state: LstmState | None) -> BiLMOutput:
        return self.session(char_ids, state)
