"""Task models of the lab (TAXONOMY section 0): feature model + query model + attention
model + output model, each taking any compatible attention from the registry so that an
ablation swaps only the attention.

* :class:`SentenceClassifier` (``"sentence-classifier"``) -- Jain & Wallace 2019.
"""

from attnlab.models.sentence import SentenceClassifier, SentenceOutput

__all__ = ["SentenceClassifier", "SentenceOutput"]
