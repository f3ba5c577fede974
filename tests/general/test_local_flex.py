"""Local-m attention on FlexAttention (attnlab.general.local_flex): what it compiles and
what it keeps between calls. Its outputs against the window path are checked in
tests/general/test_planner.py."""

from __future__ import annotations

import shutil
import warnings

import pytest
import torch
from torch.nn.attention.flex_attention import flex_attention

from attnlab.general import local_flex


def _at_most_two_compiles():
    """Dynamo's recompile limit at 2, and an error (instead of a silent fall-back to the
    uncompiled function) when a third compile would be needed."""
    names = torch._dynamo.config.get_config_copy()
    limit = "recompile_limit" if "recompile_limit" in names else "cache_size_limit"
    fail = next((n for n in ("fail_on_recompile_limit_hit", "fail_on_cache_limit_hit")
                 if n in names), None)  # fmt: skip
    if fail is None:
        pytest.skip("this torch cannot raise at Dynamo's recompile limit")
    return torch._dynamo.config.patch({limit: 2, fail: True})


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("g++") is None and shutil.which("c++") is None,
    reason="Inductor's CPU kernels need a C++ compiler (apt-get install g++)",
)
def test_compiled_flex_serves_new_lengths_with_one_recompile(monkeypatch):
    """A model fed batches of varying length: the compiled FlexAttention recompiles once,
    with symbolic lengths that serve every later length. A kernel per length
    (``dynamic=False``) recompiled at every new length until Dynamo's recompile limit (8)
    and then ran FlexAttention unfused, the full score matrix; with the limit at 2 and an
    error at the limit, it fails at the third length here. On the CPU (Inductor's C++
    kernels); the CUDA path compiles the same function."""
    monkeypatch.setattr(local_flex, "_COMPILED", {})
    torch._dynamo.reset()
    flex = local_flex._flex(True)
    try:
        with _at_most_two_compiles(), warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # the unfused reference's
            # lengths of whole 32-row blocks: torch 2.13's Inductor CPU kernel of FlexAttention
            # reads unset memory in a partial last block (wrong rows that change from one
            # compile to the next, also at a fixed shape); the CUDA kernel is not affected
            for n in (32, 64, 96):
                g = torch.Generator().manual_seed(n)
                q, k, v = (torch.randn(2, 1, n, 8, generator=g) for _ in range(3))
                block = local_flex._band(n, n, 2, "cpu")
                got = flex(q, k, v, block_mask=block)
                want = flex_attention(q, k, v, block_mask=block)
                torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    finally:
        torch._dynamo.reset()


def test_band_masks_are_built_once_per_size_and_bounded(monkeypatch):
    """The band ``|i - l| <= D`` of local-m's default window is built once per sizes (the
    same object again) and at most ``_BANDS_KEPT`` of them are kept, the most recently
    used, whatever the number of lengths a model sees."""
    monkeypatch.setattr(local_flex, "_BANDS", {})
    first = local_flex._band(10, 10, 2, "cpu")
    assert local_flex._band(10, 10, 2, "cpu") is first
    assert local_flex._band(10, 10, 3, "cpu") is not first
    for n in range(1, local_flex._BANDS_KEPT + 20):
        local_flex._band(n, n + 1, 2, "cpu")
        local_flex._band(10, 10, 2, "cpu")  # used at every step: kept
    assert len(local_flex._BANDS) == local_flex._BANDS_KEPT
    assert local_flex._band(10, 10, 2, "cpu") is first
    assert (10, 10, 3, "cpu") not in local_flex._BANDS  # the least recently used went
    # the mask itself: query i sees the keys l with |i - l| <= D
    dense = first.to_dense()  # [1, 1, query blocks, key blocks]: one block here
    assert dense.shape[-2:] == (1, 1) and bool(dense.all())
    want = (torch.arange(10)[:, None] - torch.arange(10)[None, :]).abs() <= 2
    got = first.mask_mod(
        torch.tensor(0), torch.tensor(0), torch.arange(10)[:, None], torch.arange(10)[None, :]
    )
    assert torch.equal(got, want)


def test_band_masks_under_compile_are_built_in_the_graph(monkeypatch):
    """Under ``torch.compile`` with dynamic shapes the band is built in the graph: one
    graph for every length (a cache keyed by the symbolic sizes would make them constants,
    a graph per length), no warning, and the eager band's blocks."""
    from torch._dynamo.testing import CompileCounter

    monkeypatch.setattr(local_flex, "_BANDS", {})

    def blocks(centres: torch.Tensor) -> torch.Tensor:
        band = local_flex._block_mask(centres, centres.shape[1], 2, None, True)
        return band.kv_num_blocks, band.kv_indices

    counter = CompileCounter()
    compiled = torch.compile(blocks, backend=counter, dynamic=True, fullgraph=True)
    torch._dynamo.reset()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for n in (200, 300, 520):
                centres = torch.arange(float(n)).expand(2, n)
                got, want = compiled(centres), blocks(centres)
                for g, w in zip(got, want, strict=True):
                    torch.testing.assert_close(g, w)
    finally:
        torch._dynamo.reset()
    assert counter.frame_count == 1
    assert not local_flex._BANDS or all(isinstance(k[0], int) for k in local_flex._BANDS)
