"""Recurrent layers: RNN, GRU, LSTM (directions, sequence_lens, initial states, peepholes, clip,
custom activations, layout 0/1). The input projection X @ W^T runs as one GEMM over all time steps;
only the recurrent product loops over time."""

from __future__ import annotations

import numpy as np

from .activation import sigmoid
from .common import arg

# name -> f(x, alpha, beta); the parameters an activation consumes from activation_alpha/beta
ACTIVATIONS = {
    "Relu": (lambda x, a, b: np.maximum(x, 0), 0), "Tanh": (lambda x, a, b: np.tanh(x), 0),
    "Sigmoid": (lambda x, a, b: sigmoid(x), 0), "Affine": (lambda x, a, b: a * x + b, 2),
    "LeakyRelu": (lambda x, a, b: np.where(x >= 0, x, a * x), 1),
    "ThresholdedRelu": (lambda x, a, b: np.where(x > a, x, 0), 1),
    "ScaledTanh": (lambda x, a, b: a * np.tanh(b * x), 2), "HardSigmoid": (lambda x, a, b: np.clip(a * x + b, 0, 1), 2),
    "Elu": (lambda x, a, b: np.where(x >= 0, x, a * (np.exp(x) - 1)), 1),
    "Softsign": (lambda x, a, b: x / (1 + np.abs(x)), 0), "Softplus": (lambda x, a, b: np.logaddexp(x, 0), 0),
}
DEFAULTS = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def _activations(kind: str, attrs: dict, num_dirs: int):
    names = attrs.get("activations") or DEFAULTS[kind] * num_dirs
    alphas, betas = list(attrs.get("activation_alpha") or []), list(attrs.get("activation_beta") or [])
    functions = []
    for name in names:
        fn, count = ACTIVATIONS[{n.lower(): n for n in ACTIVATIONS}[name.lower()]]
        alpha = alphas.pop(0) if count >= 1 and alphas else (0.01 if name == "LeakyRelu" else 1.0)
        beta = betas.pop(0) if count >= 2 and betas else 0.0
        functions.append(lambda x, fn=fn, a=alpha, b=beta: fn(x, a, b))
    per_dir = len(names) // num_dirs
    return [functions[d * per_dir:(d + 1) * per_dir] for d in range(num_dirs)]


def _recurrent(kind: str):
    def kernel(inputs, attrs, ctx):
        x, w, r = inputs[0], inputs[1], inputs[2]
        bias, lengths, h0 = arg(inputs, 3), arg(inputs, 4), arg(inputs, 5)
        c0, peep = (arg(inputs, 6), arg(inputs, 7)) if kind == "LSTM" else (None, None)
        if attrs.get("layout", 0):  # batch-major tensors
            x = np.swapaxes(x, 0, 1)
            h0 = np.swapaxes(h0, 0, 1) if h0 is not None else None
            c0 = np.swapaxes(c0, 0, 1) if c0 is not None else None
        seq, batch = x.shape[:2]
        direction = attrs.get("direction", "forward")
        num_dirs = 2 if direction == "bidirectional" else 1
        hidden = attrs.get("hidden_size") or r.shape[-1]
        lengths = lengths.astype(np.int64) if lengths is not None else np.full(batch, seq, np.int64)
        acts = _activations(kind, attrs, num_dirs)
        ys, hs, cs = [], [], []
        for d in range(num_dirs):
            reverse = direction == "reverse" or d == 1
            steps = _ordered(x, lengths, reverse)
            xw = np.matmul(steps, w[d].T)  # (seq, batch, gates*hidden)
            if bias is not None:
                xw += bias[d, :GATES[kind] * hidden]
            rb = bias[d, GATES[kind] * hidden:] if bias is not None else np.zeros(GATES[kind] * hidden, x.dtype)
            h = h0[d] if h0 is not None else np.zeros((batch, hidden), x.dtype)
            c = c0[d] if c0 is not None else np.zeros((batch, hidden), x.dtype)
            p = peep[d] if peep is not None else None
            y = np.zeros((seq, batch, hidden), x.dtype)
            for t in range(seq):
                alive = (t < lengths)[:, None]
                h_new, c_new = _cell(kind, xw[t], h, c, r[d], rb, p, acts[d], attrs, hidden)
                h, c = np.where(alive, h_new, h), np.where(alive, c_new, c)
                y[t] = np.where(alive, h_new, 0)
            ys.append(_ordered(y, lengths, reverse))
            hs.append(h)
            cs.append(c)
        y_all = np.stack(ys, axis=1)  # (seq, dirs, batch, hidden)
        if attrs.get("layout", 0):
            y_all, y_h, y_c = y_all.transpose(2, 0, 1, 3), np.stack(hs, 1), np.stack(cs, 1)
        else:
            y_h, y_c = np.stack(hs), np.stack(cs)
        outs = [y_all.astype(x.dtype), y_h.astype(x.dtype)]
        return outs + [y_c.astype(x.dtype)] if kind == "LSTM" else outs
    return kernel


def _ordered(x: np.ndarray, lengths: np.ndarray, reverse: bool) -> np.ndarray:
    """Each batch entry's first `length` steps reversed (reverse direction), the rest left in place."""
    if not reverse:
        return x
    seq = x.shape[0]
    index = np.arange(seq)[:, None]
    source = np.where(index < lengths[None, :], lengths[None, :] - 1 - index, index)
    return np.take_along_axis(x, source.reshape(source.shape + (1,) * (x.ndim - 2)), axis=0)


def _cell(kind, xw, h, c, r, rb, peep, acts, attrs, hidden):
    clip = attrs.get("clip")
    limit = (lambda v: np.clip(v, -clip, clip)) if clip else (lambda v: v)
    if kind == "RNN":
        return acts[0](limit(xw + h @ r.T + rb)), c
    if kind == "GRU":
        f, g = acts
        hr = h @ r.T  # (batch, 3*hidden): z, r, h parts
        z = f(limit(xw[:, :hidden] + hr[:, :hidden] + rb[:hidden]))
        reset = f(limit(xw[:, hidden:2 * hidden] + hr[:, hidden:2 * hidden] + rb[hidden:2 * hidden]))
        if attrs.get("linear_before_reset", 0):
            cand = g(limit(xw[:, 2 * hidden:] + reset * (hr[:, 2 * hidden:] + rb[2 * hidden:])))
        else:
            cand = g(limit(xw[:, 2 * hidden:] + (reset * h) @ r[2 * hidden:].T + rb[2 * hidden:]))
        return (1 - z) * cand + z * h, c
    f, g, act_h = acts
    gates = xw + h @ r.T + rb  # i, o, f, c
    p_i, p_o, p_f = (peep[:hidden], peep[hidden:2 * hidden], peep[2 * hidden:]) if peep is not None else (0, 0, 0)
    i = f(limit(gates[:, :hidden] + p_i * c))
    forget = 1 - i if attrs.get("input_forget", 0) else f(limit(gates[:, 2 * hidden:3 * hidden] + p_f * c))
    c_new = forget * c + i * g(limit(gates[:, 3 * hidden:]))
    o = f(limit(gates[:, hidden:2 * hidden] + p_o * c_new))
    return o * act_h(c_new), c_new


KERNELS = {
    ("", "RNN"): _recurrent("RNN"),
    ("", "GRU"): _recurrent("GRU"),
    ("", "LSTM"): _recurrent("LSTM"),
}
