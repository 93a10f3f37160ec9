"""An inference-only int8 form of a BiLM: its big matmuls with int8 weights (PyTorch's fbgemm).

``quantize_bilm(bilm)`` gives a new BiLM (the one handed in is never changed) whose LSTM input,
recurrent and projection matmuls, highway layers and token projection run PyTorch's dynamic
quantized linear (``torch.ops.quantized.linear_dynamic``): weights int8, symmetric, one scale per
output channel, prepacked once per direction; activations quantized per call (one scale per
tensor, so a sentence's vectors depend slightly on the others in its batch). The char CNN and the
char embedding stay float32, and so do the cell's elementwise steps: the same gate order (i, j,
f, o), forget bias, cell clip and projection clip as ``elmokit.lstm``. The outputs contract is
the model's (layers, mask, final state), so every mode of the Embedder works on it.

Which matmuls are int8 was measured (docs/export.md, "int8 on the PyTorch path"): every one is
faster in int8 at the shapes of the shipped and published models except the LSTM projection
(dim -> projection_dim) at one row, where reading the int8 weights saves less than quantizing
the input costs; the projection therefore runs int8 only for steps of at least
``PROJECTION_MIN_ROWS`` rows per direction and in float32 below.

CPU only, and only where PyTorch has a quantized engine (x86, fbgemm or qnnpack).
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from .bilm import BiLM
from .lstm import FORGET_BIAS, INPUT_CHUNK_ELEMENTS, BiLstmLayer, Packing

__all__ = ["PROJECTION_MIN_ROWS", "Int8BiLstmLayer", "Int8Linear", "check_int8", "is_int8", "quantize_bilm"]

ENGINES = ("x86", "fbgemm", "qnnpack")

# The LSTM projection runs int8 for steps of at least this many rows (per direction), else float32.
PROJECTION_MIN_ROWS = 2


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
        self.input = nn.ModuleList(Int8Linear(w_in[d].t(), bias[d]) for d in range(2))
        self.hidden = nn.ModuleList(Int8Linear(w_hidden[d].t(), None) for d in range(2))
        self.projection: nn.ModuleList | None = None
        self.weight_projection: torch.Tensor | None  # (2, dim, projection_dim), float32
        self.register_buffer("weight_projection", None)
        if layer.weight_projection is not None:
            w_proj = layer.weight_projection.detach().float()
            self.weight_projection = w_proj.clone()
            self.projection = nn.ModuleList(Int8Linear(w_proj[d].t(), None) for d in range(2))

    def forward(
        self, inputs: torch.Tensor, packing: Packing, h0: torch.Tensor, c0: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """As ``BiLstmLayer.forward``: the input side of the gates for groups of steps at a time,
        then per step the recurrent matmul of each direction and the cell, in place in buffers
        (a row that has ended keeps its last cell, which is its final cell). Views are made
        again only when the number of rows drops."""
        sizes, offsets = packing.batch_sizes, packing.offsets
        dim, proj = self.dim, h0.shape[-1]
        running = [n for n in sizes if n > 0]
        h_blocks = inputs.new_empty(2 * packing.size * proj).split([2 * n * proj for n in running])
        c = c0.clone()
        widest = sizes[0] if sizes else 0
        gate_buffer = inputs.new_empty(2 * widest * 4 * dim)
        hidden_buffer = inputs.new_empty(2 * widest * dim)
        h_prev, n_prev = h0, None
        outputs = []
        for start, end in packing.groups(max(INPUT_CHUNK_ELEMENTS // (8 * dim), 1)):
            rows = slice(offsets[start], offsets[end])
            # each direction's input side of the gates, split by step (no copy into one tensor)
            split = [self.input[d](inputs[d, rows]).split(sizes[start:end]) for d in range(2)]
            for t, step_input in enumerate(zip(*split), start):
                n = sizes[t]
                if n != n_prev:  # rows only end (sizes do not increase): views for the n left
                    gates = gate_buffer[: 2 * n * 4 * dim].view(2, n, 4 * dim)
                    i, j, f, o = gates.chunk(4, dim=-1)
                    fo, c_t, h_prev, n_prev = gates[..., 2 * dim :], c[:, :n], h_prev[:, :n], n
                    hidden = hidden_buffer[: 2 * n * dim].view(2, n, dim)
                for d in range(2):
                    torch.add(step_input[d], self.hidden[d](h_prev[d]), out=gates[d])
                fo.sigmoid_()
                c_t.mul_(f).addcmul_(i.sigmoid_(), j.tanh_())
                if self.cell_clip is not None:
                    c_t.clamp_(-self.cell_clip, self.cell_clip)
                torch.mul(o, torch.tanh(c_t, out=j), out=hidden)
                h_t = h_blocks[t].view(2, n, proj)
                if self.projection is None:
                    h_t.copy_(hidden)
                elif n >= PROJECTION_MIN_ROWS:
                    for d in range(2):
                        h_t[d] = self.projection[d](hidden[d])
                else:
                    assert self.weight_projection is not None
                    torch.bmm(hidden, self.weight_projection, out=h_t)
                if self.proj_clip is not None:
                    h_t.clamp_(-self.proj_clip, self.proj_clip)
                outputs.append(h_t)
                h_prev = h_t
        out = torch.cat(outputs, dim=1) if outputs else inputs.new_zeros(2, 0, proj)
        return out, packing.final_outputs(out, h0), c


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
    model = copy.deepcopy(bilm).to(device="cpu", dtype=torch.float32).eval()
    model.token_encoder.clear_cache()  # encodings kept by the float32 model are not the int8 model's
    encoder = model.token_encoder
    highway = encoder.highway
    highway.carry = nn.ModuleList(_int8_linear(linear) for linear in highway.carry)
    highway.transform = nn.ModuleList(_int8_linear(linear) for linear in highway.transform)
    if encoder.projection is not None:
        encoder.projection = _int8_linear(encoder.projection)  # type: ignore[assignment]
    model.lstm.layers = nn.ModuleList(Int8BiLstmLayer(layer) for layer in model.lstm.lstm_layers)
    for param in model.parameters():
        param.requires_grad_(False)
    return model
