"""A forward pass that never reaches backward must not leave its activations behind."""

import gc

import pytest
import torch

from vramlab.sim.virtual_gpu import VirtualGPU


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(),
                               torch.nn.Linear(512, 10))


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
