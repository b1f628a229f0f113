"""Diagnostics: entropy of known attention matrices, the RoPE decay bound,
attention probabilities that reproduce every layer's output, position
similarity, and the scripts end to end on a tiny checkpoint."""

import json
import math
import os
import sys

from omegaconf import OmegaConf
import pytest
import torch

from rope_lm.core.errors import ConfigError
from rope_lm.model.transformer import build_model
from rope_lm.probes import diagnostics as D
from tests import forked
from tests.conftest import ROOT, TINY_MODEL

POS_CONF = os.path.join(ROOT, "conf", "pos")
SCALING_CONF = os.path.join(ROOT, "conf", "scaling")


def conf(directory, name):
    cfg = OmegaConf.to_container(OmegaConf.load(os.path.join(directory, f"{name}.yaml")), resolve=True)
    cfg.pop("defaults", None)
    return cfg


def save_tiny_checkpoint(path, cache, data_options, pos=None, train_len=16, model=None):
    """A checkpoint as training writes it (LitLM hyper-parameters, weights,
    tokenizer), without training: the diagnostics only need a loadable model."""
    import lightning

    from rope_lm.train.lit import LitLM

    torch.manual_seed(0)
    optim = {
        "lr": 1e-3,
        "min_lr_ratio": 0.1,
        "warmup_steps": 1,
        "weight_decay": 0.1,
        "beta1": 0.9,
        "beta2": 0.95,
        "eps": 1e-8,
    }
    lit = LitLM(
        model=model or TINY_MODEL,
        pos=pos or {"name": "rope"},
        scaling={"name": "none"},
        optim=optim,
        vocab_size=cache.vocab_size,
        train_len=train_len,
        max_steps=1,
        corpus=cache.corpus,
        data=data_options,
    )
    with open(os.path.join(cache.dir, "tokenizer.json")) as f:
        tokenizer_json = f.read()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    torch.save(
        {
            "state_dict": lit.state_dict(),
            "hyper_parameters": dict(lit.hparams),
            "pytorch-lightning_version": lightning.__version__,
            "tokenizer_json": tokenizer_json,
        },
        path,
    )
    return path


def run_script(name, *args, status=0, cwd=None):
    """Run scripts/<name> with key=value arguments as a user would; returns
    the finished process after checking its exit status."""
    done = forked.run(
        [sys.executable, os.path.join(ROOT, "scripts", name), *map(str, args)],
        cwd=cwd or ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == status, done.stderr[-3000:]
    return done


def assert_one_paragraph(done, pattern):
    """A user error: one paragraph on stderr, no traceback."""
    err = done.stderr.strip()
    assert pattern in " ".join(err.split()), err
    assert "\n\n" not in err and "Traceback" not in err + done.stdout


# --- entropy ---------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 7, 100])
def test_entropy_of_uniform_is_log_n(n):
    assert float(D.entropy(torch.full((n,), 1.0 / n))) == pytest.approx(math.log(n), abs=1e-6)


def test_entropy_of_one_hot_is_zero_and_causal_rows_are_log_i_plus_1():
    assert float(D.entropy(torch.eye(5)[2])) == 0.0
    T = 6
    causal = torch.tril(torch.ones(T, T))
    causal = causal / causal.sum(-1, keepdim=True)
    assert torch.allclose(D.entropy(causal), torch.log(torch.arange(1, T + 1, dtype=torch.float32)), atol=1e-6)


def test_model_with_flat_attention_has_uniform_entropy():
    torch.manual_seed(0)
    model = build_model(TINY_MODEL, {"name": "nope"}, None, vocab_size=40, train_len=8).eval()
    C = TINY_MODEL["d_model"]
    for block in model.blocks:  # zero query/key projections: every logit 0, attention uniform over the past
        block.attn.qkv.weight.data[: 2 * C] = 0
    result = D.attention_entropy(model, torch.randint(0, 40, (2, 24)), train_len=8, buckets=24)
    ent = torch.tensor(result["entropy"])  # (layers, heads, positions)
    expected = torch.log(torch.arange(1, 25, dtype=torch.float32))
    assert ent.shape == (TINY_MODEL["n_layer"], TINY_MODEL["n_head"], 24)
    assert torch.allclose(ent, expected.expand_as(ent), atol=1e-5)
    layer = result["layers"][0]
    assert layer["mean_within"] == pytest.approx(float(expected[:8].mean()), abs=1e-5)
    assert layer["mean_beyond"] == pytest.approx(float(expected[8:].mean()), abs=1e-5)
    assert layer["normalized_beyond"] == pytest.approx(1.0, abs=1e-5)


# --- attention probabilities reproduce the model ---------------------------------------


def _check_reproduces(model, T=24):
    idx = torch.randint(0, model.cfg.vocab_size, (2, T))
    actual, mine = {}, {}
    hooks = [
        b.attn.register_forward_hook(lambda m, a, o: actual.__setitem__(m.layer, o.detach())) for b in model.blocks
    ]

    def collect(layer, probs, out):
        mine[layer] = (probs, out)

    try:
        with torch.no_grad(), D.on_attention(model, collect):
            model(idx)
    finally:
        for h in hooks:
            h.remove()
    assert sorted(mine) == list(range(model.cfg.n_layer))
    future = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    for layer, (probs, out) in mine.items():
        assert probs.shape == (2, model.cfg.n_head, T, T)
        assert torch.allclose(probs.sum(-1), torch.ones(()), atol=1e-5)
        assert float(probs[..., future].abs().max()) == 0.0
        assert torch.allclose(out, actual[layer], atol=2e-5, rtol=1e-4), f"layer {layer}"


SCHEMES = sorted(f[:-5] for f in os.listdir(POS_CONF) if f.endswith(".yaml"))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_probabilities_reproduce_attention_output(scheme):
    torch.manual_seed(0)
    model = build_model(TINY_MODEL, conf(POS_CONF, scheme), None, vocab_size=40, train_len=8).eval()
    with torch.no_grad():  # learned biases start at zero; perturb them so every term matters
        for p in model.pos_scheme.parameters():
            p.add_(0.1 * torch.randn_like(p))
    _check_reproduces(model)


@pytest.mark.parametrize("scheme", ["rope", "alibi", "shaw"])
def test_probabilities_reproduce_attention_output_with_grouped_query_heads(scheme):
    torch.manual_seed(0)
    llama_shaped = {**TINY_MODEL, "n_head": 4, "n_kv_head": 2, "d_model": 32, "mlp": "swiglu"}
    model = build_model(llama_shaped, conf(POS_CONF, scheme), None, vocab_size=40, train_len=8).eval()
    _check_reproduces(model)


# Methods that change attention itself: a second rotary pass, a window, a logit scale.
PLANS = [("rope", m) for m in ("rerope", "leaky_rerope", "self_extend", "window", "logn", "yarn")] + [
    ("alibi", "window"),
    ("t5", "logn"),
]


@pytest.mark.parametrize("scheme, method", PLANS)
def test_probabilities_reproduce_attention_under_methods(scheme, method):
    if not os.path.exists(os.path.join(SCALING_CONF, f"{method}.yaml")):
        pytest.skip(f"conf/scaling/{method}.yaml not present")
    torch.manual_seed(0)
    options = conf(SCALING_CONF, method)  # auto windows are train_len // 2 or train_len: they act within 24 tokens
    model = build_model(TINY_MODEL, conf(POS_CONF, scheme), options, vocab_size=40, train_len=8).eval()
    _check_reproduces(model)


# --- RoPE decay -----------------------------------------------------------------------


@pytest.mark.parametrize("d", [2, 8, 64, 128])
def test_decay_bound_at_distance_zero(d):
    # S_j = j at m = 0, so the bound is (1/(d/2)) sum_{j=1}^{d/2} j = (d/2 + 1) / 2
    assert float(D.rope_decay_bound(D.rope_inv_freq(d, 10000.0), [0])[0]) == pytest.approx((d / 2 + 1) / 2)


def test_decay_bound_by_hand():
    assert torch.allclose(
        D.rope_decay_bound(D.rope_inv_freq(2, 10000.0), torch.arange(50)), torch.ones(50, dtype=torch.float64)
    )
    theta = D.rope_inv_freq(4, 100.0)  # [1, 0.1]
    m = torch.tensor([1.0, 3.0, 10.0], dtype=torch.float64)
    expected = (1 + 2 * torch.cos(m * (theta[0] - theta[1]) / 2).abs()) / 2  # |S_1| = 1, |S_2| = 2|cos(m(θ0-θ1)/2)|
    assert torch.allclose(D.rope_decay_bound(theta, m), expected)
    far = D.rope_decay_bound(D.rope_inv_freq(64, 10000.0), torch.arange(0, 4097))
    assert float(far[1000:].max()) < 0.5 * float(far[0])  # it decays
    with pytest.raises(ConfigError, match="even"):
        D.rope_inv_freq(7, 10000.0)


# --- position similarity ----------------------------------------------------------------


def test_sinusoidal_table_and_similarity():
    table = D.sinusoidal_table(32, 8, 10000.0)
    assert float(table[1, 0]) == pytest.approx(math.sin(1.0)) and float(table[1, 1]) == pytest.approx(math.cos(1.0))
    assert float(table[3, 2]) == pytest.approx(math.sin(3 / 10000 ** (2 / 8)))
    sim = D.cosine_similarity_matrix(table)
    assert torch.allclose(torch.diagonal(sim), torch.ones(32, dtype=torch.float64))
    assert torch.allclose(sim, sim.T)
    # the sinusoidal similarity depends on the offset only
    assert float(sim[0, 5]) == pytest.approx(float(sim[10, 15]))
    assert D.similarity_by_offset(sim)[5] == pytest.approx(float(sim[0, 5]))


def test_checkpoint_position_table():
    torch.manual_seed(0)
    model = build_model(TINY_MODEL, conf(POS_CONF, "learned"), None, vocab_size=40, train_len=8)
    table = D.checkpoint_position_table(model, 12)
    rows = [p for p in model.pos_scheme.parameters() if p.dim() == 2]
    assert len(rows) == 1 and torch.allclose(table, rows[0][:12].double())
    rope = build_model(TINY_MODEL, {"name": "rope"}, None, vocab_size=40, train_len=8)
    with pytest.raises(ConfigError, match="no position vectors"):
        D.checkpoint_position_table(rope, 12)


# --- scripts on a checkpoint --------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_ckpt(tiny_cache, tiny_data_options, tmp_path_factory):
    run = tmp_path_factory.mktemp("run")
    save_tiny_checkpoint(str(run / "checkpoints" / "last.ckpt"), tiny_cache, tiny_data_options)
    return str(run)


def test_attention_entropy_script(tiny_ckpt, tmp_path):
    run_script("attention_entropy.py", f"ckpt={tiny_ckpt}", "length=48", "windows=2", "buckets=8", f"out={tmp_path}")
    result = json.load(open(tmp_path / "attention_entropy.json"))
    assert result["length"] == 48 and result["train_len"] == 16 and len(result["entropy"][0][0]) == 8
    assert all(layer["mean_beyond"] > layer["mean_within"] for layer in result["layers"])  # more keys past L_train
    assert (tmp_path / "attention_entropy.png").stat().st_size > 0


def test_rope_decay_and_similarity_scripts(tiny_ckpt, tmp_path):
    run_script(
        "rope_decay.py",
        "bases=[10000]",
        "head_dims=[16]",
        "max_distance=64",
        f"ckpt={tiny_ckpt}",
        "scaling=yarn",
        "scaling.factor=4",
        "length=64",
        f"out={tmp_path / 'decay'}",
        cwd=tmp_path,
    )
    decay = json.load(open(tmp_path / "decay" / "rope_decay.json"))
    assert decay["curves"][0]["bound_at_0"] == 4.5  # head dim 16: (d/2 + 1) / 2
    assert "yarn" in decay["curves"][1]["label"] and decay["curves"][1]["attention_factor"] > 1  # the method applied
    run_script("pos_similarity.py", "positions=40", "dim=16", f"out={tmp_path / 'sim'}", cwd=tmp_path)
    sim = json.load(open(tmp_path / "sim" / "pos_similarity.json"))
    assert sim["positions"] == 40 and sim["sinusoidal"]["by_offset"][0] == pytest.approx(1.0)
    assert (tmp_path / "sim" / "pos_similarity.png").stat().st_size > 0
    assert sorted(os.listdir(tmp_path)) == ["decay", "sim"]  # no Hydra output folders


def test_open_model_is_the_one_door(tiny_ckpt, tmp_path):
    """rope_lm.runs.trained: a run folder opens its last.ckpt, in eval mode, under another method on
    request; read_start gives the same checkpoint's parts without a model; a bad source names the setting."""
    from rope_lm.runs.trained import open_model, read_start

    t = open_model(tiny_ckpt, "cpu", {"name": "yarn", "factor": 2.0})
    ckpt = os.path.join(tiny_ckpt, "checkpoints", "last.ckpt")
    assert (t.source, t.path, t.train_len) == (tiny_ckpt, os.path.abspath(ckpt), 16)
    assert t.model.scaling.name == "yarn" and not t.model.training and t.tokenizer().get_vocab_size() > 0
    start = read_start(tiny_ckpt)
    assert start["path"] == ckpt and start["tokenizer_json"] == t.tokenizer_json
    assert set(start["state_dict"]) == set(t.lit.state_dict()) and start["hyper_parameters"]["train_len"] == 16
    with pytest.raises(ConfigError, match="init_from= is required"):
        read_start("", "init_from")
    with pytest.raises(ConfigError, match="names no model"):
        open_model("hf:", "cpu")
    with pytest.raises(ConfigError, match="resume=.*is not a checkpoint file"):
        open_model(str(tmp_path / "nothing"), "cpu", setting="resume")


def test_default_out_dir_is_inside_the_run_and_never_reused(tiny_ckpt):
    ckpt = os.path.join(tiny_ckpt, "checkpoints", "last.ckpt")
    first = D.default_out_dir(ckpt, "probe")
    assert first == os.path.join(tiny_ckpt, "diagnostics", "probe")
    os.makedirs(first)
    try:
        assert D.default_out_dir(ckpt, "probe") == first + "-2"  # rope_lm.core.files.fresh_dir, the one numbering style
    finally:
        os.rmdir(first)


@pytest.mark.parametrize(
    "script",
    [
        "attention_entropy.py",
        "passkey.py",
        "pos_similarity.py",
        "rope_decay.py",
        "eval_extrapolation.py",
        "compare.py",
        "study_rope_scaling.py",
        "study_finetune_extension.py",
    ],
)
def test_every_script_has_help(script, tmp_path):
    done = run_script(script, "--help", cwd=tmp_path)
    assert "python scripts/" + script in done.stdout and "== Settings (defaults) ==" in done.stdout
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    "script,args,pattern",
    [
        ("attention_entropy.py", ["ckpt=run", "windows=0"], "windows= and buckets= must be positive"),
        ("passkey.py", ["ckpt=run", "batch_size=0"], "batch_size=0 must be at least 1"),
        ("pos_similarity.py", ["positions=1"], "positions=1 must be at least 2"),
        ("rope_decay.py", ["max_distance=0"], "max_distance=0 must be at least 1"),
        (
            "eval_extrapolation.py",
            ["ckpt=run", "scaling=none,nosuch"],
            "scaling='nosuch' is not an option of the scaling config group",
        ),
        ("compare.py", [], "Give the runs to compare"),
        ("study_rope_scaling.py", ["run=/nonexistent/run"], "is not a checkpoint file"),
        ("study_finetune_extension.py", ["factor=1"], "factor=1: the fine-tune must be longer"),
    ],
)
def test_bad_setting_is_one_paragraph_with_status_2(script, args, pattern, tmp_path):
    assert_one_paragraph(run_script(script, *args, status=2, cwd=tmp_path), pattern)
    assert os.listdir(tmp_path) == []


def test_script_errors_are_one_paragraph(tmp_path):
    done = run_script("attention_entropy.py", f"ckpt={tmp_path / 'nothing'}", status=2, cwd=tmp_path)
    assert_one_paragraph(done, "not a checkpoint file")
