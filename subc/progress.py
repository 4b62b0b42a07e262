"""A progress bar over the phases of a long command (tqdm), for interactive use.

Shown on standard error only when it is a terminal, and only once the command has run for
:data:`DELAY_S` seconds (``SUBC_PROGRESS_DELAY`` in the environment, seconds, overrides it), so
short compiles and scripts (CI, pipes) print nothing extra.  A background thread refreshes it, so
that the elapsed time moves during a long phase.
"""

from __future__ import annotations

import os
import sys
import threading

DELAY_S = 1.0


def delay_s() -> float:
    """Seconds before the bar appears: ``SUBC_PROGRESS_DELAY`` when it is a number >= 0, else
    :data:`DELAY_S`."""
    try:
        d = float(os.environ.get("SUBC_PROGRESS_DELAY", ""))
    except ValueError:
        return DELAY_S
    return d if d >= 0 else DELAY_S


class _Null:
    """The bar when there is no terminal: counts phases, prints nothing."""

    n = 0

    def update(self, k: int = 1) -> None:
        self.n += k

    def set_description_str(self, *a, **k) -> None:
        pass

    def close(self) -> None:
        pass


class PhaseProgress:
    """``phases``: the phase names in order; :meth:`next` moves to the next one; use as a context
    manager (the bar is removed at the end).  ``enabled`` None: when standard error is a TTY."""

    def __init__(self, phases: list[str], enabled: bool | None = None, file=None):
        file = file or sys.stderr
        self.enabled = file.isatty() if enabled is None else enabled
        self.phases = list(phases)
        self.bar = _Null()
        self._stop = threading.Event()
        self._thread = None
        if not self.enabled:
            return
        from tqdm import tqdm  # imported only for a terminal

        self.bar = tqdm(
            total=len(self.phases),
            desc=self.phases[0],
            file=file,
            disable=not self.enabled,
            delay=delay_s(),
            leave=False,
            bar_format="{desc:<12} {bar:24} {n}/{total} phases [{elapsed}]",
        )
        self._thread = threading.Thread(target=self._tick, daemon=True)
        self._thread.start()

    def _tick(self) -> None:
        while not self._stop.wait(0.25):
            self.bar.update(0)

    def next(self, name: str | None = None) -> None:
        """The current phase is done; ``name`` (default: the next listed phase) starts."""
        self.bar.update(1)
        if self.bar.n < len(self.phases):
            self.bar.set_description_str(name or self.phases[self.bar.n], refresh=False)

    def close(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()
        self.bar.close()

    def __enter__(self) -> "PhaseProgress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
