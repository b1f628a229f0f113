"""The names compared runs go by, for the perplexity and the task
comparisons alike: scheme (+ method), and where two runs would share a name,
the settings they really differ in, else their folders."""

import json
import os

from rope_lm.runs.run_settings import BOOKKEEPING, TASK_BOOKKEEPING, without

# Seed replicas: runs whose settings are equal once the seed and the bookkeeping
# (rope_lm.runs.run_settings.BOOKKEEPING, TASK_BOOKKEEPING) are left out.
# What an evaluation was asked for besides a row (the other methods it scored, the lengths it covered)
# says nothing about the row: two evaluations of one model under one method are the same series.
EVALUATION_SCOPE = {"methods", "eval.lengths", "eval.multipliers"}
# A continued run's init_from names its own seed's base run (train_long_bound: rope_seed<N>), so seed replicas of
# continued runs differ in it by construction; it is where the weights came from, like ckpt_path, not a setting.
NOT_A_SETTING = BOOKKEEPING | TASK_BOOKKEEPING | EVALUATION_SCOPE | {"seed", "model_identity", "init_from"}
# Where a run's inputs came from (the checkpoint it resumed or evaluated, its weights' checksum
# and step, the tokenizer file an evaluation copied), not what it computed: never a name.
NOT_A_NAME = ("ckpt_path", "model_identity", "init_from", "existing", "data.tokenizer_file")


def run_name(scheme: str, method: str = "none", train_pos: str = "none") -> str:
    """A run's row name before any clash is resolved: scheme, then [train: <its
    training-time position method>], then + <evaluation method> (neither when none)."""
    return (
        scheme
        + ("" if train_pos == "none" else f" [train: {train_pos}]")
        + ("" if method == "none" else f" + {method}")
    )


def flat_settings(config: dict | None) -> dict:
    """A results file's config as dotted keys, without NOT_A_SETTING."""
    return flatten(without(config or {}, NOT_A_SETTING))


def flatten(d, prefix: str = "") -> dict:
    out = {}
    for k, v in (d or {}).items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def differing_keys(flat: list[dict]) -> list[str]:
    """The keys every config has and not all with one value. A key some
    config lacks is no difference: an evaluation's results file has no
    optim.* or trainer.* (it trained nothing), an older run lacks an option
    added since."""
    common = set.intersection(*(set(f) for f in flat)) if flat else set()
    return sorted(
        k
        for k in common
        if not k.startswith(NOT_A_NAME) and len({json.dumps(f[k], sort_keys=True, default=str) for f in flat}) > 1
    )


# The settings a name keeps first when fewer tell the rows apart: what the runs are (scheme, method, training length)
# before how they were trained; the optimiser's settings go first, since a study rarely varies them alone.
KEY_ORDER = (
    "pos.",
    "scaling.",
    "data.seq_len",
    "train_positions.",
    "trainer.max_steps",
    "max_steps",
    "model.",
    "data.",
)


def _key_rank(key: str) -> int:
    return next((r for r, p in enumerate(KEY_ORDER) if key.startswith(p)), len(KEY_ORDER) + key.startswith("optim."))


def fewest_keys(keys: set[str], groups: list[list[dict]]) -> set[str]:
    """Of keys, the ones a name needs: each key in turn, last in KEY_ORDER first, is dropped while every
    group of clashing rows still has as many distinct settings without it. A bound trained at 1,024 with its
    own steps and learning rate beside RoPE and p-RoPE reads "rope (data.seq_len=1024, pos.p_rope=1.0)",
    not every setting in which it differs."""

    def distinct(ks, rows):
        return len({json.dumps([r.get(k) for k in sorted(ks)], sort_keys=True, default=str) for r in rows})

    kept = set(keys)
    for k in sorted(keys, key=lambda k: (-_key_rank(k), k)):
        if all(distinct(kept - {k}, rows) == distinct(kept, rows) for rows in groups):
            kept.discard(k)
    return kept


def distinct_labels(entries: list[tuple]) -> list[str]:
    """entries: (scope, base label, flat settings, folder, seed or None) per row;
    rows of one scope (a table) must not share a name. Every row of a base
    label that clashes somewhere gets the fewest of the settings the clashing
    rows differ in that tell them apart (fewest_keys; so one label reads the
    same in every scope: a budget sweep's train.steps=1000 / 10000); rows
    that still clash get their seeds where those tell them apart (seed
    replicas: "rope (seed=1)"), else their folders (the same settings twice)."""
    labels = [base for _, base, _, _, _ in entries]

    def clashes():
        by = {}
        for i, (scope, *_rest) in enumerate(entries):
            by.setdefault((scope, labels[i]), []).append(i)
        return [idx for idx in by.values() if len(idx) > 1]

    groups, shown = {}, {}
    for idx in clashes():
        groups.setdefault(labels[idx[0]], []).append(idx)
        shown.setdefault(labels[idx[0]], set()).update(differing_keys([entries[i][2] for i in idx]))
    for base, keys in shown.items():
        shown[base] = fewest_keys(keys, [[entries[i][2] for i in idx] for idx in groups[base]])
    for i, (_, _, flat, _, _) in enumerate(entries):
        keys = [k for k in sorted(shown.get(labels[i], ())) if k in flat]
        if keys:
            labels[i] += " (" + ", ".join(f"{k}={flat[k]}" for k in keys) + ")"
    for idx in clashes():
        seeds = [entries[i][4] for i in idx]
        if None not in seeds and len(set(map(str, seeds))) == len(idx):
            for i, seed in zip(idx, seeds):
                labels[i] += f" (seed={seed})"
    for idx in clashes():
        # From the parents: a run and its own evaluation (run/eval/none-pi) are "run" and "run/eval/none-pi".
        root = os.path.commonpath([os.path.dirname(entries[i][3]) for i in idx])
        for i in idx:
            labels[i] += f" ({os.path.relpath(entries[i][3], root)})"
    return labels
