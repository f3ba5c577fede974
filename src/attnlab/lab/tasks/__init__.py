"""The registered tasks of the lab, one module per task.

Importing this package registers every task (``registry.names("task")``, ``attnlab list
--kind task``): the registry itself loads only the core mechanisms, so whatever looks a task
up by name (:func:`attnlab.lab.training.resolve_task`, the command line) imports this
package first.
"""

from attnlab.lab.tasks.captioning import CaptioningTask
from attnlab.lab.tasks.document import DocumentTask
from attnlab.lab.tasks.inpainting import InpaintingTask
from attnlab.lab.tasks.meta_embedding import MetaEmbeddingTask
from attnlab.lab.tasks.multilabel import MultiLabelTask
from attnlab.lab.tasks.pointer import PointerTask
from attnlab.lab.tasks.sentiment import SentimentTask
from attnlab.lab.tasks.speech import SpeechTask
from attnlab.lab.tasks.target_sentiment import TargetSentimentTask
from attnlab.lab.tasks.translation import TranslationTask
from attnlab.lab.tasks.vqa import VQATask

__all__ = [
    "CaptioningTask",
    "DocumentTask",
    "InpaintingTask",
    "MetaEmbeddingTask",
    "MultiLabelTask",
    "PointerTask",
    "SentimentTask",
    "SpeechTask",
    "TargetSentimentTask",
    "TranslationTask",
    "VQATask",
]
