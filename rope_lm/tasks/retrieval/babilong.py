"""BABILong-style fact chains (Kuratov et al., 2024), sized for small models:

  qa1  one supporting fact: people move between rooms; where is X? (X's
       earlier room and other people's moves distract);
  qa2  two supporting facts: X picks up an object and then moves; where is
       the object? (another object, X's room before the pick-up and other
       people's moves distract).

One module for the two because they tell the same kind of story: its rooms,
objects and sentences, and the rule that keeps a fact before the target."""

import random

from rope_lm.tasks.retrieval.base import (
    PEOPLE,
    RETRIEVAL_TASKS,
    Instance,
    Needle,
    RetrievalTask,
    depths_after,
    one_of,
)

# bAbI's six rooms.
LOCATIONS = ("kitchen", "garden", "office", "bathroom", "bedroom", "hallway")
OBJECTS = ("football", "apple", "milk", "book", "key", "ball")
MOVES = ("went to", "moved to", "travelled to", "journeyed to")
TAKES = ("picked up", "grabbed", "took", "got")


def _move(rng: random.Random, who: str, room: str) -> str:
    return f" {who} {rng.choice(MOVES)} the {room}."


def _before(rng: random.Random, depth: float) -> float | None:
    """A depth strictly before the target's, or None at depth 0 (nothing
    comes before the start: a tie would be placed after the target)."""
    return depth * rng.random() if depth > 0 else None


@RETRIEVAL_TASKS.register("qa1")
class SingleFact(RetrievalTask):
    """qa1. The supporting fact (the asked person's last move) is the target;
    the same person's earlier move, in another room, comes before it (at
    depth 0 there is no before), other people's moves anywhere, so the last
    move in the text is often someone else's."""

    battery_order = 60
    pattern = one_of(LOCATIONS)

    def instance(self, rng, depth):
        who, *others = rng.sample(PEOPLE, 1 + min(3, self.n - 1))
        room = rng.choice(LOCATIONS)
        needles = [Needle(_move(rng, who, room), depth)]
        earlier = _before(rng, depth)
        if earlier is not None:
            needles.append(Needle(_move(rng, who, rng.choice([r for r in LOCATIONS if r != room])), earlier))
        while len(needles) < self.n:
            needles.append(Needle(_move(rng, rng.choice(others), rng.choice(LOCATIONS)), rng.random()))
        return Instance(needles, f" Where is {who}? {who} is in the", [room])


@RETRIEVAL_TASKS.register("qa2")
class TwoFacts(RetrievalTask):
    """qa2. The supporting facts: the asked object picked up (the target, at
    depth) and its carrier's move after that (the answer's room). Distractors,
    as many as `needles` allows, in this order: the carrier's room before the
    pick-up, another person picking up another object, that person's move,
    then moves of anyone but the carrier."""

    battery_order = 70
    pattern = one_of(LOCATIONS)

    def instance(self, rng, depth):
        who, other, *rest = rng.sample(PEOPLE, 2 + min(2, max(0, self.n - 4)))
        thing, decoy = rng.sample(OBJECTS, 2)
        room = rng.choice(LOCATIONS)
        needles = [
            Needle(f" {who} {rng.choice(TAKES)} the {thing}.", depth),
            Needle(_move(rng, who, room), depths_after(rng, depth, 1)[0]),
        ]
        optional = []
        earlier = _before(rng, depth)
        if earlier is not None:
            optional.append(Needle(_move(rng, who, rng.choice([r for r in LOCATIONS if r != room])), earlier))
        took = rng.random()
        optional.append(Needle(f" {other} {rng.choice(TAKES)} the {decoy}.", took))
        optional.append(
            Needle(_move(rng, other, rng.choice([r for r in LOCATIONS if r != room])), depths_after(rng, took, 1)[0])
        )
        needles += optional[: self.n - 2]
        while len(needles) < self.n:
            needles.append(Needle(_move(rng, rng.choice([other, *rest]), rng.choice(LOCATIONS)), rng.random()))
        return Instance(needles, f" Where is the {thing}? The {thing} is in the", [room])
