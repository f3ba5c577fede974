import math

import pytest
import torch
from attention_harness import check_rebuild_same_output
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import attnlab
from attnlab.query.attention_over_attention import (
    AttentionOverAttention,
    aoa_answer_scores,
    attention_over_attention,
)


def _softmax(xs):
    if not xs:
        return []
    mx = max(xs)
    z = sum(math.exp(x - mx) for x in xs)
    return [math.exp(x - mx) / z for x in xs]


def _naive_aoa(D, Q, dm, qm, match=None):
    """Loops over the formulas of Cui et al. 2017. ``match(d_row, q_row)`` defaults to the
    dot product. Returns dict of tensors."""
    B, n_d, _ = D.shape
    n_q = Q.shape[1]
    match = match or (lambda d, q: sum(float(a) * float(b) for a, b in zip(d, q, strict=True)))
    M = torch.zeros(B, n_d, n_q, dtype=torch.float64)
    alpha = torch.zeros_like(M)
    beta = torch.zeros_like(M)
    beta_bar = torch.zeros(B, n_q, dtype=torch.float64)
    s = torch.zeros(B, n_d, dtype=torch.float64)
    for b in range(B):
        rd = [i for i in range(n_d) if dm is None or dm[b, i]]
        rq = [t for t in range(n_q) if qm is None or qm[b, t]]
        for i in range(n_d):
            for t in range(n_q):
                M[b, i, t] = match(D[b, i], Q[b, t])
        for t in rq:  # column-wise: over the document, for query word t
            for i, a in zip(rd, _softmax([float(M[b, i, t]) for i in rd]), strict=True):
                alpha[b, i, t] = a
        for i in rd:  # row-wise: over the query, for document word i
            for t, a in zip(rq, _softmax([float(M[b, i, t]) for t in rq]), strict=True):
                beta[b, i, t] = a
        for t in rq:
            beta_bar[b, t] = sum(float(beta[b, i, t]) for i in rd) / len(rd) if rd else 0.0
        for i in rd:
            s[b, i] = sum(float(alpha[b, i, t]) * float(beta_bar[b, t]) for t in rq)
    return {"matching": M, "alpha": alpha, "beta": beta, "beta_bar": beta_bar, "s": s}


def _inputs(B=3, n_d=5, n_q=3, d=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    D = torch.randn(B, n_d, d, generator=g, dtype=torch.float64)
    Q = torch.randn(B, n_q, d, generator=g, dtype=torch.float64)
    dm = torch.ones(B, n_d, dtype=torch.bool)
    dm[1, 3:] = False
    qm = torch.ones(B, n_q, dtype=torch.bool)
    qm[1, 2] = False
    qm[2] = False  # no real query word
    return D, Q, dm, qm


def _check(out, ref):
    for key, value in ref.items():
        got = getattr(out, key)
        if key == "matching":  # padded entries of M are not used; compare the real ones only
            continue
        torch.testing.assert_close(got, value, msg=lambda m, k=key: f"{k}: {m}")


def test_matches_naive_loop_with_masks_both_ways():
    D, Q, dm, qm = _inputs()
    out = attention_over_attention(D, Q, dm, qm)
    ref = _naive_aoa(D, Q, dm, qm)
    _check(out, ref)
    torch.testing.assert_close(out.matching, ref["matching"])
    torch.testing.assert_close(out.context, (ref["s"].unsqueeze(-1) * D).sum(1))
    # s is a distribution over the real document words (0 without a real query word)
    torch.testing.assert_close(out.s.sum(-1), torch.tensor([1.0, 1.0, 0.0], dtype=torch.float64))
    assert torch.equal(out.s[1, 3:], torch.zeros(2, dtype=torch.float64))
    assert torch.equal(out.alpha[1, :, 2], torch.zeros(5, dtype=torch.float64))
    for masks in ((None, None), (dm, None), (None, qm)):
        _check(attention_over_attention(D, Q, *masks), _naive_aoa(D, Q, *masks))


def test_module_with_general_score_and_sparsemax():
    torch.manual_seed(0)
    m = AttentionOverAttention(d_q=3, d_k=4, score="general").double()
    D, _, dm, qm = _inputs()
    Q = torch.randn(3, 3, 3, dtype=torch.float64)
    W = m.score.W.weight.detach()  # [d_k, d_q]: M[i, t] = d_i^T W q_t

    def general(d, q):
        return sum(float(d[i]) * float(W[i, j]) * float(q[j]) for i in range(4) for j in range(3))

    out = m(D, Q, mask1=dm, mask2=qm)
    _check(out, _naive_aoa(D, Q, dm, qm, general))
    sparse = AttentionOverAttention(align="sparsemax").double()
    out = sparse(D, D[:, :3], mask1=dm, mask2=dm[:, :3])
    assert torch.all(out.s >= 0)
    torch.testing.assert_close(out.alpha.sum(1)[0], torch.ones(3, dtype=torch.float64))
    default = AttentionOverAttention()
    D32, Q32 = D.float(), D[:, :3].float()
    torch.testing.assert_close(
        default(D32, Q32, mask1=dm, mask2=dm[:, :3]).s,
        attention_over_attention(D32, Q32, dm, dm[:, :3]).s,
    )


@settings(max_examples=25, deadline=None)
@given(
    n_d=st.integers(1, 6),
    n_q=st.integers(1, 4),
    seed=st.integers(0, 10_000),
    data=st.data(),
)
def test_s_is_a_distribution_over_real_document_words(n_d, n_q, seed, data):
    g = torch.Generator().manual_seed(seed)
    D = torch.randn(2, n_d, 3, generator=g, dtype=torch.float64)
    Q = torch.randn(2, n_q, 3, generator=g, dtype=torch.float64)
    ld = data.draw(st.lists(st.integers(0, n_d), min_size=2, max_size=2))
    lq = data.draw(st.lists(st.integers(0, n_q), min_size=2, max_size=2))
    dm = torch.arange(n_d)[None] < torch.tensor(ld)[:, None]
    qm = torch.arange(n_q)[None] < torch.tensor(lq)[:, None]
    out = attention_over_attention(D, Q, dm, qm)
    assert torch.isfinite(out.s).all() and (out.s >= 0).all()
    for b in range(2):
        expected = 1.0 if ld[b] > 0 and lq[b] > 0 else 0.0
        assert out.s[b].sum().item() == pytest.approx(expected)
        assert out.beta_bar[b].sum().item() == pytest.approx(expected)
        assert torch.equal(out.s[b, ld[b] :], torch.zeros(n_d - ld[b], dtype=torch.float64))


def test_answer_scores_sum_over_positions_of_each_candidate():
    s = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.5, 0.5, 0.0, 0.0]], dtype=torch.float64)
    doc = torch.tensor([[7, 3, 7, 9], [3, 3, 1, 1]])
    cands = torch.tensor([[7, 9, 5], [3, 1, 7]])
    got = aoa_answer_scores(s, doc, cands)
    ref = torch.zeros(2, 3, dtype=torch.float64)
    for b in range(2):
        for c in range(3):
            ref[b, c] = sum(float(s[b, i]) for i in range(4) if doc[b, i] == cands[b, c])
    torch.testing.assert_close(got, ref)
    torch.testing.assert_close(got[0], torch.tensor([0.4, 0.4, 0.0], dtype=torch.float64))
    mask = torch.tensor([[True, True, False, True], [True] * 4])
    torch.testing.assert_close(
        aoa_answer_scores(s, doc, cands, mask)[0, 0], torch.tensor(0.1, dtype=torch.float64)
    )
    with pytest.raises(
        ValueError, match=r"document_tokens has shape \(2, 3\), expected \[B, n_d\] = \[2, 4\]"
    ):
        aoa_answer_scores(s, doc[:, :3], cands)
    with pytest.raises(TypeError, match=r"candidates has dtype torch\.float32"):
        aoa_answer_scores(s, doc, cands.float())


def test_gradcheck():
    D, Q, dm, qm = _inputs()
    args = [D.clone().requires_grad_(), Q.clone().requires_grad_()]
    assert torch.autograd.gradcheck(lambda d, q: attention_over_attention(d, q, dm, qm).s, args)
    assert torch.autograd.gradcheck(
        lambda d, q: attention_over_attention(d, q, dm, qm).context, args
    )
    torch.manual_seed(0)
    m = AttentionOverAttention(4, 4, score="general").double()
    assert torch.autograd.gradcheck(lambda d, q: m(d, q, mask1=dm, mask2=qm).beta_bar, args)


def test_fully_masked_and_empty_inputs():
    D, Q, _, _ = _inputs()
    D, Q = D.clone().requires_grad_(), Q.clone().requires_grad_()
    out = attention_over_attention(D, Q, torch.zeros(3, 5, dtype=torch.bool))
    for t in (out.s, out.alpha, out.beta, out.beta_bar, out.context):
        assert torch.equal(t, torch.zeros_like(t))
    out.s.sum().backward()
    assert torch.equal(D.grad, torch.zeros_like(D)) and torch.equal(Q.grad, torch.zeros_like(Q))
    for d_slice, q_slice in ((slice(0, 0), slice(None)), (slice(None), slice(0, 0))):
        out = attention_over_attention(D[:, d_slice], Q[:, q_slice])
        assert torch.isfinite(out.s).all()
        assert torch.equal(out.s, torch.zeros_like(out.s))
        assert torch.equal(out.beta_bar, torch.zeros_like(out.beta_bar))
        out.context.sum().backward()


def test_bad_input_names_argument_and_shape():
    D, Q, dm, qm = _inputs()
    with pytest.raises(ValueError, match=r"document has shape \(3, 4\), expected \[B, n_d, d\]"):
        attention_over_attention(D[:, 0], Q)
    with pytest.raises(
        ValueError, match=r"query has shape \(2, 3, 4\), expected \[B, n_q, d\] = \[3, n_q, d\]"
    ):
        attention_over_attention(D, Q[:2])
    with pytest.raises(ValueError, match="needs the same size"):
        attention_over_attention(D, Q[..., :2])
    with pytest.raises(
        ValueError, match=r"document_mask has shape \(3, 4\), expected \[B, n\] = \[3, 5\]"
    ):
        attention_over_attention(D, Q, dm[:, :4])
    with pytest.raises(TypeError, match=r"query_mask has dtype torch\.float32"):
        attention_over_attention(D, Q, dm, qm.float())
    with pytest.raises(TypeError, match="dtype"):
        attention_over_attention(D, Q.float())
    m = AttentionOverAttention(3, 4, score="general")
    with pytest.raises(
        ValueError, match=r"query has shape \(3, 3, 4\), expected \[B, n_q, d\] = \[3, n_q, 3\]"
    ):
        m(D.float(), Q.float())
    with pytest.raises(attnlab.ConfigError, match="soft, sparsemax or entmax15"):
        AttentionOverAttention(align="hard")
    with pytest.raises(attnlab.ConfigError, match="pairwise score"):
        AttentionOverAttention(score="queryless", d_k=4)
    with pytest.raises(TypeError, match="unknown options"):
        AttentionOverAttention(score="dot", d_w=3)


def test_registry_roundtrip():
    m = AttentionOverAttention(3, 4, score="general")
    cfg = m.get_config()
    assert cfg["name"] == "attention-over-attention" and cfg["kind"] == "query"
    check_rebuild_same_output(m, [torch.randn(2, 5, 4), torch.randn(2, 3, 3)], output="s")
    assert isinstance(attnlab.build({"name": "aoa"}), AttentionOverAttention)


# ----------------------------------------------------------------------------- learning

VOCAB, N_DOC, N_QUERY, D_EMB = 20, 10, 4, 24
BLANK, START = VOCAB, VOCAB + 1


def _cloze(n, gen):
    """A document of N_DOC distinct words; a query of N_QUERY words in which the word right
    before the BLANK is a document word w. The answer is the document word that follows w."""
    doc = torch.stack([torch.randperm(VOCAB, generator=gen)[:N_DOC] for _ in range(n)])
    r = torch.arange(n)
    i = torch.randint(0, N_DOC - 1, (n,), generator=gen)
    query = torch.randint(0, VOCAB, (n, N_QUERY), generator=gen)
    blank = torch.randint(1, N_QUERY, (n,), generator=gen)
    query[r, blank] = BLANK
    query[r, blank - 1] = doc[r, i]
    return doc, query, doc[r, i + 1], blank


class _Encoder(nn.Module):
    """h_i = A e(x_(i-1)) + B e(x_i): each word vector also sees the previous word."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB + 2, D_EMB)
        self.A = nn.Linear(D_EMB, D_EMB)
        self.B = nn.Linear(D_EMB, D_EMB, bias=False)

    def forward(self, x):
        prev = torch.cat([torch.full_like(x[:, :1], START), x[:, :-1]], 1)
        return self.A(self.emb(prev)) + self.B(self.emb(x))


class _Reader(nn.Module):
    """P(w | D, Q) over the document words: the AoA reader, or (``aoa=False``) a softmax
    over the document words from the mean-pooled document and query (the baseline)."""

    def __init__(self, aoa):
        super().__init__()
        self.doc_enc, self.query_enc = _Encoder(), _Encoder()
        self.aoa = aoa
        self.out = nn.Sequential(nn.Linear(2 * D_EMB, 64), nn.Tanh(), nn.Linear(64, VOCAB))

    def forward(self, doc, query):
        D, Q = self.doc_enc(doc), self.query_enc(query)
        if self.aoa:
            out = attention_over_attention(D, Q)
            return aoa_answer_scores(out.s, doc, doc), out
        logits = self.out(torch.cat([D.mean(1), Q.mean(1)], -1))
        return logits.gather(1, doc).softmax(-1), None


def _train_cloze(model, steps=300):
    gen = torch.Generator().manual_seed(0)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(steps):
        doc, query, answer, _ = _cloze(64, gen)
        p, _ = model(doc, query)
        gold = (p * (doc == answer[:, None])).sum(-1)
        loss = -torch.log(gold + 1e-9).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    doc, query, answer, blank = _cloze(2000, torch.Generator().manual_seed(5))
    with torch.no_grad():
        p, out = model(doc, query)
    pred = doc.gather(1, p.argmax(-1, keepdim=True)).squeeze(1)
    return (pred == answer).float().mean().item(), out, blank


@pytest.mark.slow
def test_aoa_reader_answers_the_cloze_task():
    torch.manual_seed(0)
    acc, out, blank = _train_cloze(_Reader(aoa=True))
    torch.manual_seed(0)
    base, _, _ = _train_cloze(_Reader(aoa=False))
    # measured with these seeds: AoA reader 1.00, mean-pooled document + query 0.09
    # (chance among the 10 document words: 0.1)
    assert acc > 0.95, acc
    assert base < 0.3, base
    # the query-level attention beta_bar learned to weight the blank's column most (0.95 of
    # the test queries)
    top = out.beta_bar.argmax(-1)
    assert (top == blank).float().mean().item() > 0.8


def test_a_dot_matching_names_the_document_and_the_query_when_their_sizes_differ():
    # the matching score is called as score(question, document): without this check its
    # message named the question "q" and the document "k", the reverse of the call
    doc, question = torch.randn(2, 5, 8), torch.randn(2, 3, 7)
    want = (
        r"the dot matching M = D Q\^T needs the same size: document has shape \(2, 5, 8\), "
        r"query has shape \(2, 3, 7\)"
    )
    with pytest.raises(ValueError, match=want):
        AttentionOverAttention()(doc, question)
    with pytest.raises(ValueError, match=want):
        attention_over_attention(doc, question)
    with pytest.raises(ValueError, match=r"the cosine matching M = D Q\^T needs the same size"):
        AttentionOverAttention(score="cosine")(doc, question)
    # a score with weights maps one size onto the other
    assert AttentionOverAttention(7, 8, score="general")(doc, question).s.shape == (2, 5)
