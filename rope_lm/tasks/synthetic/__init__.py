"""Synthetic length-generalization tasks, one module per task, registered by name.

A task is a generator of (prompt, answer) symbol sequences whose size (the
number of digits, items or clauses) is a setting, so a model can be trained on
sizes up to L and tested on sizes up to k x L (rope_lm.probes.task_run).
"""

from rope_lm.core.errors import ConfigError
from rope_lm.core.registry import Registry
from rope_lm.tasks.synthetic.base import SPECIALS, Task, Vocabulary

TASKS = Registry("task", __name__, "task.name")


def build_task(options: dict) -> Task:
    options = dict(options)
    name = options.pop("name", None)
    cls = TASKS.get(name)
    try:
        return cls(**options)
    except TypeError as e:
        raise ConfigError(
            f"Task {name!r} got an option it does not take ({e}). Check the `task.*` settings against "
            f"conf/task/{name}.yaml."
        ) from None


__all__ = ["TASKS", "SPECIALS", "Task", "Vocabulary", "build_task"]
