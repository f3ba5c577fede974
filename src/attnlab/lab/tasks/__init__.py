"""The registered tasks of the lab, one module per task (imported here so that the registry
knows them all)."""

import importlib

_TASK_MODULES = (
    "sentiment",
    "document",
    "target_sentiment",
    "translation",
    "vqa",
    "pointer",
    "multilabel",
    "meta_embedding",
    "captioning",
)

for _name in _TASK_MODULES:
    try:
        importlib.import_module(f"{__name__}.{_name}")
    except ModuleNotFoundError as _err:  # a task module not written yet
        if _err.name != f"{__name__}.{_name}":
            raise
