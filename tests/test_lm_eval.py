"""rope-lm's model of lm-evaluation-harness (rope_lm/probes/lm_eval_model.py):
loglikelihood equals log-softmax of the model's logits summed by hand,
loglikelihood_rolling equals rope-lm's own stream NLL of the text,
generate_until returns what rope_lm.infer.generate writes and stops at `until`,
`scaling=yarn,scaling.factor=4` builds the options the scripts build, bad
model_args are one paragraph, and scripts/lm_eval_harness.py runs local
tasks end to end under two methods."""

import glob
import json
import math
import os
import runpy
import sys

from lm_eval.api.instance import Instance
import numpy as np
import pytest
import torch

from rope_lm.core.errors import ConfigError
from rope_lm.eval.evaluation import _stream
from rope_lm.infer.generate import generate
from rope_lm.probes.lm_eval_model import RopeLM
from rope_lm.scaling import method_label
from tests import forked
from tests.conftest import ROOT
from tests.test_generate import noisy_ckpt  # noqa: F401  (a checkpoint that writes varied text, a fixture)
from tests.test_pretrained_cli import tiny_llama  # noqa: F401  (a save_pretrained Llama, a fixture)

L = 16  # the checkpoint's training length


@pytest.fixture(scope="module")
def run_dir(noisy_ckpt):  # noqa: F811
    return os.path.dirname(os.path.dirname(noisy_ckpt))


@pytest.fixture(scope="module")
def lm(run_dir):
    return RopeLM(ckpt=run_dir, batch_size=3, device="cpu")


def text_of(corpus, name, chars):
    with open(os.path.join(corpus, name), encoding="utf-8") as f:
        return f.read()[:chars]


def requests(kind, args):
    return [Instance(kind, {}, a, i) for i, a in enumerate(args)]


def enc(tok, text):
    return tok.encode(text, add_special_tokens=False).ids


@torch.no_grad()
def by_hand(model, ctx: list[int], cont: list[int], max_length: int) -> tuple[float, bool]:
    """log p(cont | ctx) from a full forward of the last max_length input tokens."""
    inputs = (ctx + cont)[:-1][-max_length:]
    logits = model(torch.tensor([inputs]))[0, -len(cont) :].double()
    logp = torch.log_softmax(logits, dim=-1)
    return (
        sum(float(logp[j, t]) for j, t in enumerate(cont)),
        all(int(logits[j].argmax()) == t for j, t in enumerate(cont)),
    )


@torch.no_grad()
def greedy_ids(model, ids: list[int], n: int) -> list[int]:
    out = list(ids)
    for _ in range(n):
        out.append(int(model(torch.tensor([out]))[0, -1].argmax()))
    return out[len(ids) :]


# --- loglikelihood -----------------------------------------------------------------


def test_loglikelihood_is_the_log_softmax_summed_by_hand(lm, tiny_corpus):
    tok, eot = lm.tokenizer, lm.stop_ids[0]
    long_context = text_of(tiny_corpus, "heapq.txt", 400).rstrip()
    pairs = [
        ("def heappush(heap, item):", "\n    heap.append(item)"),
        ("", "import os"),
        ("import", " sys"),
        ("import", " os"),
        ("import", " re"),  # one length: read in one batch
        (long_context, " heap"),  # longer than max_length=L: keeps its last L tokens
        ("x = ", "1"),
    ]  # the trailing space goes to the continuation's token
    # A continuation the model writes greedily, and one token changed in it.
    for start in ("def ", "class ", "import ", "return ", "for "):
        written = greedy_ids(lm.model, [eot] + enc(tok, start.rstrip()), 2)
        text = tok.decode(written)
        if enc(tok, start.rstrip() + text) == enc(tok, start.rstrip()) + written and text.strip():
            other = tok.decode([written[0], (written[1] + 1) % tok.get_vocab_size()])
            pairs += [(start.rstrip(), text), (start.rstrip(), other)]
            break
    else:
        pytest.fail("no greedy continuation reads back as its own tokens")
    got = lm.loglikelihood(requests("loglikelihood", pairs))
    want = []
    for ctx, cont in pairs:
        if ctx.endswith(" "):
            ctx, cont = ctx.rstrip(), " " + cont
        assert enc(tok, ctx + cont) == enc(tok, ctx) + enc(tok, cont)  # the hand split is the tokenizer's own
        want.append(by_hand(lm.model, [eot] + enc(tok, ctx), enc(tok, cont), L))
    assert len(enc(tok, long_context)) > 3 * L
    for (g, g_greedy), (w, w_greedy) in zip(got, want):
        assert g == pytest.approx(w, rel=1e-5, abs=1e-4) and g_greedy == w_greedy
    assert [greedy for _, greedy in got][-2:] == [True, False]
    assert len({round(g, 3) for g, _ in got}) == len(got)  # every pair scored on its own


def test_a_tokenizer_that_adds_a_bos_reads_every_request_after_it(noisy_ckpt, tiny_corpus, tmp_path):  # noqa: F811
    from tokenizers import Tokenizer
    from tokenizers.processors import TemplateProcessing

    saved = torch.load(noisy_ckpt, weights_only=False)
    tok = Tokenizer.from_str(saved["tokenizer_json"])
    bos = next(i for i in range(1, 100) if tok.id_to_token(i).isalnum())  # an ordinary token in a BOS's role
    tok.post_processor = TemplateProcessing(
        single=f"{tok.id_to_token(bos)} $A", special_tokens=[(tok.id_to_token(bos), bos)]
    )
    saved["tokenizer_json"] = tok.to_str()
    os.makedirs(tmp_path / "bos" / "checkpoints")
    torch.save(saved, tmp_path / "bos" / "checkpoints" / "last.ckpt")
    lm = RopeLM(ckpt=str(tmp_path / "bos"), device="cpu")
    assert lm.prefix_id == bos != lm.stop_ids[0]
    text = text_of(tiny_corpus, "heapq.txt", 300)
    (ll,) = lm.loglikelihood_rolling(requests("loglikelihood_rolling", [(text,)]))
    stream = np.array([bos] + enc(tok, text), dtype=np.int64)
    n = len(stream) - 1
    assert -ll == pytest.approx(_stream(lm.model, stream, L, n, L, 4096, 4)[0]["loss"] * n, rel=1e-6)
    ((got, _),) = lm.loglikelihood(requests("loglikelihood", [("", "import os")]))
    assert got == pytest.approx(by_hand(lm.model, [bos], enc(tok, "import os"), L)[0], rel=1e-5)


# --- loglikelihood_rolling -------------------------------------------------------------


@pytest.mark.parametrize(
    "source,scaling,max_length",
    [
        ("ckpt", None, None),  # windows of L
        ("ckpt", {"name": "yarn", "factor": 4}, 40),  # windows of 2.5 L under YaRN
        ("hf", {"name": "ntk", "factor": 2}, 48),  # an imported model
    ],
)
def test_rolling_equals_rope_lms_stream_nll(request, source, scaling, max_length, tiny_corpus):
    ckpt = request.getfixturevalue("run_dir") if source == "ckpt" else "hf:" + request.getfixturevalue("tiny_llama")[0]
    args = {"scaling": scaling} if scaling else {}
    lm = RopeLM(ckpt=ckpt, max_length=max_length, batch_size=2, device="cpu", **args)
    width = max_length or L
    texts = [text_of(tiny_corpus, "heapq.txt", 900), text_of(tiny_corpus, "bisect.txt", 300), "x", ""]
    got = lm.loglikelihood_rolling(requests("loglikelihood_rolling", [(t,) for t in texts]))
    eot = lm.stop_ids[0]
    n0 = len(enc(lm.tokenizer, texts[0]))
    assert n0 > 3 * width and n0 % width  # several windows, the last one shorter
    for text, ll in zip(texts[:2], got):
        stream = np.array([eot] + enc(lm.tokenizer, text), dtype=np.int64)
        n = len(stream) - 1
        assert n > width
        row = _stream(lm.model, stream, width, n, lm.train_len, 4096, 4)[0]
        assert -ll == pytest.approx(row["loss"] * n, rel=1e-6)
    # Shorter than a window: the text after the prefix token, as loglikelihood reads it from an empty context.
    assert got[2] == pytest.approx(by_hand(lm.model, [eot], enc(lm.tokenizer, "x"), width)[0], rel=1e-5)
    assert got[3] == 0.0


# --- generate_until -----------------------------------------------------------------


def test_generate_until_writes_what_rope_lm_generate_writes_and_stops_at_until(run_dir):
    lm = RopeLM(ckpt=run_dir, max_length=48, batch_size=2, device="cpu")
    tok, eot = lm.tokenizer, lm.stop_ids
    prompts = ["def heappush(heap, item):\n", "import ", "class Queue:\n    def", "import "]
    ids = [[eot[0]] + enc(tok, p) for p in prompts]
    free = generate(lm.model, ids, 12, stop_tokens=eot, tokenizer=tok)
    until = free[0].text[4:7]
    assert len(free[0].text) > 8 and until.strip()
    kwargs = {"until": [until], "max_gen_toks": 12, "do_sample": False}
    got = lm.generate_until(
        requests(
            "generate_until", [(p, kwargs) for p in prompts] + [(prompts[1], {"until": "\u2603", "max_gen_toks": 5})]
        )
    )
    stopped = generate(lm.model, ids, 12, stop_tokens=eot, stop_strings=[until], tokenizer=tok)
    assert got[:4] == [g.text for g in stopped]
    assert got[0] == free[0].text[: free[0].text.index(until)] and until not in got[0]
    assert got[4] == generate(lm.model, ids[1:2], 5, stop_tokens=eot, tokenizer=tok)[0].text
    # A long prompt keeps its last max_length - max_gen_toks tokens.
    long = "\n".join(f"value_{i} = {i}" for i in range(40))
    sampled = {"until": [], "max_gen_toks": 8, "do_sample": True, "temperature": 0.8, "top_p": 0.9}
    got = lm.generate_until(requests("generate_until", [(long, sampled)]))
    want = generate(
        lm.model,
        [([eot[0]] + enc(tok, long))[-40:]],
        8,
        temperature=0.8,
        top_p=0.9,
        seed=0,
        stop_tokens=eot,
        tokenizer=tok,
    )
    assert got == [want[0].text]


# --- model_args ------------------------------------------------------------------------


@pytest.fixture
def script_compose(monkeypatch):
    """scripts/lm_eval_harness.py's composition, under the Hydra it sets up."""
    from hydra import initialize_config_dir

    script = runpy.run_path(os.path.join(ROOT, "scripts", "lm_eval_harness.py"), run_name="lm_eval_harness")
    monkeypatch.setattr(RopeLM, "compose_scaling", staticmethod(script["compose_scaling"]))
    with initialize_config_dir(config_dir=os.path.join(ROOT, "conf"), version_base="1.3"):
        yield script["compose_scaling"]


def test_scaling_model_args_build_what_the_scripts_build(script_compose, run_dir, lm):
    from hydra import compose
    from omegaconf import OmegaConf

    # scripts/generate.py reads `scaling=yarn scaling.factor=4` by composing conf/generate.yaml.
    generate_cfg = compose(config_name="generate", overrides=["scaling=yarn", "scaling.factor=4"])
    want = OmegaConf.to_container(generate_cfg.scaling, resolve=True)
    assert script_compose("yarn", {"factor": 4}) == want and want["factor"] == 4 and "beta_fast" in want
    yarn = RopeLM.create_from_arg_string(
        f"ckpt={run_dir},scaling=yarn,scaling.factor=4,max_length=64", {"batch_size": 2, "device": "cpu"}
    )
    assert yarn.method == method_label(want) != lm.method and yarn.max_length == 64
    pair = requests("loglikelihood", [("def heappush(heap, item):", "\n    heap.append(item)")])
    as_dict = RopeLM(ckpt=run_dir, scaling=want, max_length=64, device="cpu")
    assert yarn.loglikelihood(pair) == as_dict.loglikelihood(pair) != lm.loglikelihood(pair)
    # lm-eval reads `none` as None: the method none, not the checkpoint's own.
    none = RopeLM.create_from_arg_string(f"ckpt={run_dir},scaling=none,scaling.logn=true", {"device": "cpu"})
    assert none.model.scaling.name == "none" and none.method == "none+logn"


def test_bad_model_args_are_one_paragraph_naming_the_setting(
    script_compose, run_dir, tiny_cache, tiny_data_options, tmp_path
):
    from tests.test_diagnostics import save_tiny_checkpoint

    def refused(pattern, **args):
        with pytest.raises(ConfigError, match=pattern):
            RopeLM(**{"device": "cpu", **args})

    refused(r"ckpt= is required")
    refused(
        r"scaling='bogus' is not an extrapolation method of rope-lm; valid values are .*\byarn\b",
        ckpt=run_dir,
        scaling="bogus",
    )
    refused(
        r"scaling=yarn has no setting scaling.fctor; it takes scaling.factor",
        ckpt=run_dir,
        scaling="yarn",
        **{"scaling.fctor": 4},
    )
    refused(r"scaling.factor= sets a method's setting, but no method is chosen", ckpt=run_dir, **{"scaling.factor": 4})
    refused(r"Unknown model_args maxlen .* it takes ckpt, scaling", ckpt=run_dir, maxlen=3)
    refused(r"max_length=0 must be a whole number", ckpt=run_dir, max_length=0)
    # A learned position table serves its own rows only: max_length past them names the setting.
    learned = str(tmp_path / "learned" / "checkpoints" / "last.ckpt")
    save_tiny_checkpoint(learned, tiny_cache, tiny_data_options, pos={"name": "learned", "max_positions": L})
    refused(
        r"max_length=32 is more than none serves on this model: .* Give a smaller max_length=",
        ckpt=learned,
        max_length=32,
    )
    lm = RopeLM(ckpt=run_dir, device="cpu")
    with pytest.raises(ConfigError, match=r"num_beams are not read .* it takes until, max_gen_toks"):
        lm.generate_until(requests("generate_until", [("x", {"until": ["\n"], "num_beams": 4})]))
    with pytest.raises(ConfigError, match=r"max_gen_toks=16 leaves no room .* max_length=16"):
        lm.generate_until(requests("generate_until", [("x", {"max_gen_toks": 16})]))


def test_a_method_by_name_needs_the_script_from_python(run_dir):
    with pytest.raises(ConfigError, match=r"scaling='yarn' .* python scripts/lm_eval_harness.py .* as a dict"):
        RopeLM(ckpt=run_dir, scaling="yarn", device="cpu")


# --- end to end: lm-eval's command line, local tasks ---------------------------------

DOCS = [
    {
        "question": "def add(a, b):\n    return",
        "choices": [" a + b", " a - b", " None"],
        "label": 0,
        "prompt": "import ",
        "answer": "os",
    },
    {"question": "for i in", "choices": [" range(n):", " x"], "label": 0, "prompt": "def main(", "answer": "):"},
]


def write_tasks(folder, corpus) -> dict:
    """Three tasks over one local jsonl file, one of each request type."""
    os.makedirs(folder, exist_ok=True)
    docs = [dict(d, text=text_of(corpus, name, 500)) for d, name in zip(DOCS, ("heapq.txt", "bisect.txt"))]
    data = os.path.join(folder, "docs.jsonl")
    with open(data, "w") as f:
        f.writelines(json.dumps(d) + "\n" for d in docs)
    head = (
        f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\n"
        f"  cache_dir: {os.path.join(folder, 'hf_cache')}\ntest_split: test\n"
    )
    tasks = {
        "mc": 'output_type: multiple_choice\ndoc_to_text: "{{question}}"\ndoc_to_choice: "{{choices}}"\n'
        'doc_to_target: "{{label}}"\nmetric_list:\n  - metric: acc\n',
        "ppl": 'output_type: loglikelihood_rolling\ndoc_to_text: ""\ndoc_to_target: "{{text}}"\n'
        "metric_list:\n  - metric: word_perplexity\n  - metric: byte_perplexity\n",
        "gen": 'output_type: generate_until\ndoc_to_text: "{{prompt}}"\ndoc_to_target: "{{answer}}"\n'
        'generation_kwargs:\n  until: ["\\n"]\n  max_gen_toks: 6\n  do_sample: false\n'
        "metric_list:\n  - metric: exact_match\n",
    }
    for name, body in tasks.items():
        with open(os.path.join(folder, f"{name}.yaml"), "w") as f:
            f.write(f"task: rope_lm_tiny_{name}\n{head}{body}")
    return docs


def harness(*args):
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    return forked.run(
        [sys.executable, os.path.join(ROOT, "scripts", "lm_eval_harness.py"), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def stream_byte_perplexity(run_dir, scaling, docs, width) -> float:
    """byte_perplexity of the documents from rope-lm's own stream NLL under the method."""
    lm = RopeLM(ckpt=run_dir, scaling=scaling, max_length=width, device="cpu")
    nll = nbytes = 0.0
    for d in docs:
        stream = np.array([lm.stop_ids[0]] + enc(lm.tokenizer, d["text"]), dtype=np.int64)
        nll += _stream(lm.model, stream, width, len(stream) - 1, L, 4096, 4)[0]["loss"] * (len(stream) - 1)
        nbytes += len(d["text"].encode("utf-8"))
    return math.exp(nll / nbytes)


def check_results(results: dict, scaling: dict, byte_perplexity: float):
    model = results["config"]["rope_lm"]
    assert model["method"] == method_label(scaling) and model["max_length"] == 32 and model["train_len"] == L
    assert {k: model["scaling"][k] for k in scaling} == scaling
    assert 0 <= results["results"]["rope_lm_tiny_mc"]["acc,none"] <= 1
    assert results["results"]["rope_lm_tiny_gen"]["exact_match,none"] in (0.0, 0.5, 1.0)
    assert results["results"]["rope_lm_tiny_ppl"]["byte_perplexity,none"] == pytest.approx(byte_perplexity, rel=1e-5)


TASKS = ["rope_lm_tiny_mc", "rope_lm_tiny_ppl", "rope_lm_tiny_gen"]


def test_local_tasks_end_to_end_under_two_methods(script_compose, run_dir, tiny_corpus, tmp_path):
    """The README's command through lm-eval's command line under YaRN, and
    lm-eval's simple_evaluate in this process under direct extrapolation."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    docs = write_tasks(str(tmp_path / "tasks"), tiny_corpus)
    done = harness(
        "--model",
        "rope-lm",
        "--model_args",
        f"ckpt={run_dir},scaling=yarn,scaling.factor=4,max_length=32",
        "--tasks",
        ",".join(TASKS),
        "--include_path",
        str(tmp_path / "tasks"),
        "--batch_size",
        "4",
        "--output_path",
        str(tmp_path / "out"),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rope-lm loglikelihood_rolling" in done.stderr and "rope_lm_tiny_ppl" in done.stdout  # bar and table
    (path,) = glob.glob(str(tmp_path / "out" / "*" / "results_*.json"))
    yarn = json.load(open(path))
    yarn_ppl = stream_byte_perplexity(run_dir, {"name": "yarn", "factor": 4}, docs, 32)
    check_results(yarn, {"name": "yarn", "factor": 4}, yarn_ppl)
    # The built-in tasks are not indexed here (the command line spends 10-20 s on them).
    none = simple_evaluate(
        model="rope-lm",
        model_args=f"ckpt={run_dir},scaling=none,max_length=32",
        tasks=TASKS,
        task_manager=TaskManager(include_path=str(tmp_path / "tasks"), include_defaults=False),
        batch_size=4,
        device="cpu",
    )
    none_ppl = stream_byte_perplexity(run_dir, {"name": "none"}, docs, 32)
    check_results(none, {"name": "none"}, none_ppl)
    assert none_ppl != pytest.approx(yarn_ppl, rel=1e-3)  # the method reached the model
