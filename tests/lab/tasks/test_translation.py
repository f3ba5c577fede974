"""Task ``translation``: every preset and baseline on a tiny generated corpus (no data
needed), the real Bible data when installed, and one end-to-end ``train_run``."""

from __future__ import annotations

import math

import pytest
import torch
from task_harness import (
    check_bad_options,
    check_deterministic,
    check_train_run,
    evaluate_and_draw,
    load_or_skip,
)

from attnlab._checks import ConfigError
from attnlab.data.pharaoh import Alignment
from attnlab.lab.task import TaskData
from attnlab.lab.tasks.translation import (
    BOS,
    EOS,
    PAD,
    TranslationData,
    TranslationTask,
    corpus_bleu,
    synthetic_pairs,
)
from attnlab.models.translator import Seq2SeqTranslator

TINY = {
    "corpus": "reverse",
    "synthetic_pairs": 60,
    "max_len": 5,
    "embed_dim": 8,
    "hidden_size": 8,
    "batch_size": 8,
    "dropout": 0.0,
}
SPECS = [{"name": n} for n in (*TranslationTask.presets, "mean", "uniform")]


@pytest.fixture(scope="module")
def tiny() -> tuple[TranslationTask, TaskData]:
    task = TranslationTask(**TINY)
    return task, task.load_data()


def test_synthetic_data(tiny) -> None:
    _, data = tiny
    assert {s: len(data.split(s)) for s in ("train", "dev", "test")} == {
        "train": 48,
        "dev": 6,
        "test": 6,
    }
    part = data.train
    assert all(t == s[::-1] for s, t in zip(part.source, part.target, strict=True))
    vocab = data.info["tgt_vocab"]
    assert [vocab.token(i) for i in (PAD, BOS, EOS)] == ["<pad>", "<s>", "</s>"]
    assert (
        synthetic_pairs(3, kind="copy", seed=1)[0][0]
        == synthetic_pairs(3, kind="copy", seed=1)[0][1]
    )


def test_batches_pad_and_shift(tiny) -> None:
    task, data = tiny
    batch = next(task.batches(data, "train", 4))
    part = data.train
    for b in range(4):
        s, t = part.src_ids[b], part.tgt_ids[b]
        assert batch["src"][b, : len(s)].tolist() == list(s)
        assert (batch["src"][b, len(s) :] == PAD).all()
        assert int(batch["src_lengths"][b]) == len(s)
        assert batch["tgt_in"][b, : len(t) + 1].tolist() == [BOS, *t]
        assert batch["tgt_out"][b, : len(t) + 1].tolist() == [*t, EOS]
    g = torch.Generator().manual_seed(0)
    shuffled = [
        b["index"].tolist() for b in task.batches(data, "train", 8, shuffle=True, generator=g)
    ]
    assert sorted(i for idx in shuffled for i in idx) == list(range(48))


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s["name"])
def test_every_preset_trains_evaluates_and_draws(tiny, spec) -> None:
    task, data = tiny
    torch.manual_seed(0)
    model = task.build_model(data, spec)
    assert isinstance(model, Seq2SeqTranslator)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(3):
        batch = next(task.batches(data, "train", 8))
        loss = task.loss(model, batch)
        assert loss.dim() == 0 and torch.isfinite(loss)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    metrics, examples = evaluate_and_draw(task, model, data, "dev", n=3)
    assert list(metrics)[: len(task.metrics)] == list(task.metrics)
    assert 0.0 <= metrics["bleu"] <= 100.0
    assert 1.0 <= metrics["perplexity"] < math.inf
    assert 0.0 <= metrics["accuracy"] <= 1.0
    assert len(examples) == 3
    for ex in examples:
        assert ex.kind == "matrix"
        assert ex.cols == list(data.test.source[examples.index(ex)])
        assert len(ex.weights) == len(ex.rows) > 0


def test_model_options_follow_presets_and_baselines(tiny) -> None:
    task, data = tiny
    assert task.model_options({"name": "bahdanau"})["style"] == "bahdanau"
    opts = task.model_options({"name": "local-p", "D": 2})
    assert opts["attention"] == {"score": "general", "align": "local-p", "D": 2}
    assert task.model_options({"name": "mean"})["attention"] == "mean"
    assert task.model_options({"name": "uniform", "style": "bahdanau"}) == {
        "style": "bahdanau",
        "input_feeding": True,
        "attention": {"uniform": True},
    }
    model = task.build_model(data, {"score": "dot", "input_feeding": False})
    assert model.style == "luong" and not model.input_feeding
    assert model.attention._score_name == "dot"
    assert task.build_model(data, {}).attention._score_name == "general"


def test_attention_matrices_line_up_with_the_pairs(tiny) -> None:
    task, data = tiny
    torch.manual_seed(0)
    model = task.build_model(data, {"name": "luong-general"})
    mats = task.attention_matrices(model, data, "test")
    assert len(mats) == len(data.test)
    for m, s, t in zip(mats, data.test.source, data.test.target, strict=True):
        assert m.shape == (len(t), len(s))
        torch.testing.assert_close(m.sum(1), torch.ones(len(t)))


def test_beam_decoding_option(tiny) -> None:
    _, data = tiny
    task = TranslationTask(**TINY, decode="beam", beam_size=2)
    torch.manual_seed(0)
    model = task.build_model(data, {"name": "bahdanau"}).eval()
    metrics = task.evaluate(model, data, "test")
    assert set(task.metrics) <= set(metrics)


def test_corpus_bleu() -> None:
    assert corpus_bleu([["a", "b", "c", "d"]], [["a", "b", "c", "d"]]) == pytest.approx(100.0)
    assert corpus_bleu([["x", "y"]], [["a", "b", "c", "d"]]) == pytest.approx(0.0)
    assert corpus_bleu([], []) == 0.0


def test_bad_options() -> None:
    for options, match in (
        ({"decode": "sample"}, "decode"),
        ({"corpus": "wmt"}, "corpus"),
        ({"beam": 3}, "no option"),
    ):
        check_bad_options(TranslationTask, options, match, ValueError)


def test_real_bible_data_tiny() -> None:
    task = TranslationTask(books=["Prov"], max_len=14, hidden_size=8, embed_dim=8, min_freq=1)
    data = load_or_skip(task)
    sizes = data.info["sizes"]
    assert sizes["train"] > 50 and sizes["dev"] > 0 and sizes["test"] > 0
    assert all(s.startswith("Prov.") for s in data.train.ids)
    # the silver alignment of every pair indexes its tokens
    for s, t, a in zip(data.train.source, data.train.target, data.train.alignments, strict=True):
        i, j = a.max_indices()
        assert i < len(s) and j < len(t)
    model = task.build_model(data, {"name": "local-p"})
    loss = task.loss(model, next(task.batches(data, "train", 4)))
    assert torch.isfinite(loss)


def test_train_run_end_to_end(tmp_path) -> None:
    pytest.importorskip("attnlab.lab.training")
    result, _ = check_train_run(
        "translation", {"name": "bahdanau"}, tmp_path / "run", options={**TINY, "epochs": 1},
        task_name="translation", primary="bleu", metric_names=TranslationTask.metrics,
        epochs=1, example_kind="matrix",
    )  # fmt: skip
    assert result is not None


def test_one_seed_one_model(tiny) -> None:
    task, data = tiny
    check_deterministic(task, data, {"name": "bahdanau"}, 8)


# ----------------------------------------------------------------------------- supervision


def _hand_part(alignments) -> TranslationData:
    """Two pairs with distinct token ids: source words a b c / d, targets x y / z u v."""
    return TranslationData(
        source=(("a", "b", "c"), ("d",)),
        target=(("x", "y"), ("z", "u", "v")),
        src_ids=((4, 5, 6), (7,)),
        tgt_ids=((4, 5), (6, 7, 8)),
        ids=("p0", "p1"),
        alignments=alignments,
    )


def test_synthetic_alignments_are_exact(tiny) -> None:
    _, data = tiny
    for part in (data.train, data.test):
        for s, t, a in zip(part.source, part.target, part.alignments, strict=True):
            assert len(a.sure) == len(t) == len(s)
            assert {j for _, j in a.sure} == set(range(len(t)))
            for i, j in a.sure:  # reverse: source i is target n - 1 - i
                assert i == len(s) - 1 - j and s[i] == t[j]
    copy = TranslationTask(**{**TINY, "corpus": "copy"}).load_data()
    assert all(
        a.sure == {(j, j) for j in range(len(t))}
        for a, t in zip(copy.test.alignments, copy.test.target, strict=True)
    )


def test_gold_attention_lands_on_the_right_row_and_column() -> None:
    """Link (i, j) = (source word i, target word j) must be row j (the decoder step whose
    output is tgt_out[:, j] = y_j) and column i (src[:, i] = source word i): no BOS/EOS
    shift."""
    part = _hand_part((Alignment(sure={(2, 0), (0, 1), (1, 1)}), Alignment(sure={(0, 2)})))
    batch = TranslationTask.collate(part, [0, 1], gold=True)
    gold = batch["gold_attention"]
    assert gold.shape == (2, 4, 3)  # T = 3 target words + EOS, S = 3
    expected = torch.zeros(2, 4, 3)
    expected[0, 0, 2] = 1.0  # target word 0 ("x") <- source word 2 ("c")
    expected[0, 1, 0] = expected[0, 1, 1] = 0.5  # "y" <- "a", "b"
    expected[1, 2, 0] = 1.0  # "v" <- "d"
    torch.testing.assert_close(gold, expected, rtol=0, atol=0)
    # the row / column indices are the token positions of those words
    assert batch["tgt_out"][0, 0] == 4 and batch["tgt_out"][0, 1] == 5  # x, y
    assert batch["tgt_out"][1, 2] == 8 and batch["src"][1, 0] == 7  # v, d
    assert batch["src"][0, 2] == 6 and batch["tgt_out"][0, 2] == EOS
    # and the translator's weights row j is the attention of the step predicting tgt_out[:, j]
    torch.manual_seed(0)
    model = Seq2SeqTranslator(9, 9, embed_dim=4, hidden_size=4, dropout=0.0).eval()
    with torch.no_grad():
        out = model(batch["src"], batch["src_lengths"], batch["tgt_in"])
        enc = model.encode(batch["src"], batch["src_lengths"])
        state = model.init_state(enc)
        for j in range(batch["tgt_in"].shape[1]):
            logits, state, w, _ = model.decode_step(batch["tgt_in"][:, j], state, enc)
            torch.testing.assert_close(out.weights[:, j], w)
            torch.testing.assert_close(out.logits[:, j], logits)
    # batches without supervision carry no gold (no extra cost)
    assert "gold_attention" not in TranslationTask.collate(part, [0, 1])


def _naive_divergence(weights, part, idx, divergence) -> float:
    """Mean over target words with a link of D(gold row || attention row), by loops."""
    total, rows = 0.0, 0
    for b, i in enumerate(idx):
        links = part.alignments[i].possible
        S = len(part.src_ids[i])
        for j in range(len(part.tgt_ids[i])):
            linked = [s for s, t in links if t == j]
            if not linked:
                continue
            g = [1.0 / len(linked) if s in linked else 0.0 for s in range(weights.shape[2])]
            a = [float(weights[b, j, s]) for s in range(weights.shape[2])]
            if divergence == "ce":
                total += -sum(gs * math.log(max(a_s, 1e-12)) for gs, a_s in zip(g, a, strict=True))
            elif divergence == "mse":
                total += sum((a_s - gs) ** 2 for gs, a_s in zip(g, a, strict=True))
            else:  # mass
                total += -math.log(sum(a[s] for s in linked if s < S))
            rows += 1
    return total / rows


def test_reinforce_is_added_for_hard_attention_and_not_for_gumbel(tiny) -> None:
    """Hard attention trained by REINFORCE adds the score-function term (reward: minus
    each sentence's summed loss, batch-mean baseline); the straight-through Gumbel-softmax
    adds nothing to the cross-entropy (its sample carries the scores' gradient)."""
    import torch.nn.functional as F

    from attnlab.general.alignment import reinforce_loss

    task, data = tiny
    batch = next(task.batches(data, "train", 8))
    for estimator, adds in (("reinforce", True), ("gumbel", False)):
        torch.manual_seed(0)
        spec = {"score": "dot", "align": "hard", "estimator": estimator}
        model = task.build_model(data, spec).train()
        torch.manual_seed(1)
        got = task.loss(model, batch)
        torch.manual_seed(1)
        out = model(batch["src"], batch["src_lengths"], batch["tgt_in"])
        nll = F.cross_entropy(
            out.logits.transpose(1, 2), batch["tgt_out"], ignore_index=0, reduction="none"
        )
        real = (batch["tgt_out"] != 0).to(nll.dtype)
        want = nll.sum() / real.sum()
        if adds:
            reward = -(nll * real).sum(1).detach()
            want = want + reinforce_loss(out.log_prob, reward, reward.mean())
        torch.testing.assert_close(got, want)


def test_reinforce_weight_scales_the_reinforce_term(tiny) -> None:
    """``reinforce_weight`` times the REINFORCE term: the loss of weight w is the loss of
    weight 0 plus w times (loss of weight 1 - loss of weight 0), for the same sample."""
    task, data = tiny
    batch = next(task.batches(data, "train", 8))
    torch.manual_seed(0)
    model = task.build_model(data, {"score": "dot", "align": "hard"}).train()
    losses = {}
    for w in (0.0, 1.0, 0.25):
        torch.manual_seed(1)
        losses[w] = TranslationTask(**TINY, reinforce_weight=w).loss(model, batch)
    term = losses[1.0] - losses[0.0]
    assert abs(float(term)) > 1e-6  # the term is there to scale
    torch.testing.assert_close(losses[0.25], losses[0.0] + 0.25 * term)


def test_min_freq_applies_to_every_corpus(tiny) -> None:
    """``min_freq`` builds the vocabularies of a generated corpus too (it was ignored
    there); unset, it is 1 on a generated corpus and 2 on the Bible."""
    _, data = tiny
    assert TranslationTask(**TINY).options["min_freq"] is None
    assert (
        data.info["src_vocab"] == TranslationTask(**TINY, min_freq=1).load_data().info["src_vocab"]
    )
    rare = TranslationTask(**TINY, min_freq=10_000).load_data()
    assert len(rare.info["src_vocab"]) < len(data.info["src_vocab"])
    assert len(rare.info["src_vocab"]) == len(rare.info["src_vocab"].specials)


@pytest.mark.parametrize("divergence", ["ce", "mse", "mass"])
def test_supervised_loss_adds_lambda_times_divergence(tiny, divergence) -> None:
    _, data = tiny
    plain = TranslationTask(**TINY)
    sup = TranslationTask(**TINY, supervise=0.7, supervise_divergence=divergence)
    assert not plain.supervised and sup.supervised
    torch.manual_seed(0)
    model = sup.build_model(data, {"name": "luong-general"})
    batch = next(sup.batches(data, "train", 8))
    assert "gold_attention" in batch
    assert "gold_attention" not in next(plain.batches(data, "train", 8))
    with torch.no_grad():
        l0 = float(plain.loss(model, batch))
        l1 = float(sup.loss(model, batch))
        weights = model(batch["src"], batch["src_lengths"], batch["tgt_in"]).weights
    naive = _naive_divergence(weights, data.train, batch["index"].tolist(), divergence)
    assert naive > 0
    assert l1 - l0 == pytest.approx(0.7 * naive, rel=1e-4, abs=1e-6)


def test_supervision_gradient_reaches_the_attention(tiny) -> None:
    _, data = tiny
    sup = TranslationTask(**TINY, supervise=1.0)
    torch.manual_seed(0)
    model = sup.build_model(data, {"name": "luong-general"})
    batch = next(sup.batches(data, "train", 8))
    out = model(batch["src"], batch["src_lengths"], batch["tgt_in"])
    out.weights.retain_grad()
    sup.supervision_loss(out.weights, batch).backward()
    grad = out.weights.grad
    has_gold = batch["gold_attention"].sum(-1) > 0  # [B, T]
    assert bool((grad.abs().sum(-1)[has_gold] > 0).all())
    assert bool((grad.abs().sum(-1)[~has_gold] == 0).all())  # EOS rows and padding
    params = [p for p in model.attention.parameters() if p.grad is not None]
    assert params and any(float(p.grad.abs().sum()) > 0 for p in params)
    assert float(model.encoder.weight_ih_l0.grad.abs().sum()) > 0


def test_supervision_options_and_missing_alignments() -> None:
    with pytest.raises(ValueError, match="supervise"):
        TranslationTask(supervise=-0.1)
    with pytest.raises(ValueError, match="supervise"):
        TranslationTask(supervise="much")
    with pytest.raises(ValueError, match="supervise_divergence"):
        TranslationTask(supervise=1.0, supervise_divergence="js")
    part = _hand_part((Alignment(sure={(0, 0)}), None))
    with pytest.raises(ValueError, match="no word alignment"):
        TranslationTask.collate(part, [0, 1], gold=True)
    with pytest.raises(KeyError, match="gold_attention"):
        TranslationTask(supervise=1.0).supervision_loss(
            torch.zeros(2, 4, 3), TranslationTask.collate(part, [0])
        )


# measured (seed 0, 2 epochs): AER 0.17 with lambda = 1, 0.51 without
EPOCHS_LEARN, SUP_MAX, GAP = 2, 0.3, 0.2


def _aer_after_training(supervise: float, epochs: int) -> float:
    from attnlab.evaluation.aer import alignment_error_rate
    from attnlab.evaluation.extraction import argmax_links

    options = {
        "corpus": "reverse",
        "synthetic_pairs": 600,
        "max_len": 7,
        "embed_dim": 16,
        "hidden_size": 32,
        "batch_size": 32,
        "dropout": 0.0,
        "lr": 1e-2,
        "supervise": supervise,
    }
    task = TranslationTask(**options)
    data = task.load_data()
    torch.manual_seed(0)
    model = task.build_model(data, {"name": "luong-general"})
    opt = torch.optim.Adam(model.parameters(), lr=options["lr"])
    g = torch.Generator().manual_seed(0)
    for _ in range(epochs):
        for batch in task.batches(data, "train", 32, shuffle=True, generator=g):
            loss = task.loss(model, batch)
            opt.zero_grad()
            loss.backward()
            opt.step()
    mats = task.attention_matrices(model, data, "test")
    return alignment_error_rate(list(data.test.alignments), [argmax_links(m) for m in mats]).aer


@pytest.mark.slow
def test_supervised_attention_lowers_aer_on_reverse(one_thread) -> None:
    """Reverse task, exact alignments known. Same seed, same model (luong-general):
    with lambda = 1 the argmax links of the test attention are mostly the true ones (AER
    < 0.3); without supervision the attention is not the alignment (AER at least 0.2
    higher)."""
    aer_sup = _aer_after_training(1.0, EPOCHS_LEARN)
    aer_plain = _aer_after_training(0.0, EPOCHS_LEARN)
    assert aer_sup < SUP_MAX, aer_sup
    assert aer_plain > aer_sup + GAP, (aer_plain, aer_sup)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_len": -1}, "option max_len must be an int >= 1 or None, got -1"),
        ({"max_pairs": 0}, "option max_pairs must be an int >= 1 or None, got 0"),
        ({"max_decode_len": 0}, "option max_decode_len must be an int >= 1 or None, got 0"),
        ({"beam_size": 0}, "option beam_size must be an int >= 1, got 0"),  # greedy: unused
        ({"synthetic_pairs": -1}, "option synthetic_pairs must be an int >= 1, got -1"),
        ({"embed_dim": 0}, "option embed_dim must be an int >= 1, got 0"),
        ({"corpus": "wmt"}, "option corpus must be one of 'bible', 'reverse', 'copy', got 'wmt'"),
        ({"decode": "sample"}, "option decode must be 'greedy' or 'beam', got 'sample'"),
        ({"style": "vaswani"}, "option style must be 'bahdanau' or 'luong', got 'vaswani'"),
        ({"rnn": "rnn"}, "option rnn must be 'lstm' or 'gru', got 'rnn'"),
        ({"split_by": "verse"}, "option split_by must be 'chapter' or 'book', got 'verse'"),
        ({"links": "all"}, "option links must be 'sure' or 'graded', got 'all'"),
        ({"supervise": -0.5}, "option supervise must be a number >= 0, got -0.5"),
        ({"supervise": math.nan}, "option supervise must be a number >= 0, got nan"),
        ({"supervise": True}, "option supervise must be a number >= 0, got True"),
        ({"length_penalty": math.inf}, "option length_penalty must be a finite number, got inf"),
        ({"supervise_divergence": "l1"}, "option supervise_divergence must be"),
        ({"min_freq": 0}, "option min_freq must be an int >= 1 or None, got 0"),
        ({"reinforce_weight": -1.0}, "option reinforce_weight must be a number >= 0, got -1.0"),
    ],
)
def test_every_option_is_checked_before_any_data_is_read(options, message):
    with pytest.raises(ConfigError) as caught:
        TranslationTask(**options)
    assert str(caught.value).startswith(message)


@pytest.mark.parametrize(
    ("books", "message"),
    [
        ("bogus", "option books: unknown book 'bogus'; use OSIS names"),
        ([1, 2], "option books: unknown book 1;"),  # -o books=[1;2]
        (["Gen", "Mormon"], "option books: unknown book 'Mormon';"),
        ([], "option books must be None (all books), a book name or a non-empty list"),
        (5, "option books must be None (all books), a book name or a non-empty list"),
    ],
)
def test_books_are_checked_before_any_data_is_read(books, message):
    """The Bible reader's own check of the book names, at construction: an unknown name was
    a ValueError traceback once the data loading had started."""
    pytest.importorskip("pysword")  # the book names come from its canon
    with pytest.raises(ConfigError) as caught:
        TranslationTask(books=books)
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)
    for fine in (None, "Gen", "genesis", ["Gen", "NT"], ("OT",)):
        assert TranslationTask(books=fine).options["books"] == fine
