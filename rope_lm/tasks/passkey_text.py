"""The passkey template (Mohtashami & Jaggi, 2023) as text: the sentences a
passkey prompt is made of, and the worked examples the `passkey` corpus
source mixes into a base corpus (data=passkey). Plain strings only, so the
corpus layer reads it without torch; rope_lm/probes/passkey.py builds the
evaluation prompts in token ids from the same sentences."""

import math
import random

from rope_lm.core.errors import ConfigError

INSTRUCTIONS = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
    "I will quiz you about the important information there."
)
FILLER_SENTENCES = [
    " The grass is green.",
    " The sky is blue.",
    " The sun is yellow.",
    " Here we go.",
    " There and back again.",
]
FILLER = "".join(FILLER_SENTENCES)
KEY_SENTENCE = " The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = " What is the pass key? The pass key is"
ANSWER = " {key}"

PASSKEY_DEFAULTS = {
    "base": "stdlib",  # corpus the examples are mixed into: stdlib, none, or a path of text files
    "examples": 20000,  # passkey documents in the train split
    "min_filler": 0,  # filler sentences per example, drawn uniformly from [min_filler, max_filler]
    "max_filler": 20,
    "instructions": False,
    "seed": 0,
}


def with_defaults(extra: dict, defaults: dict, source: str) -> dict:
    """A synthetic source's data.extra over its defaults; an unknown key is
    refused, naming the valid ones."""
    unknown = set(extra) - set(defaults)
    if unknown:
        raise ConfigError(
            f"Unknown {source} data setting(s) {', '.join(sorted('data.extra.' + k for k in unknown))}; "
            f"valid ones are {', '.join('data.extra.' + k for k in defaults)}."
        )
    return {**defaults, **extra}


def corpus_options(extra: dict) -> dict:
    """data.extra of the passkey source with its defaults, checked."""
    o = with_defaults(extra, PASSKEY_DEFAULTS, "passkey")
    for k in ("examples", "min_filler", "max_filler"):
        if isinstance(o[k], bool) or not isinstance(o[k], int) or o[k] < 0:
            raise ConfigError(f"data.extra.{k}={o[k]!r} must be a non-negative integer.")
    if o["min_filler"] > o["max_filler"]:
        raise ConfigError(
            f"data.extra.min_filler={o['min_filler']} is larger than data.extra.max_filler={o['max_filler']}."
        )
    return o


def example_text(rng: random.Random, min_filler: int, max_filler: int, instructions: bool) -> str:
    key = str(rng.randint(10000, 99999))
    n = rng.randint(min_filler, max_filler)
    start = rng.randrange(len(FILLER_SENTENCES))
    filler = [FILLER_SENTENCES[(start + i) % len(FILLER_SENTENCES)] for i in range(n)]
    before = rng.randint(0, n)
    return (
        (INSTRUCTIONS if instructions else "")
        + "".join(filler[:before])
        + KEY_SENTENCE.format(key=key)
        + "".join(filler[before:])
        + QUESTION
        + ANSWER.format(key=key)
        + "."
    ).lstrip()


def _interleave(base: list[str], extra: list[str]) -> list[str]:
    """extra spread evenly through base, so that the tokenizer's training
    sample (the first characters of the train split) sees both."""
    if not base or not extra:
        return base + extra
    out, j = [], 0
    for i, doc in enumerate(base, 1):
        out.append(doc)
        upto = math.floor(i * len(extra) / len(base))
        out += extra[j:upto]
        j = upto
    return out + extra[j:]


def mix_examples(
    base: dict[str, list[str]], o: dict, valid_fraction: float, test_fraction: float
) -> dict[str, list[str]]:
    """The base corpus's splits with passkey examples spread through them
    (valid/test get valid_fraction/test_fraction times as many as train);
    deterministic in o["seed"]. o: corpus_options(...)."""
    counts = {
        "train": o["examples"],
        "valid": max(1, round(o["examples"] * valid_fraction)),
        "test": max(1, round(o["examples"] * test_fraction)),
    }
    out = {}
    for split, n in counts.items():
        rng = random.Random(f"passkey-corpus:{o['seed']}:{split}")
        examples = [example_text(rng, o["min_filler"], o["max_filler"], o["instructions"]) for _ in range(n)]
        out[split] = _interleave(base[split], examples)
    return out
