"""Tests of attnlab.lab.checkpoint: safetensors checkpoints written atomically."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnlab.lab import checkpoint
from attnlab.lab.checkpoint import load_state, save_state
from attnlab.models.sentence import SentenceClassifier


def _model(seed: int, attention="tanh") -> SentenceClassifier:
    torch.manual_seed(seed)
    return SentenceClassifier(
        20, 3, embed_dim=6, hidden_size=5, attention=attention, kernel_sizes=(1, 3)
    ).eval()


def _batch():
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(1, 20, (4, 6), generator=g)
    return tokens, torch.tensor([6, 3, 1, 4])


class Tied(nn.Module):
    """An embedding and an output layer sharing one weight, plus a non-contiguous one."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(7, 4)
        self.out = nn.Linear(4, 7, bias=False)
        self.out.weight = self.embed.weight
        self.proj = nn.Parameter(torch.randn(5, 4).t())  # a transposed, non-contiguous view
        self.register_buffer("scale", torch.tensor(2.0))

    def forward(self, x):
        return self.out(self.embed(x) @ self.proj @ self.proj.t()) * self.scale


@pytest.mark.parametrize("attention", ["tanh", "mean", {"score": "scaled-dot"}])
def test_round_trip_gives_identical_outputs(tmp_path, attention):
    a, b = _model(0, attention), _model(1, attention)
    tokens, lengths = _batch()
    assert not torch.equal(a(tokens, lengths).logits, b(tokens, lengths).logits)
    path = save_state(a, tmp_path / "m.safetensors")
    assert path == tmp_path / "m.safetensors"
    assert load_state(b, path) == ([], [])
    assert torch.equal(a(tokens, lengths).logits, b(tokens, lengths).logits)
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert ka == kb
        assert torch.equal(va, vb), ka


def test_shared_and_non_contiguous_tensors(tmp_path):
    torch.manual_seed(0)
    a = Tied()
    assert not a.proj.is_contiguous()
    with torch.no_grad():
        a.scale.fill_(3.0)
    torch.manual_seed(1)
    b = Tied()
    save_state(a, tmp_path / "tied.safetensors")
    load_state(b, tmp_path / "tied.safetensors")
    x = torch.tensor([[1, 2, 6]])
    assert torch.equal(a(x), b(x))
    assert b.out.weight is b.embed.weight  # still one tensor
    assert torch.equal(b.embed.weight, a.embed.weight)
    assert torch.equal(b.proj, a.proj)
    assert float(b.scale) == 3.0


def test_file_is_safetensors_not_pickle(tmp_path):
    from safetensors import safe_open

    model = _model(0)
    save_state(model, tmp_path / "m.safetensors", metadata={"task": "toy"})
    raw = (tmp_path / "m.safetensors").read_bytes()
    assert not raw.startswith(b"PK") and not raw.startswith(b"\x80")  # zip / pickle magic
    with safe_open(str(tmp_path / "m.safetensors"), framework="pt") as f:
        assert f.metadata()["task"] == "toy"
        keys = set(f.keys())
    assert keys <= set(model.state_dict())
    assert "output.weight" in keys


def test_strict_loading(tmp_path):
    save_state(_model(0, "tanh"), tmp_path / "tanh.safetensors")
    other = _model(0, "mean")  # no attention parameters
    with pytest.raises(RuntimeError, match="attention"):
        load_state(other, tmp_path / "tanh.safetensors")
    missing, unexpected = load_state(other, tmp_path / "tanh.safetensors", strict=False)
    assert missing == []
    assert unexpected and all(k.startswith("attention.") for k in unexpected)


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        load_state(_model(0), tmp_path / "nope.safetensors")


def test_overwrite_and_no_temporary_files_left(tmp_path):
    target = tmp_path / "sub" / "m.safetensors"
    save_state(_model(0), target)
    save_state(_model(1), target)
    assert sorted(p.name for p in target.parent.iterdir()) == ["m.safetensors"]
    b = _model(2)
    load_state(b, target)
    tokens, lengths = _batch()
    assert torch.equal(b(tokens, lengths).logits, _model(1)(tokens, lengths).logits)


def test_a_failed_write_keeps_the_old_file(tmp_path, monkeypatch):
    target = tmp_path / "m.safetensors"
    save_state(_model(0), target)
    before = target.read_bytes()

    def broken(model, filename, metadata=None):
        with open(filename, "wb") as f:
            f.write(b"half a file")
        raise OSError("disk full")

    import safetensors.torch

    monkeypatch.setattr(safetensors.torch, "save_model", broken)
    with pytest.raises(OSError, match="disk full"):
        checkpoint.save_state(_model(1), target)
    assert target.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.safetensors"]
