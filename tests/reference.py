"""A deliberately naive numpy re-implementation of the original biLM, for tests.

It reads the weights straight from an original-format HDF5 file (TensorFlow layout) and runs one
sentence token by token in float64, following bilm-tf's graph: char ids with the +1 shift, conv
over all 50 positions, max then activation, highway, projection, TF LSTMCell (i, j, f, o; forget
bias 1.0; cell clip before tanh; proj clip after the projection), skip connections from layer 2.
It shares no code with elmokit beyond nothing: the char ids are rebuilt here too.
"""

from __future__ import annotations

import h5py
import numpy as np


def char_ids(token: str, max_chars: int) -> np.ndarray:
    if token == "<S>":
        body = [256]
    elif token == "</S>":
        body = [257]
    else:
        body = None
    ids = np.full(max_chars, 260, dtype=np.int64)
    if body is not None:
        ids[:3] = [258, body[0], 259]
    else:
        raw = list(token.encode("utf-8"))[: max_chars - 2]
        ids[0] = 258
        ids[1 : 1 + len(raw)] = raw
        ids[1 + len(raw)] = 259
    return ids + 1


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def token_vector(f: h5py.File, options: dict, token: str) -> np.ndarray:
    cnn = options["char_cnn"]
    max_chars = cnn.get("max_characters_per_token", 50)
    emb = np.asarray(f["char_embed"], dtype=np.float64)
    emb = np.concatenate([np.zeros((1, emb.shape[1])), emb])
    x = emb[char_ids(token, max_chars)]  # (max_chars, d)
    act = np.tanh if cnn.get("activation", "relu") == "tanh" else (lambda v: np.maximum(v, 0))
    pooled = []
    for k, (width, _) in enumerate(cnn["filters"]):
        w = np.asarray(f[f"CNN/W_cnn_{k}"], dtype=np.float64)[0]  # (width, d, n)
        b = np.asarray(f[f"CNN/b_cnn_{k}"], dtype=np.float64)
        conv = np.stack(
            [np.einsum("wd,wdn->n", x[p : p + width], w) + b for p in range(max_chars - width + 1)]
        )
        pooled.append(act(conv.max(axis=0)))
    h = np.concatenate(pooled)
    for k in range(cnn.get("n_highway", 0)):
        g = _sigmoid(h @ f[f"CNN_high_{k}/W_carry"][...] + f[f"CNN_high_{k}/b_carry"][...])
        t = np.maximum(h @ f[f"CNN_high_{k}/W_transform"][...] + f[f"CNN_high_{k}/b_transform"][...], 0)
        h = g * t + (1 - g) * h
    if "CNN_proj/W_proj" in f:
        h = h @ f["CNN_proj/W_proj"][...] + f["CNN_proj/b_proj"][...]
    return h


def _cell_prefix(direction: int, layer: int, n_layers: int) -> str:
    if n_layers == 1:
        return f"RNN_{direction}/RNN/LSTMCell"
    return f"RNN_{direction}/RNN/MultiRNNCell/Cell{layer}/LSTMCell"


def run_direction(f: h5py.File, options: dict, direction: int, xs: list[np.ndarray]) -> list:
    """Outputs of every layer for one direction over the inputs xs (already in reading order)."""
    lstm = options["lstm"]
    n_layers, dim = lstm["n_layers"], lstm["dim"]
    cell_clip, proj_clip = lstm.get("cell_clip"), lstm.get("proj_clip")
    layers = []
    inputs = xs
    for layer in range(n_layers):
        p = _cell_prefix(direction, layer, n_layers)
        w = np.asarray(f[p + "/W_0"], dtype=np.float64)
        b = np.asarray(f[p + "/B"], dtype=np.float64)
        wp = np.asarray(f[p + "/W_P_0"], dtype=np.float64) if p + "/W_P_0" in f else None
        out_dim = wp.shape[1] if wp is not None else dim
        h, c = np.zeros(out_dim), np.zeros(dim)
        outs = []
        for x in inputs:
            z = np.concatenate([x, h]) @ w + b
            i, j, fg, o = np.split(z, 4)
            c = _sigmoid(fg + 1.0) * c + _sigmoid(i) * np.tanh(j)
            if cell_clip is not None:
                c = np.clip(c, -cell_clip, cell_clip)
            h = _sigmoid(o) * np.tanh(c)
            if wp is not None:
                h = h @ wp
            if proj_clip is not None:
                h = np.clip(h, -proj_clip, proj_clip)
            outs.append(h + x if (layer > 0 and lstm.get("use_skip_connections")) else h)
        layers.append(outs)
        inputs = outs
    return layers


def reference_layers(weight_file: str, options: dict, tokens: list[str]) -> np.ndarray:
    """(n_layers + 1, len(tokens), 2 * projection_dim) for one sentence from zero states."""
    with h5py.File(weight_file, "r") as f:
        seq = ["<S>", *tokens, "</S>"]
        xs = [token_vector(f, options, t) for t in seq]
        fwd = run_direction(f, options, 0, xs)
        bwd = [list(reversed(layer)) for layer in run_direction(f, options, 1, xs[::-1])]
    n = len(tokens)
    out = [np.concatenate([np.stack(xs), np.stack(xs)], axis=1)[1 : n + 1]]
    for lf, lb in zip(fwd, bwd):
        out.append(np.concatenate([np.stack(lf), np.stack(lb)], axis=1)[1 : n + 1])
    return np.stack(out)
