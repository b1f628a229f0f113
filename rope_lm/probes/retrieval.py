"""A retrieval battery in natural-text haystacks (RULER, Hsieh et al., 2024;
needle-in-a-haystack heatmaps; BABILong, Kuratov et al., 2024): accuracy by
context length x needle depth, and each task's effective length.

The tasks (lookups: passkey, multikey, multivalue, multiquery, vartrack;
reasoning: qa1, qa2, cwe, fwe, factqa) are small registered classes in
rope_lm/tasks/retrieval/ (RETRIEVAL_TASKS), text only, which the
`retrieval_mix` training source shares (rope_lm/data/retrieval_mix.py).

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
verdict greedy decoding gives on the exact answer tokens), so answers of
several values (multivalue, multiquery, vartrack, cwe, fwe) are all or
nothing, in the order the question asks; token_accuracy is the partial
credit (the share of answer tokens right). greedy decodes len(answer) + 4
tokens and parses the values out of the text, so an answer tokenized
differently but reading right counts: more lenient, and slower; cwe and fwe
then take the words in any order (RULER's all-words match), and the partial
credit is the share of expected values given.

Effective length (RULER): the longest length up to which a task's accuracy
stays above a threshold, see effective_length.
"""

from dataclasses import dataclass
import json
import logging
import os
import random

import numpy as np
import torch

from rope_lm.core.errors import ConfigError
from rope_lm.core.tables import markdown_table
from rope_lm.data.special_tokens import encode_piece, text_prefix
from rope_lm.eval import bootstrap
from rope_lm.probes import passkey as P
from rope_lm.probes.effective_length import (  # noqa: F401  (re-exported: R.add_effective, ...)
    THRESHOLD,
    add_effective,
    check_threshold,
    effective_label,
    effective_length,
    threshold_note,
)
from rope_lm.tasks.passkey_text import FILLER
from rope_lm.tasks.retrieval import (  # noqa: F401  (re-exported: R.RETRIEVAL_TASKS, R.build_tasks, ...)
    RETRIEVAL_TASKS,
    WORDS,
    Instance,
    Needle,
    RetrievalTask,
    build_tasks,
    task_names,
)
from rope_lm.tasks.retrieval.babilong import SingleFact, TwoFacts  # noqa: F401  (re-exported: R.TwoFacts, ...)
from rope_lm.tasks.retrieval.factqa import FactQA  # noqa: F401
from rope_lm.tasks.retrieval.multikey import MultiKey  # noqa: F401
from rope_lm.tasks.retrieval.multiquery import MultiQuery  # noqa: F401
from rope_lm.tasks.retrieval.multivalue import MultiValue  # noqa: F401
from rope_lm.tasks.retrieval.passkey import Passkey  # noqa: F401
from rope_lm.tasks.retrieval.vartrack import VariableTracking  # noqa: F401
from rope_lm.tasks.retrieval.word_extraction import CommonWords, FrequentWords  # noqa: F401

log = logging.getLogger("rope_lm")

SCORING = ("teacher", "greedy")
HAYSTACKS = ("corpus", "filler")
GREEDY_EXTRA = 4  # decoded tokens past the answer's own length: room for a differently tokenized answer


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
    return {
        i for i in range(tokenizer.get_vocab_size()) if (tokenizer.decode([i]) or "").rstrip().endswith((".", "!", "?"))
    }


class Haystacks:
    """Prompts for one tokenizer and one token stream (the evaluation text)."""

    def __init__(self, tokenizer, stream, seed: int = 0, snap: int = 32):
        self.tokenizer, self.stream, self.seed, self.snap = tokenizer, stream, seed, snap
        self.ends = _sentence_ends(tokenizer)
        self.prefix = text_prefix(tokenizer)  # a prompt starts as a document does (Gemma's <bos>)

    def encode(self, text: str) -> list[int]:
        return encode_piece(self.tokenizer, text)

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
        n_fill = length - room - len(self.prefix) - len(question) - sum(len(ids) for ids, _, _ in needles)
        if n_fill < 0:
            raise ConfigError(
                f"A {name} prompt of length {length} is too short: its needles, question and answer "
                f"room alone need {length - n_fill} tokens with this tokenizer. Use longer lengths= or "
                f"multipliers=, or fewer needles=."
            )
        if len(self.stream) < n_fill + 1:
            raise ConfigError(
                f"The evaluation split has {len(self.stream)} tokens, fewer than one {length}-token "
                f"haystack needs; use a larger corpus (data.*) or shorter lengths."
            )
        start = rng.randrange(0, len(self.stream) - n_fill + 1)
        fill = [int(t) for t in self.stream[start : start + n_fill]]
        # Needles in the order of their depth; equal depths keep their order in the instance.
        order = sorted(range(len(needles)), key=lambda i: (needles[i][1], i))
        ids, cursor, target_start, target_offset = list(self.prefix), 0, 0, 0
        for i in order:
            n_ids, d, is_target = needles[i]
            at = self._snap(fill, int(round(d * n_fill)), cursor)
            ids += fill[cursor:at]
            if is_target:
                target_start, target_offset = len(ids), at
            ids += n_ids
            cursor = at
        ids += fill[cursor:]
        return Prompt(
            ids=ids + question,
            answer_ids=answer,
            values=inst.values,
            target_start=target_start,
            target_offset=target_offset,
            fill=n_fill,
            question_start=len(ids),
        )


FILLER_TOKENS = 1 << 20  # the filler haystack's size: fixed, so a cell's prompts do not depend on the lengths asked


def filler_stream(tokenizer, n_tokens: int):
    """The passkey papers' haystack (Mohtashami & Jaggi, 2023; Self-Extend's
    and LongLM's passkey test): their five filler sentences repeated, in the
    model's own tokens, FILLER_TOKENS long (more only for a longer n_tokens).
    A model that reads the corpus poorly can still show whether it finds a
    needle past its window."""
    once = np.array(encode_piece(tokenizer, FILLER), dtype=np.int64)
    size = max(FILLER_TOKENS, 1 << int(n_tokens).bit_length())
    return np.resize(once, size)


# --- scoring ------------------------------------------------------------------------


@torch.no_grad()
def teacher_forced(model, prompts: list[Prompt], device) -> list[tuple[bool, float]]:
    """(all answer tokens are the argmax, share that are) per prompt, one
    forward pass. Prompts differ in length (numbers take different numbers of
    tokens), so rows are padded on the right, which a causal model never reads.
    The head projects the answer's rows alone: prompt x vocabulary logits would
    be 137 GB for one 128k prompt of a 262k-token vocabulary (Gemma 3)."""
    rows = [p.ids + p.answer_ids for p in prompts]
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [0] * (width - len(r)) for r in rows], device=device)
    hidden = model.hidden(ids[:, :-1])
    out = []
    for i, p in enumerate(prompts):
        n = len(p.ids)
        pred = model.lm_head(hidden[i, n - 1 : n - 1 + len(p.answer_ids)]).argmax(-1).tolist()
        hits = sum(a == b for a, b in zip(pred, p.answer_ids))
        out.append((hits == len(p.answer_ids), hits / len(p.answer_ids)))
    return out


@torch.no_grad()
def greedy(model, prompts: list[Prompt], task: RetrievalTask, tokenizer, device) -> list[tuple[bool, float]]:
    """(the values parsed from the greedy text are the expected ones, share
    of them given), as the task judges (in order, or any order for cwe and
    fwe). Decoding appends at the
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
            out[i] = task.judge(task.parse(tokenizer.decode(g)), values)
    return out


def evaluate(
    model,
    tokenizer,
    stream,
    tasks: dict[str, RetrievalTask],
    lengths: list[int],
    depths: list[float],
    samples: int,
    seed: int = 0,
    scoring: str = "teacher",
    batch_size: int = 8,
    resamples: int = 1000,
    on_cell=None,
    done: dict | None = None,
) -> dict:
    """{task: {lengths, depths, accuracy[length][depth], token_accuracy, by_length: [...] with intervals}}.
    Prompts that could not fit are refused before the first forward pass.
    on_cell(task, length, depth, verdicts) hears each cell scored here;
    done: {(task, length, depth): verdicts} of cells scored before (a resumed
    run), taken as they are: a cell's prompts depend only on the seed, so a
    cell scored twice gives the same verdicts."""
    done = done or {}
    if scoring not in SCORING:
        raise ConfigError(f"scoring={scoring!r} must be one of {', '.join(SCORING)}.")
    if samples < 1 or batch_size < 1:
        raise ConfigError(f"samples={samples} and batch_size={batch_size} must be at least 1.")
    model.eval()
    longest = max(lengths)
    model.validate_length(longest)
    hay = Haystacks(tokenizer, stream, seed)
    if len(stream) <= longest:
        raise ConfigError(
            f"The evaluation split has {len(stream)} tokens, fewer than one {longest}-token haystack "
            f"needs; use a larger corpus (data.*) or shorter lengths."
        )
    # A prompt that does not fit fails at the shortest length: build those before the first forward pass,
    # the rest cell by cell (all at once would hold every prompt of every length in memory).
    shortest = {
        (name, d): [hay.build(task, name, min(lengths), d, i) for i in range(samples)]
        for name, task in tasks.items()
        for d in depths
    }
    device = next(model.parameters()).device
    out = {}
    for t_index, (name, task) in enumerate(tasks.items()):
        cells = {}
        for L in lengths:
            for d in depths:
                if (name, L, d) in done:
                    cells[(L, d)] = [tuple(v) for v in done[(name, L, d)]]
                    continue
                prompts = (
                    shortest[(name, d)]
                    if L == min(lengths)
                    else [hay.build(task, name, L, d, i) for i in range(samples)]
                )
                verdicts = []
                for s in range(0, samples, batch_size):
                    chunk = prompts[s : s + batch_size]
                    verdicts += (
                        teacher_forced(model, chunk, device)
                        if scoring == "teacher"
                        else greedy(model, chunk, task, tokenizer, device)
                    )
                cells[(L, d)] = verdicts
                if on_cell:
                    on_cell(name, L, d, verdicts)
        by_length = []
        for j, L in enumerate(lengths):
            flat = [float(v[0]) for d in depths for v in cells[(L, d)]]
            lo, hi = bootstrap.mean_interval(flat, resamples, seed, t_index, j)
            by_length.append(
                {"length": L, "accuracy": sum(flat) / len(flat), "accuracy_lo": lo, "accuracy_hi": hi, "n": len(flat)}
            )
        out[name] = {
            "lengths": list(lengths),
            "depths": list(depths),
            "samples": samples,
            "accuracy": [[_mean([v[0] for v in cells[(L, d)]]) for d in depths] for L in lengths],
            "token_accuracy": [[_mean([v[1] for v in cells[(L, d)]]) for d in depths] for L in lengths],
            "by_length": by_length,
        }
    return out


# --- cells as they come (a run can be resumed) ----------------------------------

CELLS = "cells.jsonl"


# The model is checked by content (check_same_model), not with the other settings: the same weights
# may come by another path, and a path may hold other weights than before.
IDENTITY_KEYS = ("model", "checkpoint")


def read_cells(path: str, settings: dict) -> dict:
    """{(task, length, depth): verdicts} of a cells file written under the same
    settings; a file of other settings is refused, naming them. A last line cut
    short (the run was killed mid-write) is cut off the file, with a warning, so
    the next cell starts on a line of its own."""
    if not os.path.exists(path):
        return {}
    repair_cut_line(path)
    with open(path) as f:
        lines = f.read().splitlines()
    head = json.loads(lines[0]) if lines else {}
    theirs = head.get("settings", {})
    keys = (set(settings) | set(theirs)) - set(IDENTITY_KEYS)
    differ = sorted(k for k in keys if settings.get(k) != theirs.get(k))
    if differ:
        raise ConfigError(
            f"{path} holds cells scored with other settings ({', '.join(differ)}: "
            f"{', '.join(f'{k}={theirs.get(k)!r}' for k in differ)}); continue it with the same "
            f"settings, or give a new out= folder."
        )
    done = {}
    for line in lines[1:]:
        c = json.loads(line)
        done[(c["task"], c["length"], c["depth"])] = c["verdicts"]
    return done


def repair_cut_line(path: str) -> None:
    """A file of lines whose last line a kill cut mid-write: cut that line off, naming the file."""
    with open(path, "rb+") as f:
        data = f.read()
        if not data or data.endswith(b"\n"):
            return
        keep = data.rfind(b"\n") + 1
        f.truncate(keep)
    log.warning(
        "%s: its last line was cut by an interrupted write (%d bytes); removed, the cell it held is scored again.",
        path,
        len(data) - keep,
    )


def check_same_model(path: str, identity: dict, source: str) -> None:
    """A continued battery reads the model its cells were scored with: by weights and step
    when the file records them (any path to those weights is accepted), by path for a file
    written before it did."""
    if not os.path.exists(path):
        return
    with open(path) as f:
        theirs = json.loads(f.readline() or "{}").get("settings", {})
    if "model" in theirs:
        if theirs["model"] != identity:
            raise ConfigError(
                f"{path} holds cells scored with another model: weights {theirs['model'].get('weights')} at step "
                f"{theirs['model'].get('step')} (ckpt={theirs.get('checkpoint')}), where ckpt={source} has weights "
                f"{identity.get('weights')} at step {identity.get('step')}. Continue with the checkpoint those "
                f"cells were scored with, or give a new out= folder."
            )
        return
    recorded = theirs.get("checkpoint")
    if recorded is not None and os.path.realpath(str(recorded)) != os.path.realpath(source):
        raise ConfigError(
            f"{path} holds cells scored with ckpt={recorded} (a file written before models were recorded by "
            f"their weights), not ckpt={source}. Continue with that checkpoint, or give a new out= folder."
        )


def append_cell(path: str, settings: dict, task: str, length: int, depth: float, verdicts) -> None:
    """One scored cell, on disk before the next one starts."""
    new = not os.path.exists(path)
    with open(path, "a") as f:
        if new:
            f.write(json.dumps({"settings": settings}) + "\n")
        f.write(
            json.dumps(
                {
                    "task": task,
                    "length": length,
                    "depth": depth,
                    "verdicts": [[bool(ok), float(share)] for ok, share in verdicts],
                }
            )
            + "\n"
        )
        f.flush()
        os.fsync(f.fileno())


def _mean(xs) -> float:
    return sum(float(x) for x in xs) / len(xs)


def summary_table(results: dict, train_len: int | None = None, effective: dict | None = None) -> str:
    """Rows: tasks (and their mean, with `effective`); columns: lengths, then
    the effective length when computed; cells: accuracy over all depths [95% interval]."""
    lengths = next(iter(results.values()))["lengths"]
    head = [f"{L}" + (f" ({L / train_len:g}×)" if train_len else "") for L in lengths]
    with_effective = all("effective" in r for r in results.values())
    rows = []
    for name, r in results.items():
        cells = []
        for row in r["by_length"]:
            ci = f" [{row['accuracy_lo']:.0%}, {row['accuracy_hi']:.0%}]" if row["accuracy_lo"] is not None else ""
            cells.append(f"{row['accuracy']:.0%}{ci}")
        rows.append([name, *cells] + ([effective_label(r["effective"], train_len)] if with_effective else []))
    if effective and with_effective and len(results) > 1:
        rows.append(
            [
                "mean of tasks",
                *(f"{a:.0%}" for a in effective["mean"]["accuracy"]),
                effective_label(effective["mean"], train_len),
            ]
        )
    return markdown_table(["task", *head] + (["effective length"] if with_effective else []), rows)
