"""Comparing two runs' settings: which keys differ, and which keys are
bookkeeping (where files go, how often they are written) rather than part of
the experiment. Used when a study continues a run folder (pipeline, task
runs) and when compare.py groups seed replicas; kept free of torch so that
compare.py stays quick to import."""

import json

# Settings that say where a run's files go, how often it writes them and how
# fast it reads its data, never what it computes: two runs that differ only in
# these are the same experiment (a study finished on another machine, with its
# token cache elsewhere, or one validated more often). Evaluation reads the
# final weights, so validation and checkpoint intervals change no result.
BOOKKEEPING = frozenset(
    {
        "ckpt_path",
        "existing",
        "logger",
        "run_name",
        "data.cache_dir",
        "data.num_workers",
        "data.num_proc",
        "data.memory_mb",
        "data.full_check",
        "trainer.val_every_n_steps",
        "trainer.ckpt_every_n_steps",
        "trainer.ckpt_every_minutes",
        "trainer.log_every_n_steps",
        "trainer.enable_progress_bar",
        "trainer.rendezvous_timeout_s",  # how long a torchrun / srun job's processes wait for one another at start
        # Recomputing activations in backward trades time for memory; the numbers are the same.
        "model.activation_checkpointing",
    }
)

# Options added to a config file after runs were made, at the value that does
# what those runs did: a saved run that lacks the key is the same experiment as
# a config holding this value, so an older study still continues and its seed
# replicas still group (a missing key and None compare equal anyway).
ADDED_AT_DEFAULT = {
    "pos.p_rope": 1.0,  # p-RoPE; 1.0 rotates every frequency, as before
    "scaling.sinks": 0,  # StreamingLLM sink tokens of scaling=window
    "scaling.sink_positions": "cache",  # read only where sinks > 0
    "trainer.context_parallel": 1,  # devices sharing each training sequence; 1, none, as before
    "eval.splits": {},  # a task run's extra test splits (scripts/task.py); none, as before
}

# The same for a task run (scripts/task.py): its log interval and CPU threads
# change how it reports and how fast it runs, not what it learns.
TASK_BOOKKEEPING = frozenset({"existing", "logger", "run_name", "threads", "train.log_every"})


def without(config: dict, keys) -> dict:
    """`config` without the given top-level or dotted keys (a copy)."""
    out = dict(config)
    for key in keys:
        head, _, rest = key.partition(".")
        if not rest:
            out.pop(head, None)
        elif isinstance(out.get(head), dict):
            out[head] = without(out[head], [rest])
    return out


def settings_key(config: dict, ignored=frozenset()) -> str:
    """One string per experiment: equal for two configs exactly when
    settings_differences finds nothing between them. Keys that are None are
    left out, as there a missing key and a None compare equal: an option added
    to the code since an older run (absent there, None now) changes nothing;
    so are keys at their ADDED_AT_DEFAULT value."""

    def drop_none(value, prefix=""):
        if isinstance(value, dict):
            return {
                k: drop_none(v, f"{prefix}{k}.")
                for k, v in value.items()
                if v is not None and not _at_added_default(f"{prefix}{k}", v)
            }
        return value

    return json.dumps(drop_none(without(config, ignored)), sort_keys=True, default=str)


def _at_added_default(key: str, value) -> bool:
    return key in ADDED_AT_DEFAULT and value == ADDED_AT_DEFAULT[key]


def settings_differences(saved: dict, given: dict, ignored=frozenset()) -> list[tuple]:
    """(dotted key, saved value, given value) for every setting that differs,
    outside the `ignored` keys (top-level or dotted); values compared as JSON
    gives them back (tuples as lists), the form a saved run.yaml or results
    file has."""
    given = json.loads(json.dumps(given))
    return _differences(without(saved, ignored), without(given, ignored))


def _differences(a, b, prefix: str = "") -> list[tuple]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(set(a) | set(b), key=str):
            out += _differences(a.get(key), b.get(key), f"{prefix}{key}.")
        return out
    key = prefix.rstrip(".")
    if a == b or (a is None and _at_added_default(key, b)) or (b is None and _at_added_default(key, a)):
        return []
    return [(key, a, b)]
