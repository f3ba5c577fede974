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

    def broken(tensors, filename, metadata=None):
        with open(filename, "wb") as f:
            f.write(b"half a file")
        raise OSError("disk full")

    import safetensors.torch

    monkeypatch.setattr(safetensors.torch, "save_file", broken)
    with pytest.raises(OSError, match="disk full"):
        checkpoint.save_state(_model(1), target)
    assert target.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.safetensors"]


# ------------------------------------------------------------------ storage layouts


def flatten_like_cudnn(rnn: nn.RNNBase) -> torch.Tensor:
    """Make every weight of ``rnn`` a view of one flat buffer, as cuDNN's
    ``flatten_parameters`` does on CUDA (no view covers the whole buffer); returns it."""
    names = list(rnn._flat_weights_names)
    weights = [getattr(rnn, n) for n in names]
    flat = torch.cat([w.detach().reshape(-1) for w in weights])
    offset = 0
    for name, w in zip(names, weights, strict=True):
        setattr(rnn, name, nn.Parameter(flat[offset : offset + w.numel()].view_as(w)))
        offset += w.numel()
    return flat


def _bilstm(seed: int) -> SentenceClassifier:
    torch.manual_seed(seed)
    return SentenceClassifier(20, 3, embed_dim=6, hidden_size=5, encoder="bilstm").eval()


def _lstm_of(model: nn.Module) -> nn.RNNBase:
    return next(m for m in model.modules() if isinstance(m, nn.RNNBase))


def test_the_flattened_layout_is_what_save_model_refuses(tmp_path):
    """The case of the CUDA crash (issue 14), reproduced on the CPU: safetensors'
    save_model finds no name covering the shared buffer."""
    from safetensors.torch import save_model

    model = _bilstm(0)
    flat = flatten_like_cudnn(_lstm_of(model))
    ptrs = {p.untyped_storage().data_ptr() for p in _lstm_of(model).parameters()}
    assert ptrs == {flat.untyped_storage().data_ptr()}
    with pytest.raises(RuntimeError, match="None is covering the entire storage"):
        save_model(model, str(tmp_path / "m.safetensors"))


def test_flattened_rnn_weights_save_and_load(tmp_path):
    a, b = _bilstm(0), _bilstm(1)
    flatten_like_cudnn(_lstm_of(a))
    tokens, lengths = _batch()
    expected = a(tokens, lengths).logits
    save_state(a, tmp_path / "m.safetensors")
    assert load_state(b, tmp_path / "m.safetensors") == ([], [])
    assert torch.equal(b(tokens, lengths).logits, expected)
    # into a model whose own weights are flattened: they stay views of its one buffer
    c = _bilstm(2)
    flat = flatten_like_cudnn(_lstm_of(c))
    load_state(c, tmp_path / "m.safetensors")
    assert torch.equal(c(tokens, lengths).logits, expected)
    assert {p.untyped_storage().data_ptr() for p in _lstm_of(c).parameters()} == {
        flat.untyped_storage().data_ptr()
    }
    assert torch.equal(
        flat[: _lstm_of(a).weight_ih_l0.numel()],
        a.state_dict()[next(k for k in a.state_dict() if k.endswith("weight_ih_l0"))].reshape(-1),
    )


def test_views_of_one_buffer_and_tied_weights_together(tmp_path):
    class Mixed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            flat = torch.randn(4 * 7 + 7 + 3)
            self.embed = nn.Embedding(7, 4)
            self.embed.weight = nn.Parameter(flat[:28].view(7, 4))
            self.out = nn.Linear(4, 7)
            self.out.weight = self.embed.weight  # tied, and a view of the buffer
            self.out.bias = nn.Parameter(flat[28:35])
            self.gate = nn.Parameter(flat[35:].view(3, 1).t())  # offset, transposed

    torch.manual_seed(0)
    a = Mixed()
    torch.manual_seed(1)
    b = Mixed()
    path = save_state(a, tmp_path / "m.safetensors")
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        stored = set(f.keys())
        meta = f.metadata()
    assert stored == {"embed.weight", "out.bias", "gate"}  # the tied name stored once
    assert meta["out.weight"] == "embed.weight"
    load_state(b, path)
    assert b.out.weight is b.embed.weight
    for name, value in a.state_dict().items():
        assert torch.equal(b.state_dict()[name], value), name


def test_files_written_by_save_model_still_load(tmp_path):
    """Runs written before this change (safetensors' save_model, tied names dropped)."""
    from safetensors.torch import save_model

    torch.manual_seed(0)
    a = Tied()
    save_model(a, str(tmp_path / "old.safetensors"))
    torch.manual_seed(1)
    b = Tied()
    assert load_state(b, tmp_path / "old.safetensors") == ([], [])
    x = torch.tensor([[1, 2, 6]])
    assert torch.equal(a(x), b(x))


def test_load_onto_an_explicit_device_keeps_the_model_where_it_is(tmp_path):
    a, b = _model(0), _model(1)
    save_state(a, tmp_path / "m.safetensors")
    load_state(b, tmp_path / "m.safetensors", device="cpu")
    assert all(p.device.type == "cpu" for p in b.parameters())
    tokens, lengths = _batch()
    assert torch.equal(a(tokens, lengths).logits, b(tokens, lengths).logits)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_flattened_lstm_round_trip_and_map_location(tmp_path, monkeypatch):
    # CPU and CUDA outputs are compared: TF32 (on by default in cuDNN) rounds at 1e-4
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    a = _bilstm(0).cuda()
    _lstm_of(a).flatten_parameters()  # cuDNN's own flat buffer
    tokens, lengths = _batch()
    expected = a(tokens.cuda(), lengths.cuda()).logits.cpu()
    save_state(a, tmp_path / "m.safetensors")
    cpu_model = _bilstm(1)
    load_state(cpu_model, tmp_path / "m.safetensors")  # saved on CUDA, loaded on the CPU
    assert torch.allclose(cpu_model(tokens, lengths).logits, expected, atol=1e-5)
    gpu_model = _bilstm(2).cuda()
    load_state(gpu_model, tmp_path / "m.safetensors", device="cpu")  # read on CPU, copied
    assert all(p.device.type == "cuda" for p in gpu_model.parameters())
    got = gpu_model(tokens.cuda(), lengths.cuda()).logits.cpu()
    assert torch.allclose(got, expected, atol=1e-5)


def test_paths_expand_the_home_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    model = nn.Linear(2, 2)
    written = save_state(model, "~/ckpt/model.safetensors")
    assert written == tmp_path / "ckpt" / "model.safetensors" and written.is_file()
    other = nn.Linear(2, 2)
    sha = checkpoint.file_sha256("~/ckpt/model.safetensors")
    load_state(other, "~/ckpt/model.safetensors", sha256=sha)
    assert torch.equal(other.weight, model.weight)
    assert checkpoint.check_checkpoint("~/ckpt/model.safetensors") == written


@pytest.mark.parametrize(
    "call",
    [
        lambda p: save_state(nn.Linear(2, 2), p),
        lambda p: load_state(nn.Linear(2, 2), p),
        checkpoint.check_checkpoint,
        checkpoint.file_sha256,
    ],
    ids=["save_state", "load_state", "check_checkpoint", "file_sha256"],
)
def test_a_path_that_is_no_path_is_one_type_error(call):
    """``file_sha256(0)`` read (and closed) the process's standard input: ``open`` takes an
    int as a file descriptor."""
    for bad in (0, None, 2.5):
        with pytest.raises(TypeError, match="path must be a path"):
            call(bad)


def test_saving_onto_a_folder_fails_before_writing(tmp_path, monkeypatch):
    import attnlab._atomic as atomic

    monkeypatch.setattr(atomic.tempfile, "mkstemp", lambda *a, **k: pytest.fail("wrote"))
    with pytest.raises(IsADirectoryError, match="is a folder, not a file"):
        save_state(nn.Linear(2, 2), tmp_path)
    assert list(tmp_path.iterdir()) == []
