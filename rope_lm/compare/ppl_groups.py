"""Perplexity runs into groups: one table and plot per GroupKey (runs of
different keys refused unless group=True), reference runs trained longer
joined to the groups they bound (add_references), and every row named."""

from dataclasses import replace

from rope_lm.compare.labels import distinct_labels, run_name
from rope_lm.compare.ppl_series import Group, Run
from rope_lm.compare.result_files import short_path
from rope_lm.core.errors import ConfigError


def add_references(groups: list[Group], references: list[Run]):
    """Each reference run (trained at another, longer length: the train-long
    upper bound) joins every group of its corpus, split, tokenizer and
    protocol trained shorter, as rows at the group's lengths: PPL as
    evaluated, relative to its own PPL at the group's L_train. A reference
    that joins no group is refused."""
    for ref in references:
        joined = False
        for g in groups:
            k, lengths = g.key, set(g.lengths)
            if (ref.key.fingerprint, ref.key.split, ref.key.tokenizer, ref.key.protocol) != (
                k.fingerprint,
                k.split,
                k.tokenizer,
                k.protocol,
            ) or ref.key.train_len <= k.train_len:
                continue
            copies = [
                replace(
                    s,
                    train_len=k.train_len,
                    trained_at=s.train_len,
                    reference_self=False,
                    reference_ppl=s.ppl(k.train_len),
                    rows={L: r for L, r in s.rows.items() if L in lengths},
                )
                for s in ref.series
                if s.ppl(k.train_len) is not None
            ]
            if copies:
                g.runs.append(Run(path=ref.path, results=ref.results, key=k, series=copies))
                joined = True
        if not joined:
            same_text = [
                g
                for g in groups
                if (ref.key.fingerprint, ref.key.split, ref.key.protocol)
                == (g.key.fingerprint, g.key.split, g.key.protocol)
            ]
            why = (
                f" Its tokenizer ({ref.key.tokenizer}) is not the table's ({same_text[0].key.tokenizer}), so it "
                f"cuts this text into other tokens than the table's models (a BPE trained on another split: 'of' "
                f"names it): train the reference on the table's own split and tokenizer."
                if same_text and same_text[0].key.tokenizer != ref.key.tokenizer
                else ""
            )
            raise ConfigError(
                f"The reference run {short_path(ref.dir)} ({ref.key.describe()}) joins none of the compared tables: a "
                f"reference must share a table's corpus, split, tokenizer and protocol, be trained longer than it, "
                f"and be evaluated at its L_train. The tables: {'; '.join(g.key.describe() for g in groups)}.{why}"
            )


def group_runs(runs: list[Run], group: bool, references: list[Run] = ()) -> list[Group]:
    keys = list(dict.fromkeys(r.key for r in runs))
    if len(keys) > 1 and not group:
        parts = []
        for k in keys:
            members = [short_path(r.dir) for r in runs if r.key == k]
            parts.append(f"[{k.describe()}: {', '.join(members[:4])}{' ...' if len(members) > 4 else ''}]")
        diff = [
            name
            for name, vals in (
                ("corpus/split", {(k.fingerprint, k.split) for k in keys}),
                ("tokenizer", {k.tokenizer for k in keys}),
                ("training length", {k.train_len for k in keys}),
                ("evaluation protocol", {k.protocol for k in keys}),
            )
            if len(vals) > 1
        ]
        raise ConfigError(
            f"These runs differ in {' and '.join(diff)}, so their perplexities are not comparable in one table: "
            f"{' '.join(parts)}. Compare runs of one setting, or pass group=true for one table and plot per setting."
        )
    groups = [Group(k, [r for r in runs if r.key == k]) for k in keys]
    add_references(groups, list(references))
    for g in groups:
        _label(g)
    return groups


def _label(g: Group):
    """scheme ([train: its training-time position method]) (+ method unless
    direct); where two series would share a name, the settings their runs
    differ in, else their folders (rope_lm.compare.labels). A committed row keeps its
    label; a reference row says the length it was trained at."""
    for part in (
        [s for s in g.series if not s.given_label and s.trained_at is None],
        [s for s in g.series if not s.given_label and s.trained_at is not None],
    ):
        entries = [(0, run_name(s.scheme, s.method, s.train_pos), s.flat_config, s.run_dir, s.seed) for s in part]
        for s, label in zip(part, distinct_labels(entries)):
            width = f" ({s.control_width} keys)" if s.control_width else ""
            s.label = label + width + ("" if s.trained_at is None else f" (trained at {s.trained_at})")
    given = {s.given_label for s in g.series if s.given_label}
    for s in g.series:
        if s.given_label:
            s.label = s.given_label
        elif s.label in given:  # a new run beside a committed row of its name (a re-run): its folder tells them apart
            s.label += f" ({short_path(s.run_dir)})"
