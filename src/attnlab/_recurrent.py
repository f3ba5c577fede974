"""Recurrent encoders that ``torch.compile`` can trace into one graph.

Two things stop dynamo at a recurrent encoder over padded sequences: it refuses to trace
an ``nn.GRU`` / ``nn.LSTM`` module (unless ``torch._dynamo.config.allow_rnn``), and
packing a batch (``pack_padded_sequence``) needs the lengths on the host. The modules that
own such an RNN keep it: its parameters, their names in the ``state_dict`` and their
initialisation stay those of ``torch.nn``, and in eager mode they still call it on packed
sequences (cuDNN's flat weights, no padded steps). Traced or transformed (``torch.compile``,
``torch.export``, ``torch.func``: :func:`attnlab._checks.is_traced`)
they run the same weights through the same ATen recurrences on the padded batch instead:

* :class:`RNNWeights` reads the RNN's parameters without touching the module (dynamo
  traces it, and a moved, loaded or replaced parameter shows through; with
  :func:`bound_rnn_weights`, a replaced RNN too);
* :func:`padded_rnn`: the outputs of a (bidirectional, multi-layer) GRU / LSTM over rows
  whose first ``lengths[i]`` positions are real, as a packed run gives them. The forward
  direction reads the row as it is (the padding comes after the real positions, so it never
  reaches them); the reverse direction reads each row reversed within its length and its
  outputs are put back in place. Cost: the padded steps, ``O(N n d h)`` per direction and
  layer, where a packed run does ``sum(lengths)`` steps.
* :func:`stepped_rnn`: a one-direction RNN step by step with each row's state frozen after
  its last real position, so it also gives the final state a packed run returns (which
  :func:`padded_rnn` cannot: a fused recurrence returns the state after the last padded
  step). The loop over ``n`` is unrolled in the graph, which grows with ``n``.

Under ``torch.compile`` both run ``n`` rounded up to a power of two
(:func:`attnlab._checks.compiled_steps`): PyTorch's decompositions unroll a
recurrence's steps, and without the rounding every padded length compiled a graph of its
own until Dynamo's recompile limit.

Under a ``torch.func`` transform (``vmap`` has no batching rule for ``aten::lstm``,
``aten::gru`` nor ``aten::lstm_cell``) both take the cells' equations as plain tensor ops,
step by step (:func:`lstm_cell`, :func:`gru_cell`).

Both compute what the packed run does at the real positions (and zeros at the padding), up
to floating-point rounding; ``tests/test_recurrent.py`` checks them against ``torch.nn``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab._checks import is_transformed, pad_to_compiled_steps

__all__ = [
    "RNNWeights",
    "bound_rnn_weights",
    "gru_cell",
    "lstm_cell",
    "padded_rnn",
    "rnn_step",
    "stepped_rnn",
]

#: An LSTM's state ``(h, c)`` or a GRU's ``h``, each ``[layers * directions, N, hidden]``.
State = Tensor | tuple[Tensor, Tensor]


class RNNWeights:
    """The weights of an ``nn.GRU`` / ``nn.LSTM`` (``batch_first=True``, no ``proj_size``)
    as the ATen recurrences take them, read through the module's own parameter dict.

    Kept as a plain attribute of the module that owns the RNN: it is not a module, so it
    adds nothing to ``state_dict()`` or ``parameters()``, and ``copy.deepcopy`` / pickling
    keep it pointing at the copy's RNN. ``module`` is that RNN, for the eager packed run:
    a traced path reads the weights here and never the module (Dynamo refuses to trace
    an ``nn.GRU`` / ``nn.LSTM`` it meets). Made with :func:`bound_rnn_weights`, they
    follow the owner when it puts another RNN in place of its own.
    """

    def __init__(self, rnn: nn.Module) -> None:
        self.bind(rnn)

    def bind(self, rnn: nn.Module | None) -> None:
        """Read ``rnn`` from now on (refused in one line unless it is such an RNN)."""
        if not isinstance(rnn, (nn.GRU, nn.LSTM)):
            raise TypeError(f"rnn must be an nn.GRU or nn.LSTM, got {type(rnn).__name__}")
        if not rnn.batch_first or getattr(rnn, "proj_size", 0):
            raise ValueError("rnn must be batch_first=True and have no proj_size")
        self.cell = "lstm" if isinstance(rnn, nn.LSTM) else "gru"
        self.num_layers: int = rnn.num_layers
        self.hidden: int = rnn.hidden_size
        self.directions = 2 if rnn.bidirectional else 1
        self.bias: bool = rnn.bias
        self.dropout: float = float(rnn.dropout)
        self._params = rnn._parameters
        self.module = rnn

    def layer(self, layer: int, reverse: bool = False) -> list[Tensor]:
        """``[W_ih, W_hh(, b_ih, b_hh)]`` of one layer and direction."""
        suffix = f"_l{layer}" + ("_reverse" if reverse else "")
        names = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")[: 4 if self.bias else 2]
        return [self._params[name + suffix] for name in names]

    def zeros(self, x: Tensor) -> Tensor:
        """A zero state ``[layers * directions, N, hidden]`` for the batch ``x`` ``[N, n, d]``."""
        return x.new_zeros(self.num_layers * self.directions, x.shape[0], self.hidden)


#: The attribute of an owner module that holds its bound weights, by submodule name.
_BOUND = "_attnlab_bound_rnn_weights"


def bound_rnn_weights(owner: nn.Module, name: str) -> RNNWeights:
    """The :class:`RNNWeights` of the RNN ``owner.<name>``, kept bound to that name: a
    module that puts another RNN there (``model.lstm = pretrained_lstm``, or
    ``pyramid[0] = ...`` in an ``nn.ModuleList``) is read from then on, traced and eager
    alike; putting in anything else is refused in one line at the assignment. Without the
    binding the weights went on reading the RNN that was replaced, which no longer
    belonged to the model (nor to its optimiser). Assignments go through PyTorch's
    module registration hook, which this module installs once."""
    rnn = owner._modules.get(name)
    if rnn is None:
        raise TypeError(f"{type(owner).__name__} has no submodule {name!r}")
    weights = RNNWeights(rnn)
    owner.__dict__.setdefault(_BOUND, {})[name] = weights
    return weights


def _rebind_on_registration(owner: nn.Module, name: str, module: nn.Module | None) -> None:
    """PyTorch's hook on every submodule assignment: rebind weights bound to ``name``."""
    bound = owner.__dict__.get(_BOUND)
    if bound is not None and name in bound:
        try:
            bound[name].bind(module)
        except (TypeError, ValueError) as error:
            raise type(error)(f"{type(owner).__name__}.{name}: {error}") from None


torch.nn.modules.module.register_module_module_registration_hook(_rebind_on_registration)


def _split(weights: RNNWeights, state: State | None, x: Tensor) -> tuple[Tensor, Tensor]:
    """``(h0, c0)`` ``[layers * directions, N, hidden]`` (``c0`` unused for a GRU)."""
    if state is None:
        zero = weights.zeros(x)
        return zero, zero
    if weights.cell == "lstm":
        h0, c0 = state  # type: ignore[misc]
        return h0, c0
    return state, state  # type: ignore[return-value]


def lstm_cell(
    x: Tensor, h: Tensor, c: Tensor, w_ih: Tensor, w_hh: Tensor, *bias: Tensor
) -> tuple[Tensor, Tensor]:
    """One LSTM step in ``torch.nn.LSTM``'s gate order (input, forget, cell, output):
    ``i, f, g, o = W_ih x + b_ih + W_hh h + b_hh`` (split in four), ``c' = sigma(f) c +
    sigma(i) tanh(g)``, ``h' = sigma(o) tanh(c')``. ``x`` ``[N, d_in]``, ``h``, ``c``
    ``[N, hidden]``; ``bias``: ``(b_ih, b_hh)`` or nothing. Returns ``(h', c')``."""
    b_ih, b_hh = bias or (None, None)
    i, f, g, o = (F.linear(x, w_ih, b_ih) + F.linear(h, w_hh, b_hh)).chunk(4, -1)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c), c


def gru_cell(x: Tensor, h: Tensor, w_ih: Tensor, w_hh: Tensor, *bias: Tensor) -> Tensor:
    """One GRU step in ``torch.nn.GRU``'s gate order (reset, update, new): ``r =
    sigma(W_ir x + b_ir + W_hr h + b_hr)``, ``z`` likewise, ``n = tanh(W_in x + b_in + r
    (W_hn h + b_hn))``, ``h' = (1 - z) n + z h``. Shapes as :func:`lstm_cell`."""
    b_ih, b_hh = bias or (None, None)
    xr, xz, xn = F.linear(x, w_ih, b_ih).chunk(3, -1)
    hr, hz, hn = F.linear(h, w_hh, b_hh).chunk(3, -1)
    r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
    n = torch.tanh(xn + r * hn)
    return (1 - z) * n + z * h


def _step(
    cell: str, x: Tensor, h: Tensor, c: Tensor, params: list[Tensor]
) -> tuple[Tensor, Tensor]:
    """One step of a layer: ``(h', c')`` (``c`` passed through for a GRU); ATen's fused
    cells, or their equations under a ``torch.func`` transform."""
    if cell == "lstm":
        if is_transformed():
            return lstm_cell(x, h, c, *params)
        h_new, c_new = torch.lstm_cell(x, (h, c), *params)
        return h_new, c_new
    step = gru_cell if is_transformed() else torch.gru_cell
    return step(x, h, *params), c


def rnn_step(
    weights: RNNWeights, x: Tensor, h: Tensor, c: Tensor | None = None
) -> tuple[Tensor, Tensor | None]:
    """One time step of a one-layer, one-direction RNN, as ``nn.GRU`` / ``nn.LSTM`` over a
    sequence of one step: ``x`` ``[N, d_in]`` and the state ``h`` (and, for an LSTM, ``c``)
    ``[N, hidden]`` -> the new ``(h, c)`` (``c`` None for a GRU); ``h`` is also the step's
    output. For the traced path of a decoder that runs its RNN a step at a time."""
    if weights.num_layers != 1 or weights.directions != 1:
        raise ValueError("rnn_step runs a one-layer, one-direction RNN")
    if weights.cell == "lstm":
        if c is None:
            raise ValueError("rnn_step: an LSTM needs its cell state c")
        return _step("lstm", x, h, c, weights.layer(0))
    return _step("gru", x, h, h, weights.layer(0))[0], None


def _run(
    weights: RNNWeights,
    x: Tensor,
    h0: Tensor,
    c0: Tensor,
    layer: int,
    reverse: bool,
    training: bool,
) -> Tensor:
    """Outputs ``[N, n, hidden]`` of one layer and direction over the whole of ``x``."""
    params = weights.layer(layer, reverse)
    if is_transformed():  # no batching rule for the fused recurrences: step by step
        h, c, outputs = h0, c0, []
        for t in range(x.shape[1]):
            h, c = _step(weights.cell, x[:, t], h, c, params)
            outputs.append(h)
        return torch.stack(outputs, 1) if outputs else x.new_zeros(*x.shape[:2], weights.hidden)
    if weights.cell == "lstm":
        out, _, _ = torch.lstm(
            _in_weights_graph(x, params), (h0[None], c0[None]), params, weights.bias,
            1, 0.0, training, False, True,
        )  # fmt: skip
    else:
        out, _ = torch.gru(x, h0[None], params, weights.bias, 1, 0.0, training, False, True)
    return out


def _in_weights_graph(x: Tensor, params: list[Tensor]) -> Tensor:
    """``x``, joined to the autograd graph of the weights where it needs no gradient and
    they do: plus an exact zero, the empty sum of one weight (no gradient reaches either).

    Works around PyTorch's CPU LSTM under AOTAutograd (``torch.compile``'s default
    backend, torch 2.13): ``torch.lstm`` (its oneDNN ``mkldnn_rnn_layer``) on an input
    that needs no gradient, with weights that do, fails there ("expected all
    tensors_saved_with_vc_check to be Tensors"; Inductor: "expected Tensor() for op:
    torch.ops.aten.mkldnn_rnn_layer"), as with frozen embeddings in front of the encoder.
    The GRU has no such failure."""
    live = [p for p in params if p.requires_grad]
    if x.requires_grad or not live or not torch.is_grad_enabled():
        return x
    return x + live[0][:0].sum()


def _real(x: Tensor, lengths: Tensor | None) -> Tensor:
    """``[N, n]`` True at the real positions ``t < lengths[i]``."""
    N, n = x.shape[:2]
    if lengths is None:
        return torch.ones(N, n, dtype=torch.bool, device=x.device)
    return torch.arange(n, device=x.device)[None, :] < lengths[:, None]


def padded_rnn(
    weights: RNNWeights,
    x: Tensor,
    lengths: Tensor | None = None,
    state: State | None = None,
    *,
    training: bool = False,
) -> Tensor:
    """The RNN's outputs ``[N, n, directions * hidden]`` over ``x`` ``[N, n, d_in]``, whose
    row ``i`` is real at its first ``lengths[i]`` positions (all of them when ``lengths``
    is None); zeros at the padding.

    ``state`` is the initial state (zeros when None), as ``nn.GRU`` / ``nn.LSTM`` take it.
    Between layers, dropout ``weights.dropout`` applies in training, as in ``torch.nn``.
    Under ``torch.compile`` the recurrence runs over
    :func:`attnlab._checks.compiled_steps` positions.
    """
    n = x.shape[1]
    real = pad_to_compiled_steps(_real(x, lengths), 1, False)  # compiled: padded steps
    x = pad_to_compiled_steps(x, 1)
    h0, c0 = _split(weights, state, x)
    flip = None
    if weights.directions == 2:  # reverse each row within its length: an involution
        t = torch.arange(x.shape[1], device=x.device)[None, :]
        flip = torch.where(real, real.sum(1, keepdim=True) - 1 - t, t)
    out = x
    for layer in range(weights.num_layers):
        if layer and weights.dropout and training:
            out = F.dropout(out, weights.dropout, True)
        i = layer * weights.directions
        parts = [_run(weights, out, h0[i], c0[i], layer, False, training)]
        if flip is not None:
            index = flip[..., None].expand(-1, -1, out.shape[-1])
            back = _run(weights, out.gather(1, index), h0[i + 1], c0[i + 1], layer, True, training)
            parts.append(back.gather(1, flip[..., None].expand_as(back)))
        out = torch.cat(parts, -1) if len(parts) > 1 else parts[0]
    return torch.where(real[..., None], out, out.new_zeros(()))[:, :n]


def stepped_rnn(
    weights: RNNWeights, x: Tensor, lengths: Tensor, *, training: bool = False
) -> tuple[Tensor, State]:
    """A one-direction RNN from a zero state over ``x`` ``[N, n, d_in]``, whose row ``i``
    is real at its first ``lengths[i]`` positions, step by step: the outputs ``[N, n,
    hidden]`` (zeros at the padding) and the final state, each row's state after its last
    real position (zeros where ``lengths[i] == 0``), as a packed run returns it: ``(h, c)``
    for an LSTM, ``h`` for a GRU, each ``[layers, N, hidden]``."""
    if weights.directions != 1:
        raise ValueError("stepped_rnn runs one direction; use padded_rnn for a bidirectional RNN")
    n = x.shape[1]
    # compiled: padded steps, which keep each row's state
    real = pad_to_compiled_steps(_real(x, lengths), 1, False)
    x = pad_to_compiled_steps(x, 1)
    zero = weights.zeros(x)
    h, c = list(zero.unbind(0)), list(zero.unbind(0))
    outputs = []
    for t in range(x.shape[1]):
        keep = real[:, t, None]
        inp = x[:, t]
        for layer in range(weights.num_layers):
            if layer and weights.dropout and training:
                inp = F.dropout(inp, weights.dropout, True)
            h_new, c_new = _step(weights.cell, inp, h[layer], c[layer], weights.layer(layer))
            c[layer] = torch.where(keep, c_new, c[layer])
            h[layer] = torch.where(keep, h_new, h[layer])
            inp = h_new
        outputs.append(torch.where(keep, inp, inp.new_zeros(())))
    out = torch.stack(outputs, 1) if outputs else x.new_zeros(x.shape[0], 0, weights.hidden)
    out = out[:, :n]
    final_h = torch.stack(h)
    return out, ((final_h, torch.stack(c)) if weights.cell == "lstm" else final_h)
