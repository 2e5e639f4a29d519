"""What a sandbox carries of the fleet (docs/fleet.md): the id and generation its edge gave it.

An edge places a create on a host with an id and a generation of its choosing (``Assignment``);
the host keeps the generation in the sandbox's record (``extra["fleet"]``). Every later request
an edge sends carries the generation it knows: a host whose copy is older than that is not the
sandbox any more (the sandbox moved on while this host was cut off), and one asked with an older
generation is being asked by an edge that has not seen the move (fencing, e2b/fleet_host.py).
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

KEY = "fleet"


@dataclass(frozen=True)
class Assignment:
    sandbox_id: str
    generation: int


# Set by the host's gate (e2b/fleet_host.py) for the request being served.
assigned: ContextVar[Assignment | None] = ContextVar("sandhold_fleet_assigned", default=None)


def stamp(extra: dict[str, Any], assignment: Assignment | None) -> str | None:
    """Record an edge's generation in a new sandbox's ``extra``; the id the edge chose."""
    if assignment is None:
        return None
    extra[KEY] = {"generation": assignment.generation}
    return assignment.sandbox_id


def of(extra: dict[str, Any]) -> dict[str, Any]:
    """A copy of what a sandbox's record holds of the fleet ({} for none)."""
    got = extra.get(KEY)
    return dict(got) if isinstance(got, dict) else {}


def generation_of(extra: dict[str, Any]) -> int:
    """A sandbox's generation: 1 for one no edge placed (a fork, a sandbox of before)."""
    got = extra.get(KEY)
    return int(got.get("generation", 1)) if isinstance(got, dict) else 1
