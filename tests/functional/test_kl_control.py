"""AdaptiveKLController / FixedKLController (Ziegler et al. 2019)."""

import io

import pytest
import torch
from torch.testing import assert_close

from rlhf_lit.functional import AdaptiveKLController, FixedKLController

torch.set_num_threads(1)


def test_adaptive_steps_and_clip_bounds():
    ctl = AdaptiveKLController(init_kl_coef=0.1, target=6.0, horizon=10000)
    assert_close(ctl.value, 0.1)
    # kl 9: 9/6 - 1 = 0.5 -> clipped to +0.2; coef *= 1 + 0.2 * 1000 / 10000 = 1.02 -> 0.102
    ctl.update(9.0, n_steps=1000)
    assert_close(ctl.value, 0.102)
    # kl 0: -1 -> clipped to -0.2; coef *= 0.98 -> 0.09996
    ctl.update(0.0, n_steps=1000)
    assert_close(ctl.value, 0.09996)
    # kl 6.6: 6.6/6 - 1 = 0.1 (inside); coef *= 1 + 0.1 * 500 / 10000 = 1.005 -> 0.1004598
    ctl.update(6.6, n_steps=500)
    assert_close(ctl.value, 0.1004598)
    # 0-dim tensor, kl 4.5: 4.5/6 - 1 = -0.25 -> -0.2; coef *= 1 - 0.2 * 2000 / 10000 = 0.96 -> 0.096441408
    ctl.update(torch.tensor(4.5), n_steps=2000)
    assert_close(ctl.value, 0.096441408)
    assert isinstance(ctl.value, float)


def test_adaptive_state_dict_round_trip_weights_only():
    ctl = AdaptiveKLController(init_kl_coef=0.1, target=6.0, horizon=10000)
    ctl.update(9.0, n_steps=1000)  # -> 0.102 (see above)
    buffer = io.BytesIO()
    torch.save(ctl.state_dict(), buffer)
    buffer.seek(0)
    restored = AdaptiveKLController(init_kl_coef=0.5, target=6.0, horizon=10000)
    restored.load_state_dict(torch.load(buffer, weights_only=True))
    assert_close(restored.value, 0.102)


def test_adaptive_rejects_bad_settings():
    with pytest.raises(ValueError, match="target"):
        AdaptiveKLController(0.1, target=0.0, horizon=10)
    with pytest.raises(ValueError, match="horizon"):
        AdaptiveKLController(0.1, target=6.0, horizon=0)
    with pytest.raises(ValueError, match="init_kl_coef"):
        AdaptiveKLController(-0.1, target=6.0, horizon=10)


def test_fixed_controller():
    ctl = FixedKLController(kl_coef=0.05)
    ctl.update(100.0, n_steps=1000)
    ctl.update(torch.tensor(0.0), n_steps=1000)
    assert_close(ctl.value, 0.05)
    other = FixedKLController(kl_coef=0.2)
    other.load_state_dict(ctl.state_dict())
    assert_close(other.value, 0.05)
    with pytest.raises(ValueError, match="kl_coef"):
        FixedKLController(-1.0)
