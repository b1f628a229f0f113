"""A SCAN-like compositional task (Lake & Baroni, 2018): commands such as
`jump opposite left twice and walk after look right` -> action sequences
(LTURN LTURN JUMP LTURN LTURN JUMP WALK RTURN LOOK ... ).

size = the number of clauses. A clause is a verb, an optional direction
(left, right, opposite <dir>, and with around=true also around <dir>) and an
optional repetition (twice, thrice). Clauses are joined left to right:
`X and Y` -> X Y, `X after Y` -> Y X, where X is everything to the left, so
longer commands need the same rules applied to more material, in new orders.
"""

from rope_lm.tasks.synthetic.base import SYNTHETIC_TASKS, Task

VERBS = {"walk": "WALK", "run": "RUN", "jump": "JUMP", "look": "LOOK", "turn": None}
TURNS = {"left": "LTURN", "right": "RTURN"}
REPEATS = {"": 1, "twice": 2, "thrice": 3}
CONNECTIVES = ("and", "after")


@SYNTHETIC_TASKS.register("scan")
class Scan(Task):
    def __init__(self, around: bool = False):
        self.around = around
        modes = ["", "plain", "opposite"] + (["around"] if around else [])
        self.modes = tuple(modes)
        self.symbols = (
            *VERBS,
            *TURNS,
            "opposite",
            "around",
            "twice",
            "thrice",
            *CONNECTIVES,
            *[a for a in VERBS.values() if a],
            *TURNS.values(),
        )

    def max_tokens(self, size: int) -> int:
        per_clause_out = (4 * 2 if self.around else 3) * 3
        return size * (5 + per_clause_out) + 3

    def clause(self, rng) -> tuple[list[str], list[str]]:
        verb = rng.choice(list(VERBS))
        mode = rng.choice(self.modes[1:] if verb == "turn" else self.modes)  # "turn" needs a direction
        words, act = [verb], VERBS[verb]
        unit = [act] if act else []
        if mode:
            side = rng.choice(list(TURNS))
            turn = TURNS[side]
            if mode == "plain":
                words, unit = [verb, side], [turn] + unit
            elif mode == "opposite":
                words, unit = [verb, "opposite", side], [turn, turn] + unit
            else:
                words, unit = [verb, "around", side], ([turn] + unit) * 4
        rep = rng.choice(list(REPEATS))
        if rep:
            words.append(rep)
        return words, unit * REPEATS[rep]

    def instance(self, rng, size):
        words, actions = self.clause(rng)
        for _ in range(size - 1):
            conn = rng.choice(CONNECTIVES)
            w, a = self.clause(rng)
            words += [conn, *w]
            actions = actions + a if conn == "and" else a + actions
        return words, actions
