"""Task ``translation``: every preset and baseline on a tiny generated corpus (no data
needed), the real Bible data when installed, and one end-to-end ``train_run``."""

from __future__ import annotations

import json
import math

import pytest
import torch

from attnlab.data import MissingDataError
from attnlab.lab.task import AttentionExample, TaskData
from attnlab.lab.tasks.translation import (
    BOS,
    EOS,
    PAD,
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
    model.eval()
    metrics = task.evaluate(model, data, "dev")
    assert list(metrics)[: len(task.metrics)] == list(task.metrics)
    assert 0.0 <= metrics["bleu"] <= 100.0
    assert 1.0 <= metrics["perplexity"] < math.inf
    assert 0.0 <= metrics["accuracy"] <= 1.0
    examples = task.attention_examples(model, data, n=3)
    assert len(examples) == 3
    for ex in examples:
        assert isinstance(ex, AttentionExample) and ex.kind == "matrix"
        assert ex.cols == list(data.test.source[examples.index(ex)])
        assert len(ex.weights) == len(ex.rows) > 0
        AttentionExample.from_json(json.loads(json.dumps(ex.to_json())))


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
    with pytest.raises(ValueError, match="decode"):
        TranslationTask(decode="sample")
    with pytest.raises(ValueError, match="corpus"):
        TranslationTask(corpus="wmt")
    with pytest.raises(ValueError, match="no option"):
        TranslationTask(beam=3)


def test_real_bible_data_tiny() -> None:
    task = TranslationTask(books=["Prov"], max_len=14, hidden_size=8, embed_dim=8, min_freq=1)
    try:
        data = task.load_data()
    except MissingDataError as err:
        pytest.skip(str(err))
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
    training = pytest.importorskip("attnlab.lab.training")
    result = training.train_run(
        "translation",
        {"name": "bahdanau"},
        seed=0,
        options={**TINY, "epochs": 1},
        out_dir=tmp_path / "run",
        progress=False,
    )
    assert result is not None
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["primary"] == "bleu"
    assert set(TranslationTask.metrics) <= set(metrics["test"])
    examples = json.loads((tmp_path / "run" / "examples.json").read_text())
    assert examples and examples[0]["kind"] == "matrix"
