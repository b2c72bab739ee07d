"""Per-kernel device times add up to the plan's when kernels overlap (``run.timing.exclusive_spans``).

With programmatic dependent launch a kernel starts while its predecessor still runs and waits
inside; the profiler's span of that kernel covers the wait, so plain durations over-count (run 84:
51.1 + 47.7 + 44.1 us for a 57.0 us plan).
"""

from __future__ import annotations

import pytest

from pyrunner.run.timing import exclusive_spans


def test_disjoint_spans_keep_their_lengths() -> None:
    assert exclusive_spans([(0.0, 5.0), (6.0, 8.0)]) == [5.0, 2.0]


def test_an_early_launched_kernel_is_charged_only_past_its_predecessor() -> None:
    # the second kernel launched at 1 us, waited until 5 us, finished at 9 us
    assert exclusive_spans([(0.0, 5.0), (1.0, 9.0)]) == [5.0, 4.0]


def test_times_add_up_to_the_union_in_any_order() -> None:
    spans = [(10.0, 20.0), (0.0, 12.0), (11.0, 15.0), (30.0, 31.0)]
    got = exclusive_spans(spans)
    assert got == [8.0, 12.0, 0.0, 1.0]
    assert sum(got) == pytest.approx(21.0)  # [0, 20] and [30, 31]
