"""The eBPF backend (:class:`~subc.backends.backend.Backend`): the program (static C and the two
generated headers, :mod:`.program`) and ``maps.json`` (:mod:`.target`)."""

from __future__ import annotations

from typing import Any

from ...compiler.driver import CompileResult
from ..backend import OutputOptions
from ..output import TextStream
from ..json_text import dumps
from .program import render_filter
from .target import build_maps, ebpf_plan, report


class EbpfBackend:
    """``subc_filter.bpf.c`` with its static headers, ``subc_config.h`` and ``subc_classify.h``
    (:mod:`.source`), ``maps.json``; ``report.json``'s document."""

    def check(self, res: CompileResult, options: OutputOptions) -> None:
        """Nothing to check before generating: :meth:`outputs` raises SubcError for a field or
        action the program cannot handle."""

    def outputs(self, res: CompileResult, options: OutputOptions) -> tuple[dict[str, str | TextStream], dict[str, Any]]:
        """(file name -> text, ``report.json`` document); SubcError for an unsupported field,
        parser or action (:func:`.target.ebpf_plan`, :func:`.target.build_maps`)."""
        parse_plan = ebpf_plan(res)
        maps_doc = build_maps(res, parse_plan)
        files: dict[str, str | TextStream] = {**render_filter(res, parse_plan, maps_doc, options.rules_path)}
        files["maps.json"] = dumps(maps_doc.to_json())
        return files, report(res, maps_doc)
