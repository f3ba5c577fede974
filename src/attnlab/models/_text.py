"""The base of the text classifiers: the keywords they all take alike, handled once.

The sentence, document, target-sentiment and capsule classifiers all read token ids
``w_t`` into ``x_t = E[w_t]`` and drop out features while training. Their constructors
take the vocabulary size and the number of outputs first, their own encoder and
attention options, and the keywords of :class:`TextOptions` (``embed_dim``,
``embeddings``, ``freeze_embeddings``, ``padding_idx``, ``dropout``), which mean the same
and default the same in every one of them. :class:`TextClassifier` checks and builds
those once (:func:`~attnlab.models._embedding.init_text_model`); a subclass names its
default embedding size and its encoders.
"""

from __future__ import annotations

from typing import Any, ClassVar, TypedDict

from attnlab._checks import check_int
from attnlab.models._embedding import init_text_model
from attnlab.registry import Configurable

__all__ = ["TEXT_DEFAULTS", "TextClassifier", "TextOptions"]


class TextOptions(TypedDict, total=False):
    """The keywords every text classifier takes for its word embeddings and its dropout
    (defaults: :data:`TEXT_DEFAULTS`).

    Attributes:
        embed_dim: the embedding size ``d_e`` (None: the columns of ``embeddings``, else the
            model's default).
        embeddings: a pretrained matrix ``[vocab_size, d_e]`` (tensor, numpy array or
            ``attnlab.data.Embeddings``), copied; None for a learned table.
        freeze_embeddings: keep the embedding matrix fixed during training.
        padding_idx: the padding id (its row gets no gradient), or None.
        dropout: the dropout probability in ``[0, 1)`` (training only).
    """

    embed_dim: int | None
    embeddings: Any
    freeze_embeddings: bool
    padding_idx: int | None
    dropout: float


#: the defaults of :class:`TextOptions`, the same in every text classifier
TEXT_DEFAULTS: dict[str, Any] = {
    "embed_dim": None,
    "embeddings": None,
    "freeze_embeddings": False,
    "padding_idx": 0,
    "dropout": 0.0,
}


class TextClassifier(Configurable):
    """A text classifier's shared start: ``embedding`` (``E`` ``[V, d_e]``), ``dropout``,
    ``vocab_size``, ``padding_idx`` and ``embed_dim`` (``d_e``) from ``vocab_size`` (None:
    the rows of ``embeddings``), the :class:`TextOptions` ``text``, the ``encoder`` name
    (one of the class's ``encoder_names``) and the ``sizes`` to check (ints >= 1, e.g.
    ``num_classes``, ``hidden_size``). A keyword that is not a :class:`TextOptions` raises
    ``TypeError``, as an unknown argument does. Cost: O(V d_e) memory.

    A subclass names, as class keywords, its ``default_embed_dim`` (``d_e`` when neither
    ``embed_dim`` nor ``embeddings`` is given) and its ``encoder_names`` (the choices of
    its ``encoder`` argument): ``class M(TextClassifier, default_embed_dim=300,
    encoder_names=("lstm", "gru"))``.
    """

    default_embed_dim: ClassVar[int] = 300
    encoder_names: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(
        cls,
        *,
        default_embed_dim: int | None = None,
        encoder_names: tuple[str, ...] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init_subclass__(**kwargs)
        if default_embed_dim is not None:
            cls.default_embed_dim = check_int(default_embed_dim, "default_embed_dim")
        if encoder_names is not None:
            cls.encoder_names = tuple(encoder_names)

    def __init__(
        self, vocab_size: int | None, encoder: str, text: TextOptions, **sizes: int
    ) -> None:
        super().__init__()
        for name in text:
            if name not in TEXT_DEFAULTS:
                raise TypeError(
                    f"{type(self).__name__}.__init__() got an unexpected keyword argument {name!r}"
                )
        options = {**TEXT_DEFAULTS, **text}
        self.embed_dim = init_text_model(
            self,
            options["embeddings"],
            vocab_size,
            options["embed_dim"],
            options["padding_idx"],
            options["freeze_embeddings"],
            options["dropout"],
            default_dim=self.default_embed_dim,
            encoder=("encoder", encoder, self.encoder_names),
            **sizes,
        )

    def get_config(self) -> dict[str, Any]:
        """The constructor arguments (with the :class:`TextOptions` left at their defaults)
        plus ``name`` and ``kind``, for :func:`attnlab.build`."""
        config = super().get_config()
        return {**config, **{k: v for k, v in TEXT_DEFAULTS.items() if k not in config}}
