"""Training documents for the retrieval battery's tasks (data=retrieval_mix):
each one a prompt of the battery's own format with its answer, so that a
model trained from scratch knows the format before it is tested past its
training length. Torch-free, for the corpus layer (rope_lm/data/corpus.py).

An example is what rope_lm/probes/retrieval.py builds in token ids, written as
text: a haystack cut from the base corpus's documents of the same split
(real text, as the battery cuts its haystacks from the evaluation split),
the task's needles inserted after sentence ends in the order of their
depths, the question, the answer and a full stop. The target's depth is
uniform in [0, 1]; the haystack's length uniform in [min_chars, max_chars]
characters (the corpus layer has no tokenizer: the tokenizer is trained on
this very corpus).

Examples go into the train and valid splits, and into test only when there
is no base corpus: the battery cuts its haystacks from the test split by
default, and another example's facts ("Mary went to the garden.") in a
haystack would contradict the prompt's own.
"""

import random

from rope_lm.core.errors import ConfigError
from rope_lm.tasks.passkey_text import _interleave, with_defaults
from rope_lm.tasks.retrieval import RetrievalTask, build_tasks

MIX_DEFAULTS = {
    "base": "stdlib",  # corpus the examples are mixed into: stdlib, none, or a path of text files
    "tasks": ["qa1", "qa2", "cwe", "fwe", "factqa"],  # any of rope_lm.tasks.retrieval.RETRIEVAL_TASKS, in turn
    "examples": 20000,  # examples in the train split, the tasks taking turns
    "needles": 4,  # as scripts/retrieval.py's needles=
    "min_chars": 0,  # haystack characters per example, uniform in [min_chars, max_chars]
    "max_chars": 400,
    "seed": 0,
}
SNAP_CHARS = 200  # how far past its depth a needle may move to follow a sentence end
ENDS = (".", "!", "?", "\n")


def corpus_options(extra: dict) -> dict:
    """data.extra of the retrieval_mix source with its defaults, checked."""
    o = with_defaults(extra, MIX_DEFAULTS, "retrieval_mix")
    tasks = o["tasks"]
    if isinstance(tasks, str) or not isinstance(tasks, (list, tuple)):
        raise ConfigError(f"data.extra.tasks={tasks!r} must be a list of task names, e.g. [qa1,cwe].")
    build_tasks(list(tasks), o["needles"], setting="data.extra.tasks", count_setting="data.extra.needles")
    for k in ("examples", "min_chars", "max_chars"):
        if isinstance(o[k], bool) or not isinstance(o[k], int) or o[k] < 0:
            raise ConfigError(f"data.extra.{k}={o[k]!r} must be a non-negative integer.")
    if o["min_chars"] > o["max_chars"]:
        raise ConfigError(
            f"data.extra.min_chars={o['min_chars']} is larger than data.extra.max_chars={o['max_chars']}."
        )
    return {**o, "tasks": list(tasks)}


def _haystack(rng: random.Random, docs: list[str], chars: int) -> str:
    if not docs or not chars:
        return ""
    doc = docs[rng.randrange(len(docs))]
    start = rng.randrange(max(1, len(doc) - chars + 1))
    return doc[start : start + chars]


def _snap(text: str, at: int, lo: int) -> int:
    """The first place at or after `at` (within SNAP_CHARS) that follows a
    sentence end or a line break, else the next space, never before lo."""
    at = max(at, lo)
    for j in range(at, min(len(text), at + SNAP_CHARS) + 1):
        if j == 0 or text[j - 1] in ENDS:
            return j
    space = text.find(" ", at, at + SNAP_CHARS)
    return at if space < 0 else space


def example_text(rng: random.Random, task: RetrievalTask, docs: list[str], min_chars: int, max_chars: int) -> str:
    inst = task.instance(rng, rng.random())
    hay = _haystack(rng, docs, rng.randint(min_chars, max_chars))
    # The battery's order: by depth, ties in the instance's order.
    order = sorted(range(len(inst.needles)), key=lambda i: (inst.needles[i].depth, i))
    out, cursor = [], 0
    for i in order:
        at = _snap(hay, int(round(inst.needles[i].depth * len(hay))), cursor)
        out += [hay[cursor:at], inst.needles[i].text]
        cursor = at
    out.append(hay[cursor:])
    return ("".join(out) + inst.question + inst.answer + ".").lstrip()


def mix_examples(
    base: dict[str, list[str]], o: dict, valid_fraction: float, test_fraction: float
) -> dict[str, list[str]]:
    """The base corpus's splits with the tasks' examples spread through them
    (valid gets valid_fraction times as many as train; test none unless there
    is no base text); deterministic in o["seed"]. o: corpus_options(...)."""
    tasks = build_tasks(o["tasks"], o["needles"])
    names = list(tasks)
    has_base = any(base[s] for s in base)
    counts = {
        "train": o["examples"],
        "valid": max(1, round(o["examples"] * valid_fraction)),
        "test": 0 if has_base else max(1, round(o["examples"] * test_fraction)),
    }
    out = {}
    for split, n in counts.items():
        rng = random.Random(f"retrieval-mix:{o['seed']}:{split}")
        examples = [
            example_text(rng, tasks[names[i % len(names)]], base[split], o["min_chars"], o["max_chars"])
            for i in range(n)
        ]
        out[split] = _interleave(base[split], examples)
    return out
