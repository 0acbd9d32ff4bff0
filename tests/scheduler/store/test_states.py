from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from errors import Conflict
from scheduler.store.states import ACTIVE, TERMINAL, TRANSITIONS, JobState, allowed, check_transition


def test_terminal_states_have_no_way_out() -> None:
    for state in TERMINAL:
        assert TRANSITIONS[state] == frozenset()
        for dst in JobState:
            with pytest.raises(Conflict, match="it is final"):
                check_transition("j-1", state, dst)


def test_every_state_has_a_row_and_active_ones_can_be_cancelled() -> None:
    assert set(TRANSITIONS) == set(JobState)
    for state in ACTIVE:
        assert allowed(state, JobState.CANCELLED)


def test_illegal_transition_names_the_legal_ones() -> None:
    with pytest.raises(Conflict) as info:
        check_transition("j-9", JobState.QUEUED, JobState.SUCCEEDED)
    assert "j-9 cannot go from queued to succeeded" in str(info.value)
    assert "running" in str(info.value)


@given(st.lists(st.sampled_from(list(JobState)), max_size=30))
def test_any_walk_of_allowed_moves_ends_nowhere_after_a_terminal_state(path: list[JobState]) -> None:
    state = JobState.PENDING
    seen_terminal = False
    for dst in path:
        if allowed(state, dst):
            assert not seen_terminal
            state = dst
            seen_terminal = state.terminal
        else:
            with pytest.raises(Conflict):
                check_transition("j", state, dst)
    assert state in set(JobState)
