"""Task models of the lab (TAXONOMY section 0): feature model + query model + attention
model + output model, each taking any compatible attention from the registry so that an
ablation swaps only the attention.

* :class:`SentenceClassifier` (``"sentence-classifier"``) -- Jain & Wallace 2019.
* :class:`DocumentClassifier` (``"document-classifier"``) -- hierarchical attention
  network, Yang et al. 2016.
* :class:`TargetSentimentClassifier` (``"target-sentiment"``) -- LCR-Rot-hop, Wallaart &
  Frasincar 2019.
* :class:`Seq2SeqTranslator` (``"translator"``) -- Bahdanau et al. 2015, Luong et al. 2015.
* :class:`VQAModel` (``"vqa"``) -- co-attention, Lu et al. 2016.
* :class:`PointerNetworkModel` (``"pointer-network-model"``) -- Vinyals et al. 2015.
* :class:`CapsuleClassifier` (``"capsule-classifier"``) -- multi-label with capsule routing.
* :class:`MetaEmbeddingClassifier` (``"meta-embedding-classifier"``) -- Kiela et al. 2018.
* :class:`ShowAttendTell` (``"captioner"``) -- Show, Attend and Tell, Xu et al. 2015.
* :class:`ListenAttendSpell` (``"recogniser"``) -- Listen, Attend and Spell, Chan et al.
  2016.
* :class:`Inpainter` (``"inpainter"``) -- a CNN with a non-local block, Wang et al. 2018.

Importing this package registers every task model (``registry.names("model")``); the
registry itself loads only the core mechanisms (general, feature, query).
"""

from attnlab.models.captioner import CaptionerOutput, ShowAttendTell
from attnlab.models.document import DocumentClassifier, DocumentOutput
from attnlab.models.inpainter import Inpainter, InpainterOutput
from attnlab.models.meta_embedding import MetaEmbeddingClassifier, MetaEmbeddingOutput
from attnlab.models.multilabel import CapsuleClassifier, MultiLabelOutput
from attnlab.models.pointer import PointerNetworkModel
from attnlab.models.recogniser import ListenAttendSpell, RecogniserOutput
from attnlab.models.sentence import SentenceClassifier, SentenceOutput
from attnlab.models.target import TargetOutput, TargetSentimentClassifier
from attnlab.models.translator import Seq2SeqTranslator, TranslatorOutput
from attnlab.models.vqa import VQAModel, VQAOutput

__all__ = [
    "CapsuleClassifier",
    "CaptionerOutput",
    "DocumentClassifier",
    "DocumentOutput",
    "Inpainter",
    "InpainterOutput",
    "ListenAttendSpell",
    "MetaEmbeddingClassifier",
    "MetaEmbeddingOutput",
    "MultiLabelOutput",
    "PointerNetworkModel",
    "RecogniserOutput",
    "SentenceClassifier",
    "SentenceOutput",
    "Seq2SeqTranslator",
    "ShowAttendTell",
    "TargetOutput",
    "TargetSentimentClassifier",
    "TranslatorOutput",
    "VQAModel",
    "VQAOutput",
]
