"""Passkey retrieval (Mohtashami & Jaggi, 2023): a 5-digit number hidden at a
chosen depth of repetitive filler text, then a question asking for it.

Evaluation builds prompts in token ids, so a prompt has exactly the requested
length: instructions (optional), filler cut to fill the length, the key
sentence inserted at `depth` (0 = right after the instructions, 1 = right
before the question), and the question. The model greedily decodes a few
tokens; the answer is the first run of digits in the decoded text, correct
only when it equals the key. Everything is a function of (seed, length,
depth, sample index), so reruns and other models see the same prompts.

Training mix (`data=passkey`): the corpus source `passkey` adds text examples
of the same template (with the answer) to a base corpus (rope_lm/tasks/passkey_text.py,
the template's sentences, torch-free for the corpus layer).
"""

from dataclasses import dataclass
import random
import re

import torch

from rope_lm.core.errors import ConfigError
from rope_lm.core.files import save_figure
from rope_lm.data.special_tokens import encode_piece, text_prefix
from rope_lm.infer.generate import generate
from rope_lm.tasks.passkey_text import ANSWER, FILLER, INSTRUCTIONS, KEY_SENTENCE, QUESTION  # noqa: F401  (the template, re-exported)

# Tokens kept free after the prompt for the generated answer: up to 5 digit
# tokens, a space, and room to see whether the model stops after the digits.
ANSWER_ROOM = 8


def make_key(seed: int, *parts) -> str:
    """A 5-digit key determined by the seed and the parts (string seeds hash with SHA-512: stable across runs)."""
    return str(random.Random(f"passkey:{seed}:" + ":".join(map(str, parts))).randint(10000, 99999))


def parse_answer(text: str) -> str | None:
    """The first run of digits in generated text ('71432.' -> '71432'), or None."""
    m = re.search(r"\d+", text)
    return m.group(0) if m else None


@dataclass
class PasskeyPrompt:
    ids: list[int]
    key: str
    answer_ids: list[int]
    length: int  # prompt tokens plus ANSWER_ROOM
    depth: float
    key_start: int  # token index where the key sentence begins


def min_length(tokenizer, instructions: bool = False) -> int:
    key = encode_piece(tokenizer, KEY_SENTENCE.format(key="00000"))
    fixed = (
        len(text_prefix(tokenizer))
        + (len(encode_piece(tokenizer, INSTRUCTIONS)) if instructions else 0)
        + len(key)
        + len(encode_piece(tokenizer, QUESTION))
    )
    return fixed + ANSWER_ROOM


def build_prompt(tokenizer, length: int, depth: float, key: str, instructions: bool = False) -> PasskeyPrompt:
    """A prompt of exactly length - ANSWER_ROOM tokens with the key at `depth`."""
    if not 0.0 <= depth <= 1.0:
        raise ConfigError(f"Passkey depth {depth} must be within [0, 1] (0: start of the filler, 1: its end).")
    head = text_prefix(tokenizer) + (encode_piece(tokenizer, INSTRUCTIONS) if instructions else [])
    key_ids = encode_piece(tokenizer, KEY_SENTENCE.format(key=key))
    question = encode_piece(tokenizer, QUESTION)
    n_fill = length - ANSWER_ROOM - len(head) - len(key_ids) - len(question)
    if n_fill < 0:
        raise ConfigError(
            f"A passkey prompt of length {length} is too short: the template alone needs "
            f"{length - n_fill} tokens with this tokenizer{' and the instructions' if instructions else ''}. "
            f"Use longer lengths{' or leave out the instructions' if instructions else ''}."
        )
    unit = encode_piece(tokenizer, FILLER)
    fill = (unit * (n_fill // len(unit) + 1))[:n_fill]
    before = int(round(depth * n_fill))
    ids = head + fill[:before] + key_ids + fill[before:] + question
    return PasskeyPrompt(
        ids=ids,
        key=key,
        answer_ids=encode_piece(tokenizer, ANSWER.format(key=key)),
        length=length,
        depth=depth,
        key_start=len(head) + before,
    )


def prompts(
    tokenizer, length: int, depth: float, samples: int, seed: int = 0, instructions: bool = False
) -> list[PasskeyPrompt]:
    return [
        build_prompt(tokenizer, length, depth, make_key(seed, length, depth, i), instructions) for i in range(samples)
    ]


def greedy_decode(model, ids: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """(B, new_tokens) greedy continuations of the prompts ids (B, T),
    through rope_lm.infer.generate (the KV cache: the prompt read once, then one
    token a step), planned for T + new_tokens tokens."""
    out = generate(model, [row.tolist() for row in ids], new_tokens, batch_size=max(1, ids.shape[0]))
    return torch.tensor([g.ids for g in out], dtype=ids.dtype, device=ids.device)


@torch.no_grad()
def evaluate_passkey(
    model,
    tokenizer,
    lengths: list[int],
    depths: list[float],
    samples: int = 10,
    seed: int = 0,
    instructions: bool = False,
    batch_size: int = 8,
    on_cell=None,
) -> dict:
    """Accuracy by length x depth. A sample is correct when the first digits
    of its greedy answer equal the key; token_accuracy is the share of the
    answer's tokens that the greedy tokens match position by position."""
    if samples < 1:
        raise ConfigError(f"samples={samples} must be at least 1.")
    model.eval()
    model.validate_length(max(lengths))
    device = next(model.parameters()).device
    cells = []
    for L in lengths:
        for d in depths:
            batch = prompts(tokenizer, L, d, samples, seed, instructions)
            examples = []
            for s in range(0, len(batch), batch_size):
                chunk = batch[s : s + batch_size]
                ids = torch.tensor([p.ids for p in chunk], device=device)
                gen = greedy_decode(model, ids, ANSWER_ROOM).cpu().tolist()
                for p, g in zip(chunk, gen):
                    text = tokenizer.decode(g)
                    answer = parse_answer(text)
                    matched = sum(a == b for a, b in zip(p.answer_ids, g))
                    examples.append(
                        {
                            "key": p.key,
                            "generated": text,
                            "answer": answer,
                            "correct": answer == p.key,
                            "token_accuracy": matched / len(p.answer_ids),
                        }
                    )
            cell = {
                "length": L,
                "depth": d,
                "accuracy": sum(e["correct"] for e in examples) / len(examples),
                "token_accuracy": sum(e["token_accuracy"] for e in examples) / len(examples),
                "examples": examples,
            }
            cells.append(cell)
            if on_cell:
                on_cell(cell)
    return {
        "lengths": list(lengths),
        "depths": list(depths),
        "samples": samples,
        "seed": seed,
        "instructions": instructions,
        "answer_room": ANSWER_ROOM,
        "accuracy": [[_cell(cells, L, d)["accuracy"] for d in depths] for L in lengths],
        "cells": cells,
    }


def _cell(cells, L, d):
    return next(c for c in cells if c["length"] == L and c["depth"] == d)


def plot_passkey(result: dict, path: str, train_len: int | None = None, title: str = ""):
    """Heatmap of accuracy: depth (rows) x length (columns)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    acc = np.asarray(result["accuracy"], dtype=float).T  # depths x lengths
    fig, ax = plt.subplots(
        figsize=(max(5.0, 1.8 + 0.9 * len(result["lengths"])), max(3.2, 1.6 + 0.55 * len(result["depths"])))
    )
    im = ax.imshow(acc, cmap="RdYlGn", vmin=0, vmax=1, aspect="auto")
    ax.set_xticks(range(len(result["lengths"])))
    ax.set_xticklabels([f"{L}" + (f"\n{L / train_len:g}×" if train_len else "") for L in result["lengths"]], fontsize=8)
    ax.set_yticks(range(len(result["depths"])))
    ax.set_yticklabels([f"{d:g}" for d in result["depths"]], fontsize=8)
    ax.set_xlabel("context length (tokens" + (", × L_train" if train_len else "") + ")")
    ax.set_ylabel("key depth (0 = start)")
    for i in range(acc.shape[0]):
        for j in range(acc.shape[1]):
            ax.text(j, i, f"{acc[i, j]:.0%}", ha="center", va="center", fontsize=7)
    if train_len:
        inside = [j for j, L in enumerate(result["lengths"]) if L <= train_len]
        if inside and len(inside) < len(result["lengths"]):
            ax.axvline(max(inside) + 0.5, color="black", linestyle="--", linewidth=1)
    ax.set_title(title or f"Passkey retrieval accuracy ({result['samples']} samples per cell)", fontsize=9, wrap=True)
    fig.colorbar(im, ax=ax, label="accuracy")
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
