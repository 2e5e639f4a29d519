"""Which host takes a create: power of K choices (E2B places this way, with K = 3). Hosts that
cannot take it are filtered out (not ready, draining, full counting the creates already on their
way to them); K of the rest are sampled and the emptiest wins. The next candidates are the
others of the sample, then every other fitting host, emptiest first: an admission refusal (the
host filled up meanwhile, or started draining) moves on to the next."""

from __future__ import annotations

import random
from collections.abc import Collection, Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Candidate:
    host_id: str
    address: str
    capacity: int
    load: int  # sandboxes it holds or is being given (the catalog's count)

    @property
    def free(self) -> int:
        return self.capacity - self.load

    @property
    def use(self) -> float:
        return self.load / self.capacity if self.capacity > 0 else 1.0


def order(
    hosts: list[Candidate],
    k: int,
    prefer: Collection[str] = (),
    rng: random.Random | None = None,
) -> list[Candidate]:
    """The hosts to try, in order; those in ``prefer`` (that have the template or snapshot
    already, or the sandbox's own copy) first when they fit, emptiest first."""
    rng = rng or random.Random()
    fitting = [h for h in hosts if h.free > 0]

    # Ties go to chance: hosts equally empty (as every host looks to an edge between two polls)
    # must not all send their creates to the first by name.
    def emptiest(hosts: Iterable[Candidate]) -> list[Candidate]:
        return sorted(hosts, key=lambda h: (h.use, rng.random()))

    first = emptiest(h for h in fitting if h.host_id in prefer)
    rest = [h for h in fitting if h.host_id not in prefer]
    sample = emptiest(rng.sample(rest, min(k, len(rest))))
    others = emptiest(h for h in rest if h not in sample)
    return first + sample + others
