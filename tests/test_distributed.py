"""Data-parallel training (``torch.nn.parallel.DistributedDataParallel``) of a model built
from attnlab's modules: two processes on the CPU (the gloo backend), each with half of the
batch, as the ranks of a multi-GPU job run.

DDP sums the gradients of the ranks (and divides by their number), so with a loss that
sums over the examples, twice the synchronised gradient must equal the gradient of the
whole batch in one process; by default (``find_unused_parameters=False``) DDP also needs
every parameter to take part in every step's loss. A mechanism that left a parameter out
of the graph, or mixed the examples of a batch, fails here. A stochastic alignment
(hard / reinforced attention) trains its policy through the REINFORCE loss only, so that
loss goes into every step (docs/attention.md, "Data-parallel training").
"""

from __future__ import annotations

import copy
import datetime
import os
import sys

import pytest
import torch
import torch.distributed as dist
from torch import Tensor, nn

from attnlab import Attention, MultiHeadAttention
from attnlab.functional import reinforce_loss

WORLD = 2
BATCH = 4  # two examples a rank


class _Model(nn.Module):
    """Self-attention, then pooling by a (deterministic or stochastic) attention with one
    learned query, then a linear classifier."""

    def __init__(self, align: str) -> None:
        super().__init__()
        self.embed = nn.Linear(3, 8)
        self.encoder = MultiHeadAttention(8, 2, score="additive")
        self.query = nn.Parameter(torch.randn(8))
        self.pool = Attention("general", align, d_q=8, d_k=8)
        self.classify = nn.Linear(8, 2)

    def forward(self, x: Tensor, mask: Tensor) -> tuple[Tensor, Tensor | None]:
        keys = mask.unsqueeze(1)  # [B, 1, n]: the key padding mask
        h = self.encoder(self.embed(x), mask=keys).context
        q = self.query.expand(x.shape[0], -1)
        out = self.pool(q, h, h, mask=keys)
        return self.classify(out.context), out.log_prob


def _loss(model: nn.Module, x: Tensor, mask: Tensor, y: Tensor) -> Tensor:
    """The summed cross-entropy, plus the REINFORCE loss of a stochastic pooling (its
    reward the negative per-example cross-entropy), summed over the examples too."""
    logits, log_prob = model(x, mask)
    ce = nn.functional.cross_entropy(logits, y, reduction="none")
    loss = ce.sum()
    if log_prob is not None:
        loss = loss + reinforce_loss(log_prob, -ce) * x.shape[0]
    return loss


def _data() -> tuple[Tensor, Tensor, Tensor]:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(BATCH, 5, 3, generator=g)
    mask = torch.arange(5) < torch.tensor([5, 3, 4, 2]).unsqueeze(1)
    y = torch.tensor([0, 1, 1, 0])
    return x, mask, y


def _worker(rank: int, align: str, init: str, steps: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=init,
        rank=rank,
        world_size=WORLD,
        timeout=datetime.timedelta(seconds=60),
    )
    try:
        torch.manual_seed(0)
        model = _Model(align)
        whole = copy.deepcopy(model)
        ddp = nn.parallel.DistributedDataParallel(model)  # find_unused_parameters=False
        x, mask, y = _data()
        mine = slice(rank * BATCH // WORLD, (rank + 1) * BATCH // WORLD)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        for _ in range(steps):  # DDP checks the previous step's reduction at every step
            opt.zero_grad(set_to_none=True)
            torch.manual_seed(10 + rank)
            _loss(ddp, x[mine], mask[mine], y[mine]).backward()
            opt.step()
        # the parameters agree across the ranks after the steps
        for name, p in model.named_parameters():
            copies = [torch.empty_like(p) for _ in range(WORLD)]
            dist.all_gather(copies, p.detach())
            assert torch.equal(copies[0], copies[1]), f"{name} differs between the ranks"
        if align != "soft":
            return
        # deterministic: twice the synchronised gradient is the whole batch's gradient
        whole.zero_grad(set_to_none=True)
        _loss(whole, x, mask, y).backward()
        ddp.zero_grad(set_to_none=True)
        # the last step moved the DDP copy: compare at the initial weights
        model.load_state_dict(whole.state_dict())
        _loss(ddp, x[mine], mask[mine], y[mine]).backward()
        for (name, p), q in zip(model.named_parameters(), whole.parameters(), strict=True):
            assert p.grad is not None, f"no gradient reaches {name}"
            torch.testing.assert_close(
                p.grad * WORLD, q.grad, atol=1e-5, rtol=1e-4, msg=lambda m, n=name: f"{n}: {m}"
            )
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(),
    reason="this torch build has no torch.distributed gloo backend",
)
@pytest.mark.skipif(sys.platform == "win32", reason="file:// rendezvous on POSIX paths")
@pytest.mark.parametrize("align", ["soft", "reinforced", "hard"])
def test_distributed_data_parallel_training(align, tmp_path):
    """Two ranks, three SGD steps under DDP's defaults: no unused parameter, the ranks'
    parameters stay equal, and (soft attention) the synchronised gradient is the
    whole batch's."""
    import torch.multiprocessing as mp

    init = f"file://{os.fspath(tmp_path / 'rendezvous')}"
    mp.spawn(_worker, args=(align, init, 3), nprocs=WORLD, join=True)
