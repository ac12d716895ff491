"""service.vocabulary spells the pass's policy names and targets itself (so query commands import no
amp_pass); here they are held to the pass's own lists."""

from __future__ import annotations

import pytest

from amp_pass.policy import NAMED_POLICIES, TARGETS
from service import vocabulary
from service.vocabulary import UnknownNameError


def test_policy_names_and_targets_are_the_passes() -> None:
    assert vocabulary.PASS_POLICY_NAMES == NAMED_POLICIES
    assert vocabulary.POLICY_NAMES == (*NAMED_POLICIES, "auto")
    assert vocabulary.TARGETS == TARGETS


@pytest.mark.parametrize("target", TARGETS)
def test_every_pass_target_and_its_queues_are_accepted(target: str) -> None:
    """The service's target validator takes each of the pass's targets, and a queue of one."""
    assert vocabulary.target_name(target) == target
    assert vocabulary.target_name(f"{target}-a100") == f"{target}-a100"
    with pytest.raises(UnknownNameError):
        vocabulary.target_name(f"{target}x")
