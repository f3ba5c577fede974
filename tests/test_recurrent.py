"""attnlab._recurrent: the traceable recurrences agree with torch.nn's packed runs.

The reference is ``nn.GRU`` / ``nn.LSTM`` on a packed batch (``pack_padded_sequence``),
computed independently of the code under test; float64, so agreement is to rounding.
"""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from torch import nn
from torch._dynamo.testing import CompileCounter
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from attnlab._recurrent import (
    RNNWeights,
    bound_rnn_weights,
    gru_cell,
    lstm_cell,
    padded_rnn,
    rnn_step,
    stepped_rnn,
)

N, n, D_IN, H = 5, 6, 3, 4
#: one full row, a row with one real position, an empty row and two in between
LENGTHS = torch.tensor([6, 3, 1, 0, 4])
TOL = {"rtol": 1e-10, "atol": 1e-12}


def _rnn(cell: str, layers: int, bidirectional: bool, **kw) -> nn.Module:
    torch.manual_seed(0)
    cls = nn.LSTM if cell == "lstm" else nn.GRU
    return cls(D_IN, H, layers, batch_first=True, bidirectional=bidirectional, **kw).double()


def _x(requires_grad: bool = False) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return torch.randn(N, n, D_IN, generator=g, dtype=torch.float64, requires_grad=requires_grad)


def _packed(rnn: nn.Module, x: torch.Tensor, lengths: torch.Tensor, state=None):
    """The reference: torch.nn on the packed rows (an empty row is read for one step, as
    packing needs, and its outputs are then cleared)."""
    packed = pack_padded_sequence(x, lengths.clamp(min=1), batch_first=True, enforce_sorted=False)
    out, final = rnn(packed, state)
    out, _ = pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])
    return out * (lengths > 0)[:, None, None], final


CONFIGS = [
    (cell, layers, bi) for cell in ("gru", "lstm") for layers in (1, 2) for bi in (False, True)
]


@pytest.mark.parametrize("cell,layers,bi", CONFIGS)
def test_padded_rnn_gives_the_packed_outputs_and_gradients(cell, layers, bi):
    rnn = _rnn(cell, layers, bi)
    x = _x(requires_grad=True)
    got = padded_rnn(RNNWeights(rnn), x, LENGTHS)
    want, _ = _packed(rnn, x, LENGTHS)
    assert got.shape == (N, n, H * (2 if bi else 1))
    torch.testing.assert_close(got, want, **TOL)
    # the padding is zero and the empty row is all zeros
    real = torch.arange(n)[None, :] < LENGTHS[:, None]
    assert got[~real].abs().max() == 0
    # gradients with respect to the input and every weight
    probe = torch.randn_like(got)
    params = list(rnn.parameters())
    g_got = torch.autograd.grad((got * probe).sum(), [x, *params])
    g_want = torch.autograd.grad((want * probe).sum(), [x, *params])
    for a, b in zip(g_got, g_want, strict=True):
        torch.testing.assert_close(a, b, **TOL)


@pytest.mark.parametrize("cell,layers,bi", CONFIGS)
def test_padded_rnn_compiles_through_aot_autograd_for_an_input_without_gradient(cell, layers, bi):
    """``torch.compile``'s default path goes through AOTAutograd; there, the input needing
    no gradient and the weights needing one (frozen embeddings in front of the encoder,
    float32 on the CPU), the outputs and the weights' gradients are eager's. PyTorch 2.13's
    CPU LSTM failed this before ``_in_weights_graph`` joined the input to the weights'
    graph ("expected all tensors_saved_with_vc_check to be Tensors")."""
    rnn = _rnn(cell, layers, bi).float()
    weights = RNNWeights(rnn)
    x = _x().float()

    def run(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return padded_rnn(weights, x, lengths)

    want = run(x, LENGTHS)
    probe = torch.randn(want.shape, generator=torch.Generator().manual_seed(2))
    params = list(rnn.parameters())
    g_want = torch.autograd.grad((want * probe).sum(), params)
    torch._dynamo.reset()
    got = torch.compile(run, backend="aot_eager", fullgraph=True)(x, LENGTHS)
    g_got = torch.autograd.grad((got * probe).sum(), params)
    assert not x.requires_grad
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    for a, b in zip(g_got, g_want, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("cell,layers,bi", CONFIGS)
def test_padded_rnn_takes_an_initial_state_and_no_lengths(cell, layers, bi):
    rnn = _rnn(cell, layers, bi)
    x = _x()
    g = torch.Generator().manual_seed(2)
    h0 = torch.randn(layers * (2 if bi else 1), N, H, generator=g, dtype=torch.float64)
    state = (h0, torch.randn(h0.shape, generator=g, dtype=torch.float64)) if cell == "lstm" else h0
    want, _ = rnn(x, state)
    torch.testing.assert_close(padded_rnn(RNNWeights(rnn), x, state=state), want, **TOL)


@pytest.mark.parametrize("cell,layers", [(c, layer) for c in ("gru", "lstm") for layer in (1, 2)])
def test_stepped_rnn_gives_the_packed_outputs_and_final_state(cell, layers):
    rnn = _rnn(cell, layers, False)
    x = _x(requires_grad=True)
    lengths = LENGTHS.clamp(min=1)
    out, final = stepped_rnn(RNNWeights(rnn), x, lengths)
    want, want_final = _packed(rnn, x, lengths)
    torch.testing.assert_close(out, want, **TOL)
    got_states = final if cell == "lstm" else (final,)
    want_states = want_final if cell == "lstm" else (want_final,)
    for a, b in zip(got_states, want_states, strict=True):
        assert a.shape == (layers, N, H)
        torch.testing.assert_close(a, b, **TOL)
    loss = out.square().sum() + sum(s.sum() for s in got_states)
    ref = want.square().sum() + sum(s.sum() for s in want_states)
    for a, b in zip(
        torch.autograd.grad(loss, [x, *rnn.parameters()]),
        torch.autograd.grad(ref, [x, *rnn.parameters()]),
        strict=True,
    ):
        torch.testing.assert_close(a, b, **TOL)


def test_stepped_rnn_gives_zeros_for_an_empty_row():
    rnn = _rnn("lstm", 2, False)
    out, (h, c) = stepped_rnn(RNNWeights(rnn), _x(), LENGTHS)
    empty = int((LENGTHS == 0).nonzero()[0])
    assert h[:, empty].abs().max() == 0 and c[:, empty].abs().max() == 0
    assert out[empty].abs().max() == 0
    assert out[:empty].abs().amin(-1).gt(0).any()


def test_dropout_between_layers_only_in_training():
    rnn = _rnn("gru", 2, True, dropout=0.5)
    weights, x = RNNWeights(rnn), _x()
    want, _ = _packed(rnn.eval(), x, LENGTHS)
    torch.testing.assert_close(padded_rnn(weights, x, LENGTHS), want, **TOL)
    torch.manual_seed(3)
    trained = padded_rnn(weights, x, LENGTHS, training=True)
    assert not torch.allclose(trained, want)
    step_rnn = _rnn("lstm", 2, False, dropout=0.5)
    eval_out, _ = stepped_rnn(RNNWeights(step_rnn), x, LENGTHS)
    torch.manual_seed(3)
    train_out, _ = stepped_rnn(RNNWeights(step_rnn), x, LENGTHS, training=True)
    assert not torch.allclose(train_out, eval_out)


def test_the_weights_follow_the_module():
    """Moves, loads, copies and replaced parameters show through; nothing is added to the
    module's parameters or state."""
    rnn = _rnn("gru", 1, True).float()
    owner = nn.Module()
    owner.rnn = rnn
    owner.weights = RNNWeights(rnn)
    assert list(owner.state_dict()) == [f"rnn.{k}" for k in rnn.state_dict()]
    owner.double()
    assert owner.weights.layer(0)[0].dtype == torch.float64
    x = _x()
    other = _rnn("gru", 1, True)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(1.0)
    owner.rnn.load_state_dict(other.state_dict())
    torch.testing.assert_close(padded_rnn(owner.weights, x), other(x)[0], **TOL)
    for copied in (copy.deepcopy(owner), pickle.loads(pickle.dumps(owner))):
        assert copied.weights.layer(0, reverse=True)[1] is copied.rnn.weight_hh_l0_reverse
    before = torch.__future__.get_overwrite_module_params_on_conversion()
    torch.__future__.set_overwrite_module_params_on_conversion(True)
    try:
        owner.float()
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(before)
    assert owner.weights.layer(0)[0] is owner.rnn.weight_ih_l0
    assert owner.weights.layer(0)[0].dtype == torch.float32


def test_bound_weights_follow_an_rnn_put_in_place_of_the_owners():
    """``bound_rnn_weights(owner, name)``: put another RNN in (a pretrained encoder,
    another cell or size) and the weights, the shape they imply and ``module`` are the new
    one's, eager and compiled; plain ``RNNWeights(rnn)`` keeps reading its own RNN, and
    anything but such an RNN is refused at the assignment, which then does not happen."""
    owner = nn.Module()
    owner.rnn = _rnn("gru", 1, True)
    bound, fixed = bound_rnn_weights(owner, "rnn"), RNNWeights(owner.rnn)
    first, x = owner.rnn, _x()
    compiled = torch.compile(lambda w, x: padded_rnn(w, x, LENGTHS), backend="eager")
    torch.testing.assert_close(compiled(bound, x), _packed(first, x, LENGTHS)[0], **TOL)
    owner.rnn = new = _rnn("lstm", 2, False, dropout=0.25).eval()  # the reference: no dropout
    assert bound.module is new and fixed.module is first
    assert (bound.cell, bound.num_layers, bound.directions, bound.dropout) == ("lstm", 2, 1, 0.25)
    assert bound.layer(1)[1] is new.weight_hh_l1
    want = _packed(new, x, LENGTHS)[0]
    torch.testing.assert_close(padded_rnn(bound, x, LENGTHS), want, **TOL)
    torch.testing.assert_close(compiled(bound, x), want, **TOL)
    torch.testing.assert_close(padded_rnn(fixed, x, LENGTHS), _packed(first, x, LENGTHS)[0], **TOL)
    owner.weights = bound
    for copied in (copy.deepcopy(owner), pickle.loads(pickle.dumps(owner))):
        assert copied.weights.module is copied.rnn and copied.rnn is not new
        copied.rnn = first
        assert copied.weights.module is first and bound.module is new  # each its own
    with pytest.raises(
        TypeError, match=r"^Module\.rnn: rnn must be an nn\.GRU or nn\.LSTM, got RNN$"
    ):
        owner.rnn = nn.RNN(D_IN, H, batch_first=True)
    with pytest.raises(ValueError, match=r"^Module\.rnn: rnn must be batch_first=True"):
        owner.rnn = nn.GRU(D_IN, H)
    assert owner.rnn is new and bound.module is new
    with pytest.raises(TypeError, match=r"^Module has no submodule 'encoder'$"):
        bound_rnn_weights(owner, "encoder")
    stack = nn.ModuleList([_rnn("gru", 1, False), _rnn("gru", 1, False)])
    second = bound_rnn_weights(stack, "1")
    stack[1] = other = _rnn("lstm", 1, False)
    assert second.module is other


#: padded lengths of successive batches: the powers of two 8, 16, 32 and 64 cover them
VARIED = (5, 7, 9, 13, 17, 25, 31, 33, 3, 60)


@pytest.mark.parametrize("run", ["padded", "stepped"])
def test_compiled_recurrences_serve_every_padded_length_with_a_few_graphs(run):
    """Under ``torch.compile`` the recurrences run over the padded length rounded up
    (``attnlab._checks.compiled_steps``): ten batches of ten padded lengths compile five graphs (the
    first length, then one per power of two: Dynamo guards on the length's range), where
    a graph per length reached Dynamo's recompile limit (8) and fell back to eager; the
    outputs, the final state and the gradients are the packed run's."""
    rnn = _rnn("lstm", 2, run == "padded")
    weights, counter = RNNWeights(rnn), CompileCounter()

    def call(x: torch.Tensor, lengths: torch.Tensor):
        if run == "padded":
            return padded_rnn(weights, x, lengths), None
        return stepped_rnn(weights, x, lengths)

    torch._dynamo.reset()
    compiled = torch.compile(call, backend=counter)
    g = torch.Generator().manual_seed(3)
    for length in VARIED:
        x = torch.randn(3, length, D_IN, generator=g, dtype=torch.float64, requires_grad=True)
        lengths = torch.tensor([length, max(1, length - 2), 1])
        out, final = compiled(x, lengths)
        want, want_final = _packed(rnn, x, lengths)
        assert out.shape == want.shape
        torch.testing.assert_close(out, want, **TOL)
        loss, ref = out.square().sum(), want.square().sum()
        if final is not None:
            loss = loss + sum(s.sum() for s in final)
            ref = ref + sum(s.sum() for s in want_final)
            for a, b in zip(final, want_final, strict=True):
                torch.testing.assert_close(a, b, **TOL)
        for a, b in zip(
            torch.autograd.grad(loss, [x, *rnn.parameters()]),
            torch.autograd.grad(ref, [x, *rnn.parameters()]),
            strict=True,
        ):
            torch.testing.assert_close(a, b, **TOL)
    graphs = counter.frame_count
    assert graphs <= 5, f"{graphs} graphs for the padded lengths {VARIED}"
    torch._dynamo.reset()


def test_bad_rnns_and_directions_are_refused_in_one_line():
    with pytest.raises(TypeError, match=r"must be an nn\.GRU or nn\.LSTM, got RNN"):
        RNNWeights(nn.RNN(2, 3, batch_first=True))
    with pytest.raises(ValueError, match="batch_first=True and have no proj_size"):
        RNNWeights(nn.GRU(2, 3))
    with pytest.raises(ValueError, match="batch_first=True and have no proj_size"):
        RNNWeights(nn.LSTM(2, 3, batch_first=True, proj_size=2))
    with pytest.raises(ValueError, match="one direction; use padded_rnn"):
        stepped_rnn(RNNWeights(_rnn("gru", 1, True)), _x(), LENGTHS)


def test_bias_free_rnns():
    for cell in ("gru", "lstm"):
        rnn = _rnn(cell, 2, True, bias=False)
        want, _ = _packed(rnn, _x(), LENGTHS)
        torch.testing.assert_close(padded_rnn(RNNWeights(rnn), _x(), LENGTHS), want, **TOL)
        uni = _rnn(cell, 1, False, bias=False)
        want, _ = _packed(uni, _x(), LENGTHS.clamp(min=1))
        got, _ = stepped_rnn(RNNWeights(uni), _x(), LENGTHS.clamp(min=1))
        torch.testing.assert_close(got, want, **TOL)


@pytest.mark.parametrize("bias", [True, False])
def test_cell_equations_match_atens_cells(bias):
    """The plain-op cells (what the recurrences run under torch.func) against ATen's fused
    ``lstm_cell`` / ``gru_cell``, float64, with and without biases."""
    g = torch.Generator().manual_seed(2)
    x, h, c = (torch.randn(4, k, generator=g, dtype=torch.float64) for k in (D_IN, H, H))
    for cell, gates in (("lstm", 4), ("gru", 3)):
        params = [torch.randn(gates * H, k, generator=g, dtype=torch.float64) for k in (D_IN, H)]
        if bias:
            params += [torch.randn(gates * H, generator=g, dtype=torch.float64) for _ in "ih"]
        if cell == "lstm":
            want = torch.lstm_cell(x, (h, c), *params)
            got = lstm_cell(x, h, c, *params)
            for a, b in zip(got, want, strict=True):
                torch.testing.assert_close(a, b, **TOL)
        else:
            torch.testing.assert_close(
                gru_cell(x, h, *params), torch.gru_cell(x, h, *params), **TOL
            )


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_recurrences_under_vmap_match_the_batched_run(cell):
    """torch.func.vmap has no batching rule for aten::lstm / gru / lstm_cell: under it both
    recurrences run the cells' equations, and give the batched run's outputs and states
    (a bidirectional two-layer padded run, a one-direction stepped run)."""
    x = _x()
    lengths = LENGTHS.clamp(min=1)
    both = RNNWeights(_rnn(cell, 2, True))
    uni = RNNWeights(_rnn(cell, 2, False))
    want = padded_rnn(both, x, lengths)
    got = torch.func.vmap(lambda xi, li: padded_rnn(both, xi[None], li[None])[0])(x, lengths)
    torch.testing.assert_close(got, want, **TOL)
    want_out, want_state = stepped_rnn(uni, x, lengths)

    def one(xi: torch.Tensor, li: torch.Tensor):
        return stepped_rnn(uni, xi[None], li[None])

    # the state's batch axis is its second ([layers, N, hidden])
    dims = (0, (1, 1)) if cell == "lstm" else (0, 1)
    got_out, got_state = torch.func.vmap(one, out_dims=dims)(x, lengths)
    torch.testing.assert_close(got_out.squeeze(1), want_out, **TOL)
    for a, b in zip(torch.utils._pytree.tree_leaves(got_state),
                    torch.utils._pytree.tree_leaves(want_state), strict=True):  # fmt: skip
        torch.testing.assert_close(a.squeeze(2), b, **TOL)


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_rnn_step_is_one_step_of_the_module(cell):
    """``rnn_step`` (a decoder's traced step) gives the state ``nn.GRU`` / ``nn.LSTM``
    returns for a sequence of one step from the same state, with the same gradients."""
    rnn = _rnn(cell, 1, False)
    x = _x(requires_grad=True)[:, 0]
    g = torch.Generator().manual_seed(3)
    h = torch.randn(N, H, generator=g, dtype=torch.float64)
    c = torch.randn(N, H, generator=g, dtype=torch.float64)
    state = (h[None], c[None]) if cell == "lstm" else h[None]
    out, final = rnn(x[:, None], state)
    got_h, got_c = rnn_step(RNNWeights(rnn), x, h, c if cell == "lstm" else None)
    want_h = out[:, 0]
    torch.testing.assert_close(got_h, want_h, **TOL)
    if cell == "lstm":
        torch.testing.assert_close(got_c, final[1][0], **TOL)
    else:
        assert got_c is None
    params = [x, *rnn.parameters()]
    got_g = torch.autograd.grad(got_h.sum(), params)
    want_g = torch.autograd.grad(want_h.sum(), params)
    for a, b in zip(got_g, want_g, strict=True):
        torch.testing.assert_close(a, b, **TOL)


def test_rnn_step_refuses_what_it_cannot_run_in_one_line():
    h = torch.zeros(N, H, dtype=torch.float64)
    x = _x()[:, 0]
    for rnn in (_rnn("gru", 2, False), _rnn("gru", 1, True)):
        with pytest.raises(ValueError, match="one-layer, one-direction"):
            rnn_step(RNNWeights(rnn), x, h)
    with pytest.raises(ValueError, match="needs its cell state"):
        rnn_step(RNNWeights(_rnn("lstm", 1, False)), x, h)
