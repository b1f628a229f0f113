"""The retrieval battery's tasks as text: what each task inserts into a
haystack (its needles, at depths), the question and the values the answer
must give. Plain strings and random draws only, so the corpus layer (the
`retrieval_mix` training source, rope_lm/data/retrieval_mix.py) reads the same
tasks without torch; rope_lm/probes/retrieval.py turns them into prompts in token
ids and scores them.

Lookups (the first battery):
  passkey     one needle, the passkey sentence of rope_lm.tasks.passkey_text;
  multikey    several "special magic number for <word>" needles, one queried;
  multivalue  one word with several numbers, all asked for in order;
  multiquery  several words, each with its number, all asked for;
  vartrack    a chain VAR A = n, VAR B = A, ...: which variables hold n?
              (a second chain with another value distracts).

Reasoning over long context, sized for small models:
  qa1         BABILong qa1, one supporting fact: people move between rooms;
              where is X? (X's earlier room and other people's moves distract);
  qa2         BABILong qa2, two supporting facts: X picks up an object and
              then moves; where is the object? (another object, X's room
              before the pick-up and other people's moves distract);
  cwe         RULER's common words extraction: a few words listed three
              times each among words listed once; which are the common ones?
  fwe         RULER's frequent words extraction: coded words listed 4, 3 and
              2 times among codes listed once; the three most frequent?
  factqa      question answering over inserted facts: short facts about
              people (where they live, their job, colour, pet), one asked;
              the same person's other facts and the same relation of other
              people distract.

`needles` sizes every task: keys, values, queries or chain hops for the
lookups, fact sentences for qa1 / qa2 / factqa, words listed once (the
distractors) for cwe / fwe. The target needle (needles[0], the first one the
answer needs) goes at the cell's depth. Needles are placed in the order of
their depths, equal depths in their order here; that order is the story's
order (who moved last), so every task draws depths that keep its facts in
the order its answer assumes.
"""

from dataclasses import dataclass
import random
import re
import string

from rope_lm.core.errors import ConfigError
from rope_lm.tasks.passkey_text import KEY_SENTENCE
from rope_lm.tasks.passkey_text import QUESTION as PASSKEY_QUESTION

WORDS = (
    "apple",
    "river",
    "candle",
    "mountain",
    "violin",
    "harbor",
    "pencil",
    "garden",
    "falcon",
    "marble",
    "lantern",
    "meadow",
    "copper",
    "thunder",
    "island",
    "saddle",
    "orchid",
    "glacier",
    "compass",
    "velvet",
    "anchor",
    "meteor",
    "puzzle",
    "walnut",
    "blossom",
    "engine",
    "feather",
    "quartz",
    "tunnel",
    "whistle",
)
# bAbI's six rooms and four people, and four more people for longer stories.
PEOPLE = ("Mary", "John", "Sandra", "Daniel", "Emma", "Oliver", "Lucas", "Sofia")
LOCATIONS = ("kitchen", "garden", "office", "bathroom", "bedroom", "hallway")
OBJECTS = ("football", "apple", "milk", "book", "key", "ball")
MOVES = ("went to", "moved to", "travelled to", "journeyed to")
TAKES = ("picked up", "grabbed", "took", "got")


@dataclass
class Needle:
    text: str
    depth: float


@dataclass
class Instance:
    needles: list[Needle]
    question: str
    values: list[str]  # what the answer must give, in order

    @property
    def answer(self) -> str:
        return " " + ", ".join(self.values)


def _number(rng: random.Random) -> str:
    return str(rng.randint(10000, 99999))


def _others(rng: random.Random, n: int) -> list[float]:
    return [rng.random() for _ in range(n)]


def _after(rng: random.Random, depth: float, n: int) -> list[float]:
    """n depths in [depth, 1], sorted: needles that come after the target."""
    return sorted(depth + (1 - depth) * x for x in _others(rng, n))


def _one_of(words) -> str:
    return r"\b(?:" + "|".join(sorted(words, key=len, reverse=True)) + r")\b"


class RetrievalTask:
    pattern = r"\d+"  # what a value looks like in decoded text (greedy scoring)
    max_needles: int | None = None  # None: as many as the prompt length allows
    ordered = True  # greedy scoring: the values must come in order (False: any order, RULER's all-words match)

    def __init__(self, needles: int = 4):
        self.n = needles

    def instance(self, rng: random.Random, depth: float) -> Instance:
        raise NotImplementedError

    def parse(self, text: str) -> list[str]:
        return re.findall(self.pattern, text)

    def judge(self, found: list[str], values: list[str]) -> tuple[bool, float]:
        """(all values given, share given) for the values parsed from a greedy answer."""
        if self.ordered:
            found = found[: len(values)]
            return found == values, sum(a == b for a, b in zip(found, values)) / len(values)
        # Order-free: the first len(values) distinct words the answer names, each expected one counted once.
        named = list(dict.fromkeys(found))[: len(values)]
        right = len(set(named) & set(values))
        return right == len(values), right / len(values)


class Passkey(RetrievalTask):
    def instance(self, rng, depth):
        key = _number(rng)
        return Instance([Needle(KEY_SENTENCE.format(key=key), depth)], PASSKEY_QUESTION, [key])


def _keyed(rng: random.Random, n: int, depth: float) -> tuple[list[str], list[str], list[Needle]]:
    """n words, a number each, their needles: the first at `depth`, the rest anywhere."""
    words = rng.sample(WORDS, n)
    values = [_number(rng) for _ in words]
    depths = [depth] + _others(rng, n - 1)
    return (
        words,
        values,
        [Needle(f" The special magic number for {w} is {v}.", d) for w, v, d in zip(words, values, depths)],
    )


class MultiKey(RetrievalTask):
    max_needles = len(WORDS)  # a distinct word per key

    def instance(self, rng, depth):
        words, values, needles = _keyed(rng, self.n, depth)
        return Instance(
            needles,
            f" What is the special magic number for {words[0]}? The special magic number for {words[0]} is",
            [values[0]],
        )


class MultiValue(RetrievalTask):
    def instance(self, rng, depth):
        word = rng.choice(WORDS)
        values = [_number(rng) for _ in range(self.n)]
        # The first value at `depth`, the rest after it, so the order of the answer is the order in the text.
        depths = [depth] + _after(rng, depth, self.n - 1)
        needles = [Needle(f" One of the special magic numbers for {word} is {v}.", d) for v, d in zip(values, depths)]
        return Instance(
            needles,
            f" What are all the special magic numbers for {word}? The special magic numbers for {word} are",
            values,
        )


class MultiQuery(RetrievalTask):
    max_needles = len(WORDS)

    def instance(self, rng, depth):
        words, values, needles = _keyed(rng, self.n, depth)
        listed = ", ".join(words[:-1]) + f" and {words[-1]}"
        return Instance(
            needles,
            f" What are the special magic numbers for {listed}? The special magic numbers for {listed} are",
            values,
        )


class VariableTracking(RetrievalTask):
    pattern = r"[A-Z]{5}"

    def instance(self, rng, depth):
        names = ["".join(rng.choices(string.ascii_uppercase, k=5)) for _ in range(2 * self.n)]
        while len(set(names)) < len(names):
            names = ["".join(rng.choices(string.ascii_uppercase, k=5)) for _ in range(2 * self.n)]
        value, other = _number(rng), _number(rng)
        chain, decoy = names[: self.n], names[self.n :]

        def hops(vars_, start_value, first_depth, later):
            texts = [f" VAR {vars_[0]} = {start_value}."] + [f" VAR {b} = {a}." for a, b in zip(vars_, vars_[1:])]
            depths = [first_depth] + sorted(first_depth + (1 - first_depth) * x for x in later)
            return [Needle(t, d) for t, d in zip(texts, depths)]

        needles = hops(chain, value, depth, _others(rng, self.n - 1))
        needles += hops(decoy, other, rng.random() * 0.5, _others(rng, self.n - 1))
        return Instance(needles, f" Find all variables that are assigned the value {value}. Answer: they are", chain)


# --- BABILong-style fact chains ------------------------------------------------------


def _move(rng: random.Random, who: str, room: str) -> str:
    return f" {who} {rng.choice(MOVES)} the {room}."


def _before(rng: random.Random, depth: float) -> float | None:
    """A depth strictly before the target's, or None at depth 0 (nothing
    comes before the start: a tie would be placed after the target)."""
    return depth * rng.random() if depth > 0 else None


class SingleFact(RetrievalTask):
    """qa1. The supporting fact (the asked person's last move) is the target;
    the same person's earlier move, in another room, comes before it (at
    depth 0 there is no before), other people's moves anywhere, so the last
    move in the text is often someone else's."""

    pattern = _one_of(LOCATIONS)

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


class TwoFacts(RetrievalTask):
    """qa2. The supporting facts: the asked object picked up (the target, at
    depth) and its carrier's move after that (the answer's room). Distractors,
    as many as `needles` allows, in this order: the carrier's room before the
    pick-up, another person picking up another object, that person's move,
    then moves of anyone but the carrier."""

    pattern = _one_of(LOCATIONS)

    def instance(self, rng, depth):
        who, other, *rest = rng.sample(PEOPLE, 2 + min(2, max(0, self.n - 4)))
        thing, decoy = rng.sample(OBJECTS, 2)
        room = rng.choice(LOCATIONS)
        needles = [
            Needle(f" {who} {rng.choice(TAKES)} the {thing}.", depth),
            Needle(_move(rng, who, room), _after(rng, depth, 1)[0]),
        ]
        optional = []
        earlier = _before(rng, depth)
        if earlier is not None:
            optional.append(Needle(_move(rng, who, rng.choice([r for r in LOCATIONS if r != room])), earlier))
        took = rng.random()
        optional.append(Needle(f" {other} {rng.choice(TAKES)} the {decoy}.", took))
        optional.append(
            Needle(_move(rng, other, rng.choice([r for r in LOCATIONS if r != room])), _after(rng, took, 1)[0])
        )
        needles += optional[: self.n - 2]
        while len(needles) < self.n:
            needles.append(Needle(_move(rng, rng.choice([other, *rest]), rng.choice(LOCATIONS)), rng.random()))
        return Instance(needles, f" Where is the {thing}? The {thing} is in the", [room])


# --- RULER-style aggregation ---------------------------------------------------------


def _mentions(
    rng: random.Random, counts: list[tuple[str, int]], depth: float, template: str
) -> tuple[list[Needle], list[str]]:
    """Every word listed `count` times: the first word's first mention at
    `depth` (the target), the others after it in a shuffled order (so that
    at depth 1, where all depths tie, a word's mentions are not side by
    side). Returns the needles and the word each one names."""
    words = [w for w, c in counts for _ in range(c)]
    rest = words[1:]
    rng.shuffle(rest)
    words = words[:1] + rest
    depths = [depth] + [depth + (1 - depth) * x for x in _others(rng, len(rest))]
    return [Needle(template.format(w), d) for w, d in zip(words, depths)], words


def _placed_order(needles: list[Needle]) -> list[int]:
    """The order Haystacks places needles in: by depth, ties in list order."""
    return sorted(range(len(needles)), key=lambda i: (needles[i].depth, i))


class CommonWords(RetrievalTask):
    """cwe. `top` words listed `repeats` times, `needles` words once; the
    answer names the common words in the order of their first mention, so
    teacher forcing has one right answer; greedy scoring takes them in any
    order (RULER's all-words match)."""

    top, repeats = 3, 3
    pattern = _one_of(WORDS)
    max_needles = len(WORDS) - top
    ordered = False
    template = " Word: {}."

    def instance(self, rng, depth):
        words = rng.sample(WORDS, self.top + self.n)
        needles, named = _mentions(
            rng,
            [(w, self.repeats) for w in words[: self.top]] + [(w, 1) for w in words[self.top :]],
            depth,
            self.template,
        )
        common = set(words[: self.top])
        first = list(dict.fromkeys(named[i] for i in _placed_order(needles) if named[i] in common))
        return Instance(
            needles, f" Which {self.top} words are listed most often? In order of first mention, they are", first
        )


class FrequentWords(RetrievalTask):
    """fwe. Coded words (4 random letters) listed 4, 3 and 2 times, and
    `needles` codes once; the answer ranks the three by frequency (greedy
    scoring: in any order, as RULER scores it)."""

    counts = (4, 3, 2)
    pattern = r"\b[a-z]{4}\b"
    ordered = False
    template = " Code: {}."

    def instance(self, rng, depth):
        k = len(self.counts) + self.n
        codes = []
        while len(codes) < k:
            c = "".join(rng.choices(string.ascii_lowercase, k=4))
            if c not in codes:
                codes.append(c)
        ranked = codes[: len(self.counts)]
        needles, _ = _mentions(
            rng, list(zip(ranked, self.counts)) + [(c, 1) for c in codes[len(self.counts) :]], depth, self.template
        )
        return Instance(
            needles,
            f" Which {len(self.counts)} codes are listed most often? From most to least often, they are",
            ranked,
        )


# --- question answering over inserted facts ------------------------------------------

# (fact, question ending where the answer starts, the values a fact can take)
RELATIONS = (
    (
        "{p} lives in {v}.",
        "Where does {p} live? {p} lives in",
        ("Lisbon", "Oslo", "Cairo", "Lima", "Dublin", "Prague", "Quito", "Seoul"),
    ),
    (
        "{p} works as a {v}.",
        "What is {p}'s job? {p} works as a",
        ("baker", "pilot", "nurse", "farmer", "tailor", "painter", "sailor", "dentist"),
    ),
    (
        "{p}'s favourite colour is {v}.",
        "What is {p}'s favourite colour? {p}'s favourite colour is",
        ("red", "blue", "green", "yellow", "purple", "orange", "silver", "brown"),
    ),
    (
        "{p} keeps a {v} as a pet.",
        "What pet does {p} keep? {p} keeps a",
        ("cat", "dog", "parrot", "rabbit", "turtle", "hamster", "goldfish", "pony"),
    ),
)


class FactQA(RetrievalTask):
    """factqa. One fact asked; the distractors alternate between the same
    person's other relations and the same relation of other people (with
    other values), then any other person and relation."""

    pattern = _one_of({v for _, _, values in RELATIONS for v in values})
    max_needles = len(PEOPLE) * len(RELATIONS)

    def instance(self, rng, depth):
        people = rng.sample(PEOPLE, len(PEOPLE))
        rel = rng.randrange(len(RELATIONS))
        fact, question, values = RELATIONS[rel]
        who, value = people[0], rng.choice(values)
        same_person = [(who, r) for r in rng.sample(range(len(RELATIONS)), len(RELATIONS)) if r != rel]
        same_relation = [(p, rel) for p in people[1:]]
        pairs = _alternate(same_person, same_relation)
        rest = [(p, r) for p in people[1:] for r in range(len(RELATIONS)) if r != rel]
        rng.shuffle(rest)
        pairs += rest
        needles = [Needle(" " + fact.format(p=who, v=value), depth)]
        for p, r in pairs[: self.n - 1]:
            options = [v for v in RELATIONS[r][2] if r != rel or v != value]
            needles.append(Needle(" " + RELATIONS[r][0].format(p=p, v=rng.choice(options)), rng.random()))
        return Instance(needles, " " + question.format(p=who), [value])


def _alternate(a: list, b: list) -> list:
    out = []
    for i in range(max(len(a), len(b))):
        out += a[i : i + 1] + b[i : i + 1]
    return out


TASKS = {
    "passkey": Passkey,
    "multikey": MultiKey,
    "multivalue": MultiValue,
    "multiquery": MultiQuery,
    "vartrack": VariableTracking,
    "qa1": SingleFact,
    "qa2": TwoFacts,
    "cwe": CommonWords,
    "fwe": FrequentWords,
    "factqa": FactQA,
}


def build_tasks(
    names: list[str], needles: int, setting: str = "tasks", count_setting: str = "needles"
) -> dict[str, RetrievalTask]:
    unknown = [n for n in names if n not in TASKS]
    if unknown or not names:
        raise ConfigError(
            f"{setting}={names}: {', '.join(unknown) or 'none given'}; valid tasks are {', '.join(TASKS)}."
        )
    if isinstance(needles, bool) or not isinstance(needles, int) or needles < 2:
        raise ConfigError(
            f"{count_setting}={needles!r} must be a whole number of at least 2 (keys, values, queries, "
            f"chain hops, facts, or words listed once)."
        )
    bounded = {n: TASKS[n].max_needles for n in names if TASKS[n].max_needles is not None}
    if bounded and needles > min(bounded.values()):
        over = [n for n, most in bounded.items() if needles > most]
        raise ConfigError(
            f"{count_setting}={needles} is more than {' and '.join(over)} can hold: their needles draw "
            f"distinct words (or people and facts) from a fixed list, so {count_setting}= must be "
            f"between 2 and {min(bounded.values())} (the other tasks take any number from 2 that fits "
            f"the prompt length); lower {count_setting}= or leave {' and '.join(over)} out of "
            f"{setting}=."
        )
    return {n: TASKS[n](needles) for n in names}
