"""The Snakefile's onsuccess/onerror cancel the timers Snakemake's scheduler left armed, so the run exits at once."""

from __future__ import annotations

import threading

from accubisect.workflow.step import cancel_scheduler_timers


def test_an_armed_timer_is_cancelled_and_never_fires():
    fired = threading.Event()
    timer = threading.Timer(30, fired.set)
    timer.start()
    cancel_scheduler_timers()
    timer.join(5)
    assert not timer.is_alive() and not fired.is_set()
