"""ONNX export of a biLM, and the runtime that runs an exported file through onnxruntime.

The graph (``export_onnx``, ``elmokit export-onnx``) takes what ``BiLM.forward`` takes and gives
what it gives:

- inputs: ``char_ids`` int64 (batch, timesteps, input_width) from the model's ``batch_to_ids``;
  ``initial_h`` (n_layers, 2, rows, projection_dim) and ``initial_c`` (n_layers, 2, rows, dim),
  both optional: left out, every row starts from the model's start state (zeros for a model
  without one), which the file holds (warm mode); given, ``rows`` is 1 (the same state for every
  row) or the batch;
- outputs: ``layers`` (num_layers, batch, timesteps, 2 * projection_dim), zero past each row's
  length; ``mask`` bool (batch, timesteps); ``final_h`` and ``final_c``, each row's state after
  its last position (</S>), usable as the next call's initial state.

Batch and length are dynamic, and the graph handles any length: each LSTM layer is one ONNX
``Scan`` (``elmokit.model.scan_lstm``). The token encoder runs over the characters it is given (the
plain form of ``CharCNN``: a convolution, its max over positions); the char width is dynamic too,
and ``OnnxBiLM`` feeds only the characters a batch needs (``_CharTrim``, exact). The file
records a fingerprint of the weights it was exported from, and ``OnnxBiLM`` refuses to pair it
with another model.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..base.atomic import atomic_path, check_output
from ..model.bilm import BiLM, BiLMOutput, StateArg
from ..model.characters import lengths_from_ids
from ..model.lstm import LstmState
from ..model.scan_lstm import reverse_index, scan_bilstm

logger = logging.getLogger(__name__)

__all__ = ["export_onnx"]

FORMAT = "elmokit-bilm-1"  # metadata "elmokit.format": what the inputs and outputs are
INPUTS = ("char_ids", "initial_h", "initial_c")
OUTPUTS = ("layers", "mask", "final_h", "final_c")
OPSET = 18
EXTRA_HINT = "pip install 'elmokit[onnx]'"


def require_onnx(what: str = "the onnxruntime backend") -> None:
    """Raise a one-line ImportError when onnx or onnxruntime is missing."""
    for name in ("onnx", "onnxruntime"):
        try:
            __import__(name)
        except ImportError:
            raise ImportError(f"{what} needs the package {name}: {EXTRA_HINT}") from None


def model_fingerprint(bilm: BiLM) -> str:
    """sha256 of a model's options, weights and start state: what an exported file was made from."""
    digest = hashlib.sha256(json.dumps(bilm.options.to_dict(), sort_keys=True).encode())
    tensors = [(name, p) for name, p in bilm.state_dict().items()]
    if bilm.start_state is not None:
        tensors += [("start_state.h", bilm.start_state.h), ("start_state.c", bilm.start_state.c)]
    for name, tensor in tensors:
        digest.update(name.encode())
        digest.update(tensor.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return digest.hexdigest()


class _Graph(nn.Module):
    """What is exported: ``BiLM.forward`` in a form ``torch.export`` takes with dynamic shapes."""

    def __init__(self, bilm: BiLM) -> None:
        super().__init__()
        self.bilm = bilm

    def encode(self, ids: torch.Tensor) -> torch.Tensor:
        """The token encoder over the characters given: (n, width) -> (n, projection_dim)."""
        encoder = self.bilm.token_encoder
        cnn = encoder.char_cnn
        chars = ids if encoder.word_embedding is None else ids[:, :-1]
        x = cnn.embedding(chars).transpose(1, 2)
        pooled = [F.conv1d(x, conv.weight, conv.bias).amax(dim=-1) for conv in cnn.filter_convolutions]
        features = encoder.highway(cnn.activation(torch.cat(pooled, dim=-1)))
        if encoder.word_embedding is not None:
            features = torch.cat([encoder.word_embedding(ids[:, -1]), features], dim=-1)
        return features if encoder.projection is None else encoder.projection(features)

    def forward(
        self, char_ids: torch.Tensor, initial_h: torch.Tensor, initial_c: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        batch, steps, width = char_ids.shape
        words = lengths_from_ids(char_ids)  # (batch,)
        boundary = self.bilm._boundary_ids  # (2, input_width), cut to the width given
        if self.bilm.token_encoder.word_embedding is None:
            boundary = boundary[:, :width]
        else:
            boundary = torch.cat([boundary[:, : width - 1], boundary[:, -1:]], dim=1)
        bos, eos = boundary[0], boundary[1]
        ids = torch.cat([bos.expand(batch, 1, width), char_ids, torch.zeros_like(char_ids[:, :1])], dim=1)
        positions = torch.arange(steps + 2, device=ids.device).unsqueeze(0)  # (1, steps + 2)
        ids = torch.where((positions == (words + 1).unsqueeze(1)).unsqueeze(-1), eos, ids)
        real = positions < (words + 2).unsqueeze(1)  # (batch, steps + 2)
        tokens = self.encode(ids.reshape(-1, width)).view(batch, steps + 2, -1)
        dim = tokens.shape[-1]
        reverse = reverse_index(real).unsqueeze(-1).expand(-1, -1, dim)
        inputs = torch.stack([tokens, tokens.gather(1, reverse)])
        outputs, final = scan_bilstm(self.bilm.lstm, inputs, real, LstmState(initial_h, initial_c))
        backward = outputs[:, 1].gather(2, reverse.unsqueeze(0).expand_as(outputs[:, 1]))
        forward = outputs[:, 0]
        layers = torch.cat(
            [torch.cat([tokens, tokens], dim=-1).unsqueeze(0), torch.cat([forward, backward], dim=-1)]
        )[:, :, 1 : steps + 1]
        mask = positions[:, :steps] < words.unsqueeze(1)
        layers = torch.where(mask.unsqueeze(0).unsqueeze(-1), layers, torch.zeros_like(layers))
        return layers, mask, final.h, final.c


class _CharTrim(NamedTuple):
    """How many characters of each token the graph needs (``CharCNN.forward``'s exact shortcut):
    a window of padding characters only gives the same value for every token, so the first
    ``L + max_filter_width`` characters hold all a token's windows that matter (L: one past its
    last character that is not padding). The runtime cuts ``char_ids`` to that width for the
    longest real token of the batch; the graph takes any width from ``min_width`` on."""

    padding_id: int
    max_chars: int
    max_filter_width: int
    word_column: bool
    min_width: int

    @classmethod
    def of(cls, bilm: BiLM) -> _CharTrim:
        cnn = bilm.token_encoder.char_cnn
        widest = max(conv.kernel_size[0] for conv in cnn.filter_convolutions)
        word = bilm.token_encoder.word_embedding is not None
        boundary = cls(cnn.padding_id, cnn.max_chars, widest, word, 0).needed(bilm._boundary_ids.cpu())
        return cls(cnn.padding_id, cnn.max_chars, widest, word, boundary + int(word))

    def needed(self, ids: torch.Tensor) -> int:
        """The characters the real tokens of ``ids`` (..., input_width) need (at most max_chars)."""
        chars = ids[..., : self.max_chars]
        real = (ids > 0).any(dim=-1)
        if not bool(real.any()):
            return min(self.max_chars, 1 + self.max_filter_width)
        positions = torch.arange(1, self.max_chars + 1)
        last = int(((chars != self.padding_id) * positions).amax(dim=-1)[real].max())
        return min(self.max_chars, last + self.max_filter_width)

    def cut(self, ids: torch.Tensor) -> torch.Tensor:
        """``ids`` with only the characters its real tokens need (the word column kept)."""
        width = max(self.needed(ids), self.min_width - int(self.word_column))
        if width >= self.max_chars:
            return ids
        return torch.cat([ids[..., :width], ids[..., -1:]], dim=-1) if self.word_column else ids[..., :width]


def _start_state(bilm: BiLM) -> LstmState:
    """The state a row starts from in warm mode, one row: h (n_layers, 2, 1, proj), c (.., dim)."""
    state = bilm.initial_state(1)
    return LstmState(state.h.detach().float().cpu(), state.c.detach().float().cpu())


def export_onnx(
    bilm: BiLM, output: str | os.PathLike | None = None, overwrite: bool = False, int8: bool = False
) -> bytes:
    """Export ``bilm`` (float32, CPU) as an ONNX graph (see the module docstring); with ``int8``
    its matmuls quantized (``quantize_int8``); write it to ``output`` when given (atomically; an
    existing file only with ``overwrite``). Returns the file's bytes."""
    require_onnx("ONNX export")
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    if output is not None:  # never over a file the model was read from (its weights, its archive)
        check_output(output, overwrite, bilm.source_files)
    source = bilm
    if _device_or_dtype_differ(bilm):  # the given model is never changed: export a copy
        bilm = copy.deepcopy(bilm).to("cpu", torch.float32)
    was_training = bilm.training
    graph = _Graph(bilm).eval()  # the model in eval mode (no dropout) until the export is done
    opt = bilm.options.lstm
    example_ids = bilm.batch_to_ids([["a", "b", "c"], ["d", "e"]]).cpu()
    start = _start_state(bilm)
    example_state = (
        start.h.expand(-1, -1, 2, -1).contiguous(),
        start.c.expand(-1, -1, 2, -1).contiguous(),
    )
    batch, steps = torch.export.Dim("batch", min=1), torch.export.Dim("timesteps", min=1)
    trim = _CharTrim.of(bilm)
    chars = torch.export.Dim("width", min=trim.min_width, max=bilm.token_encoder.input_width)
    dynamic = {"char_ids": {0: batch, 1: steps, 2: chars}, "initial_h": {2: batch}, "initial_c": {2: batch}}
    try:
        with warnings.catch_warnings(), torch.no_grad(), _quiet_exporter():
            warnings.simplefilter("ignore")
            program = torch.onnx.export(
                graph,
                (example_ids, *example_state),
                dynamic_shapes=dynamic,
                input_names=list(INPUTS),
                output_names=list(OUTPUTS),
                opset_version=OPSET,
                dynamo=True,
                verbose=False,
                optimize=True,
            )
    finally:
        bilm.train(was_training)
    if program is None:  # torch returns None only for the legacy (dynamo=False) exporter
        raise RuntimeError("torch.onnx.export returned no program")
    model = program.model_proto
    # The state inputs become optional: the given state (1 or `batch` rows) is broadcast to the
    # batch, and a state left out is the start state held in the file (an overridable initializer).
    g = model.graph
    renamed = {"initial_h": "_state_h", "initial_c": "_state_c"}
    for node in g.node:
        node.input[:] = [renamed.get(name, name) for name in node.input]
    kept = [i for i in g.input if i.name not in renamed]
    del g.input[:]
    g.input.extend(kept)
    shape_nodes = [
        helper.make_node("Shape", ["char_ids"], ["_batch"], start=0, end=1),
        helper.make_node("Concat", ["_layers_dirs", "_batch", "_proj"], ["_shape_h"], axis=0),
        helper.make_node("Concat", ["_layers_dirs", "_batch", "_dim"], ["_shape_c"], axis=0),
        helper.make_node("Expand", ["initial_h", "_shape_h"], ["_state_h"]),
        helper.make_node("Expand", ["initial_c", "_shape_c"], ["_state_c"]),
    ]
    for node in reversed(shape_nodes):
        g.node.insert(0, node)
    g.initializer.extend(
        [
            numpy_helper.from_array(np.array([opt.n_layers, 2], dtype=np.int64), "_layers_dirs"),
            numpy_helper.from_array(np.array([opt.projection_dim], dtype=np.int64), "_proj"),
            numpy_helper.from_array(np.array([opt.dim], dtype=np.int64), "_dim"),
            numpy_helper.from_array(start.h.numpy(), "initial_h"),
            numpy_helper.from_array(start.c.numpy(), "initial_c"),
        ]
    )
    for name, size in (("initial_h", opt.projection_dim), ("initial_c", opt.dim)):
        g.input.append(
            helper.make_tensor_value_info(name, TensorProto.FLOAT, [opt.n_layers, 2, "state_rows", size])
        )
    metadata = {
        "elmokit.format": FORMAT,
        "elmokit.fingerprint": model_fingerprint(source),
        "elmokit.options": json.dumps(bilm.options.to_dict(), sort_keys=True),
        "elmokit.model_class": type(source).__name__,
        "elmokit.char_trim": json.dumps(trim._asdict()),
    }
    del model.metadata_props[:]
    for key, value in metadata.items():
        model.metadata_props.add(key=key, value=value)
    onnx.checker.check_model(model)
    data = model.SerializeToString()
    if int8:
        data = quantize_int8(data)
    if output is not None:
        with atomic_path(output, overwrite) as tmp:
            tmp.write_bytes(data)
        logger.info("wrote %s (%d bytes)", output, len(data))
    return data


@contextmanager
def _quiet_exporter() -> Iterator[None]:
    """Silence the exporter's log lines about operators of packages elmokit does not use."""
    registry = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = registry.level
    registry.setLevel(logging.ERROR)
    try:
        yield
    finally:
        registry.setLevel(level)


def quantize_int8(data: bytes) -> bytes:
    """An exported graph with int8 weights: onnxruntime's dynamic quantization of every MatMul (the
    LSTM steps inside the Scans included; activations quantized per call), the char CNN's
    convolutions kept in float32. Opt-in and not exact: docs/export.md gives its accuracy."""
    require_onnx("int8 quantization")
    import tempfile

    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    model = onnx.load_model_from_string(data)
    metadata = {p.key: p.value for p in model.metadata_props}
    if metadata.get("elmokit.dtype", "float32") != "float32":
        raise ValueError(f"the graph is already {metadata['elmokit.dtype']}")
    with tempfile.TemporaryDirectory() as folder, _quiet_quantizer():
        target = Path(folder) / "int8.onnx"
        quantize_dynamic(
            model,
            target,
            op_types_to_quantize=["MatMul"],
            weight_type=QuantType.QInt8,
            extra_options={"EnableSubgraph": True},
        )
        quantized = onnx.load(str(target))
    kept = {p.key: p.value for p in quantized.metadata_props if p.key.startswith("elmokit.")}
    kept["elmokit.dtype"] = "int8"
    del quantized.metadata_props[:]
    for key, value in kept.items():
        quantized.metadata_props.add(key=key, value=value)
    return quantized.SerializeToString()


@contextmanager
def _quiet_quantizer() -> Iterator[None]:
    """onnxruntime's quantizer logs advice through the root logger; keep it off the user's screen."""
    before = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(before)


def _device_or_dtype_differ(bilm: BiLM) -> bool:
    weight = next(bilm.parameters())
    return weight.device.type != "cpu" or weight.dtype != torch.float32


class OnnxBiLM:
    """An exported biLM run by onnxruntime on the CPU, called as ``BiLM.forward`` is:
    ``onnx_bilm(char_ids, state)`` -> ``BiLMOutput`` (layers, mask, final state) as torch tensors.

    source: the file's path or its bytes. ``bilm``: the model it must have been exported from
    (its fingerprint is checked; None skips the check). ``threads``: onnxruntime's intra-op
    threads (None: torch's setting). A file that is not an elmokit ONNX export, is damaged, or
    was made from other weights is a ValueError naming it."""

    def __init__(
        self, source: str | os.PathLike | bytes, bilm: BiLM | None = None, threads: int | None = None
    ) -> None:
        require_onnx()
        import onnx
        import onnxruntime as ort

        self.name = "the exported model" if isinstance(source, bytes) else str(source)
        data = source if isinstance(source, bytes) else _read_file(Path(source))
        try:
            proto = onnx.load_model_from_string(data)
        except Exception as err:  # protobuf's DecodeError and others: the file is not ONNX
            raise ValueError(f"{self.name}: not an ONNX file ({_first_line(err)})") from None
        metadata = {p.key: p.value for p in proto.metadata_props}
        if metadata.get("elmokit.format") != FORMAT:
            raise ValueError(
                f"{self.name}: not an ONNX file exported by elmokit export-onnx "
                f"(metadata elmokit.format is {metadata.get('elmokit.format')!r}, expected {FORMAT!r})"
            )
        if bilm is not None and metadata.get("elmokit.fingerprint") != model_fingerprint(bilm):
            raise ValueError(
                f"{self.name} was exported from other weights than the model given; export this "
                "model again (elmokit export-onnx MODEL OUT.onnx)"
            )
        self.dtype = metadata.get("elmokit.dtype", "float32")  # "int8": quantize_int8's graph
        trim = metadata.get("elmokit.char_trim")
        self.trim = None if trim is None else _CharTrim(**json.loads(trim))
        options = json.loads(metadata.get("elmokit.options", "{}"))
        lstm = options.get("lstm", {})
        self.n_layers = int(lstm.get("n_layers", 0))
        self.state_dims = (int(lstm.get("projection_dim", 0)), int(lstm.get("dim", 0)))
        settings = ort.SessionOptions()
        settings.intra_op_num_threads = threads or torch.get_num_threads()
        settings.inter_op_num_threads = 1
        settings.log_severity_level = 3
        try:
            self.session = ort.InferenceSession(data, settings, providers=["CPUExecutionProvider"])
        except Exception as err:  # onnxruntime's Fail, InvalidGraph, ...: a damaged graph
            raise ValueError(f"{self.name}: onnxruntime cannot load it ({_first_line(err)})") from None
        names = [i.name for i in self.session.get_inputs()]  # the required ones
        names += [i.name for i in self.session.get_overridable_initializers() if i.name in INPUTS]
        if names != list(INPUTS) or [o.name for o in self.session.get_outputs()] != list(OUTPUTS):
            raise ValueError(f"{self.name}: its inputs {names} are not those of an elmokit export")

    def __call__(self, char_ids: torch.Tensor, state: StateArg = None) -> BiLMOutput:
        """char_ids (batch, timesteps, input_width); state None (the start state held in the
        file), "zero", or an LstmState for the batch (or one row)."""
        ids = char_ids.detach().cpu().to(torch.int64)
        if self.trim is not None and ids.numel():
            ids = self.trim.cut(ids)
        feeds = {"char_ids": ids.numpy()}
        if isinstance(state, str):
            if state != "zero":
                raise ValueError(f"state must be an LstmState, None or 'zero', got {state!r}")
            proj, dim = self.state_dims
            state = LstmState(torch.zeros(self.n_layers, 2, 1, proj), torch.zeros(self.n_layers, 2, 1, dim))
        if state is not None:
            rows = state.h.shape[2]
            if rows not in (1, char_ids.shape[0]):
                raise ValueError(f"state has {rows} rows for a batch of {char_ids.shape[0]}")
            feeds["initial_h"] = state.h.detach().float().cpu().contiguous().numpy()
            feeds["initial_c"] = state.c.detach().float().cpu().contiguous().numpy()
        layers, mask, h, c = self.session.run(list(OUTPUTS), feeds)
        final = LstmState(torch.from_numpy(h), torch.from_numpy(c))
        return BiLMOutput(torch.from_numpy(layers), torch.from_numpy(mask), final)


def _read_file(path: Path) -> bytes:
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a folder, not an ONNX file")
    if not path.is_file():
        raise FileNotFoundError(f"ONNX file not found: {path}")
    return path.read_bytes()


def _first_line(err: BaseException, width: int = 160) -> str:
    text = str(err).strip().splitlines()
    return (text[0] if text else type(err).__name__)[:width]
