"""Synthetic length-generalization tasks, one module per task, registered by name.

A task is a generator of (prompt, answer) symbol sequences whose size (the
number of digits, items or clauses) is a setting, so a model can be trained on
sizes up to L and tested on sizes up to k x L (rope_lm.probes.task_run).
A task is a Task subclass (base.py) decorated with
``@SYNTHETIC_TASKS.register("name")`` plus a conf/task/<name>.yaml; the
registry lives in base.py with the interface, so a task module imports base.py,
never this package.
"""

from rope_lm.core.errors import ConfigError
from rope_lm.tasks.synthetic.base import SPECIALS, SYNTHETIC_TASKS, Task, Vocabulary


def build_task(options: dict) -> Task:
    options = dict(options)
    name = options.pop("name", None)
    cls = SYNTHETIC_TASKS.get(name)
    try:
        return cls(**options)
    except TypeError as e:
        raise ConfigError(
            f"Task {name!r} got an option it does not take ({e}). Check the `task.*` settings against "
            f"conf/task/{name}.yaml."
        ) from None


__all__ = ["SYNTHETIC_TASKS", "SPECIALS", "Task", "Vocabulary", "build_task"]
