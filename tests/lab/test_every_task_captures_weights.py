"""``attnlab.capture_weights`` on every task model of the lab: the model's outputs do not
change, and every attention module the model calls records its weights (the pointer
network's attention is its output, the pointing distributions, and records nothing)."""

from __future__ import annotations

import pytest
import torch
from tiny_tasks import TASKS, model_and_call
from torch.utils._pytree import tree_flatten

import attnlab

#: a module each task model must record (by its name in ``model.named_modules()``)
RECORDED = {
    "sentiment": "attention",
    "document": "sentence_attention.attn.0",
    "target_sentiment": "rotatory",
    "translation": "attention",
    "vqa": "co_attention",
    "multilabel": "routing",
    "meta_embedding": "meta_embedding",
}


def test_every_task_but_the_pointer_network_is_listed():
    assert sorted(RECORDED) == sorted(t for t in TASKS if t != "pointer")


@pytest.mark.parametrize("name", TASKS)
def test_task_model_weights_are_captured(name):
    model, args, kwargs = model_and_call(name)
    with torch.no_grad():
        want = model(*args, **kwargs)
        with attnlab.capture_weights(model) as weights:
            got = model(*args, **kwargs)
    flat_got, flat_want = tree_flatten(got)[0], tree_flatten(want)[0]
    for g, w in zip(flat_got, flat_want, strict=True):
        if isinstance(w, torch.Tensor):
            torch.testing.assert_close(g, w, equal_nan=True, atol=1e-5, rtol=1e-4)
    if name == "pointer":
        assert weights == {}
        return
    recorded = weights[RECORDED[name]]
    assert recorded, f"{name}: {RECORDED[name]} recorded nothing"
    for w in recorded:
        for t in w.values() if isinstance(w, dict) else [w]:
            assert t.shape[0] == 4 and torch.isfinite(t).all()  # one row per example
