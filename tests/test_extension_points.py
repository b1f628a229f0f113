"""Each extension point takes a new module and nothing else (docs/architecture.md):
a throwaway positional scheme, extrapolation method and retrieval task, written
to a temporary folder with their conf/pos and conf/scaling files, are picked up
by the registry-wide tests as they stand and by the command line (train.py,
scripts/retrieval.py) with no other edit.

The modules are put where each registry looks, the package's path (as the
dropped-in module of tests/test_positional.py is), and their configs where
Hydra looks (`hydra.searchpath=[file://...]`; the registry-wide tests read
ROPE_LM_TESTS_CONF the same way). Registries are process-wide, so all of it
runs in child processes started by a launcher written next to the modules:
this process and every other test never see the throwaway names.
"""

import json
import os
import sys
import textwrap

import pytest

from tests import forked
from tests.conftest import ROOT, cli_overrides

SCHEME, METHOD, TASK = "tmp_slope_bias", "tmp_squeeze", "tmp_colour"

SCHEME_MODULE = f'''
"""A learned linear distance penalty per head, -softplus(w_h) * (i - j)."""

import math

import torch
from torch import nn

from rope_lm.core.errors import ConfigError
from rope_lm.positional import SCHEMES
from rope_lm.positional._common import PairwiseBias


@SCHEMES.register("{SCHEME}")
class SlopeBias(PairwiseBias):
    def __init__(self, dims, init_slope: float = 0.5):
        super().__init__(dims)
        if not init_slope > 0:
            raise ConfigError(f"pos.init_slope={{init_slope!r}} must be positive.")
        self.raw = nn.Parameter(torch.full((dims.n_head,), math.log(math.expm1(init_slope))))

    def coefficients(self, layer, ctx):
        return (nn.functional.softplus(self.raw),)

    @staticmethod
    def formula(coefs, h, q_pos, k_pos):
        (slopes,) = coefs
        return -slopes[h] * (q_pos - k_pos).clamp(min=0)
'''

METHOD_MODULE = f'''
"""Positions x 1/s with s = min(cap, max(1, T / L)), for rotary and bias schemes."""

import torch

from rope_lm.core.errors import ConfigError
from rope_lm.scaling.base import METHODS, ScalingMethod


@METHODS.register("{METHOD}")
class Squeeze(ScalingMethod):
    applies_to = frozenset({{"rotary", "bias"}})

    def __init__(self, cap: float = 4.0, **common):
        super().__init__(**common)
        if isinstance(cap, bool) or not isinstance(cap, (int, float)) or cap < 1:
            raise ConfigError(f"scaling.cap={{cap!r}} must be a number >= 1.")
        self.cap = float(cap)

    def scale(self, ctx) -> float:
        return min(self.cap, max(1.0, ctx.seq_len / ctx.train_len))

    def map_positions(self, pos, scheme, ctx):
        s = self.scale(ctx)
        return pos if s == 1.0 else pos.to(torch.float32) / s

    def describe(self, scheme, ctx):
        return {{**super().describe(scheme, ctx), "scale": self.scale(ctx)}}
'''

TASK_MODULE = f'''
"""Doors of numbered rooms painted in colours: which colour is room k's door?"""

from rope_lm.tasks.retrieval.base import RETRIEVAL_TASKS, Instance, Needle, RetrievalTask, one_of, other_depths

COLOURS = ("crimson", "teal", "amber", "indigo", "olive", "coral", "ivory", "maroon")


@RETRIEVAL_TASKS.register("{TASK}")
class DoorColour(RetrievalTask):
    pattern = one_of(COLOURS)
    max_needles = len(COLOURS)

    def instance(self, rng, depth):
        rooms = rng.sample(range(100, 1000), self.n)
        colours = rng.sample(COLOURS, self.n)
        depths = [depth] + other_depths(rng, self.n - 1)
        needles = [Needle(f" The door of room {{r}} is {{c}}.", d) for r, c, d in zip(rooms, colours, depths)]
        return Instance(needles, f" What colour is the door of room {{rooms[0]}}? It is", [colours[0]])
'''

LAUNCHER = '''
"""python with_extensions.py <script.py> args... | -m <module> args...: the command with the
throwaway modules on their packages' paths (EXTENSIONS: {package: folder}), where a registry
that has not looked yet, or looks again, finds them."""

import importlib
import json
import os
import runpy
import sys

for package, folder in json.loads(os.environ["EXTENSIONS"]).items():
    importlib.import_module(package).__path__.append(folder)
from rope_lm.positional import SCHEMES  # noqa: E402
from rope_lm.scaling import METHODS  # noqa: E402
from rope_lm.tasks.retrieval import RETRIEVAL_TASKS  # noqa: E402

for registry in (SCHEMES, METHODS, RETRIEVAL_TASKS):
    registry._loaded = False  # a parent process (the test runner's fork server) may have looked already
if sys.argv[1] == "-m":
    sys.argv = sys.argv[2:]
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
else:
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
'''

FAST = {
    "trainer.max_steps": 4,
    "trainer.val_every_n_steps": 2,
    "trainer.ckpt_every_n_steps": 2,
    "trainer.log_every_n_steps": 1,
}


@pytest.fixture
def extensions(tmp_path):
    """The three modules, their configs and the launcher, in tmp_path; returns
    (launcher, environment, config folder)."""
    folders = {
        "rope_lm.positional": (tmp_path / "positional", SCHEME, SCHEME_MODULE),
        "rope_lm.scaling": (tmp_path / "scaling", METHOD, METHOD_MODULE),
        "rope_lm.tasks.retrieval": (tmp_path / "retrieval", TASK, TASK_MODULE),
    }
    for folder, name, source in folders.values():
        folder.mkdir()
        (folder / f"{name}.py").write_text(textwrap.dedent(source).lstrip())
    conf = tmp_path / "conf"
    (conf / "pos").mkdir(parents=True)
    (conf / "scaling").mkdir()
    (conf / "pos" / f"{SCHEME}.yaml").write_text(f"name: {SCHEME}\ninit_slope: 0.5\n")
    (conf / "scaling" / f"{METHOD}.yaml").write_text(
        f"name: {METHOD}\ncap: 4.0\nlogn: false\nlogn_in_training: false\n"
    )
    launcher = tmp_path / "with_extensions.py"
    launcher.write_text(LAUNCHER.lstrip())
    env = {
        **os.environ,
        "PYTHONPATH": ROOT,
        "EXTENSIONS": json.dumps({p: str(f) for p, (f, _, _) in folders.items()}),
        "ROPE_LM_TESTS_CONF": str(conf),
    }
    return str(launcher), env, conf


def launch(launcher, env, *args, cwd=ROOT, timeout=300):
    done = forked.run(
        [sys.executable, launcher, *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    return done


def test_the_registry_wide_tests_pick_up_a_new_scheme_method_and_task(extensions, tmp_path):
    """The tests as they stand, collected with the throwaway modules registered:
    each new name gets its parametrized cases, and they pass."""
    launcher, env, _ = extensions
    registry_wide = [
        "test_every_bias_scheme_offers_a_score_mod",
        "test_every_method_has_a_config_with_every_knob",
        "test_the_battery_order_is_the_registry_order",
    ]
    done = launch(
        launcher,
        env,
        "-m",
        "pytest",
        "-n",
        "0",
        "-p",
        "no:cacheprovider",
        "-v",
        f"--basetemp={tmp_path / 'pytest'}",
        "-k",
        " or ".join([SCHEME, METHOD, TASK, *registry_wide]),
        "tests/test_attention.py",
        "tests/test_scaling.py",
        "tests/test_retrieval.py",
    )
    passed = [line.split(" ")[0] for line in done.stdout.splitlines() if line.endswith("PASSED") or " PASSED " in line]
    for test in [
        "test_sdpa_and_blocked_paths_match_explicit",
        "test_flex_matches_explicit",
        "test_distance_bias_path_matches_explicit",
        "test_distance_bias_path_at_long_positions",
        "test_grouped_key_value_heads_match_repeated_heads_on_every_path",
    ]:
        assert any(test in p and SCHEME in p for p in passed), (test, done.stdout[-3000:])
    assert any("test_every_method_runs_past_the_training_length_where_it_applies" in p and METHOD in p for p in passed)
    assert any("test_every_registered_task_keeps_the_battery_contract" in p and TASK in p for p in passed)
    assert all(any(t in p for p in passed) for t in registry_wide), done.stdout[-3000:]
    assert " failed" not in done.stdout.splitlines()[-1] and " passed" in done.stdout.splitlines()[-1]


def test_the_command_line_picks_up_a_new_scheme_method_and_task(extensions, tiny_data_options, tmp_path):
    """train.py pos=<new> scaling=<new>, then scripts/retrieval.py tasks=[<new>]
    on that run, with its configs found through hydra.searchpath only."""
    launcher, env, conf = extensions
    searchpath = f"hydra.searchpath=[file://{conf}]"
    run = tmp_path / "run"
    launch(
        launcher,
        env,
        os.path.join(ROOT, "train.py"),
        *cli_overrides(tiny_data_options, run, pos=SCHEME, scaling=METHOD, **FAST),
        searchpath,
    )
    results = json.load(open(run / "results.json"))
    assert results["config"]["pos"] == {"name": SCHEME, "init_slope": 0.5}
    assert results["config"]["scaling"]["name"] == METHOD
    rows = results["results"]
    assert [r["length"] for r in rows] == [16, 32, 64] and all(r["ppl"] > 0 for r in rows)

    out = tmp_path / "battery"
    done = launch(
        launcher,
        env,
        os.path.join(ROOT, "scripts", "retrieval.py"),
        f"ckpt={run}",
        f"tasks=[{TASK},passkey]",
        f"scaling={METHOD}",
        "lengths=[160]",
        "depths=[0.5]",
        "samples=2",
        "needles=2",
        "bootstrap=0",
        f"out={out}",
        searchpath,
    )
    report = json.load(open(out / "retrieval.json"))
    assert list(report["tasks"]) == [TASK, "passkey"] and report["method"] == METHOD
    assert report["tasks"][TASK]["lengths"] == [160]
    assert f"| {TASK} |" in done.stdout


def test_nothing_of_the_throwaway_modules_reaches_this_process():
    from rope_lm.positional import SCHEMES
    from rope_lm.scaling import METHODS
    from rope_lm.tasks.retrieval import task_names

    assert SCHEME not in SCHEMES.names() and METHOD not in METHODS.names() and TASK not in task_names()
    assert not [m for m in sys.modules if m.endswith((SCHEME, METHOD, TASK))]
