"""Task ``translation``: English -> Spanish Bible verses with a seq2seq translator.

Data (option ``corpus``):

* ``"bible"`` (default): King James Version -> Reina Valera 1909 verse pairs from the
  Debian SWORD modules (:func:`attnlab.data.bible.load_bible_pairs`), lower-cased and
  tokenised, split by chapter (80/10/10, ``data_seed``), verses longer than ``max_len``
  tokens on either side dropped, at most ``max_pairs`` pairs. Every pair keeps its silver
  word alignment from shared Strong's numbers (for AER).
* ``"reverse"`` / ``"copy"``: a generated task (reverse or copy a random sequence of
  symbols), data-free, for tests and quick checks; its exact word alignment is known
  (source ``i`` -- target ``n - 1 - i`` for reverse, ``i`` -- ``i`` for copy).

Model: :class:`attnlab.models.translator.Seq2SeqTranslator` (Bahdanau or Luong style,
any score x alignment), trained with token-level cross-entropy under teacher forcing
(plus ``reinforce_weight`` times the REINFORCE term of hard attention, reward minus each
sentence's loss).
Supervised attention (option ``supervise`` = lambda > 0; Liu et al. 2016, Mi et al. 2016):
the loss becomes ``L_task + lambda * D(gold || a)`` with ``D`` =
``supervise_divergence`` (``"ce"``, ``"kl"``, ``"mse"`` or ``"mass"``, see
:mod:`attnlab.evaluation.supervision`), averaged over the real target words that have a
gold link. The gold attention ``[B, T, S]`` comes from each pair's links
(:func:`~attnlab.evaluation.supervision.links_to_weights`): row ``j`` (the decoder step
that predicts target word ``j``; the source has no BOS, so column ``i`` is source word
``i``) is uniform over the source words linked to target word ``j``; the EOS row and
unlinked words are not supervised. Batches carry it as ``gold_attention`` only when
``supervise > 0``.

Metrics: ``bleu`` (corpus BLEU of the decoded dev/test translations, sacrebleu, on the
joined tokens; selection metric), ``perplexity`` (``exp`` of the teacher-forced
per-token loss; lower is better), ``accuracy`` (teacher-forced next-token accuracy) and
``meteor`` (METEOR with the exact and Spanish Snowball-stem stages; NaN without NLTK).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab._checks import ConfigError
from attnlab.data.pharaoh import Alignment
from attnlab.data.vocab import Vocab
from attnlab.evaluation.meteor import meteor_or_nan
from attnlab.evaluation.supervision import DIVERGENCES, attention_supervision_loss, links_to_weights
from attnlab.lab.task import AttentionExample, Task, TaskData, register_task
from attnlab.lab.tasks._shared import add_reinforce, evaluating
from attnlab.models.translator import Seq2SeqTranslator, Translation

__all__ = ["TranslationData", "TranslationTask", "corpus_bleu", "synthetic_pairs"]

SPECIALS = ("<pad>", "<unk>", "<s>", "</s>")
PAD, UNK, BOS, EOS = 0, 1, 2, 3


@dataclass(frozen=True)
class TranslationData:
    """One split: tokens, ids (without BOS/EOS), verse ids and alignments (the silver
    Strong's-number links for the Bible, the exact ones for generated data), pair by
    pair."""

    source: tuple[tuple[str, ...], ...]
    target: tuple[tuple[str, ...], ...]
    src_ids: tuple[tuple[int, ...], ...]
    tgt_ids: tuple[tuple[int, ...], ...]
    ids: tuple[str, ...]
    alignments: tuple[Alignment | None, ...]

    def __len__(self) -> int:
        return len(self.ids)


def synthetic_pairs(
    n: int,
    *,
    kind: str = "reverse",
    n_symbols: int = 12,
    min_len: int = 3,
    max_len: int = 8,
    seed: int = 0,
) -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
    """``n`` generated pairs: a random symbol sequence and its reversal (or copy)."""
    if kind not in ("reverse", "copy"):
        raise ValueError(f"kind must be 'reverse' or 'copy', got {kind!r}")
    rng = random.Random(seed)
    symbols = [f"w{i}" for i in range(n_symbols)]
    out = []
    for _ in range(n):
        src = tuple(rng.choice(symbols) for _ in range(rng.randint(min_len, max_len)))
        out.append((src, src[::-1] if kind == "reverse" else src))
    return out


def corpus_bleu(hypotheses: list[list[str]], references: list[list[str]]) -> float:
    """Corpus BLEU (0-100) of tokenised hypotheses against one reference each, with
    sacrebleu on the space-joined tokens (``tokenize="none"``: the tokens are already
    split)."""
    import sacrebleu

    if not hypotheses:
        return 0.0
    bleu = sacrebleu.corpus_bleu(
        [" ".join(h) for h in hypotheses],
        [[" ".join(r) for r in references]],
        tokenize="none",
        force=True,
    )
    return float(bleu.score)


@register_task("translation")
class TranslationTask(Task):
    """English -> Spanish verse translation (see the module docstring).

    Option presets (``-o preset=NAME``): ``cpu`` (the defaults) and ``paper``: the sizes
    and training length of Luong, Pham & Manning (2015, EMNLP, section 4.1) -- 1000-d
    embeddings and decoder states, input feeding, dropout 0.2 with 12 epochs, mini-batches
    of 128, gradient norm clipped at 5, sentences up to 50 tokens -- on every verse pair
    of the Bible corpus. Their local attention's window is ``D = 10``: refine the presets,
    ``-a local-p,D=10`` (the presets' ``D = 3`` suits the ``cpu`` preset's short
    sentences). Not reproduced: their 4 stacked one-way LSTM layers reading the reversed
    source (one bidirectional layer of 2 x 500 here), their dropout between the LSTM
    layers (here on the embeddings and the output layer's input), plain SGD with learning
    rate 1 halved every epoch after epoch 8 and the uniform [-0.1, 0.1] initialisation
    (Adam 1e-3, constant, and PyTorch's initialisation here), their 50,000-word
    vocabularies (here the words seen twice, ``min_freq=2``), the batches in corpus order
    (length buckets here, as Bahdanau et al. sort theirs), case-sensitive BLEU, and the
    WMT'14 data. ``style=bahdanau`` keeps this preset's training, not Bahdanau et al.'s
    (Adadelta, batches of 80, clipping at 1, GRUs, 620-d embeddings).

    :formula: p(y_t | y_<t, x) = softmax(W_y h~_t); h~_t from the decoder state and c_t = sum_l
        align(score(s, h_l)) h_l; loss = -sum_t log p(y_t | y_<t, x)
    :source: Bahdanau et al. 2015, Neural Machine Translation by Jointly Learning to Align and
        Translate; Luong et al. 2015, Effective Approaches to Attention-based Neural Machine
        Translation
    :cost: per batch O(B (S + T) d (d_e + d) + B T S d + B T d V)
    """

    metrics: ClassVar[tuple[str, ...]] = ("bleu", "perplexity", "accuracy", "meteor")
    higher_is_better: ClassVar[bool] = True
    data_source: ClassVar[str] = (
        "KJV -> Reina Valera 1909 Bible verses (Debian sword-text-kjv, sword-text-sparv; "
        "public domain) read with pysword"
    )
    option_presets: ClassVar[dict[str, dict[str, Any]]] = {
        "cpu": {},
        "paper": {
            "style": "luong",
            "input_feeding": True,
            "embed_dim": 1000,
            "hidden_size": 1000,
            "dropout": 0.2,
            "epochs": 12,
            "batch_size": 128,
            "lr": 1e-3,
            "grad_clip": 5.0,
            "max_len": 50,
            "max_pairs": None,
            "bucket": True,
        },
    }
    defaults: ClassVar[dict[str, Any]] = {
        "epochs": 8,
        "lr": 2e-3,
        "corpus": "bible",
        "source": "KJV",
        "target": "SpaRV",
        "books": None,
        "max_len": 16,
        "max_pairs": None,
        "max_eval": None,
        "data_seed": 0,
        "split_by": "chapter",
        "links": "sure",
        "min_freq": None,
        "synthetic_pairs": 2000,
        "embed_dim": 64,
        "hidden_size": 128,
        "rnn": "lstm",
        "style": "luong",
        "input_feeding": True,
        "dropout": 0.1,
        "decode": "greedy",
        "beam_size": 5,
        "length_penalty": 0.0,
        "max_decode_len": None,
        "supervise": 0.0,
        "supervise_divergence": "ce",
        "reinforce_weight": 1.0,
        "bucket": False,
    }
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "bahdanau": {"style": "bahdanau", "score": "additive", "align": "soft"},
        "luong-dot": {"style": "luong", "score": "dot", "align": "soft"},
        "luong-general": {"style": "luong", "score": "general", "align": "soft"},
        "luong-concat": {"style": "luong", "score": "additive", "align": "soft"},
        "local-m": {"style": "luong", "score": "general", "align": "local-m", "D": 3},
        "local-p": {"style": "luong", "score": "general", "align": "local-p", "D": 3},
    }
    default_attention: ClassVar[dict[str, Any]] = dict(presets["luong-general"])

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        # every option checked here, before any data is read: a bad value is one error
        # line (a negative max_len reached the Bible reader as a ValueError traceback), and
        # an option that the run may not use (beam_size under greedy decoding) is checked
        # all the same
        for name, choices in (
            ("corpus", ("bible", "reverse", "copy")),
            ("decode", ("greedy", "beam")),
            ("style", ("bahdanau", "luong")),
            ("rnn", ("lstm", "gru")),
            ("split_by", ("chapter", "book")),
            ("links", ("sure", "graded")),
            ("supervise_divergence", DIVERGENCES),
        ):
            self.check_option_choice(name, choices)
        self.check_int_options("synthetic_pairs", "embed_dim", "hidden_size", "beam_size")
        self.check_int_options(
            "max_len", "max_pairs", "max_eval", "max_decode_len", "min_freq", optional=True
        )
        self.check_number_options("supervise", low=0.0)
        self.check_number_options("length_penalty")
        self._check_books()

    def _check_books(self) -> None:
        """The option ``books``: None or book names the Bible reader knows (its own check,
        :func:`attnlab.data.bible._book_filter`), else a one-line ``ConfigError`` naming the
        option (an unknown name failed as a traceback after the data loading started).
        Without pysword the names cannot be looked up: loading the Bible says so."""
        books = self.options["books"]
        if books is None:
            return
        from attnlab.data._common import MissingDataError
        from attnlab.data.bible import _book_filter

        try:
            _book_filter(books)
        except MissingDataError:
            return
        except ValueError as error:
            message = str(error)
            prefix = "option " if message.startswith("books ") else "option books: "
            raise ConfigError(prefix + message) from None

    @property
    def supervised(self) -> bool:
        """Whether the loss has the attention supervision term (``supervise > 0``)."""
        return float(self.options["supervise"]) > 0.0

    # ------------------------------------------------------------------ data

    def _pairs(self) -> tuple[list[tuple[tuple[str, ...], tuple[str, ...], str, str, Any]], dict]:
        o = self.options
        if o["corpus"] == "bible":
            from attnlab.data.bible import load_bible_pairs

            corpus = load_bible_pairs(
                o["source"],
                o["target"],
                books=o["books"],
                max_pairs=o["max_pairs"],
                max_len=o["max_len"],
                seed=o["data_seed"],
                split_by=o["split_by"],
                links=o["links"],
            )
            rows = [(p.source, p.target, p.id, p.split, p.alignment) for p in corpus]
            return rows, {"corpus": corpus.name, **corpus.stats()}
        n = int(o["synthetic_pairs"])
        max_len = int(o["max_len"] or 8)
        pairs = synthetic_pairs(
            n, kind=o["corpus"], max_len=max_len, min_len=min(3, max_len), seed=o["data_seed"]
        )
        rows = []
        for k, (s, t) in enumerate(pairs):
            split = "train" if k < 0.8 * n else "dev" if k < 0.9 * n else "test"
            m = len(s)
            links = (
                frozenset((m - 1 - j, j) for j in range(m))
                if o["corpus"] == "reverse"
                else frozenset((j, j) for j in range(m))
            )
            rows.append((s, t, f"{o['corpus']}-{k}", split, Alignment(sure=links)))
        return rows, {"corpus": o["corpus"], "pairs": n}

    def load_data(self) -> TaskData:
        rows, stats = self._pairs()
        train = [r for r in rows if r[3] == "train"]
        min_freq = self.options["min_freq"]
        if min_freq is None:  # the words seen twice in the Bible; every symbol of a toy task
            min_freq = 2 if self.options["corpus"] == "bible" else 1
        src_vocab = Vocab.from_corpus((r[0] for r in train), min_freq=min_freq, specials=SPECIALS)
        tgt_vocab = Vocab.from_corpus((r[1] for r in train), min_freq=min_freq, specials=SPECIALS)

        def split(name: str) -> TranslationData:
            part = [r for r in rows if r[3] == name]
            return TranslationData(
                source=tuple(r[0] for r in part),
                target=tuple(r[1] for r in part),
                src_ids=tuple(tuple(src_vocab.encode(r[0])) for r in part),
                tgt_ids=tuple(tuple(tgt_vocab.encode(r[1])) for r in part),
                ids=tuple(r[2] for r in part),
                alignments=tuple(r[4] for r in part),
            )

        data = TaskData(split("train"), split("dev"), split("test"))
        data.info.update(
            src_vocab=src_vocab,
            tgt_vocab=tgt_vocab,
            stats=stats,
            sizes={s: len(data.split(s)) for s in ("train", "dev", "test")},
        )
        return data

    def example_size(self, part: TranslationData, i: int) -> tuple[int, int]:
        return (len(part.src_ids[i]), len(part.tgt_ids[i]))

    def make_batch(self, data: TaskData, part: TranslationData, idx: list[int]) -> dict[str, Any]:
        return self.collate(part, idx, gold=self.supervised)

    @staticmethod
    def collate(part: TranslationData, idx: list[int], *, gold: bool = False) -> dict[str, Tensor]:
        """Pad the pairs ``idx`` of a split: ``src`` ``[B, S]``, ``src_lengths`` ``[B]``,
        ``tgt_in`` ``[B, T]`` (BOS + y), ``tgt_out`` ``[B, T]`` (y + EOS; PAD after).

        With ``gold=True`` also ``gold_attention`` ``[B, T, S]``: row ``j`` uniform over the
        source words linked to target word ``j`` (the row of the step whose output is
        ``tgt_out[:, j]`` = ``y_j``; column ``i`` = ``src[:, i]`` = source word ``i``); the
        EOS row, padding and unlinked words are zero rows. Raises ``ValueError`` when a pair
        has no alignment."""
        srcs = [part.src_ids[i] for i in idx]
        tgts = [part.tgt_ids[i] for i in idx]
        B = len(idx)
        S = max((len(s) for s in srcs), default=0)
        T = max((len(t) for t in tgts), default=0) + 1
        src = torch.full((B, S), PAD, dtype=torch.long)
        tgt_in = torch.full((B, T), PAD, dtype=torch.long)
        tgt_out = torch.full((B, T), PAD, dtype=torch.long)
        for b, (s, t) in enumerate(zip(srcs, tgts, strict=True)):
            src[b, : len(s)] = torch.tensor(s, dtype=torch.long)
            tgt_in[b, : len(t) + 1] = torch.tensor((BOS, *t), dtype=torch.long)
            tgt_out[b, : len(t) + 1] = torch.tensor((*t, EOS), dtype=torch.long)
        batch = {
            "src": src,
            "src_lengths": torch.tensor([len(s) for s in srcs], dtype=torch.long),
            "tgt_in": tgt_in,
            "tgt_out": tgt_out,
            "index": torch.tensor(idx, dtype=torch.long),
        }
        if gold:
            links = []
            for i in idx:
                alignment = part.alignments[i]
                if alignment is None:
                    raise ValueError(
                        f"pair {part.ids[i]!r} has no word alignment to supervise the attention "
                        "with (option supervise > 0)"
                    )
                links.append(alignment.possible)
            batch["gold_attention"] = links_to_weights(links, T, S)
        return batch

    # ------------------------------------------------------------------ model

    def model_options(self, attention: Mapping[str, Any]) -> dict[str, Any]:
        """The translator's ``style``, ``input_feeding`` and ``attention`` argument for a
        spec (a preset name, a baseline, or score/align keys)."""
        spec = self.resolve_attention(attention)
        name = spec.pop("name", None)
        style = spec.pop("style", self.options["style"])
        feeding = spec.pop("input_feeding", self.options["input_feeding"])
        att: str | dict[str, Any] | None
        if name == "mean":
            att = "mean"
        elif name == "uniform":
            att = {**spec, "uniform": True}
        else:
            att = spec or None
        return {"style": style, "input_feeding": bool(feeding), "attention": att}

    def build_model(self, data: TaskData, attention: Mapping[str, Any]) -> nn.Module:
        o = self.options
        return Seq2SeqTranslator(
            len(data.info["src_vocab"]),
            len(data.info["tgt_vocab"]),
            embed_dim=int(o["embed_dim"]),
            hidden_size=int(o["hidden_size"]),
            rnn=o["rnn"],
            dropout=float(o["dropout"]),
            pad_idx=PAD,
            bos_idx=BOS,
            eos_idx=EOS,
            **self.model_options(attention),
        )

    def loss(self, model: nn.Module, batch: Mapping[str, Tensor]) -> Tensor:
        out = model(batch["src"], batch["src_lengths"], batch["tgt_in"])
        V = out.logits.shape[-1]
        nll = F.cross_entropy(
            out.logits.reshape(-1, V),
            batch["tgt_out"].reshape(-1),
            ignore_index=PAD,
            reduction="none",
        ).view(batch["tgt_out"].shape)
        real = (batch["tgt_out"] != PAD).to(nll.dtype)
        loss = nll.sum() / real.sum().clamp(min=1.0)
        # hard attention trained by REINFORCE (reward: minus each sentence's loss)
        loss = add_reinforce(
            loss, out.log_prob, (nll * real).sum(1), float(self.options["reinforce_weight"]), model
        )
        if self.supervised:
            loss = loss + float(self.options["supervise"]) * self.supervision_loss(
                out.weights, batch
            )
        return loss

    def supervision_loss(self, weights: Tensor, batch: Mapping[str, Tensor]) -> Tensor:
        """``D(gold || weights)`` averaged over the real target words with a gold link:
        ``weights`` ``[B, T, S]`` (teacher-forced attention), ``batch`` from
        :meth:`collate` with ``gold=True``."""
        if "gold_attention" not in batch:
            raise KeyError(
                "the batch has no 'gold_attention' (collate(..., gold=True) adds it; the task's "
                "batches do when supervise > 0)"
            )
        return attention_supervision_loss(
            weights,
            batch["gold_attention"],
            kind="links",
            divergence=self.options["supervise_divergence"],
            mask=batch["tgt_out"] != PAD,
        )

    # ------------------------------------------------------------------ evaluation

    def _decode_len(self, part: TranslationData) -> int:
        limit = self.options["max_decode_len"]
        if limit is not None:
            return int(limit)
        return 2 * max((len(s) for s in part.source), default=1) + 5

    def translate(
        self, model: Seq2SeqTranslator, batch: Mapping[str, Tensor], max_len: int
    ) -> Translation:
        """Decode a batch with the task's ``decode`` option (greedy or beam)."""
        if self.options["decode"] == "beam":
            return model.beam_search(
                batch["src"],
                batch["src_lengths"],
                beam_size=int(self.options["beam_size"]),
                max_len=max_len,
                length_penalty=float(self.options["length_penalty"]),
            )
        return model.greedy_decode(batch["src"], batch["src_lengths"], max_len=max_len)

    def _eval_indices(self, part: TranslationData) -> list[int]:
        n = self.options["max_eval"]
        return list(range(len(part) if n is None else min(len(part), int(n))))

    def evaluate(self, model: nn.Module, data: TaskData, split: str) -> dict[str, float]:
        part: TranslationData = data.split(split)
        device = next(model.parameters()).device
        tgt_vocab: Vocab = data.info["tgt_vocab"]
        idx = self._eval_indices(part)
        total_nll, total_ok, total_n = 0.0, 0, 0
        hyps: list[list[str]] = []
        refs: list[list[str]] = []
        max_len = self._decode_len(part)
        bs = int(self.options["batch_size"])
        with evaluating(model):
            for start in range(0, len(idx), bs):
                batch = {
                    k: v.to(device) for k, v in self.collate(part, idx[start : start + bs]).items()
                }
                out = model(batch["src"], batch["src_lengths"], batch["tgt_in"])
                V = out.logits.shape[-1]
                real = batch["tgt_out"] != PAD
                nll = F.cross_entropy(
                    out.logits.reshape(-1, V).float(),
                    batch["tgt_out"].reshape(-1),
                    ignore_index=PAD,
                    reduction="sum",
                )
                total_nll += float(nll)
                total_ok += int(((out.logits.argmax(-1) == batch["tgt_out"]) & real).sum())
                total_n += int(real.sum())
                tr = self.translate(model, batch, max_len)
                hyps += [tgt_vocab.decode(t) for t in tr.tokens]
                refs += [list(part.target[i]) for i in batch["index"].tolist()]
        n = max(total_n, 1)
        return {
            "bleu": corpus_bleu(hyps, refs),
            "perplexity": math.exp(min(total_nll / n, 50.0)),
            "accuracy": total_ok / n,
            # Spanish targets: exact and Snowball-stem stages (WordNet is English)
            "meteor": meteor_or_nan(hyps, refs, language="spanish"),
        }

    def attention_matrices(
        self, model: nn.Module, data: TaskData, split: str = "test"
    ) -> list[Tensor]:
        """Teacher-forced attention on the gold targets: one ``[T_i, S_i]`` matrix per
        pair of ``split`` (in the split's order; ``T_i`` the gold target tokens -- the row of
        ``y_t`` is the attention of the step that predicts it -- and ``S_i`` the source
        tokens). ``data.split(split).alignments[i]`` holds the silver links ``(s, t)`` of
        the same pair (note the transposition) for the alignment error rate."""
        part: TranslationData = data.split(split)
        device = next(model.parameters()).device
        out_list: list[Tensor] = []
        with evaluating(model):
            for start in range(0, len(part), 64):
                idx = list(range(start, min(start + 64, len(part))))
                batch = {k: v.to(device) for k, v in self.collate(part, idx).items()}
                out = model(batch["src"], batch["src_lengths"], batch["tgt_in"])
                for b, i in enumerate(idx):
                    T, S = len(part.tgt_ids[i]), len(part.src_ids[i])
                    out_list.append(out.weights[b, :T, :S].detach().cpu())
        return out_list

    def attention_examples(
        self, model: nn.Module, data: TaskData, n: int = 4
    ) -> list[AttentionExample]:
        part: TranslationData = data.split("test")
        idx = list(range(min(n, len(part))))
        if not idx:
            return []
        device = next(model.parameters()).device
        tgt_vocab: Vocab = data.info["tgt_vocab"]
        batch = {k: v.to(device) for k, v in self.collate(part, idx).items()}
        with evaluating(model):
            tr = self.translate(model, batch, self._decode_len(part))
        gold = None
        examples = []
        for b, i in enumerate(idx):
            cols = list(part.source[i])
            rows = tgt_vocab.decode(tr.tokens[b])
            weights = tr.attention[b]
            extra: dict[str, Any] = {"id": part.ids[i]}
            if not rows:  # nothing generated: show the teacher-forced gold attention
                if gold is None:
                    gold = self.attention_matrices(model, data, "test")
                rows, weights = list(part.target[i]), gold[i]
                extra["teacher_forced"] = True
            examples.append(
                AttentionExample(
                    title=f"test {part.ids[i]}",
                    rows=rows,
                    cols=cols,
                    weights=[[float(x) for x in row] for row in weights.tolist()],
                    label=" ".join(part.target[i]),
                    prediction=" ".join(tgt_vocab.decode(tr.tokens[b])),
                    kind="matrix",
                    extra=extra,
                )
            )
        return examples
