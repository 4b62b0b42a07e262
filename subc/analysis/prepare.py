"""Driver work of ``subc analyze`` that does not need the tasks' results, done while they run.

The driver only waits for the Spark tasks of step 1 (:mod:`.analyze`); meanwhile a thread groups
the rules by shape for the reference pass (:func:`~.reference_np.shape_groups`) and finds their
action sets (:func:`~.reference_np.action_sets`), reads the rules' source lines for
``rules.parquet`` and imports matplotlib for the plots (100,000 rules: 0.9, 0.13, 0.75 and 1.1 s
that were serial after the tasks), then runs the cycle collector's full pass: the
driver holds millions of objects (the rules, the compiled pipeline), and a full pass over them
(0.35 s) otherwise fell, in a job after the first of a process, in the reference step after the
tasks; once it has run here, what the steps after the tasks allocate stays below its threshold.
:meth:`Prepared.result` waits for the thread and re-raises its error, so the outcome is the same
as doing the work in line.
"""

from __future__ import annotations

import gc
import threading
from typing import Any, Sequence

from ..compiler.gcpause import paused_gc
from ..lang.ast import Rule
from .reference_np import action_sets, shape_groups


class Prepared:
    """Starts the thread at construction for ``rules``; :meth:`result` gives (the rules' shape
    groups, as :func:`~.reference_np.shape_groups` returns them, and their action sets, as
    :func:`~.reference_np.action_sets` does, both None unless ``groups``; per rule its (location,
    source text), as :meth:`~subc.lang.ast.Rule.source` gives them)."""

    def __init__(self, rules: Sequence[Rule], groups: bool = True):
        self._rules = rules
        self._groups = groups
        self._out: tuple[list | None, Any, list] | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="subc-analyze-prepare", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            groups = shape_groups(self._rules) if self._groups else None
            with paused_gc():  # without materialising deferred rules' conditions
                actions = action_sets(self._rules) if self._groups else None
                sources = [r.source() for r in self._rules]
            from .plots import pyplot

            pyplot()
            gc.collect()
            self._out = (groups, actions, sources)
        except BaseException as e:  # re-raised by result() in the caller's thread
            self._error = e

    def result(self) -> tuple[list[tuple[tuple, list[int], Any]] | None, Any, list]:
        """Wait for the thread; (shape groups, action sets, sources).  Raises what the thread raised."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._out is not None
        return self._out
