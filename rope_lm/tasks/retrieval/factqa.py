"""factqa: question answering over inserted facts: short facts about people
(where they live, their job, colour, pet), one asked; the same person's
other facts and the same relation of other people distract."""

from rope_lm.tasks.retrieval.base import PEOPLE, RETRIEVAL_TASKS, Instance, Needle, RetrievalTask, one_of

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


@RETRIEVAL_TASKS.register("factqa")
class FactQA(RetrievalTask):
    """factqa. One fact asked; the distractors alternate between the same
    person's other relations and the same relation of other people (with
    other values), then any other person and relation."""

    battery_order = 100
    pattern = one_of({v for _, _, values in RELATIONS for v in values})
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
