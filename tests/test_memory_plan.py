"""The memory plan (rope_lm/train/memory_plan.py, scripts/plan_memory.py): its
total against the peak measured on this CPU for the same training step (the
sweep is benchmarks/activation_memory.py), the fit in the length against a
direct trace, the longest length that fits (the same whatever length is asked,
"all up to" a model's limit, "none" said as such), every part monotone in the
length, sharding applied, and the refusals train.py makes, in its words."""

import os
import sys
from types import SimpleNamespace

from conftest import ROOT, TINY_MODEL
import pytest

from rope_lm.core.errors import ConfigError
from rope_lm.train.memory_plan import (
    ATTENTION_TOLERANCE,
    FIT_TOLERANCE,
    STEP,
    GiB,
    Planner,
    Setup,
    format_plan,
    length_limit,
    per_device,
    plan,
    setup_of,
    trace_step,
)

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from activation_memory import PLAN_BELOW_PEAK, _in_fresh_process, model_shape, planned  # noqa: E402

from tests import forked

VOCAB = 4096
ROPE = {"name": "rope"}
SMALL = {k: v for k, v in TINY_MODEL.items() if k != "name"}  # 2 layers, 32 wide: a trace takes a blink
PARTS = ("parameters", "gradients", "optimizer state", "activations", "attention workspace", "loss / logits", "total")


@pytest.mark.parametrize("model,seq_len,checkpointing", [("tiny", 1024, False), ("tiny", 1024, True)])
def test_plan_is_within_the_stated_band_below_the_measured_peak(model, seq_len, checkpointing):
    """docs/benchmarks.md states the band (measured with benchmarks/activation_memory.py)."""
    spec = {
        "model": model_shape(model),
        "pos": ROPE,
        "vocab_size": VOCAB,
        "seq_len": seq_len,
        "batch_size": 1,
        "checkpointing": checkpointing,
        "device": "cpu",
        "threads": 1,
    }
    measured = _in_fresh_process(spec)["peak"]
    lo, hi = PLAN_BELOW_PEAK
    assert 1 - hi <= planned(spec) / measured <= 1 - lo, (planned(spec) / 2**20, measured / 2**20)


def planner(batch=4, limit=None, pos=ROPE, setup=None):
    return Planner(SMALL, pos, None, 320, batch, setup or Setup(), limit=limit)


def test_the_fit_equals_a_direct_trace_at_held_out_lengths():
    p = planner()
    for on in (False, True):
        f = p.fit(on)
        assert f is not None and f.error <= FIT_TOLERANCE, f and f.error
        for n in (f.held_out + 3 * STEP, 3 * f.start):  # lengths none of the fit's traces used
            fitted, traced = p.column(n, on), p.direct(n, on)
            for part, tolerance in (
                ("total", FIT_TOLERANCE),
                ("activations", FIT_TOLERANCE),
                ("attention workspace", ATTENTION_TOLERANCE),
            ):
                assert abs(fitted[part] - traced[part]) <= tolerance * traced[part], (on, n, part)


def test_every_part_is_monotone_in_the_length():
    p = planner()
    lengths = [64, 128, 256, 512, 1024, 1040, 2048, 4096, 8192, 65536, 2**20]  # 1024 x 4: the last whole loss
    for on in (False, True):
        columns = [p.column(n, on) for n in lengths]
        for part in PARTS:
            values = [c[part] for c in columns]
            assert values == sorted(values), (on, part, values)


def test_the_longest_length_is_the_same_whatever_length_is_asked():
    answers = set()
    for asked in (64, 1024, 65536):
        p = plan(SMALL, ROPE, None, 320, asked, 4, Setup(), device_gb=0.5)
        answers.add(tuple(str(c["longest seq_len"]) for c in p["columns"].values()))
    assert len(answers) == 1, answers
    (without, with_) = answers.pop()
    assert int(without) < int(with_)


def test_the_longest_length_fits_and_one_step_more_does_not():
    p = planner()
    for budget in (0.05 * GiB, 0.5 * GiB):  # one inside the traced lengths, one answered by the fit
        for on in (False, True):
            n = p.longest(budget, on)
            assert p.direct(n, on)["total"] <= budget < p.direct(n + STEP, on)["total"], (budget, on, n)


def test_a_huge_device_takes_every_length_up_to_the_models_limit():
    learned = {"name": "learned", "max_positions": 2048}
    limit = length_limit(SMALL, learned, None, 320)
    assert limit == 2048
    p = plan(SMALL, learned, None, 320, 128, 4, Setup(), device_gb=1e6, limit=limit)
    assert all(c["longest seq_len"] == ("all", 2048) for c in p["columns"].values())
    text = format_plan(p, 1e6)
    assert "all up to 2048" in text and "every data.seq_len the model takes fits" in text
    assert length_limit(SMALL, ROPE, None, 320) is None
    p = plan(SMALL, ROPE, None, 320, 128, 4, Setup(), device_gb=1e12)
    assert all(c["longest seq_len"] == ("all", None) for c in p["columns"].values())


def test_a_device_too_small_for_any_length_is_said_so():
    p = plan(SMALL, ROPE, None, 320, 128, 4, Setup(), device_gb=1e-6)
    assert all(c["longest seq_len"] is None for c in p["columns"].values())
    text = format_plan(p, 1e-6)
    assert "none fits 1e-06 GiB; not even data.seq_len=64 does" in text
    assert "longest seq_len" in text and "none" in text.split("longest seq_len")[1].splitlines()[0]


def test_checkpointing_keeps_less_and_sharding_divides_the_weights():
    off = trace_step(model_shape("tiny"), ROPE, None, VOCAB, 512, 1, False)
    on = trace_step(model_shape("tiny"), ROPE, None, VOCAB, 512, 1, True)
    assert on.activations < off.activations / 2 and on.peak < off.peak
    one = per_device(off, Setup())
    ddp = per_device(off, Setup(devices=4, strategy="ddp"))
    fsdp = per_device(off, Setup(devices=4, strategy="fsdp"))
    assert one["total"] == off.peak
    assert ddp["total"] == one["total"] + off.grads  # DDP's buckets: a second copy of the gradients
    assert fsdp["optimizer state"] == off.optimizer // 4
    assert fsdp["parameters"] == off.params // 4 + off.root_params + 2 * off.block_params
    assert fsdp["total"] < one["total"] and fsdp["activations"] == one["activations"]


def _train_refusal(config):
    """What train.py says of these trainer settings (rope_lm.runs.pipeline builds its trainer so)."""
    from rope_lm.runs.config import resolve_run
    from rope_lm.train.trainer import build_trainer, trainer_kwargs

    with pytest.raises(ConfigError) as e:
        build_trainer(trainer_kwargs(resolve_run(config).trainer, "/nonexistent/run", None))
    return str(e.value)


@pytest.mark.parametrize("settings", [{"devices": 0}, {"sharded": True, "devices": 1}])
def test_it_refuses_what_train_refuses_in_the_same_words(tiny_config, settings):
    from rope_lm.runs.pipeline import plan_memory

    tiny_config["trainer"].update(settings)
    said = _train_refusal(tiny_config)
    with pytest.raises(ConfigError) as e:
        plan_memory(tiny_config)
    assert str(e.value) == said


def test_the_setup_is_the_built_trainers(tiny_config):
    from rope_lm.runs.config import resolve_run
    from rope_lm.train.trainer import build_trainer, trainer_kwargs

    def setup(**settings):
        config = {**tiny_config, "trainer": {**tiny_config["trainer"], **settings}}
        return setup_of(build_trainer(trainer_kwargs(resolve_run(config).trainer, "/nonexistent/run", None)))

    assert setup() == Setup(1, "single", "32-true")
    assert setup(devices=2, strategy="ddp") == Setup(2, "ddp", "32-true")
    assert setup(devices=2, sharded=True, precision="bf16-mixed") == Setup(2, "fsdp", "bf16-mixed")
    assert setup(devices=2, strategy="ddp_spawn").strategy == "ddp"
    other = SimpleNamespace(num_devices=2, num_nodes=1, strategy=object(), precision="32-true")
    with pytest.raises(ConfigError, match="is not one the memory plan knows"):
        setup_of(other)  # e.g. Lightning's own FSDP on a GPU node (trainer=fsdp is rope-lm's)


def test_the_script_takes_train_overrides(tmp_path):
    done = forked.run(
        [
            sys.executable,
            os.path.join(ROOT, "scripts", "plan_memory.py"),
            "model=tiny",
            "data.seq_len=256",
            "data.batch_size=2",
            "trainer=fsdp",
            "trainer.accelerator=cpu",
            "trainer.devices=2",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    for row in (*PARTS, "2 device(s), fsdp"):
        assert row in done.stdout, row
    assert not os.listdir(tmp_path)  # writes nothing
    bad = forked.run(
        [sys.executable, os.path.join(ROOT, "scripts", "plan_memory.py"), "device_gb=-1"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    assert bad.returncode == 2 and "device_gb=-1 must be a positive number" in bad.stderr


# --- context parallelism (trainer.context_parallel) ----------------------------------------------------------


def test_the_plan_of_a_sequence_split_over_two_ranks_is_within_25_percent_of_their_measured_peak():
    """benchmarks/context_parallel.py measures each of two gloo processes
    training one sequence split between them (FSDP2 on the data x context mesh,
    as ContextParallelStrategy builds it); the plan's total for one of them is
    within 25% of the larger measured peak."""
    from context_parallel import measure
    from context_parallel import planned as planned_split

    spec = {"model": model_shape("tiny"), "pos": "rope", "vocab_size": VOCAB, "seq_len": 1024, "batch_size": 1}
    measured = measure({**spec, "steps": 1, "threads": 1, "device": "cpu"}, 2)["peak"]
    ratio = planned_split(spec, 2) / measured
    assert 0.75 <= ratio <= 1.25, (ratio, measured / 2**20)


def test_a_device_sharing_the_sequence_holds_its_share_of_the_activations_and_the_gathered_keys():
    """Per device, K = 2 keeps half the activations of one process holding the
    sequence (its T/2 tokens) plus what only the split has (every layer's
    gathered keys and values, its queries' masks over all keys), which grows
    with the length; half the loss's logits, the weights' FSDP share of 2, and
    lengths in steps the 2K chunks divide. A model wide enough that the
    per-token activations dominate."""
    wide = {"n_layer": 2, "n_head": 4, "d_model": 256, "mlp_ratio": 4.0}
    extra = []
    for n in (512, 2048):
        alone = Planner(wide, ROPE, None, 320, 1, Setup()).column(n, False)
        split = Planner(wide, ROPE, None, 320, 1, Setup(devices=2, strategy="fsdp", context=2)).column(n, False)
        assert 0.5 < split["activations"] / alone["activations"] < 0.6
        assert split["loss / logits"] == alone["loss / logits"] // 2
        assert split["optimizer state"] == alone["optimizer state"] // 2
        extra.append(split["activations"] - alone["activations"] / 2)
    assert extra[1] > 2 * extra[0]
    assert Setup(devices=6, strategy="fsdp", context=3).step == 192  # 64 and 2K = 6
    longest = planner(batch=1, setup=Setup(devices=6, strategy="fsdp", context=3)).longest(0.25 * GiB, False)
    assert isinstance(longest, int) and longest % 192 == 0


def test_the_setup_of_a_context_parallel_trainer(tiny_config):
    from rope_lm.runs.config import resolve_run
    from rope_lm.train.trainer import build_trainer, trainer_kwargs

    config = {
        **tiny_config,
        "trainer": {**tiny_config["trainer"], "context_parallel": 2, "accelerator": "cpu", "devices": 4},
    }
    trainer = build_trainer(trainer_kwargs(resolve_run(config).trainer, "/nonexistent/run", None))
    assert setup_of(trainer) == Setup(4, "fsdp", "32-true", context=2)
    assert Setup(4, "fsdp", "32-true", context=2).shards == 2
