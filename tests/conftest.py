"""Shared fixtures: a tiny corpus, its token cache and a tiny run config.

Everything is CPU-only, offline and small enough that the whole suite runs in
a few minutes on two cores.
"""

import copy
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
# The same for the train.py / script processes the tests start: two test workers on two cores, each
# process one thread (torch and numba read these at start).
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("NUMBA_NUM_THREADS", "1")

import torch  # noqa: E402

# Test tensors are tiny: intra-op threads cost more than they save, and on a
# busy CPU oversubscription costs 100x (measured: 1.3 ms vs 550 ms a step).
torch.set_num_threads(1)

from rope_lm.data.corpus import stdlib_dir  # noqa: E402
from rope_lm.data.split import split_data  # noqa: E402
from rope_lm.data.token_cache import prepare  # noqa: E402

TINY_FILES = [
    "textwrap.py",
    "colorsys.py",
    "bisect.py",
    "heapq.py",
    "keyword.py",
    "shlex.py",
    "fnmatch.py",
    "glob.py",
    "string.py",
    "numbers.py",
    "queue.py",
    "sched.py",
]


def write_corpus(directory, names=TINY_FILES):
    os.makedirs(directory, exist_ok=True)
    for name in names:
        with open(os.path.join(stdlib_dir(), name), encoding="utf-8") as f:
            text = f.read()
        with open(os.path.join(directory, name.replace(".py", ".txt")), "w", encoding="utf-8") as f:
            f.write(text)
    return str(directory)


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory):
    """A directory of a dozen small text files (stdlib modules copied as .txt)."""
    return write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="session")
def tiny_data_options(tiny_corpus, tmp_path_factory):
    return {
        "name": "tiny",
        "source": "files",
        "path": tiny_corpus,
        "seq_len": 16,
        "batch_size": 4,
        "vocab_size": 320,
        "tokenizer_train_chars": 200_000,
        "valid_fraction": 0.2,
        "test_fraction": 0.2,
        "val_tokens": 256,
        "cache_dir": str(tmp_path_factory.mktemp("cache")),
    }


@pytest.fixture(scope="session")
def tiny_cache(tiny_data_options):
    data, source = split_data(tiny_data_options)
    return prepare(data, source)


TINY_MODEL = {
    "name": "test",
    "n_layer": 2,
    "n_head": 2,
    "d_model": 32,
    "mlp_ratio": 2.0,
    "dropout": 0.0,
    "tie_embeddings": True,
    "bias": False,
    "attention": "auto",
}


@pytest.fixture
def tiny_config(tiny_data_options):
    """A complete run config (as train.py builds it) that trains in seconds."""
    return copy.deepcopy(
        {
            "seed": 0,
            "ckpt_path": None,
            "run_name": None,
            "model": TINY_MODEL,
            "pos": {"name": "rope", "base": 10000.0, "rotary_fraction": 1.0, "pairing": "half"},
            "scaling": {"name": "none"},
            "data": tiny_data_options,
            "optim": {
                "lr": 3e-3,
                "min_lr_ratio": 0.1,
                "warmup_steps": 2,
                "weight_decay": 0.1,
                "beta1": 0.9,
                "beta2": 0.95,
                "eps": 1e-8,
            },
            "trainer": {
                "max_steps": 6,
                "val_every_n_steps": 3,
                "ckpt_every_n_steps": 3,
                "log_every_n_steps": 1,
                "enable_progress_bar": False,
                "enable_model_summary": False,
                "accelerator": "cpu",
                "devices": 1,
            },
            "logger": {"name": "none"},
            "eval": {
                "multipliers": [1, 2, 4],
                "token_budget": 256,
                "batch_tokens": 256,
                "position_buckets": 8,
                "sliding_stride": None,
                "split": "test",
            },
        }
    )


def cli_overrides(data_options: dict, run_dir, **extra) -> list[str]:
    """train.py command-line overrides for the tiny corpus and model."""
    args = ["data=local_files"] + [f"data.{k}={v}" for k, v in data_options.items()]
    args += [f"model.{k}={v}" for k, v in TINY_MODEL.items() if k != "name"]
    args += [
        "logger=csv",
        "trainer.enable_progress_bar=false",
        "trainer.accelerator=cpu",
        "trainer.devices=1",
        "eval.multipliers=[1,2,4]",
        "eval.token_budget=256",
        "eval.batch_tokens=256",
        "optim.warmup_steps=2",
        f"hydra.run.dir={run_dir}",
    ]
    return args + [f"{k}={v}" for k, v in extra.items()]
