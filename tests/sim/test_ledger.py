"""A forward pass that never reaches backward must not leave its activations behind."""

import gc

import pytest
import torch

from vramlab.sim.virtual_gpu import VirtualGPU


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(),
                               torch.nn.Linear(512, 10))


@pytest.mark.slow
def test_oom_in_the_middle_of_forward_releases_everything():
    gpu = VirtualGPU("8MiB")
    model = mlp()
    gpu.adopt(model)
    base = gpu.allocated
    with pytest.raises(torch.OutOfMemoryError):
        with gpu:
            model(torch.randn(4096, 256)).sum().backward()
    gc.collect()
    assert gpu.allocated == base
    assert gpu.breakdown()["activations"] == 0
    del model
    gc.collect()
    assert gpu.allocated == 0


def test_forward_without_backward_releases_activations():
    gpu = VirtualGPU("64MiB")
    model = mlp()
    gpu.adopt(model)
    base = gpu.allocated
    with gpu:
        out = model(torch.randn(512, 256))
        assert gpu.breakdown()["activations"] > 0
        del out
    gc.collect()
    assert gpu.allocated == base


def test_what_a_block_allocates_is_counted_in_its_category():
    from vramlab.sim.ledger import Ledger

    acct = Ledger(None)
    with acct:
        with acct.category("gradients"):
            kept = torch.empty(1 << 16)
        other = torch.empty(1 << 10)
    assert acct.cats["gradients"] == kept.untyped_storage().nbytes()
    assert acct.cats["other"] == other.untyped_storage().nbytes()
    assert acct.allocating_as is None
    with pytest.raises(ValueError, match="unknown category"):
        with acct.category("weights"):
            pass


def test_nothing_on_the_meta_device_is_counted():
    from torch._subclasses.fake_tensor import FakeTensorMode

    from vramlab.sim.ledger import Ledger

    acct = Ledger(None, fake=True)
    with FakeTensorMode(), acct:
        on_meta = torch.empty(1 << 20, device="meta")
        on_cpu = torch.empty(1 << 10)
    assert acct.peak == on_cpu.untyped_storage().nbytes()
    del on_meta
