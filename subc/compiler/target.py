"""The compilation targets: what each back end is called, in one place.

A :class:`Target` is a ``str`` (``StrEnum``), so a target read from the command line or a JSON
document compares equal to its member; :func:`target_of` turns any such string into the member.
"""

from __future__ import annotations

from enum import StrEnum

from ..errors import SubcError


class Target(StrEnum):
    """BMV2: P4_16 for BMv2's v1model (``simple_switch``); TOFINO: P4_16 for Tofino's TNA; EBPF: an
    XDP + TC program with BPF maps (loaded with bcc)."""

    BMV2 = "bmv2"
    TOFINO = "tofino"
    EBPF = "ebpf"

    @property
    def is_p4(self) -> bool:
        """Whether the target is a P4 switch (match-action tables, multicast groups, P4Info)."""
        return self in P4_TARGETS


#: The P4 targets, and every target, in the order the commands list them.
P4_TARGETS = (Target.BMV2, Target.TOFINO)
TARGETS = (*P4_TARGETS, Target.EBPF)


def target_of(name: str) -> Target:
    """The :class:`Target` named ``name``; SubcError naming the targets for any other name."""
    try:
        return Target(name)
    except ValueError:
        raise SubcError(f"unknown target {name!r} (one of {', '.join(TARGETS)})") from None
