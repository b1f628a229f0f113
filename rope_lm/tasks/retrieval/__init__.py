"""The retrieval battery's tasks as text, one registered class a task
(RETRIEVAL_TASKS): what each task inserts into a haystack (its needles, at
depths), the question and the values the answer must give. Plain strings and random draws only, so the corpus layer (the
`retrieval_mix` training source, rope_lm/data/retrieval_mix.py) reads the same
tasks without torch; rope_lm/probes/retrieval.py turns them into prompts in token
ids and scores them.

The tasks, in the battery's order (task_names(): each class's
`battery_order`), and the modules that hold them:

Lookups (the first battery; passkey.py, multikey.py, multivalue.py,
multiquery.py, vartrack.py):
  passkey     one needle, the passkey sentence of rope_lm.tasks.passkey_text;
  multikey    several "special magic number for <word>" needles, one queried;
  multivalue  one word with several numbers, all asked for in order;
  multiquery  several words, each with its number, all asked for;
  vartrack    a chain VAR A = n, VAR B = A, ...: which variables hold n?
              (a second chain with another value distracts).

Reasoning over long context, sized for small models (babilong.py: qa1, qa2;
word_extraction.py: cwe, fwe; factqa.py):
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

A new task is one module here (base.py has the interface and the shared
helpers); nothing else names it. The package imports no torch.
"""

from rope_lm.core.errors import ConfigError
from rope_lm.tasks.retrieval.base import RETRIEVAL_TASKS, WORDS, Instance, Needle, RetrievalTask


def task_names() -> list[str]:
    """Every registered task, in the battery's order: by `battery_order`, then name."""
    return sorted(RETRIEVAL_TASKS.names(), key=lambda n: (RETRIEVAL_TASKS.get(n).battery_order, n))


def build_tasks(
    names: list[str], needles: int, setting: str = "tasks", count_setting: str = "needles"
) -> dict[str, RetrievalTask]:
    known = task_names()
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise ConfigError(
            f"{setting}={names}: {', '.join(unknown) or 'none given'}; valid tasks are {', '.join(known)}."
        )
    if isinstance(needles, bool) or not isinstance(needles, int) or needles < 2:
        raise ConfigError(
            f"{count_setting}={needles!r} must be a whole number of at least 2 (keys, values, queries, "
            f"chain hops, facts, or words listed once)."
        )
    classes = {n: RETRIEVAL_TASKS.get(n) for n in names}
    bounded = {n: cls.max_needles for n, cls in classes.items() if cls.max_needles is not None}
    if bounded and needles > min(bounded.values()):
        over = [n for n, most in bounded.items() if needles > most]
        raise ConfigError(
            f"{count_setting}={needles} is more than {' and '.join(over)} can hold: their needles draw "
            f"distinct words (or people and facts) from a fixed list, so {count_setting}= must be "
            f"between 2 and {min(bounded.values())} (the other tasks take any number from 2 that fits "
            f"the prompt length); lower {count_setting}= or leave {' and '.join(over)} out of "
            f"{setting}=."
        )
    return {n: cls(needles) for n, cls in classes.items()}


__all__ = ["RETRIEVAL_TASKS", "WORDS", "Instance", "Needle", "RetrievalTask", "build_tasks", "task_names"]
