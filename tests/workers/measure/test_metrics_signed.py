"""Accuracy metrics on signed data: a sign flip is an error, not agreement (cosine on values, not magnitudes)."""

from __future__ import annotations

import numpy as np
import pytest

from workers.measure.metrics import output_metrics


def test_cosine_sees_sign_flips() -> None:
    rng = np.random.default_rng(0)
    ref = rng.standard_normal(1000).astype(np.float32)
    flipped = ref.copy()
    flipped[::2] *= -1  # half the elements change sign: |got| == |ref| everywhere
    m = output_metrics(ref, flipped)
    assert abs(m.cosine) < 0.2  # cosine of |x| would be exactly 1.0
    assert m.max_abs == pytest.approx(2 * float(np.abs(ref[::2]).max()), rel=1e-6)
    assert output_metrics(ref, -ref).cosine == pytest.approx(-1.0)
    assert output_metrics(ref, ref).cosine == pytest.approx(1.0)


def test_snr_of_a_negated_output_is_below_zero_db() -> None:
    ref = np.linspace(-3, 3, 101, dtype=np.float32)
    # |ref - (-ref)| = 2|ref|: noise power 4x the signal, -6 dB
    assert output_metrics(ref, -ref).snr_db == pytest.approx(-6.0206, abs=1e-3)
