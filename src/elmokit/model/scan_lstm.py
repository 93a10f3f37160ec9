"""The LSTM stacks written as a scan over time: the form that exports to ONNX with dynamic shapes.

A plain Python loop over the steps cannot be exported with a dynamic number of steps
(``torch.export`` refuses it; ``torch.onnx.export(dynamo=True)`` unrolls it to the example's
length). Written with ``torch._higher_order_ops.scan``, one layer becomes one ONNX ``Scan``
whose body is the cell of ``BiLstmLayer._step`` (the same function: projection, cell clip and
projection clip), so the exported graph takes any batch and any length.

This is a variant beside the packed, step-by-step layers of ``elmokit.model.lstm`` (which stay the
PyTorch path): it runs on the padded layout, every row for every step, and keeps a row's state
unchanged past its length, so its outputs and final states equal ``BiLstm``'s up to float
rounding (tests/test_onnx.py).
"""

from __future__ import annotations

import torch

from .lstm import BiLstm, BiLstmLayer, LstmState

__all__: list[str] = []


def _scan():
    """``torch._higher_order_ops.scan`` (private in torch; imported where it is used)."""
    from torch._higher_order_ops.scan import scan

    return scan


def reverse_index(mask: torch.Tensor) -> torch.Tensor:
    """For each row of ``mask`` (batch, steps) (True on the row's first ``length`` steps), the
    step each position reads in the backward direction: ``length - 1 - t`` inside the row,
    ``t`` past it, so padding stays at the end (``tf.reverse_sequence``). Its own inverse."""
    steps = torch.arange(mask.shape[1], device=mask.device).unsqueeze(0)
    lengths = mask.sum(dim=1, keepdim=True)
    return torch.where(mask, lengths - 1 - steps, steps)


def scan_layer(
    layer: BiLstmLayer, inputs: torch.Tensor, mask: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One layer as a scan over time.

    inputs (2, batch, steps, input_dim), each direction in its reading order and left-aligned;
    mask (batch, steps) bool, True on each row's real steps; h0 (2, batch, projection_dim), c0
    (2, batch, dim). Returns outputs (2, batch, steps, projection_dim), zero past each row's
    length, and the final h and c of each row (taken after its last real step)."""
    bias = layer.bias.unsqueeze(1)
    xs = inputs.permute(2, 0, 1, 3)  # (steps, 2, batch, input_dim)
    running = mask.transpose(0, 1).unsqueeze(1).unsqueeze(-1)  # (steps, 1, batch, 1)

    def step(
        carry: tuple[torch.Tensor, torch.Tensor], x: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
        h, c = carry
        x_t, real = x
        h_new, c_new = layer._step(torch.baddbmm(bias, x_t, layer.weight_input), h, c)
        output = torch.where(real, h_new, torch.zeros_like(h_new))
        return (torch.where(real, h_new, h), torch.where(real, c_new, c)), output

    (h, c), outputs = _scan()(step, (h0, c0), (xs, running))
    return outputs.permute(1, 2, 0, 3), h, c


def scan_bilstm(
    lstm: BiLstm, inputs: torch.Tensor, mask: torch.Tensor, state: LstmState
) -> tuple[torch.Tensor, LstmState]:
    """``BiLstm.forward`` as scans (eval mode: no dropout): inputs (2, batch, steps, input_dim),
    each direction in its reading order and left-aligned; mask (batch, steps); state for every
    row. Returns outputs (n_layers, 2, batch, steps, projection_dim), zero past each row's
    length, and the final state."""
    x = inputs
    outputs, final_h, final_c = [], [], []
    for k, layer in enumerate(lstm.lstm_layers):
        out, h, c = scan_layer(layer, x, mask, state.h[k], state.c[k])
        if k > 0 and lstm.options.use_skip_connections:
            out = out + x
        outputs.append(out)
        final_h.append(h)
        final_c.append(c)
        x = out
    return torch.stack(outputs), LstmState(torch.stack(final_h), torch.stack(final_c))
