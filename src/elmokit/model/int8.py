"""An inference-only int8 form of a BiLM: its big matmuls with int8 weights (PyTorch's fbgemm).

``quantize_bilm(bilm)`` gives a new BiLM (the one handed in is never changed) whose LSTM input,
recurrent and projection matmuls, char CNN convolutions (``Int8CharCNN``: all filter widths in
one matmul, for tokens up to 20 characters), highway layers and token projection run PyTorch's
dynamic quantized linear (``torch.ops.quantized.linear_dynamic``): weights int8, symmetric, one
scale per output channel, prepacked once; activations quantized per call (one scale per tensor,
so a sentence's vectors depend slightly on the others in its batch). The char embedding and the
convolutions of longer tokens stay float32, and so do the cell's elementwise steps
(``base.kernels.lstm_cell_``, the float kernel's): the same gate order (i, j, f, o), forget
bias, cell clip and projection clip as ``elmokit.model.lstm``. The outputs contract is the
model's (layers, mask, final state), so every mode of the Embedder works on it.

Each LSTM direction runs as one function of its steps (``direction_steps``), which TorchScript
compiles (the kernel ``lstm_scripted``): at one sentence per call the int8 matmuls are so small
that calling them one by one from Python took a third of the time or more. Speed and accuracy
are measured in docs/export.md, "int8 on the PyTorch path".

CPU only, and only where PyTorch has a quantized engine (x86, fbgemm or qnnpack).
"""

from __future__ import annotations

import copy
import logging
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar, cast

import torch
from torch import nn

from ..base import kernels
from ..base.kernels import lstm_cell_
from .bilm import BiLM
from .char_cnn import CharCNN
from .lstm import FORGET_BIAS, INPUT_CHUNK_ELEMENTS, BiLstmLayer, Packing
from .options import CharCNNOptions

__all__ = ["quantize_bilm"]

logger = logging.getLogger(__name__)

ENGINES = ("x86", "fbgemm", "qnnpack")

# The revision of the int8 form's numbers, raised whenever they change (so that caches of int8
# layers, ``tasks.LayerCache``, are computed again): 2 = the LSTM projection int8 at every row
# count (1: float32 at one row); 3 = the char CNN's convolutions int8 (Int8CharCNN).
FORM = 3

T = TypeVar("T")


@contextmanager
def _quiet_quantization() -> Iterator[None]:
    """PyTorch's deprecation warning of its quantized tensors, silenced here only."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"torch\.quantize_per_tensor", category=UserWarning)
        yield


def check_int8(device: torch.device | str) -> None:
    """A one-line ValueError unless int8 can run here: on the CPU, with a quantized engine."""
    if torch.device(device).type != "cpu":
        raise ValueError(f"dtype int8 runs on the CPU only, not on {device}: pass device='cpu'")
    engine = torch.backends.quantized.engine
    if engine not in ENGINES:
        supported = ", ".join(torch.backends.quantized.supported_engines) or "none"
        raise ValueError(
            f"dtype int8 needs PyTorch's quantized engine x86, fbgemm or qnnpack; this PyTorch "
            f"uses {engine!r} (supported: {supported})"
        )


def reduce_range() -> bool:
    """Whether activations are quantized to 7 bits rather than 8: on x86 without VNNI, where
    fbgemm's 8-bit products are summed in pairs into int16 and can saturate (qnnpack and VNNI's
    int32 sums cannot). 8 bits halve the error: on the shipped model the mean cosine of the
    first LSTM layer to float32 goes from 0.9982 to 0.9993 (docs/export.md)."""
    if torch.backends.quantized.engine == "qnnpack":
        return False
    capabilities = torch.cpu.get_capabilities()
    return not (capabilities.get("avx512_vnni") or capabilities.get("avx_vnni"))


class Int8Linear(nn.Module):
    """y = x W^T + b with W int8 (per output channel, symmetric) and x quantized per call:
    (..., in_features) -> (..., out_features), float32 in and out.

    It pickles (and deep-copies) as its int8 values, scales and bias, and packs them again when
    loaded: the packed weight itself cannot be sent to another process (``embed_file`` with
    ``processes=N``)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        """weight (out_features, in_features) and bias (out_features,) in float32."""
        super().__init__()
        weight = weight.detach().float().cpu().contiguous()
        scales = (weight.abs().amax(dim=1) / 127.0).clamp(min=1e-12).double()
        with _quiet_quantization():
            quantized = torch.quantize_per_channel(
                weight, scales, torch.zeros_like(scales).long(), 0, torch.qint8
            )
        self._pack(quantized.int_repr(), scales, None if bias is None else bias.detach().float().cpu())

    def _pack(self, values: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None) -> None:
        """Pack int8 values (out_features, in_features) with their per-row scales (float64)."""
        self.out_features, self.in_features = values.shape
        weight = (values.double() * scales.unsqueeze(1)).float()  # requantized to the same values
        with _quiet_quantization():
            quantized = torch.quantize_per_channel(
                weight, scales, torch.zeros_like(scales).long(), 0, torch.qint8
            )
            self._packed = torch.ops.quantized.linear_prepack(quantized, bias)
        self.reduce_range = reduce_range()

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        weight, bias = torch.ops.quantized.linear_unpack(self._packed)
        # as numpy arrays, pickled by value: a temporary tensor sent to a spawned process would
        # go through shared memory and be freed before the process reads it
        arrays = (weight.int_repr(), weight.q_per_channel_scales(), bias)
        state["_packed"] = tuple(None if a is None else a.numpy() for a in arrays)
        return state

    def __setstate__(self, state: dict) -> None:
        values, scales, bias = (None if a is None else torch.from_numpy(a) for a in state.pop("_packed"))
        self.__dict__.update(state)
        assert values is not None and scales is not None
        self._pack(values, scales, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.quantized.linear_dynamic(x, self._packed, self.reduce_range)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


class Int8CharCNN(CharCNN):
    """``CharCNN`` whose convolutions run as one int8 matmul, inference only: (n_tokens,
    max_chars) -> (n_tokens, n_filters), as ``CharCNN``.

    In a length bucket whose rows end in ``max_width`` padding characters (the buckets up to 20
    characters, nearly every token), the filters of every width are one matmul of the windows
    of ``max_width`` characters, (n * positions, char_dim * max_width), with the filters side by
    side, each zero past its own width. A narrower filter's windows past the last full-width
    window hold padding only, and a full-width window of padding only is among the positions,
    so the max over positions is the convolutions' (up to int8 rounding). Rows of the longest
    bucket go through the float32 convolutions."""

    def __init__(self, options: CharCNNOptions, cnn: CharCNN) -> None:
        """The int8 form of ``cnn`` (not changed), a char CNN made with ``options``."""
        with torch.random.fork_rng(devices=[]):  # the initial weights, replaced below, draw nothing
            super().__init__(options, cnn.padding_id)
        self.load_state_dict(cnn.state_dict())
        self.max_width = max(width for width, _ in options.filters)
        self.windows = Int8Linear(*stacked_filters(self, self.max_width))

    def _convolve(self, char_ids: torch.Tensor, padded_tail: bool = False) -> torch.Tensor:
        """(n, width) -> (n, n_filters); one int8 matmul where ``padded_tail``, else float32."""
        if not padded_tail:
            return super()._convolve(char_ids)
        n = char_ids.shape[0]
        x = self.embedding(char_ids)  # (n, width, char_dim)
        # (n, positions, char_dim, max_width) -> (n * positions, char_dim * max_width)
        windows = x.unfold(1, self.max_width, 1).reshape(-1, x.shape[-1] * self.max_width)
        return self.activation(self.windows(windows).view(n, -1, self.output_dim).amax(dim=1))


def stacked_filters(cnn: CharCNN, max_width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The filters of every width of ``cnn`` side by side, each zero past its own width: weight
    (n_filters, char_dim * max_width) in the layout of unfolded windows (char_dim, max_width),
    bias (n_filters,)."""
    convs = cnn.filter_convolutions
    first = convs[0].weight
    weight = first.new_zeros(cnn.output_dim, first.shape[1], max_width)
    row = 0
    for conv in convs:
        weight[row : row + conv.out_channels, :, : conv.kernel_size[0]] = conv.weight.detach()
        row += conv.out_channels
    bias = torch.cat([cast(torch.Tensor, conv.bias).detach() for conv in convs])
    return weight.reshape(cnn.output_dim, -1), bias


_scripted: dict[Callable[..., Any], Callable[..., Any]] = {}


def scripted(function: Callable[..., T]) -> Callable[..., T]:
    """``function`` compiled by TorchScript (once per process), or ``function`` itself where
    TorchScript cannot compile it (no source files, a PyTorch without TorchScript): the same
    operations, with Python between them. TorchScript's deprecation warning is silenced here
    only: no other form of PyTorch runs a loop of operations without Python and without a C++
    compiler at run time."""
    if function not in _scripted:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                compiled = torch.jit.script(function)
        except Exception as error:
            logger.info("%s runs in Python: TorchScript cannot compile it (%s)", function.__name__, error)
            compiled = function
        _scripted[function] = compiled
    return _scripted[function]


class Int8BiLstmLayer(nn.Module):
    """``BiLstmLayer`` with int8 matmuls, inference only: the same ``forward`` contract
    (packed inputs (2, n_packed, input_dim), h0, c0 in sorted row order -> packed outputs, final
    h and final c) and the same cell."""

    def __init__(self, layer: BiLstmLayer) -> None:
        super().__init__()
        self.dim, self.output_dim = layer.dim, layer.output_dim
        self.cell_clip, self.proj_clip = layer.cell_clip, layer.proj_clip
        w_in, w_hidden = layer.weight_input.detach(), layer.weight_hidden.detach()  # TF layout [in, out]
        bias = layer.bias.detach().clone()
        bias[:, 2 * self.dim : 3 * self.dim] += FORGET_BIAS  # added once here, not at every step
        # the gates' order i, j, f, o becomes i, f, o, j: the three sigmoid gates side by side
        dim = self.dim
        order = torch.cat([torch.arange(0, dim), torch.arange(2 * dim, 4 * dim), torch.arange(dim, 2 * dim)])
        w_in, w_hidden, bias = w_in[..., order], w_hidden[..., order], bias[..., order]
        self.input = nn.ModuleList(Int8Linear(w_in[d].t(), bias[d]) for d in range(2))
        self.hidden = nn.ModuleList(Int8Linear(w_hidden[d].t(), None) for d in range(2))
        self.projection: nn.ModuleList | None = None
        if layer.weight_projection is not None:
            w_proj = layer.weight_projection.detach().float()
            self.projection = nn.ModuleList(Int8Linear(w_proj[d].t(), None) for d in range(2))

    def forward(
        self, inputs: torch.Tensor, packing: Packing, h0: torch.Tensor, c0: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """As ``BiLstmLayer.forward``, one direction after the other by ``direction_steps``
        (compiled by TorchScript with the kernel ``lstm_scripted``, else run by Python)."""
        sizes = [n for n in packing.batch_sizes if n > 0]
        ends = [end for _, end in packing.groups(max(INPUT_CHUNK_ELEMENTS // (4 * self.dim), 1))]
        steps = scripted(direction_steps) if kernels.enabled("lstm_scripted") else direction_steps
        reduce_range = cast(Int8Linear, self.hidden[0]).reduce_range
        outputs, cells = [], []
        for d in range(2):
            projection = None if self.projection is None else self.projection[d]._packed
            out, c = steps(
                inputs[d],
                sizes,
                packing.offsets,
                ends,
                self.input[d]._packed,
                self.hidden[d]._packed,
                projection,
                h0[d],
                c0[d],
                self.cell_clip,
                self.proj_clip,
                reduce_range,
            )
            outputs.append(out)
            cells.append(c)
        out = torch.stack(outputs)
        return out, packing.final_outputs(out, h0), torch.stack(cells)


def direction_steps(
    inputs: torch.Tensor,
    sizes: list[int],
    offsets: list[int],
    group_ends: list[int],
    w_input: torch.classes.quantized.LinearPackedParamsBase,  # type: ignore[name-defined]
    w_hidden: torch.classes.quantized.LinearPackedParamsBase,  # type: ignore[name-defined]
    w_proj: torch.classes.quantized.LinearPackedParamsBase | None,  # type: ignore[name-defined]
    h0: torch.Tensor,
    c0: torch.Tensor,
    cell_clip: float | None,
    proj_clip: float | None,
    reduce_range: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One direction's steps, the cell of ``Int8BiLstmLayer.forward`` (TorchScript compiles
    this function; it also runs as Python): inputs (n_packed, input_dim), sizes and offsets as
    ``Packing``'s (running steps only), group_ends the end step of each group whose input side
    is one matmul, packed int8 weights whose gates are in the order (i, f, o, j) (the input
    matmul's bias holds the forget bias), h0 (batch, proj), c0 (batch, dim) -> packed outputs
    (n_packed, proj) and final c (batch, dim). The gates go to one buffer and the cell is
    updated in place (a row that has ended keeps its last cell, its final one); their views are
    made again only when the number of rows drops.

    The cell is the float kernel's (``base.kernels.lstm_cell_``); the matmuls around it are this
    function's own, as TorchScript compiles a free function of tensors and packed weights, not
    ``BiLstmLayer``'s steps (methods of a module, both directions in one float ``baddbmm``)."""
    dim = c0.shape[-1]
    c = c0.clone()
    gate_buffer = inputs.new_empty(sizes[0] if len(sizes) > 0 else 0, 4 * dim)
    gates, sigmoid_gates, i, f, o, j, c_t = c, c, c, c, c, c, c  # views made at the first step
    h_prev = h0
    n_prev = -1
    outputs: list[torch.Tensor] = []
    start = 0
    for end in group_ends:
        rows = inputs[offsets[start] : offsets[end]]
        projected = torch.ops.quantized.linear_dynamic(rows, w_input, reduce_range)
        for t in range(start, end):
            n = sizes[t]
            if n != n_prev:  # rows only end (sizes do not increase): views for the n left
                gates, c_t, h_prev, n_prev = gate_buffer[:n], c[:n], h_prev[:n], n
                sigmoid_gates, j = gates[:, : 3 * dim], gates[:, 3 * dim :]
                i, f, o = gates[:, :dim], gates[:, dim : 2 * dim], gates[:, 2 * dim : 3 * dim]
            first = offsets[t] - offsets[start]
            recurrent = torch.ops.quantized.linear_dynamic(h_prev, w_hidden, reduce_range)
            torch.add(projected[first : first + n], recurrent, out=gates)
            sigmoid_gates.sigmoid_()
            h = torch.mul(o, lstm_cell_(i, f, j, c_t, cell_clip))
            if w_proj is not None:
                h = torch.ops.quantized.linear_dynamic(h, w_proj, reduce_range)
            if proj_clip is not None:
                h.clamp_(-proj_clip, proj_clip)
            outputs.append(h)
            h_prev = h
        start = end
    out = torch.cat(outputs) if len(outputs) > 0 else inputs.new_empty(0, h0.shape[-1])
    return out, c


def is_int8(bilm: BiLM) -> bool:
    """Whether ``bilm`` is the int8 form made by ``quantize_bilm``."""
    return any(isinstance(layer, Int8BiLstmLayer) for layer in bilm.lstm.layers)


def _int8_linear(linear: nn.Module) -> Int8Linear:
    assert isinstance(linear, nn.Linear)
    return Int8Linear(linear.weight, linear.bias)


def quantize_bilm(bilm: BiLM) -> BiLM:
    """A new BiLM (of the same class, in eval mode, on the CPU in float32) whose LSTM layers,
    highway layers and token projection run int8 matmuls; ``bilm`` is not changed. Inference
    only (no gradients flow through the int8 matmuls)."""
    check_int8("cpu")
    if is_int8(bilm):
        return bilm
    model = copy.deepcopy(bilm).to(device="cpu", dtype=torch.float32)
    model.token_encoder.clear_cache()  # encodings kept by the float32 model are not the int8 model's
    encoder = model.token_encoder
    encoder.char_cnn = Int8CharCNN(model.options.char_cnn, encoder.char_cnn)
    highway = encoder.highway
    highway.carry = nn.ModuleList(_int8_linear(linear) for linear in highway.carry)
    highway.transform = nn.ModuleList(_int8_linear(linear) for linear in highway.transform)
    if encoder.projection is not None:
        encoder.projection = _int8_linear(encoder.projection)  # type: ignore[assignment]
    model.lstm.layers = nn.ModuleList(Int8BiLstmLayer(layer) for layer in model.lstm.lstm_layers)
    for param in model.parameters():
        param.requires_grad_(False)
    return model.eval()  # the new modules too
