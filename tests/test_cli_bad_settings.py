"""Nothing lost, round three (issue 26): settings, inputs and surroundings a
hostile first week tried, driven through the command line as a user meets
them: the exit status, one paragraph and no traceback, the files before and
after."""

import glob
import hashlib
import os
import subprocess
import sys
import textwrap
import time

import pytest
import yaml

from tests import forked
from tests.conftest import ROOT, cli_overrides, write_corpus
from tests.test_lost_work import one_paragraph

FAST = {
    "trainer.max_steps": 4,
    "trainer.val_every_n_steps": 2,
    "trainer.ckpt_every_n_steps": 2,
    "trainer.log_every_n_steps": 1,
}
CLOSED_PORT = "http://127.0.0.1:9"  # the discard port: nothing listens, so no host is ever contacted


def run(script, args, env=None, timeout=300, unset=()):
    environ = {k: v for k, v in os.environ.items() if k not in unset}
    return forked.run(
        [sys.executable, os.path.join(ROOT, script), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**environ, "PYTHONPATH": ROOT, **(env or {})},
    )


def digest(folder) -> dict:
    out = {}
    for path in sorted(glob.glob(os.path.join(folder, "**", "*"), recursive=True)):
        if os.path.isfile(path):
            with open(path, "rb") as f:
                out[os.path.relpath(path, folder)] = hashlib.sha1(f.read()).hexdigest()
    return out


def train_args(options, run_dir, **extra):
    return cli_overrides(options, run_dir, **{**FAST, **extra})


def data_args(options):
    keys = ("name", "path", "vocab_size", "tokenizer_train_chars", "valid_fraction", "test_fraction", "cache_dir")
    return ["data=local_files", *[f"data.{k}={options[k]}" for k in keys]]


# --- item 4: floats that are not finite ----------------------------------------------


@pytest.mark.parametrize(
    "override",
    ["optim.lr=nan", "optim.lr=inf", "optim.beta2=-inf", "trainer.gradient_clip_val=nan", "eval.multipliers=[1,inf]"],
)
def test_a_float_setting_that_is_not_finite_is_refused_before_work(tiny_data_options, tmp_path, override):
    options = {**tiny_data_options, "cache_dir": str(tmp_path / "cache")}
    args = [a for a in train_args(options, tmp_path / "run") if not a.startswith(override.split("=")[0] + "=")]
    message = one_paragraph(run("train.py", [*args, override]), 2)
    key = override.split("=")[0]
    assert f"{key}=" in message and "is not finite" in message and "nan or inf is never a valid setting" in message
    assert not os.path.exists(tmp_path / "cache")  # refused before the cache
    assert not os.path.exists(tmp_path / "run" / "checkpoints")


def test_a_loss_that_diverges_at_once_says_no_checkpoint_was_kept(tiny_data_options, tmp_path):
    message = one_paragraph(
        run(
            "train.py",
            train_args(
                tiny_data_options,
                tmp_path / "run",
                **{
                    "optim.lr": 1e30,
                    "optim.warmup_steps": 0,
                    "trainer.ckpt_every_n_steps": 50,
                    "trainer.val_every_n_steps": 50,
                },
            ),
        ),
        1,
    )
    assert "no checkpoint had been saved yet, so there is nothing to resume" in message
    assert "none saved yet" not in message  # "the last good checkpoint is none saved yet (untouched)"
    assert not glob.glob(str(tmp_path / "run" / "checkpoints" / "*.ckpt"))


# --- item 5: a transformers folder with a broken config.json ----------------------------

LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 300,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32,
}


def _eval_hf(model_dir, tmp_path, tiny_corpus):
    return run(
        "scripts/eval_extrapolation.py",
        [
            f"hf={model_dir}",
            f"out={tmp_path / 'eval'}",
            f"data.path={tiny_corpus}",
            f"data.cache_dir={tmp_path / 'cache'}",
        ],
    )


def test_a_config_json_that_is_not_json_is_named_with_its_position(tiny_corpus, tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"architectures": ["LlamaForCausalLM"],\n "hidden_size": 64,,\n}')
    before = digest(model)
    message = one_paragraph(_eval_hf(model, tmp_path, tiny_corpus), 2)
    assert f"{model / 'config.json'} is not valid JSON" in message and "line 2, column 20" in message
    assert digest(model) == before and not os.path.exists(tmp_path / "eval")


def test_grouped_heads_that_do_not_divide_are_named_as_config_json_names_them(tiny_corpus, tmp_path):
    import json

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({**LLAMA, "num_key_value_heads": 3}))
    message = one_paragraph(_eval_hf(model, tmp_path, tiny_corpus), 2)
    assert "num_key_value_heads=3" in message and "num_attention_heads=4" in message
    assert "model.n_kv_head" not in message and not os.path.exists(tmp_path / "eval")


# --- item 7: files that are not regular files -------------------------------------------


def test_a_fifo_in_the_data_folder_is_skipped_by_name(tiny_data_options, tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    os.mkfifo(os.path.join(corpus, "pipe.txt"))  # reading it would wait for a writer forever
    options = {**tiny_data_options, "path": corpus, "cache_dir": str(tmp_path / "cache")}
    done = run("scripts/prepare_data.py", data_args(options), timeout=120)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert f"{os.path.join(corpus, 'pipe.txt')} (a named pipe)" in done.stderr + done.stdout


@pytest.mark.parametrize("what", ["device", "fifo"])
def test_a_data_path_that_is_not_a_regular_file_is_refused_saying_what_it_is(tiny_data_options, tmp_path, what):
    path = "/dev/zero"
    if what == "fifo":
        path = str(tmp_path / "pipe.txt")
        os.mkfifo(path)
    options = {**tiny_data_options, "path": path, "cache_dir": str(tmp_path / "cache")}
    message = one_paragraph(run("scripts/prepare_data.py", data_args(options), timeout=120), 2)
    assert f"data.path='{path}' is {'a character device' if what == 'device' else 'a named pipe'}" in message
    assert "does not exist" not in message


# --- item 2 (the cache part) and item 9 (the cache build) ----------------------------------


def _read_only(tmp_path, folder, script) -> str:
    """A wrapper that runs `script` with `folder` refusing writes as a
    read-only file system does (EROFS), reads still allowed."""
    wrapper = tmp_path / "read_only.py"
    wrapper.write_text(
        textwrap.dedent(f"""
        import errno, os, runpy, sys
        real_open, folder = os.open, {str(folder)!r}
        def read_only_open(path, flags, *a, **k):
            if os.path.abspath(os.fspath(path)).startswith(folder + os.sep) and flags & (
                    os.O_WRONLY | os.O_RDWR | os.O_CREAT):
                raise OSError(errno.EROFS, "Read-only file system", os.fspath(path))
            return real_open(path, flags, *a, **k)
        os.open = read_only_open
        sys.argv[0] = {os.path.join(ROOT, script)!r}
        runpy.run_path(sys.argv[0], run_name="__main__")
    """)
    )
    return str(wrapper)


def test_a_read_only_cache_dir_is_one_paragraph_naming_it(tiny_data_options, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    options = {**tiny_data_options, "cache_dir": str(cache)}
    message = one_paragraph(run(_read_only(tmp_path, cache, "train.py"), train_args(options, tmp_path / "run")), 1)
    assert f"data.cache_dir='{cache}'" in message and "is not writable (Read-only file system)" in message
    assert os.listdir(cache) == [] and not os.path.exists(tmp_path / "run" / "checkpoints")


def test_a_cache_dir_below_a_file_is_one_paragraph_naming_it(tiny_data_options, tmp_path):
    (tmp_path / "file").write_text("")
    options = {**tiny_data_options, "cache_dir": str(tmp_path / "file" / "cache")}
    message = one_paragraph(run("scripts/prepare_data.py", data_args(options)), 1)
    assert f"data.cache_dir='{tmp_path / 'file' / 'cache'}'" in message and "is not writable" in message


def test_cache_builds_wait_aloud_reuse_read_only_and_clear_a_killed_builds_leftover(tiny_data_options, tmp_path):
    from filelock import FileLock

    cache = tmp_path / "cache"
    args = data_args({**tiny_data_options, "cache_dir": str(cache)})
    assert run("scripts/prepare_data.py", args).returncode == 0
    # A complete cache in a folder that has become read-only is still used.
    done = run(_read_only(tmp_path, cache, "scripts/prepare_data.py"), args)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "its folder is read-only" in done.stderr + done.stdout
    # A build killed before its cleanup left its temp folder; the cache itself is gone.
    (built,) = [d for d in glob.glob(str(cache / "*")) if os.path.isdir(d)]
    os.rename(built, f"{built}.tmp-99999999")
    (lock_path,) = glob.glob(str(cache / "*-source-*.json.lock"))
    log = tmp_path / "second.log"
    with FileLock(lock_path), open(log, "w") as out:  # another process is building
        second = forked.start(
            [sys.executable, os.path.join(ROOT, "scripts/prepare_data.py"), *args],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": ROOT},
        )
        deadline = time.monotonic() + 120
        while "Waiting for another process" not in log.read_text() and time.monotonic() < deadline:
            if second.poll() is not None:
                break
            time.sleep(0.2)
        said = log.read_text()
    assert second.wait(timeout=300) == 0, log.read_text()[-3000:]
    assert "Waiting for another process" in said and lock_path in said
    assert not glob.glob(f"{built}.tmp-*") and os.path.isdir(built)
    assert f"Removing {built}.tmp-99999999" in log.read_text()


# --- item 9: messages that mislead --------------------------------------------------------


@pytest.mark.parametrize("override", ["pos=alibi", "pos.name=alibi"])
def test_resuming_with_another_scheme_says_the_run_keeps_its_own(tiny_config, tmp_path, override):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.yaml").write_text(yaml.safe_dump(tiny_config))
    before = digest(run_dir)
    message = one_paragraph(run("train.py", [f"resume={run_dir}", override]), 2)
    assert "continues a run with the positional scheme it was trained with" in message
    assert "start a new run (python train.py pos=alibi" in message and "must be a mapping" not in message
    assert digest(run_dir) == before


def test_changing_pos_name_alone_says_what_the_scheme_takes(tiny_data_options, tmp_path):
    options = {**tiny_data_options, "cache_dir": str(tmp_path / "cache")}
    message = one_paragraph(run("train.py", [*train_args(options, tmp_path / "run"), "pos.name=alibi"]), 2)
    assert "'alibi' takes no settings besides its name" in message and "settings are ." not in message
    assert "Choose a scheme with pos=alibi" in message
    assert not os.path.exists(tmp_path / "cache")


# --- item 3: wandb without network ----------------------------------------------------------

WANDB_ENV = ("WANDB_MODE", "WANDB_SILENT", "WANDB_API_KEY", "WANDB_BASE_URL")


def _wandb_env(tmp_path, **extra):
    # A home of its own: no ~/.netrc login, no wandb settings from the machine.
    return {"HOME": str(tmp_path / "home"), "WANDB_BASE_URL": CLOSED_PORT, **extra}


def test_wandb_online_without_a_key_is_one_paragraph_before_training(tiny_data_options, tmp_path):
    args = train_args(tiny_data_options, tmp_path / "run", logger="wandb", **{"logger.mode": "online"})
    message = one_paragraph(run("train.py", args, env=_wandb_env(tmp_path), unset=WANDB_ENV, timeout=120), 2)
    assert "logger.mode=online" in message and "logger.mode=offline" in message and "No API key" in message
    assert not os.path.exists(tmp_path / "run" / "checkpoints")


def test_wandb_online_without_network_gives_up_after_init_timeout(tiny_data_options, tmp_path):
    args = train_args(
        tiny_data_options, tmp_path / "run", logger="wandb", **{"logger.mode": "online", "logger.init_timeout": 2}
    )
    env = _wandb_env(tmp_path, WANDB_API_KEY="x" * 40)
    # wandb's own wait is 90 s, asked twice: the old behaviour ran past this timeout.
    message = one_paragraph(run("train.py", args, env=env, unset=WANDB_ENV, timeout=150), 2)
    assert "logger.init_timeout=2 s" in message and "logger.mode=offline" in message
    assert not os.path.exists(tmp_path / "run" / "checkpoints")


def test_wandb_auto_without_network_trains_offline_and_default_runs_print_no_wandb_warnings(
    tiny_data_options, tmp_path
):
    args = train_args(tiny_data_options, tmp_path / "run", logger="wandb", **{"logger.init_timeout": 2})
    done = run("train.py", args, env=_wandb_env(tmp_path, WANDB_API_KEY="x" * 40), unset=WANDB_ENV, timeout=150)
    said = done.stderr + done.stdout
    assert done.returncode == 0 and "Traceback" not in said, done.stderr[-3000:]
    assert "this run logs offline instead" in said and glob.glob(str(tmp_path / "run" / "wandb" / "offline-run-*"))
    assert os.path.exists(tmp_path / "run" / "results.json")
    # Not logged in: offline from the start, as every default run without `wandb login`.
    done = run(
        "train.py",
        train_args(tiny_data_options, tmp_path / "run2", logger="wandb"),
        env=_wandb_env(tmp_path),
        unset=WANDB_ENV,
        timeout=150,
    )
    said = done.stderr + done.stdout
    assert done.returncode == 0, done.stderr[-3000:]
    assert "anonymous setting has no effect" not in said and "environment variables will be ignored" not in said
