"""Bad configurations and inputs are refused before any training, with one
paragraph that names the setting and says what would be valid."""

import sys

import pytest

from rope_lm.core.errors import ConfigError
from rope_lm.runs.pipeline import train_and_evaluate
from tests import forked
from tests.conftest import ROOT, cli_overrides


def _set(path, value):
    def apply(cfg, tmp):
        node = cfg
        *parents, last = path.split(".")
        for p in parents:
            node = node[p]
        node[last] = value(tmp) if callable(value) else value

    return apply


def _empty_dir(tmp):
    d = tmp / "empty"
    d.mkdir()
    (d / "blank.txt").write_text("  \n\n")
    return str(d)


def _latin1_dir(tmp):
    d = tmp / "latin1"
    d.mkdir()
    (d / "a.txt").write_bytes("na\xefve caf\xe9\n".encode("latin-1") * 50)
    return str(d)


CASES = {
    "unknown scheme": (_set("pos", {"name": "nosuch"}), r"Unknown positional scheme 'nosuch'.*Valid names are:.*rope"),
    "unknown method": (
        _set("scaling", {"name": "nosuch"}),
        r"Unknown extrapolation method 'nosuch'.*Valid names are:.*none",
    ),
    "method not applicable to scheme": (
        lambda c, t: (c.update(pos={"name": "alibi"}), c.update(scaling={"name": "ntk"})),
        r"'ntk'.*does not apply to positional scheme 'alibi'.*Methods that apply",
    ),
    "odd rotary dimension": (lambda c, t: c["model"].update(d_model=30, n_head=2), r"head_dim=15.*even number"),
    "d_model not divisible by heads": (
        lambda c, t: c["model"].update(d_model=33, n_head=2),
        r"not divisible by model.n_head=2",
    ),
    "zero evaluation length": (_set("eval.multipliers", [0, 1]), r"not positive.*eval.multipliers"),
    "negative evaluation length": (_set("eval.lengths", [-16]), r"not positive"),
    "eval past a learned table without a method": (
        _set("pos", {"name": "learned", "max_positions": 32}),
        r"learned.*32.*(pi|hierarchical)",
    ),
    "hierarchical past n squared positions": (
        lambda c, t: (
            c.update(pos={"name": "learned", "max_positions": 16}),
            c.update(scaling={"name": "hierarchical"}),
            c["eval"].update(lengths=[16, 512]),
        ),
        r"16-row position table to at most 256 positions; 512",
    ),
    "missing data path": (_set("data.path", lambda t: str(t / "missing")), r"data.path=.*does not exist"),
    "empty data": (_set("data.path", _empty_dir), r"empty"),
    "non-UTF-8 text": (_set("data.path", _latin1_dir), r"not valid UTF-8"),
    "vocab smaller than the byte alphabet": (
        _set("data.vocab_size", 100),
        r"vocab_size=100 is too small.*at least 257",
    ),
    "batch larger than the split": (
        _set("data.batch_size", 100_000),
        r"batch_size=100000 is larger than the training split",
    ),
    "eval longer than the test split": (_set("eval.lengths", [1_000_000]), r"test split has \d+ tokens.*1000000"),
    "zero sequence length": (_set("data.seq_len", 0), r"data.seq_len=0 must be a positive integer"),
    "unknown trainer setting": (_set("trainer.max_stpes", 5), r"Unknown trainer setting\(s\) trainer.max_stpes"),
    "unknown model setting": (
        _set("model.n_layers", 5),
        r"Unknown model setting\(s\) model.n_layers; valid `model.\*` settings are .*n_layer",
    ),
    "unknown data setting": (
        _set("data.seqlen", 5),
        r"Unknown data setting\(s\) data.seqlen; valid `data.\*` settings are .*seq_len",
    ),
    "bad RoPE pairing": (_set("pos.pairing", "diagonal"), r"pos.pairing='diagonal'.*half, interleaved"),
    "missing checkpoint to resume": (
        _set("ckpt_path", lambda t: str(t / "nope.ckpt")),
        r"ckpt_path=.*not a checkpoint",
    ),
    "unwritable output directory": (None, r"not writable"),
    # Types and ranges: every one is refused by rope_lm.runs.config.resolve_run before the cache or the model.
    "string for an integer": (
        _set("data.seq_len", "abc"),
        r"data.seq_len='abc' has the wrong type: it must be an integer",
    ),
    "string for a float": (_set("optim.lr", "fast"), r"optim.lr='fast' has the wrong type: it must be a number"),
    "number for a boolean": (
        _set("trainer.compile", 1),
        r"trainer.compile=1 \(int\) has the wrong type: it must be true or false",
    ),
    "fractional integer": (_set("model.n_layer", 2.5), r"model.n_layer=2.5 \(float\) has the wrong type"),
    "zero heads": (lambda c, t: c["model"].update(n_head=0), r"n_head=0"),
    "zero max_steps": (_set("trainer.max_steps", 0), r"trainer.max_steps=0 must be a positive integer"),
    "zero token budget": (_set("eval.token_budget", 0), r"eval.token_budget=0 must be a positive integer"),
    "wrong type for a scheme knob": (
        _set("pos.base", "ten thousand"),
        r"pos.base='ten thousand' has the wrong type: it must be a number",
    ),
    "unknown scheme knob": (_set("pos.bse", 5.0), r"Unknown pos 'rope' setting\(s\) pos.bse"),
    "wrong type for a method knob": (
        _set("scaling", {"name": "yarn", "beta_fast": "x"}),
        r"scaling.beta_fast='x' has the wrong type",
    ),
    "wrong type for a Lightning argument": (
        _set("trainer.gradient_clip_val", "big"),
        r"trainer.gradient_clip_val='big' has the wrong type",
    ),
    "fractions leave no training data": (_set("data.valid_fraction", 0.99), r"leaves nothing to train on"),
    "learning rate zero": (_set("optim.lr", 0), r"lr must be positive"),
    "unknown top-level key": (lambda c, t: c.update(sead=3), r"Unknown top-level setting\(s\) sead"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_refused_before_work(case, tiny_config, tmp_path):
    mutate, pattern = CASES[case]
    out = tmp_path / "run"
    if mutate is None:  # an output path below a regular file can never be created, even by root
        (tmp_path / "file").write_text("")
        out = tmp_path / "file" / "run"
    else:
        mutate(tiny_config, tmp_path)
    with pytest.raises(ConfigError, match=pattern) as err:
        train_and_evaluate(tiny_config, str(out))
    assert "\n" not in str(err.value)  # one paragraph
    assert not (out / "checkpoints").exists()  # refused before any training


def test_resuming_into_a_different_model_is_refused(tiny_config, tmp_path):
    train_and_evaluate(tiny_config, str(tmp_path / "first"))
    tiny_config["ckpt_path"] = str(tmp_path / "first")
    tiny_config["model"]["d_model"] = 48
    with pytest.raises(ConfigError, match=r"Cannot resume .*different model.*d_model.*resume=<run dir>"):
        train_and_evaluate(tiny_config, str(tmp_path / "second"))
    assert not (tmp_path / "second" / "checkpoints").exists()


@pytest.mark.parametrize(
    "override,status,pattern",
    [
        ("pos=nosuch", 1, "Could not find 'pos/nosuch'"),
        ("model.d_model=33", 2, "configuration error: model.d_model=33 is not divisible"),
    ],
)
def test_cli_prints_one_paragraph_and_no_traceback(tiny_data_options, tmp_path, override, status, pattern):
    args = [a for a in cli_overrides(tiny_data_options, tmp_path / "run") if not a.startswith("model.d_model")]
    done = forked.run(
        [sys.executable, "train.py", *args, "trainer.max_steps=2", override], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == status
    assert pattern in " ".join(done.stderr.split())
    assert "Traceback" not in done.stderr + done.stdout
    if override.startswith("pos="):
        assert "Available options in 'pos'" in done.stderr and "rope" in done.stderr
