"""Tests of attnlab.models.document: the hierarchical attention network (Yang et al. 2016)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from attention_harness import Inputs, check_rebuild_same_output

from attnlab._checks import ConfigError
from attnlab.feature.multilevel import HierarchicalAttention
from attnlab.models.document import DocumentClassifier, DocumentOutput
from attnlab.registry import get

V = 30
ATTENTIONS = {
    "han": "han",
    "dot-query": {"score": "scaled-dot"},
    "additive-sparsemax": {"score": "additive", "align": "sparsemax"},
    "mean": "mean",
    "uniform": "uniform",
}


def tiny(attention="han", **kw):
    torch.manual_seed(0)
    kw = {"embed_dim": 6, "hidden_size": 3, **kw}
    return DocumentClassifier(V, 3, attention=attention, **kw).eval()


def batch(seed=0):
    """Three documents of up to 3 sentences of up to 4 words; document 1 has an empty
    middle sentence, document 2 only 2 sentences (its third word_lengths entry is
    ignored)."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, V, (3, 3, 4), generator=g)
    word_lengths = torch.tensor([[4, 2, 3], [1, 0, 3], [2, 3, 4]])
    sentence_lengths = torch.tensor([3, 3, 2])
    mask = torch.arange(4)[None, None] < word_lengths[..., None]
    mask &= (torch.arange(3)[None] < sentence_lengths[:, None])[..., None]
    tokens[~mask] = 0
    return tokens, word_lengths, sentence_lengths, mask


# ----------------------------------------------------------------------------- shapes


@pytest.mark.parametrize("attention", list(ATTENTIONS))
def test_shapes_and_weights(attention):
    model = tiny(ATTENTIONS[attention])
    tokens, wl, sl, mask = batch()
    out = model(tokens, word_lengths=wl, sentence_lengths=sl)
    assert isinstance(out, DocumentOutput)
    assert out.logits.shape == (3, 3)
    assert out.document.shape == (3, model.d_c) and model.d_c == 6
    assert out.sentences.shape == (3, 3, 6)
    assert out.sentence_mask.tolist() == [
        [True, True, True],
        [True, False, True],
        [True, True, False],
    ]
    if attention == "mean":
        assert out.word_weights is None and out.sentence_weights is None
        return
    assert out.word_weights.shape == (3, 3, 4) and out.sentence_weights.shape == (3, 3)
    # zero on padding words and empty sentences, sums to 1 over the real items
    assert (out.word_weights[~mask] == 0).all()
    sums = out.word_weights.sum(-1)
    torch.testing.assert_close(sums[out.sentence_mask], torch.ones(7))
    assert (sums[~out.sentence_mask] == 0).all()
    assert out.sentence_weights[1, 1] == 0 and out.sentence_weights[2, 2] == 0
    torch.testing.assert_close(out.sentence_weights.sum(-1), torch.ones(3))


def test_mask_argument_equals_lengths():
    model = tiny()
    tokens, wl, sl, mask = batch()
    a = model(tokens, word_lengths=wl, sentence_lengths=sl)
    b = model(tokens, mask)
    torch.testing.assert_close(a.logits, b.logits)
    torch.testing.assert_close(a.word_weights, b.word_weights)


# ----------------------------------------------------------------------------- formula


def _naive_gru_states(rnn: torch.nn.GRU, x: torch.Tensor) -> torch.Tensor:
    """Bidirectional GRU states of one unpadded sequence ``x`` ``[n, d]`` from the
    textbook recurrence (Cho et al. 2014), one step at a time."""
    H = rnn.hidden_size

    def run(suffix: str, seq: list[torch.Tensor]) -> list[torch.Tensor]:
        w_ih, w_hh = getattr(rnn, f"weight_ih_l0{suffix}"), getattr(rnn, f"weight_hh_l0{suffix}")
        b_ih, b_hh = getattr(rnn, f"bias_ih_l0{suffix}"), getattr(rnn, f"bias_hh_l0{suffix}")
        h = torch.zeros(H, dtype=x.dtype)
        out = []
        for xt in seq:
            gi, gh = w_ih @ xt + b_ih, w_hh @ h + b_hh
            r = torch.sigmoid(gi[:H] + gh[:H])
            z = torch.sigmoid(gi[H : 2 * H] + gh[H : 2 * H])
            n = torch.tanh(gi[2 * H :] + r * gh[2 * H :])
            h = (1 - z) * n + z * h
            out.append(h)
        return out

    rows = list(x)
    fwd = run("", rows)
    bwd = run("_reverse", rows[::-1])[::-1]
    return torch.stack([torch.cat([f, b]) for f, b in zip(fwd, bwd, strict=True)])


def _naive_han_pool(han: HierarchicalAttention, items: torch.Tensor) -> tuple[torch.Tensor, list]:
    """HAN's attention over ``items`` ``[n, d]`` by hand: u_i = tanh(W h_i + b),
    e_i = u_i . w, a = softmax(e), c = sum a_i h_i."""
    score = han.attn[0].score
    W, b, w = score.W.weight, score.W.bias, score.w
    e = [float((torch.tanh(W @ h + b) @ w).detach()) for h in items]
    top = max(e)
    z = [math.exp(v - top) for v in e]
    a = [v / sum(z) for v in z]
    c = sum(ai * h for ai, h in zip(a, items, strict=True))
    return c, a


def test_document_vector_equals_a_naive_loop_over_sentences_and_words():
    model = tiny("han").double()
    tokens, wl, sl, _mask = batch()
    out = model(tokens, word_lengths=wl, sentence_lengths=sl)
    E = model.embedding.weight
    for b in range(3):
        sent_vecs, kept = [], []
        for i in range(int(sl[b])):
            n = int(wl[b, i])
            if n == 0:  # an empty sentence is skipped
                assert out.sentence_weights[b, i] == 0
                continue
            h = _naive_gru_states(model.word_encoder.rnn, E[tokens[b, i, :n]])
            s, a = _naive_han_pool(model.word_attention, h)
            torch.testing.assert_close(out.word_weights[b, i, :n], torch.tensor(a).double())
            torch.testing.assert_close(out.sentences[b, i], s)
            sent_vecs.append(s)
            kept.append(i)
        g = _naive_gru_states(model.sentence_encoder.rnn, torch.stack(sent_vecs))
        v, beta = _naive_han_pool(model.sentence_attention, g)
        torch.testing.assert_close(out.sentence_weights[b, kept], torch.tensor(beta).double())
        torch.testing.assert_close(out.document[b], v)
        logits = model.output.weight @ v + model.output.bias
        torch.testing.assert_close(out.logits[b], logits)


def test_two_levels_equal_hierarchical_attention_with_two_levels():
    """The model's two levels are HierarchicalAttention(levels=2) with its encoders."""
    model = tiny("han")
    han = HierarchicalAttention(
        6, 2, "queryless", "soft", encoder=[model.word_encoder, model.sentence_encoder], d_w=6
    )
    han.attn[0].load_state_dict(model.word_attention.attn[0].state_dict())
    han.attn[1].load_state_dict(model.sentence_attention.attn[0].state_dict())
    tokens, wl, sl, mask = batch()
    out = model(tokens, word_lengths=wl, sentence_lengths=sl)
    x = model.embedding(tokens) * mask[..., None]
    ref = han(x, mask=mask, need_weights=True)
    torch.testing.assert_close(out.document, ref.context)
    torch.testing.assert_close(out.word_weights, ref.weights[0])
    torch.testing.assert_close(out.sentence_weights, ref.weights[1])


@pytest.mark.parametrize("attention", ["mean", "uniform"])
def test_baselines_equal_hand_computed_means(attention):
    model = tiny(attention, encoder="identity")
    tokens, wl, sl, _mask = batch()
    out = model(tokens, word_lengths=wl, sentence_lengths=sl)
    E = model.embedding.weight
    for b in range(3):
        sents = []
        for i in range(int(sl[b])):
            n = int(wl[b, i])
            if n:
                sents.append(sum(E[int(t)] for t in tokens[b, i, :n]) / n)
        torch.testing.assert_close(out.document[b], sum(sents) / len(sents))
    if attention == "uniform":
        assert out.sentence_weights[1].tolist() == [0.5, 0.0, 0.5]
        assert out.sentence_weights[2].tolist() == [0.5, 0.5, 0.0]
        assert out.word_weights[0, 1].tolist() == [0.5, 0.5, 0.0, 0.0]
        assert model.word_attention is not None  # the attention parameters stay


def test_uniform_flag_on_trained_model_and_value_projection():
    model = tiny({"score": "queryless", "value_dim": 5}, encoder="identity")
    tokens, wl, sl, _mask = batch()
    model.uniform = (True, False)
    out = model(tokens, word_lengths=wl, sentence_lengths=sl)
    E = model.embedding.weight
    proj = model.word_attention.attn[0].value_proj
    expected = sum(proj(E[int(t)]) for t in tokens[0, 0, :4]) / 4
    torch.testing.assert_close(out.sentences[0, 0], expected)
    assert out.word_weights[0, 0].tolist() == [0.25] * 4
    assert model.uniform == (True, False)


def test_per_level_attention_and_encoder():
    model = tiny("mean", sentence_attention="han", sentence_encoder="identity")
    tokens, wl, sl, _ = batch()
    out = model(tokens, word_lengths=wl, sentence_lengths=sl)
    assert out.word_weights is None and out.sentence_weights.shape == (3, 3)
    assert model.word_attention is None and model.sentence_attention is not None
    assert isinstance(model.sentence_encoder, torch.nn.Identity)


# ----------------------------------------------------------------------------- padding, empty


@pytest.mark.parametrize("attention", list(ATTENTIONS))
def test_padding_does_not_change_the_result(attention):
    model = tiny(ATTENTIONS[attention])
    tokens, wl, sl, mask = batch()
    a = model(tokens, word_lengths=wl, sentence_lengths=sl)
    bigger = torch.zeros(3, 5, 7, dtype=torch.long)
    bigger[:, :3, :4] = tokens
    wl2 = torch.zeros(3, 5, dtype=torch.long)
    wl2[:, :3] = wl
    b = model(bigger, word_lengths=wl2, sentence_lengths=sl)
    torch.testing.assert_close(b.logits, a.logits)
    # garbage ids at the padding positions do not matter either
    garbage = bigger.clone()
    m2 = torch.zeros(3, 5, 7, dtype=torch.bool)
    m2[:, :3, :4] = mask
    garbage[~m2] = torch.randint(1, V, (int((~m2).sum()),))
    c = model(garbage, m2)
    torch.testing.assert_close(c.logits, a.logits)
    if a.word_weights is not None:
        assert (c.word_weights[~m2] == 0).all()
        assert (c.sentence_weights[:, 3:] == 0).all()


@pytest.mark.parametrize("attention", list(ATTENTIONS))
def test_empty_sentence_is_skipped(attention):
    """Document 1 = [s0, <empty>, s2] gives the same result as [s0, s2]."""
    model = tiny(ATTENTIONS[attention])
    tokens, wl, sl, _ = batch()
    out = model(tokens[1:2], word_lengths=wl[1:2], sentence_lengths=sl[1:2])
    squeezed = tokens[1:2, [0, 2]]
    ref = model(squeezed, word_lengths=wl[1:2, [0, 2]])
    torch.testing.assert_close(out.logits, ref.logits)
    if out.sentence_weights is not None:
        torch.testing.assert_close(out.sentence_weights[:, [0, 2]], ref.sentence_weights)


@pytest.mark.parametrize("attention", list(ATTENTIONS))
def test_empty_document_gives_the_output_bias_and_finite_grads(attention):
    model = tiny(ATTENTIONS[attention]).train()
    tokens, wl, sl, _ = batch()
    wl = wl.clone()
    wl[1] = 0
    out = model(tokens, word_lengths=wl, sentence_lengths=sl)
    torch.testing.assert_close(out.logits[1], model.output.bias)
    assert (out.document[1] == 0).all()
    if out.sentence_weights is not None:
        assert (out.sentence_weights[1] == 0).all() and (out.word_weights[1] == 0).all()
    out.logits.sum().backward()
    for p in model.parameters():
        if p.grad is not None:
            assert torch.isfinite(p.grad).all()
    # zero-size inputs
    for shape in [(2, 0, 4), (2, 3, 0), (0, 3, 4)]:
        o = model(torch.zeros(shape, dtype=torch.long))
        assert o.logits.shape == (shape[0], 3)
        assert torch.isfinite(o.logits).all()


# ----------------------------------------------------------------------------- gradients


@pytest.mark.parametrize("attention", ["han", {"score": "scaled-dot"}, "uniform"])
def test_gradcheck(attention):
    model = tiny(attention, embed_dim=2, hidden_size=2).double()
    _, _wl, _sl, mask = batch()
    mask = mask[1:, :, :3]  # an empty sentence, a padding sentence, ragged words
    x = torch.randn(2, 3, 3, 2, dtype=torch.float64) * mask[..., None]
    x.requires_grad_(True)

    def f(x):
        return model.classify(x, mask).logits

    assert torch.autograd.gradcheck(f, (x,), eps=1e-6, atol=1e-5)


def test_hard_attention_exposes_log_prob():
    model = tiny({"align": "hard"}).train()
    tokens, wl, sl, _ = batch()
    out = model(tokens, word_lengths=wl, sentence_lengths=sl)
    assert out.log_prob is not None and out.log_prob.shape == (3,)
    assert ((out.word_weights == 0) | (out.word_weights == 1)).all()
    out.log_prob.sum().backward()


# ----------------------------------------------------------------------------- errors


def test_bad_inputs():
    model = tiny()
    tokens, wl, sl, mask = batch()
    with pytest.raises(TypeError, match=r"tokens has dtype torch.float32 and shape \(3, 3, 4\)"):
        model(tokens.float())
    with pytest.raises(ValueError, match=r"tokens has shape \(3, 12\), expected \[B, S, W\]"):
        model(tokens.reshape(3, 12))
    with pytest.raises(ValueError, match="outside \\[0, vocab_size\\)"):
        model(tokens + V)
    with pytest.raises(TypeError, match=r"mask has dtype torch.int64"):
        model(tokens, mask.long())
    with pytest.raises(ValueError, match=r"mask has shape \(3, 3\), expected \[B, S, W\]"):
        model(tokens, mask[..., 0])
    with pytest.raises(ValueError, match="not both"):
        model(tokens, mask, word_lengths=wl)
    with pytest.raises(ValueError, match=r"word_lengths has shape \(3,\), expected \[B, S\]"):
        model(tokens, word_lengths=sl)
    with pytest.raises(ValueError, match="outside \\[0, W\\] = \\[0, 4\\]"):
        model(tokens, word_lengths=wl + 3)
    with pytest.raises(ValueError, match="outside \\[0, S\\] = \\[0, 3\\]"):
        model(tokens, word_lengths=wl, sentence_lengths=sl + 2)
    with pytest.raises(TypeError, match=r"word_lengths has dtype torch.float32"):
        model(tokens, word_lengths=wl.float())
    with pytest.raises(ValueError, match="needs word_lengths"):
        model(tokens, sentence_lengths=sl)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"attention": "nope"}, "attention must be"),
        ({"attention": 3}, "attention must be a name or a dict"),
        ({"encoder": "cnn"}, "encoder must be one of"),
        ({"sentence_encoder": "cnn"}, "sentence_encoder must be one of"),
        ({"hidden_size": 0}, "hidden_size must be an int >= 1"),
        ({"dropout": 1.0}, "dropout must be in"),
        ({"padding_idx": V}, "padding_idx"),
    ],
)
def test_bad_config(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        DocumentClassifier(V, 2, **{"embed_dim": 4, "hidden_size": 2, **kwargs})


def test_unknown_score_option_is_rejected():
    with pytest.raises(TypeError, match="unknown options"):
        DocumentClassifier(V, 2, embed_dim=4, hidden_size=2, attention={"nope": 1})


# ----------------------------------------------------------------------------- embeddings, config


def test_pretrained_embeddings():
    matrix = np.random.default_rng(0).normal(size=(V, 5)).astype(np.float32)
    model = DocumentClassifier(embeddings=matrix, freeze_embeddings=True, hidden_size=2)
    assert model.vocab_size == V and model.embedding.embedding_dim == 5
    torch.testing.assert_close(model.embedding.weight, torch.from_numpy(matrix))
    assert not model.embedding.weight.requires_grad
    with pytest.raises(ConfigError, match="embeddings has shape"):
        DocumentClassifier(V + 1, embeddings=matrix)
    with pytest.raises(ConfigError, match="give vocab_size"):
        DocumentClassifier()


def test_registry_and_config_round_trip():
    entry = get("model", "document-classifier")
    assert entry.cls is DocumentClassifier and "Yang" in entry.source
    model = tiny({"score": "additive", "align": "sparsemax"}, sentence_attention="mean")
    cfg = model.get_config()
    assert cfg["name"] == "document-classifier" and cfg["kind"] == "model"
    tokens, wl, _sl, _ = batch()
    rebuilt = check_rebuild_same_output(
        model, Inputs((tokens,), {"word_lengths": wl}), output="logits"
    )
    assert isinstance(rebuilt, DocumentClassifier)


def test_uniform_keeps_the_checkpoint_layout_of_the_attention_model():
    assert tiny("han").state_dict().keys() == tiny("uniform").state_dict().keys()
    assert not any("attention" in k for k in tiny("mean").state_dict())


# ----------------------------------------------------------------------------- learning


def _marked_documents(n: int, seed: int, S: int = 4, W: int = 5):
    """Documents of S sentences; every sentence holds one polarity word (2 = good, 3 =
    bad) among noise words (5..29); exactly one sentence also holds the marker 1, and the
    label is the polarity of that sentence. Without finding the marked sentence the best
    guess is the majority polarity: about 69% for S = 4 (ties are coin flips)."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(5, V, (n, S, W), generator=g)
    lengths = torch.randint(3, W + 1, (n, S), generator=g)
    polarity = torch.randint(0, 2, (n, S), generator=g)
    marked = torch.randint(0, S, (n,), generator=g)
    for d in range(n):
        for i in range(S):
            L = int(lengths[d, i])
            slots = torch.randperm(L, generator=g)
            tokens[d, i, slots[0]] = 2 + int(polarity[d, i])
            if i == int(marked[d]):
                tokens[d, i, slots[1]] = 1
            tokens[d, i, L:] = 0
    labels = 1 - polarity[torch.arange(n), marked]  # 1 = good
    return tokens, lengths, labels, marked


def _train(attention, seed=0, steps=100):
    torch.manual_seed(seed)
    model = DocumentClassifier(
        V, 2, embed_dim=12, encoder="identity", attention=attention, attention_dim=12
    )
    tokens, lengths, labels, _ = _marked_documents(1024, seed=1)
    opt = torch.optim.Adam(model.parameters(), lr=2e-2)
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        idx = torch.randint(0, len(labels), (64,), generator=g)
        out = model(tokens[idx], word_lengths=lengths[idx])
        loss = F.cross_entropy(out.logits, labels[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    tokens, lengths, labels, marked = _marked_documents(512, seed=2)
    model.eval()
    with torch.no_grad():
        out = model(tokens, word_lengths=lengths)
    acc = float((out.logits.argmax(-1) == labels).float().mean())
    return acc, out, marked


@pytest.mark.slow
def test_hierarchical_attention_finds_the_marked_sentence():
    """HAN (identity encoders, so only the attention can relate the marker to the polarity
    word) reaches 1.00 test accuracy and puts 0.98 of the sentence weight on the marked
    sentence; mean pooling at both levels stays at the majority-polarity level, 0.66."""
    acc, out, marked = _train("han")
    weight_on_marked = float(out.sentence_weights[torch.arange(len(marked)), marked].mean())
    assert acc >= 0.95, acc
    assert weight_on_marked >= 0.7, weight_on_marked
    mean_acc, _, _ = _train("mean")
    assert mean_acc <= 0.75, mean_acc
