"""ScalarMix: the mix it computes, that it learns, and that its values feed `build --mix` exactly."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from elmo_cache import ScalarMix
from elmo_cache.errors import InvalidParameterError
from elmo_cache.rows.selection import MixSpec


def test_forward_is_gamma_times_softmax_weighted_sum():
    torch.manual_seed(0)
    mix = ScalarMix(initial=[0.5, -1.0, 2.0], gamma=1.7)
    x = torch.randn(4, 3, 6, 8)
    e = [math.exp(v) for v in (0.5, -1.0, 2.0)]
    s = [v / sum(e) for v in e]
    want = 1.7 * (s[0] * x[:, 0] + s[1] * x[:, 1] + s[2] * x[:, 2])
    torch.testing.assert_close(mix(x), want)
    assert mix.weights == pytest.approx(s, rel=1e-6)
    # another layer axis
    torch.testing.assert_close(mix(x.transpose(1, 2), layer_dim=2), want)


def test_learns_a_known_mix():
    torch.manual_seed(1)
    target = ScalarMix(initial=[-1.0, 0.0, 1.5], gamma=2.0, trainable=False)
    mix = ScalarMix()
    optimiser = torch.optim.Adam(mix.parameters(), lr=0.05)
    for _ in range(300):
        x = torch.randn(16, 3, 5, 4)
        loss = torch.nn.functional.mse_loss(mix(x), target(x))
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    assert mix.weights == pytest.approx(target.weights, abs=1e-2)
    assert mix.gamma_value == pytest.approx(2.0, abs=1e-2)
    assert not any(p.requires_grad for p in target.parameters())


def test_build_args_reproduce_the_module_exactly():
    torch.manual_seed(2)
    mix = ScalarMix(initial=[0.3, -0.2, 1.1], gamma=0.8)
    args = mix.build_args()
    assert args[0] == "--mix" and args[2] == "--mix-softmax" and args[3] == "--gamma"
    spec = MixSpec.from_raw(args[1], gamma=float(args[4]), softmax=True)
    assert spec == mix.mix_spec()
    x = torch.randn(2, 3, 7, 8)
    torch.testing.assert_close(spec.apply(x), mix(x).detach(), rtol=1e-6, atol=1e-7)


def test_subset_of_layers_maps_to_all_three_for_build():
    torch.manual_seed(3)
    mix = ScalarMix((1, 2), initial=[0.4, -0.4], gamma=1.3)
    raw = mix.raw_weights
    assert len(raw) == 3 and all(math.isfinite(v) for v in raw)
    spec = MixSpec.from_raw(raw, gamma=mix.gamma_value, softmax=True)
    all_layers = torch.randn(2, 3, 5, 8)
    # layer 0 gets weight exactly 0, so the fixed mix over all three layers equals the learned one
    assert torch.tensor(spec.weights, dtype=torch.float32)[0].item() == 0.0
    torch.testing.assert_close(spec.apply(all_layers), mix(all_layers[:, 1:]).detach(), rtol=1e-6, atol=1e-7)


def test_bad_inputs():
    with pytest.raises(InvalidParameterError, match=r"layer 3 does not exist; choose from \[0, 1, 2\]"):
        ScalarMix((1, 3))
    with pytest.raises(InvalidParameterError, match="expected 2 raw weights"):
        ScalarMix((0, 2), initial=[1.0, 2.0, 3.0])
    with pytest.raises(InvalidParameterError, match=r"input axis -3 has size 3, expected 2"):
        ScalarMix((1, 2))(torch.zeros(1, 3, 2, 4))


def test_cli_build_with_learned_mix_stores_what_the_module_computes(tmp_path):
    """A layered cache mixed by ScalarMix == the cache `elmo-cache build <build_args()>` writes."""
    from click.testing import CliRunner

    import elmo_cache
    from elmo_cache.cli.main import cli
    from elmo_cache.model.random_model import write_random_model

    options, weights = write_random_model(tmp_path / "model", "tiny", seed=4)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("a small corpus .\nwith three lines\n\nand an empty one\n", encoding="utf-8")
    model = ["--options-file", str(options), "--weight-file", str(weights), "--no-progress"]
    mix = ScalarMix((1, 2), initial=[0.7, -0.3], gamma=1.4)
    runner = CliRunner()
    layered = runner.invoke(cli, ["build", str(corpus), "-o", str(tmp_path / "layers.zarr"), "--layers", "1,2", *model])
    assert layered.exit_code == 0, layered.output
    mixed = runner.invoke(cli, ["build", str(corpus), "-o", str(tmp_path / "mix.h5"), *mix.build_args(), *model])
    assert mixed.exit_code == 0, mixed.output
    with elmo_cache.open(tmp_path / "layers.zarr") as layers, elmo_cache.open(tmp_path / "mix.h5") as mixed_cache:
        assert mixed_cache.kind == "mix" and mixed_cache.metadata["mix"]["softmax"] is True
        assert len(layers) == len(mixed_cache) == 4
        for i in range(len(layers)):
            want = mix(torch.from_numpy(np.array(layers[i]))).detach().numpy()
            np.testing.assert_allclose(mixed_cache[i], want, rtol=1e-6, atol=1e-6)
