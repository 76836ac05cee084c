"""The Gram under every covariance (outlierlab.metrics.gram): the upper-triangular block products must give the
same xᵀx as the plain product, exactly symmetric, for every layout the whitener and IsoScore hand it."""

import numpy as np
import pytest
import torch

from outlierlab.metrics.gram import gram


def test_a_hand_computed_gram():
    x = torch.tensor([[1.0, 2.0], [3.0, -1.0], [0.5, 0.0]], dtype=torch.float64)
    # columns (1, 3, .5) and (2, -1, 0): 1+9+.25 = 10.25, 2-3+0 = -1, 4+1+0 = 5
    assert torch.equal(gram(x), torch.tensor([[10.25, -1.0], [-1.0, 5.0]], dtype=torch.float64))


@pytest.mark.parametrize("layout", ["stacked", "strided", "float32", "transposed", "empty"])
def test_the_gram_equals_the_plain_product_and_is_exactly_symmetric(layout):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 200, 24, generator=g, dtype=torch.float64) * torch.linspace(0.1, 30, 24, dtype=torch.float64)
    x = {"stacked": x, "strided": x[:, ::3], "float32": x.float(), "transposed": x.mT.contiguous().mT,
         "empty": x[:, :0]}[layout]
    got, want = gram(x), x.mT @ x
    assert got.dtype == x.dtype and got.shape == want.shape
    tol = 1e-13 if x.dtype == torch.float64 else 1e-5
    assert torch.allclose(got, want, rtol=tol, atol=tol * float(want.abs().max().clamp_min(1)))
    assert torch.equal(got, got.mT)  # one triangle computed, mirrored; a GEMM's two triangles may differ by an ulp
    # the result owns its memory (the whitener adds into it in place)
    assert not np.shares_memory(got.numpy(), x.numpy()) or x.numel() == 0


@pytest.mark.parametrize("blocks", [1, 2, 3, 4, 7])
def test_every_block_count_covers_each_entry_once(blocks):
    """Uneven column blocks (d = 23 is no multiple of 2, 3, 4 or 7) must still tile the upper triangle exactly."""
    x = torch.arange(1.0, 1 + 11 * 23, dtype=torch.float64).reshape(11, 23).remainder(7) - 3
    assert torch.equal(gram(x, blocks=blocks), x.mT @ x)  # small integers: every sum is exact, any order

def test_tensors_that_need_autograd_keep_torch_s_product():
    x = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    gram(x).sum().backward()
    assert torch.allclose(x.grad, 2 * x.detach() @ torch.ones(3, 3, dtype=torch.float64))
