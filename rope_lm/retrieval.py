"""A retrieval battery in natural-text haystacks (RULER, Hsieh et al., 2024;
needle-in-a-haystack heatmaps): accuracy by context length x needle depth.

Tasks (each a small class in TASKS):
  passkey     one needle, the passkey sentence of rope_lm.passkey;
  multikey    several "special magic number for <word>" needles, one queried;
  multivalue  one word with several numbers, all asked for in order;
  multiquery  several words, each with its number, all asked for;
  vartrack    a chain VAR A = n, VAR B = A, ...: which variables hold n?
              (a second chain with another value distracts).

A prompt is built in token ids of the model's own tokenizer; with its answer
room (the answer's tokens + 4, at least passkey.ANSWER_ROOM) it has exactly
the requested length, the most any forward pass sees: a haystack cut from the
evaluation split of the checkpoint's corpus (real text, not repeated filler),
the needles inserted at sentence ends near their depth, then the question.
The target needle (the first one the answer needs) sits at `depth` (0: start
of the haystack, 1: its end); the other needles at depths drawn from the
sample's seed. Everything is a function of (seed, task, length, depth, sample
index), so two models see the same prompts when they share a tokenizer.

Scoring: teacher (the default) runs prompt + answer through the model once;
a sample is right when the argmax at every answer token is that token (the
verdict greedy decoding gives on the exact answer tokens). greedy decodes
len(answer) + 4 tokens and parses the values out of the text, so an answer
tokenized differently but reading right counts: more lenient, and slower.
"""

from dataclasses import dataclass
import random
import re
import string

import torch

from rope_lm import bootstrap
from rope_lm import passkey as P
from rope_lm.errors import ConfigError
from rope_lm.tables import markdown_table

SCORING = ("teacher", "greedy")
WORDS = ("apple", "river", "candle", "mountain", "violin", "harbor", "pencil", "garden", "falcon", "marble", "lantern",
         "meadow", "copper", "thunder", "island", "saddle", "orchid", "glacier", "compass", "velvet", "anchor", "meteor",
         "puzzle", "walnut", "blossom", "engine", "feather", "quartz", "tunnel", "whistle")
GREEDY_EXTRA = 4  # decoded tokens past the answer's own length: room for a differently tokenized answer


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


class RetrievalTask:
    pattern = r"\d+"  # what a value looks like in decoded text (greedy scoring)
    max_needles: int | None = None  # None: as many as the prompt length allows

    def __init__(self, needles: int = 4):
        self.n = needles

    def instance(self, rng: random.Random, depth: float) -> Instance:
        raise NotImplementedError

    def parse(self, text: str) -> list[str]:
        return re.findall(self.pattern, text)


class Passkey(RetrievalTask):
    def instance(self, rng, depth):
        key = _number(rng)
        return Instance([Needle(P.KEY_SENTENCE.format(key=key), depth)], P.QUESTION, [key])


def _keyed(rng: random.Random, n: int, depth: float) -> tuple[list[str], list[str], list[Needle]]:
    """n words, a number each, their needles: the first at `depth`, the rest anywhere."""
    words = rng.sample(WORDS, n)
    values = [_number(rng) for _ in words]
    depths = [depth] + _others(rng, n - 1)
    return words, values, [Needle(f" The special magic number for {w} is {v}.", d)
                           for w, v, d in zip(words, values, depths)]


class MultiKey(RetrievalTask):
    max_needles = len(WORDS)  # a distinct word per key
    def instance(self, rng, depth):
        words, values, needles = _keyed(rng, self.n, depth)
        return Instance(needles, f" What is the special magic number for {words[0]}? The special magic number for "
                                 f"{words[0]} is", [values[0]])


class MultiValue(RetrievalTask):
    def instance(self, rng, depth):
        word = rng.choice(WORDS)
        values = [_number(rng) for _ in range(self.n)]
        # The first value at `depth`, the rest after it, so the order of the answer is the order in the text.
        depths = [depth] + sorted(depth + (1 - depth) * x for x in _others(rng, self.n - 1))
        needles = [Needle(f" One of the special magic numbers for {word} is {v}.", d) for v, d in zip(values, depths)]
        return Instance(needles, f" What are all the special magic numbers for {word}? The special magic numbers "
                                 f"for {word} are", values)


class MultiQuery(RetrievalTask):
    max_needles = len(WORDS)
    def instance(self, rng, depth):
        words, values, needles = _keyed(rng, self.n, depth)
        listed = ", ".join(words[:-1]) + f" and {words[-1]}"
        return Instance(needles, f" What are the special magic numbers for {listed}? The special magic numbers for "
                                 f"{listed} are", values)


class VariableTracking(RetrievalTask):
    pattern = r"[A-Z]{5}"

    def instance(self, rng, depth):
        names = ["".join(rng.choices(string.ascii_uppercase, k=5)) for _ in range(2 * self.n)]
        while len(set(names)) < len(names):
            names = ["".join(rng.choices(string.ascii_uppercase, k=5)) for _ in range(2 * self.n)]
        value, other = _number(rng), _number(rng)
        chain, decoy = names[: self.n], names[self.n:]

        def hops(vars_, start_value, first_depth, later):
            texts = [f" VAR {vars_[0]} = {start_value}."] + [f" VAR {b} = {a}." for a, b in zip(vars_, vars_[1:])]
            depths = [first_depth] + sorted(first_depth + (1 - first_depth) * x for x in later)
            return [Needle(t, d) for t, d in zip(texts, depths)]

        needles = hops(chain, value, depth, _others(rng, self.n - 1))
        needles += hops(decoy, other, rng.random() * 0.5, _others(rng, self.n - 1))
        return Instance(needles, f" Find all variables that are assigned the value {value}. Answer: they are", chain)


TASKS = {"passkey": Passkey, "multikey": MultiKey, "multivalue": MultiValue, "multiquery": MultiQuery,
         "vartrack": VariableTracking}


def build_tasks(names: list[str], needles: int) -> dict[str, RetrievalTask]:
    unknown = [n for n in names if n not in TASKS]
    if unknown or not names:
        raise ConfigError(f"tasks={names}: {', '.join(unknown) or 'none given'}; valid tasks are "
                          f"{', '.join(TASKS)}.")
    if isinstance(needles, bool) or not isinstance(needles, int) or needles < 2:
        raise ConfigError(f"needles={needles!r} must be a whole number of at least 2 (keys, values, queries or chain "
                          f"hops).")
    bounded = {n: TASKS[n].max_needles for n in names if TASKS[n].max_needles is not None}
    if bounded and needles > min(bounded.values()):
        over = [n for n, most in bounded.items() if needles > most]
        raise ConfigError(f"needles={needles} is more than {' and '.join(over)} can hold: each of its needles names "
                          f"a different word of {min(bounded.values())}, so needles= must be between 2 and "
                          f"{min(bounded.values())} (the other tasks take any number from 2 that fits the prompt "
                          f"length); lower needles= or leave {' and '.join(over)} out of tasks=.")
    return {n: TASKS[n](needles) for n in names}


# --- prompts in token ids -----------------------------------------------------------

@dataclass
class Prompt:
    ids: list[int]
    answer_ids: list[int]
    values: list[str]
    target_start: int  # token index where the target needle begins
    target_offset: int  # ... and where it went in the haystack, in haystack tokens (of `fill`)
    fill: int  # haystack tokens in the prompt
    question_start: int


def _sentence_ends(tokenizer) -> set[int]:
    """Token ids that end a sentence: a needle goes in right after one."""
    return {i for i in range(tokenizer.get_vocab_size())
            if (tokenizer.decode([i]) or "").rstrip().endswith((".", "!", "?"))}


class Haystacks:
    """Prompts for one tokenizer and one token stream (the evaluation text)."""

    def __init__(self, tokenizer, stream, seed: int = 0, snap: int = 32):
        self.tokenizer, self.stream, self.seed, self.snap = tokenizer, stream, seed, snap
        self.ends = _sentence_ends(tokenizer)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text).ids

    def _snap(self, fill: list[int], at: int, lo: int) -> int:
        """The first position at or after `at` (within `snap` tokens) that
        follows a sentence end, but not before lo (needles keep their order)."""
        for j in range(max(at, lo), min(len(fill), at + self.snap) + 1):
            if j == 0 or fill[j - 1] in self.ends:
                return j
        return max(at, lo)

    def build(self, task: RetrievalTask, name: str, length: int, depth: float, sample: int) -> Prompt:
        if not 0.0 <= depth <= 1.0:
            raise ConfigError(f"Retrieval depth {depth} must be within [0, 1] (0: start of the haystack, 1: its end).")
        rng = random.Random(f"retrieval:{self.seed}:{name}:{length}:{depth}:{sample}")
        inst = task.instance(rng, depth)
        needles = [(self.encode(n.text), n.depth, i == 0) for i, n in enumerate(inst.needles)]
        question, answer = self.encode(inst.question), self.encode(inst.answer)
        # Room for the answer (and greedy's extra tokens), so no forward pass runs past `length`.
        room = max(P.ANSWER_ROOM, len(answer) + GREEDY_EXTRA)
        n_fill = length - room - len(question) - sum(len(ids) for ids, _, _ in needles)
        if n_fill < 0:
            raise ConfigError(f"A {name} prompt of length {length} is too short: its needles, question and answer "
                              f"room alone need {length - n_fill} tokens with this tokenizer. Use longer lengths= or "
                              f"multipliers=, or fewer needles=.")
        if len(self.stream) < n_fill + 1:
            raise ConfigError(f"The evaluation split has {len(self.stream)} tokens, fewer than one {length}-token "
                              f"haystack needs; use a larger corpus (data.*) or shorter lengths.")
        start = rng.randrange(0, len(self.stream) - n_fill + 1)
        fill = [int(t) for t in self.stream[start : start + n_fill]]
        # Needles in the order of their depth; equal depths keep their order in the instance.
        order = sorted(range(len(needles)), key=lambda i: (needles[i][1], i))
        ids, cursor, target_start, target_offset = [], 0, 0, 0
        for i in order:
            n_ids, d, is_target = needles[i]
            at = self._snap(fill, int(round(d * n_fill)), cursor)
            ids += fill[cursor:at]
            if is_target:
                target_start, target_offset = len(ids), at
            ids += n_ids
            cursor = at
        ids += fill[cursor:]
        return Prompt(ids=ids + question, answer_ids=answer, values=inst.values, target_start=target_start,
                      target_offset=target_offset, fill=n_fill, question_start=len(ids))


# --- scoring ------------------------------------------------------------------------

@torch.no_grad()
def teacher_forced(model, prompts: list[Prompt], device) -> list[tuple[bool, float]]:
    """(all answer tokens are the argmax, share that are) per prompt, one
    forward pass. Prompts differ in length (numbers take different numbers of
    tokens), so rows are padded on the right, which a causal model never reads."""
    rows = [p.ids + p.answer_ids for p in prompts]
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [0] * (width - len(r)) for r in rows], device=device)
    logits = model(ids[:, :-1])
    out = []
    for i, p in enumerate(prompts):
        n = len(p.ids)
        pred = logits[i, n - 1 : n - 1 + len(p.answer_ids)].argmax(-1).tolist()
        hits = sum(a == b for a, b in zip(pred, p.answer_ids))
        out.append((hits == len(p.answer_ids), hits / len(p.answer_ids)))
    return out


@torch.no_grad()
def greedy(model, prompts: list[Prompt], task: RetrievalTask, tokenizer, device) -> list[tuple[bool, float]]:
    """(the values parsed from the greedy text are exactly the expected ones,
    share of expected values found at their place). Decoding appends at the
    end of every row, so prompts are batched by length."""
    out = [None] * len(prompts)
    by_length = {}
    for i, p in enumerate(prompts):
        by_length.setdefault(len(p.ids), []).append(i)
    for group in by_length.values():
        ids = torch.tensor([prompts[i].ids for i in group], device=device)
        new = max(len(prompts[i].answer_ids) for i in group) + GREEDY_EXTRA
        gen = P.greedy_decode(model, ids, new).cpu().tolist()
        for i, g in zip(group, gen):
            values = prompts[i].values
            found = task.parse(tokenizer.decode(g))[: len(values)]
            out[i] = (found == values, sum(a == b for a, b in zip(found, values)) / len(values))
    return out


def evaluate(model, tokenizer, stream, tasks: dict[str, RetrievalTask], lengths: list[int], depths: list[float],
             samples: int, seed: int = 0, scoring: str = "teacher", batch_size: int = 8, resamples: int = 1000,
             on_cell=None) -> dict:
    """{task: {lengths, depths, accuracy[length][depth], token_accuracy, by_length: [...] with intervals}}.
    Prompts that could not fit are refused before the first forward pass."""
    if scoring not in SCORING:
        raise ConfigError(f"scoring={scoring!r} must be one of {', '.join(SCORING)}.")
    if samples < 1 or batch_size < 1:
        raise ConfigError(f"samples={samples} and batch_size={batch_size} must be at least 1.")
    model.eval()
    longest = max(lengths)
    model.validate_length(longest)
    hay = Haystacks(tokenizer, stream, seed)
    if len(stream) <= longest:
        raise ConfigError(f"The evaluation split has {len(stream)} tokens, fewer than one {longest}-token haystack "
                          f"needs; use a larger corpus (data.*) or shorter lengths.")
    # A prompt that does not fit fails at the shortest length: build those before the first forward pass,
    # the rest cell by cell (all at once would hold every prompt of every length in memory).
    shortest = {(name, d): [hay.build(task, name, min(lengths), d, i) for i in range(samples)]
                for name, task in tasks.items() for d in depths}
    device = next(model.parameters()).device
    out = {}
    for t_index, (name, task) in enumerate(tasks.items()):
        cells = {}
        for L in lengths:
            for d in depths:
                prompts = (shortest[(name, d)] if L == min(lengths)
                           else [hay.build(task, name, L, d, i) for i in range(samples)])
                verdicts = []
                for s in range(0, samples, batch_size):
                    chunk = prompts[s : s + batch_size]
                    verdicts += (teacher_forced(model, chunk, device) if scoring == "teacher"
                                 else greedy(model, chunk, task, tokenizer, device))
                cells[(L, d)] = verdicts
                if on_cell:
                    on_cell(name, L, d, sum(v[0] for v in verdicts) / len(verdicts))
        by_length = []
        for j, L in enumerate(lengths):
            flat = [float(v[0]) for d in depths for v in cells[(L, d)]]
            lo, hi = bootstrap.mean_interval(flat, resamples, seed, t_index, j)
            by_length.append({"length": L, "accuracy": sum(flat) / len(flat), "accuracy_lo": lo, "accuracy_hi": hi,
                              "n": len(flat)})
        out[name] = {"lengths": list(lengths), "depths": list(depths), "samples": samples,
                     "accuracy": [[_mean([v[0] for v in cells[(L, d)]]) for d in depths] for L in lengths],
                     "token_accuracy": [[_mean([v[1] for v in cells[(L, d)]]) for d in depths] for L in lengths],
                     "by_length": by_length}
    return out


def _mean(xs) -> float:
    return sum(float(x) for x in xs) / len(xs)


def summary_table(results: dict, train_len: int | None = None) -> str:
    """Rows: tasks; columns: lengths; cells: accuracy over all depths [95% interval]."""
    lengths = next(iter(results.values()))["lengths"]
    head = [f"{L}" + (f" ({L / train_len:g}×)" if train_len else "") for L in lengths]
    rows = []
    for name, r in results.items():
        cells = []
        for row in r["by_length"]:
            ci = f" [{row['accuracy_lo']:.0%}, {row['accuracy_hi']:.0%}]" if row["accuracy_lo"] is not None else ""
            cells.append(f"{row['accuracy']:.0%}{ci}")
        rows.append([name, *cells])
    return markdown_table(["task", *head], rows)
