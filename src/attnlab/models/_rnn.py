"""The recurrent encoders of the task models.

:func:`masked_rnn` builds the :class:`~attnlab.feature.multilevel.MaskedRNN` of an encoder
name (``"bilstm"``, ``"bigru"``, ``"lstm"``, ``"gru"``: :data:`RNN_ENCODERS`), as the
document and target classifiers take it. :func:`run_packed` is the packed run of a
recurrent encoder over prefix-padded sequences, shared by the task models whose real
tokens come first (the sentence classifier's BiLSTM, the VQA question encoder, the
translator's encoder, the speech recogniser's listener).

``run_packed(weights, x, lengths, training=...)`` (``weights``: the encoder's
:class:`~attnlab._recurrent.RNNWeights`, built with it) packs ``x`` ``[B, n, d_in]`` by
``lengths`` ``[B]``, so the recurrence never reads padding, and pads the outputs back to
``n`` steps (a caller that needs a final state reads it from the outputs: the last real
step going forward, step 0 going backward). A row of length 0 is run as length 1
(``pack_padded_sequence`` refuses 0); its outputs are the caller's to
mask. Cost: that of the cell, O(B n d_in h), sequential in ``n``.
"""

from __future__ import annotations

from torch import Tensor
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from attnlab._checks import is_traced
from attnlab._recurrent import RNNWeights, padded_rnn
from attnlab.feature.multilevel import MaskedRNN

__all__ = ["RNN_ENCODERS", "masked_rnn", "run_packed"]

#: encoder name -> (its cell, whether it is bidirectional)
RNN_ENCODERS: dict[str, tuple[str, bool]] = {
    "bilstm": ("lstm", True),
    "bigru": ("gru", True),
    "lstm": ("lstm", False),
    "gru": ("gru", False),
}


def masked_rnn(name: str, d_in: int, hidden: int) -> MaskedRNN:
    """The :class:`MaskedRNN` of the encoder ``name`` (a key of :data:`RNN_ENCODERS`) from
    ``d_in`` features to ``hidden`` units per direction (its ``out_dim``: ``2 hidden``
    when bidirectional)."""
    cell, bidirectional = RNN_ENCODERS[name]
    return MaskedRNN(d_in, hidden, cell=cell, bidirectional=bidirectional)


def run_packed(weights: RNNWeights, x: Tensor, lengths: Tensor, *, training: bool) -> Tensor:
    """The outputs ``[B, n, d_out]`` of the ``batch_first`` RNN of ``weights`` (an
    ``nn.GRU`` or ``nn.LSTM``, ``weights.module``) over the first ``lengths[b]`` steps of
    each row of ``x`` ``[B, n, d_in]``, zero beyond them; ``training`` is the owner's mode
    (dropout between layers). ``B`` and ``n`` must be at least 1. Under ``torch.compile``
    and ``torch.export`` (which trace neither the fused recurrences nor packing) the same
    weights run over the padded rows (:func:`attnlab._recurrent.padded_rnn`: the same
    outputs, one graph). ``weights`` is built once with the RNN (a plain attribute of its
    owner): Dynamo refuses to trace a call that meets the ``nn.GRU`` / ``nn.LSTM`` itself."""
    if is_traced():
        return padded_rnn(weights, x, lengths.clamp(min=1), training=training)
    packed = pack_padded_sequence(
        x, lengths.clamp(min=1).cpu(), batch_first=True, enforce_sorted=False
    )
    out, _ = weights.module(packed)
    h, _ = pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])
    return h
