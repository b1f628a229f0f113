"""Generation (rope_lm/infer/generate.py): greedy decoding equals the argmax of
full forwards, seeded sampling is reproducible, top-k / top-p only ever pick
the tokens a hand computation allows, stops end a prompt where they should,
prompts of different lengths in one call equal each alone, bad input is one
paragraph before any forward; passkey, the retrieval battery and the task
runs decode through it with the answers of the old re-read-everything
decoding; scripts/generate.py on a trained checkpoint and an imported model."""

import math

import pytest
import torch

from rope_lm.core.errors import ConfigError
from rope_lm.infer.generate import Sampling, allowed_probs, end_of_text_ids, generate, stop_token_ids
from rope_lm.model.transformer import ModelConfig, TransformerLM
from rope_lm.probes import passkey as P
from rope_lm.probes import retrieval as R
from tests.test_pretrained_cli import tiny_llama  # noqa: F401  (the tiny save_pretrained model, a fixture)

L = 16  # trained length; the tests decode past it


def tiny(pos=None, scaling=None, vocab=61, seed=0, **extra):
    torch.manual_seed(seed)
    cfg = ModelConfig(
        **{
            **dict(vocab_size=vocab, train_len=L, n_layer=2, n_head=4, n_kv_head=2, d_model=32, tie_embeddings=False),
            **extra,
        }
    )
    m = TransformerLM(cfg, pos or {"name": "rope"}, scaling)
    with torch.no_grad():  # off the initial values, so that tokens differ from step to step
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return m.eval()


def prompt_rows(lengths, vocab=61, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]


@torch.no_grad()
def rerun_greedy(model, row, n):
    """The old decoding: every step reads the whole sequence again."""
    out = list(row)
    for _ in range(n):
        out.append(int(model(torch.tensor([out]))[0, -1].argmax()))
    return out[len(row) :]


@torch.no_grad()
def step_logits(model, row, written):
    """Full-forward logits before each written token."""
    return [model(torch.tensor([row + written[:t]]))[0, -1] for t in range(len(written))]


# --- greedy ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "pos,scaling",
    [
        ({"name": "rope"}, None),
        ({"name": "alibi"}, None),
        ({"name": "learned", "max_positions": 64}, None),
        ({"name": "t5", "num_buckets": 8, "max_distance": 12}, None),
        ({"name": "rope"}, {"name": "pi", "factor": 2.0}),
        ({"name": "rope"}, {"name": "rerope", "window": 6}),
    ],
)
def test_greedy_equals_argmax_of_full_forwards_past_the_training_length(pos, scaling):
    m = tiny(pos, scaling)
    rows = prompt_rows([12, 7])
    out = generate(m, rows, 20)
    for row, g in zip(rows, out):
        assert g.ids == rerun_greedy(m, row, 20) and g.finish == "length" and g.prompt == row
    assert len(set(out[0].ids)) > 3  # a real continuation, not one token repeated


def test_only_the_last_position_is_projected():
    m = tiny()
    seen = []
    m.lm_head.register_forward_hook(lambda mod, inp, out: seen.append(tuple(inp[0].shape)))
    generate(m, prompt_rows([30, 30]), 4)
    assert seen == [(2, 32)] * 4  # (batch, d_model) a step: never prompt x vocabulary


# --- sampling ----------------------------------------------------------------------


def test_seeded_sampling_is_reproducible_and_the_seed_matters():
    m = tiny()
    rows = prompt_rows([9, 9, 5])
    a = generate(m, rows, 15, temperature=1.5, seed=7)
    b = generate(m, rows, 15, temperature=1.5, seed=7)
    c = generate(m, rows, 15, temperature=1.5, seed=8)
    assert [g.ids for g in a] == [g.ids for g in b]
    assert [g.ids for g in a] != [g.ids for g in c]
    greedy = generate(m, rows, 15)
    assert [g.ids for g in a] != [g.ids for g in greedy]  # it does sample


def hand_allowed(logits, temperature, top_k, top_p):
    """The allowed set by plain Python: temperature, the k largest, then the
    most probable tokens until their probability reaches p."""
    scaled = [x / temperature for x in logits.tolist()]
    order = sorted(range(len(scaled)), key=lambda i: -scaled[i])
    keep = order[:top_k] if top_k else order
    if top_p is None:
        return set(keep)
    z = sum(math.exp(scaled[i]) for i in keep)
    allowed, mass = [], 0.0
    for i in keep:
        if mass >= top_p:
            break
        allowed.append(i)
        mass += math.exp(scaled[i]) / z
    return set(allowed)


@pytest.mark.parametrize("top_k,top_p", [(3, None), (None, 0.5), (8, 0.6), (1, None)])
def test_top_k_and_top_p_only_pick_allowed_tokens(top_k, top_p):
    m = tiny()
    rows = prompt_rows([6] * 6, seed=4)
    out = generate(m, rows, 12, temperature=2.0, top_k=top_k, top_p=top_p, seed=3)
    picked_outside_argmax = 0
    for row, g in zip(rows, out):
        for logits, token in zip(step_logits(m, row, g.ids), g.ids):
            allowed = hand_allowed(logits, 2.0, top_k, top_p)
            assert token in allowed, (token, allowed)
            picked_outside_argmax += token != int(logits.argmax())
            probs = allowed_probs(logits[None], Sampling(2.0, top_k, top_p))[0]
            assert {int(i) for i in torch.nonzero(probs).flatten()} == allowed
            assert float(probs.sum()) == pytest.approx(1.0, abs=1e-5)
    if top_k != 1:
        assert picked_outside_argmax > 0  # the filters left more than the argmax, and sampling used it


# --- stops -------------------------------------------------------------------------


def test_a_stop_token_ends_that_prompt_only():
    m = tiny()
    rows = prompt_rows([10, 10])
    free = generate(m, rows, 12)
    stop = free[0].ids[4]
    first = free[0].ids.index(stop)
    out = generate(m, rows, 12, stop_tokens=[stop])
    assert out[0].ids == free[0].ids[: first + 1] and out[0].finish == "token" and out[0].stop == stop
    other = free[1].ids[: free[1].ids.index(stop) + 1] if stop in free[1].ids else free[1].ids
    assert out[1].ids == other


@pytest.fixture(scope="module")
def tokenizer(tiny_cache):
    return tiny_cache.tokenizer()


def test_a_stop_string_cuts_the_text(tokenizer):
    m = tiny(vocab=tokenizer.get_vocab_size())
    prompt = "def wrap(text, width):\n"
    free = generate(m, [prompt], 30, tokenizer=tokenizer)[0]
    assert free.text == tokenizer.decode(free.ids) and len(free.text) > 12
    stop = free.text[8:11]
    out = generate(m, [prompt], 30, tokenizer=tokenizer, stop_strings=["\u2603never", stop])[0]
    assert out.finish == "string" and out.stop == stop
    assert out.text == free.text[: free.text.index(stop)]
    assert out.ids == free.ids[: len(out.ids)] and len(out.ids) < 30
    assert stop in tokenizer.decode(out.ids) and stop not in tokenizer.decode(out.ids[:-1])


def test_stop_tokens_by_name_and_the_end_of_text_token(tokenizer):
    eos = tokenizer.token_to_id("<|endoftext|>")
    assert stop_token_ids(tokenizer, ["<|endoftext|>", 5]) == [eos, 5]
    assert end_of_text_ids(tokenizer) == [eos]
    with pytest.raises(ConfigError, match=r"stop token '<\|eot\|>' is not a token .*'<\|endoftext\|>'"):
        stop_token_ids(tokenizer, ["<|eot|>"])


# --- batches -----------------------------------------------------------------------


@pytest.mark.parametrize("sampled", [False, True])
def test_prompts_of_different_lengths_equal_each_alone(sampled):
    m = tiny(scaling={"name": "yarn"})  # yarn's factor follows the length: a padded batch would change it
    rows = prompt_rows([5, 11, 5, 8, 11, 3])
    settings = dict(temperature=1.2, top_p=0.9, seed=5) if sampled else {}
    together = generate(m, rows, 14, batch_size=2, **settings)
    # Alone, prompt i keeps its own seed stream: pass it at its index among placeholders of other lengths.
    for i, row in enumerate(rows):
        alone = generate(m, [[0]] * i + [row], 14, **settings)[i]
        assert together[i].ids == alone.ids, i
        if not sampled:
            from rope_lm.model.kv_cache import KVCache

            with torch.no_grad():  # ... and alone means one full forward of the finished sequence at its plan
                cache = KVCache(planned_len=len(row) + 14)
                logits = m(torch.tensor([row + alone.ids[:-1]]), cache=cache)[0, len(row) - 1 :]
            assert logits.argmax(-1).tolist() == alone.ids


def test_the_model_mode_is_kept():
    m = tiny().train()
    generate(m, prompt_rows([4]), 2)
    assert m.training


# --- bad input: one paragraph each, before any forward -------------------------------


class NoForward(TransformerLM):
    def hidden(self, *a, **k):
        raise AssertionError("a forward ran before the input was checked")


def unreadable():
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=61, train_len=L, n_layer=1, n_head=2, d_model=16)
    return NoForward(cfg, {"name": "learned", "max_positions": 32})


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (
            dict(prompts=[[1] * 20], max_new_tokens=13),
            "A prompt of 20 tokens plus max_new_tokens=13 is 33 tokens, more than this model serves",
        ),
        (dict(prompts=[[1] * 40], max_new_tokens=1), "A prompt of 40 tokens"),
        (dict(prompts=[[1, 2], []]), "Prompt 1 is empty"),
        (dict(prompts=[]), "needs a list of prompts"),
        (dict(prompts=["hello"]), "Prompt 0 is text, and no tokenizer"),
        (dict(prompts=[[1, 99]]), "outside the model's vocabulary of 61"),
        (dict(max_new_tokens=0), "max_new_tokens=0 must be a whole number of at least 1"),
        (dict(stop_tokens=[61]), "stop token id(s) [61] are not tokens of the model's vocabulary"),
        (dict(stop_strings=["."]), "Stop strings ['.'] need the model's tokenizer"),
        (dict(temperature=-0.5), "temperature=-0.5 must be a finite number of at least 0"),
        (dict(temperature=float("nan")), "temperature=nan must be a finite number"),
        (dict(temperature=1.0, top_k=0), "top_k=0 must be a whole number of at least 1"),
        (dict(temperature=1.0, top_p=0.0), "top_p=0.0 must be a probability in (0, 1]"),
        (dict(temperature=1.0, top_p=1.5), "top_p=1.5 must be a probability in (0, 1]"),
        (dict(seed=-1), "seed=-1 must be a whole number of at least 0"),
        (dict(batch_size=0), "batch_size=0 must be a whole number of at least 1"),
    ],
)
def test_bad_input_is_one_paragraph_before_any_forward(kwargs, message):
    args = {"prompts": [[1, 2, 3]], "max_new_tokens": 4, **kwargs}
    with pytest.raises(ConfigError) as e:
        generate(unreadable(), args.pop("prompts"), args.pop("max_new_tokens"), **args)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_stop_string_needs_text_and_an_empty_text_prompt_is_refused(tokenizer):
    m = tiny(vocab=tokenizer.get_vocab_size())
    with pytest.raises(ConfigError, match="Stop strings must be non-empty"):
        generate(m, ["a"], 2, tokenizer=tokenizer, stop_strings=[""])
    with pytest.raises(ConfigError, match=r"Prompt 0 is empty \(its text encodes to no tokens\)"):
        generate(m, [""], 2, tokenizer=tokenizer)


# --- passkey, retrieval and tasks decode through generate --------------------------


def test_passkey_gives_the_answers_of_the_old_decoding(tokenizer, monkeypatch):
    m = tiny(vocab=tokenizer.get_vocab_size(), scaling={"name": "pi", "factor": 2.0})
    ids = torch.tensor([p.ids for p in P.prompts(tokenizer, 100, 0.5, 3, seed=2)])
    new = P.greedy_decode(m, ids, P.ANSWER_ROOM)
    assert new.tolist() == [rerun_greedy(m, row, P.ANSWER_ROOM) for row in ids.tolist()]
    cached = P.evaluate_passkey(m, tokenizer, [90, 110], [0.0, 1.0], samples=2, seed=1)
    monkeypatch.setattr(
        P, "greedy_decode", lambda model, ids, n: torch.tensor([rerun_greedy(model, row, n) for row in ids.tolist()])
    )
    assert P.evaluate_passkey(m, tokenizer, [90, 110], [0.0, 1.0], samples=2, seed=1) == cached


def test_retrieval_greedy_gives_the_verdicts_of_the_old_decoding(tokenizer, tiny_cache, monkeypatch):
    m = tiny(vocab=tokenizer.get_vocab_size())
    hay = R.Haystacks(tokenizer, tiny_cache.tokens("test"), seed=0)
    task = R.MultiQuery(2)
    prompts = [hay.build(task, "multiquery", 200 + 9 * (s % 2), 0.5, s) for s in range(3)]
    cached = R.greedy(m, prompts, task, tokenizer, "cpu")
    monkeypatch.setattr(
        P, "greedy_decode", lambda model, ids, n: torch.tensor([rerun_greedy(model, row, n) for row in ids.tolist()])
    )
    assert R.greedy(m, prompts, task, tokenizer, "cpu") == cached


def test_task_runs_write_what_the_model_generates(monkeypatch):
    from rope_lm.probes import task_run as TR
    from rope_lm.tasks.synthetic import build_task

    task = build_task({"name": "copy"})
    vocab = task.vocabulary()
    m = tiny(vocab=len(vocab), train_len=24)
    rng = __import__("random").Random(0)
    instances = [task.instance(rng, n) for n in (3, 3, 5)]
    greedy = TR.greedy_answers(m, task, vocab, instances, 8, "cpu")
    for (prompt, answer), written in zip(instances, greedy):
        row = vocab.encode([*task.sequence(prompt, answer)][: len(prompt) + 2])
        expect = vocab.decode(rerun_greedy(m, row, len(answer) + 1))
        if "<eos>" in expect:
            expect = expect[: expect.index("<eos>") + 1]
        assert written == expect
    # score() records it for the failed examples it keeps, and asks for no others.
    sizes = TR.Sizes(train_min=3, train_max=3, test_factor=5 / 3, bucket=1)
    tests = {3: instances[:2], 4: [task.instance(rng, 4)], 5: instances[2:]}
    scored = {
        s: {
            "correct": [i == 0 and s == 3 for i in range(len(t))],
            "token_accuracy": [0.0] * len(t),
            "predictions": [["0"]] * len(t),
        }
        for s, t in tests.items()
    }
    asked = []

    def write(kept):
        asked.append(kept)
        return TR.greedy_answers(m, task, vocab, kept, 8, "cpu")

    result = TR.score(sizes, task, tests, scored, resamples=0, seed=0, n_examples=1, write=write)
    assert [len(k) for k in asked] == [1, 1, 1]
    three = result["buckets"][0]["failed_examples"]
    assert three == [
        {
            "prompt": " ".join(instances[1][0]),
            "answer": " ".join(instances[1][1]),
            "predicted (teacher-forced argmax)": "0",
            "generated (greedy)": " ".join(greedy[1]),
        }
    ]


# --- scripts/generate.py -----------------------------------------------------------


def run_generate(*args, status=0, cwd=None):
    from tests.test_diagnostics import run_script

    return run_script("generate.py", *args, status=status, cwd=cwd)


@pytest.fixture(scope="module")
def noisy_ckpt(tiny_cache, tiny_data_options, tmp_path_factory):
    """A checkpoint as training writes it, weights moved off their init so it writes varied text."""
    from tests.test_diagnostics import save_tiny_checkpoint

    path = str(tmp_path_factory.mktemp("run") / "checkpoints" / "last.ckpt")
    save_tiny_checkpoint(path, tiny_cache, tiny_data_options)
    saved = torch.load(path, weights_only=False)
    torch.manual_seed(1)
    saved["state_dict"] = {
        k: v + 0.3 * torch.randn_like(v) if v.is_floating_point() else v for k, v in saved["state_dict"].items()
    }
    torch.save(saved, path)
    return path


def test_generate_script_on_a_checkpoint(noisy_ckpt, tiny_corpus, tmp_path):
    import json
    import os

    from rope_lm.runs.trained import open_model

    out = tmp_path / "g.json"
    done = run_generate(
        f"ckpt={noisy_ckpt}",
        "prompt=[def wrap,class Queue]",
        "max_new_tokens=12",
        "scaling=yarn",
        "temperature=0.8",
        "top_k=20",
        "seed=4",
        f"out={out}",
    )
    result = json.load(open(out))
    assert result["source"] == noisy_ckpt and result["method"] == "yarn" and result["train_len"] == 16
    trained = open_model(noisy_ckpt, "cpu", {"name": "yarn"})
    tok = trained.tokenizer()
    expect = generate(
        trained.model,
        ["def wrap", "class Queue"],
        12,
        temperature=0.8,
        top_k=20,
        seed=4,
        tokenizer=tok,
        stop_tokens=end_of_text_ids(tok),
    )
    assert [g["ids"] for g in result["generations"]] == [g.ids for g in expect]
    for g in expect:
        assert f"⟨model⟩ {g.text}\n" in done.stdout
    assert done.stdout.count("=== prompt ") == 2 and "[rope_lm]" not in done.stdout and "HYDRA" not in done.stdout
    assert "[rope_lm] " in done.stderr and "yarn" in done.stderr  # progress on stderr, as eval_extrapolation logs
    # A file's text cut to 40 tokens: a prompt past L = 16.
    text_file = os.path.join(tiny_corpus, "textwrap.txt")
    done = run_generate(
        f"ckpt={noisy_ckpt}",
        f"file={text_file}",
        "prompt_tokens=40",
        "max_new_tokens=5",
        "stop_tokens=[]",
        "show_prompt=0",
        f"out={tmp_path / 'f.json'}",
    )
    assert f"=== file={text_file}: 40 tokens (2.5 x L=16); 5 written, stopped by max_new_tokens=5" in done.stdout
    with open(text_file) as f:
        ids = tok.encode(f.read()).ids[:40]
    plain = open_model(noisy_ckpt, "cpu").model
    assert json.load(open(tmp_path / "f.json"))["generations"][0]["ids"] == generate(plain, [ids], 5)[0].ids
    run_generate(f"ckpt={noisy_ckpt}", "prompt=x", f"out={out}", status=2)  # never written over


@pytest.mark.parametrize(
    "args,message",
    [
        (["ckpt=a", "hf=b", "prompt=x"], "Give one of ckpt="),
        (["ckpt=/nowhere", "prompt=x", "file=y"], "Give one of prompt="),
        (["ckpt=/nowhere", "prompt=x", "top_p=2"], "top_p=2 must be a probability"),
        (["ckpt=/nowhere", "prompt=x", "max_new_tokens=0"], "max_new_tokens=0 must be"),
    ],
)
def test_generate_script_refuses_bad_settings_before_loading_a_model(args, message):
    from tests.test_diagnostics import assert_one_paragraph

    assert_one_paragraph(run_generate(*args, status=2), message)


@pytest.mark.parametrize(
    "args,message",
    [
        (["stop_tokens=['<|nope|>']"], "stop token '<|nope|>' is not a token of the model's tokenizer"),
        (["prompt_tokens=500"], "prompt_tokens=500: prompt 0 has only"),
    ],
)
def test_generate_script_refuses_unknown_stops_and_short_texts(noisy_ckpt, args, message):
    from tests.test_diagnostics import assert_one_paragraph

    assert_one_paragraph(
        run_generate(f"ckpt={noisy_ckpt}", "prompt='def wrap(text, width):'", *args, status=2), message
    )


def test_generate_script_on_an_imported_model_matches_transformers(tiny_llama, tmp_path):
    """hf= and ckpt=hf: write what transformers' own greedy generate writes
    with the same weights, and name the model as given."""
    import json

    from tokenizers import Tokenizer
    import transformers

    directory, _ = tiny_llama
    out = tmp_path / "g.json"
    run_generate(
        f"hf={directory}",
        "prompt=[def wrap,import os]",
        "max_new_tokens=10",
        "stop_tokens=[]",
        f"out={out}",
        cwd=tmp_path,
    )
    result = json.load(open(out))
    assert result["source"] == f"hf:{directory}" and result["checkpoint"] == f"hf:{directory}"
    hf = transformers.AutoModelForCausalLM.from_pretrained(directory).eval()
    hf.generation_config.eos_token_id = None  # the script was told no stop token
    tok = Tokenizer.from_file(f"{directory}/tokenizer.json")
    for text, g in zip(["def wrap", "import os"], result["generations"]):
        ids = torch.tensor([tok.encode(text).ids])
        want = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=10, do_sample=False)[
            0, ids.shape[1] :
        ].tolist()
        assert g["ids"] == want
    done = run_generate(f"ckpt=hf:{directory}", "prompt=x", "max_new_tokens=2", cwd=tmp_path)
    assert done.stdout.startswith("=== prompt 0:")


def test_a_generation_too_long_for_the_machine_is_refused_with_its_figure_before_any_forward(monkeypatch):
    import rope_lm.infer.generate as G

    m = tiny(scaling={"name": "window", "window": 8})
    monkeypatch.setattr(G, "free_memory_bytes", lambda device: 2**30)  # a machine with 1 GiB free
    forwards = []
    monkeypatch.setattr(m, "hidden", lambda *a, **k: forwards.append(1))
    # 2 layers x (keys, values) x 2 key/value heads x 8 dimensions x 4 bytes = 256 bytes a token: 23.8 GiB.
    with pytest.raises(ConfigError, match=r"max_new_tokens=100000000 .* need 23\.8 GiB .* 1\.0 GiB the cpu has free"):
        generate(m, [[1, 2, 3]], max_new_tokens=100_000_000)
    assert forwards == []


def test_the_memory_check_counts_a_sliding_window_layer_as_about_two_windows(monkeypatch):
    import rope_lm.infer.generate as G

    m = tiny(layout={"pattern": [{"window": 8}, {}]})  # a local layer, then a global one
    monkeypatch.setattr(G, "free_memory_bytes", lambda device: 2**30)
    monkeypatch.setattr(m, "hidden", lambda *a, **k: None)
    # The global layer's 100,000,003 rows and the local one's 64 (two windows of 8, in a buffer of at
    # least 64): 2 x 2 heads x 8 dimensions x 4 bytes = 128 bytes a row, 11.9 GiB (23.8 with both layers full).
    with pytest.raises(ConfigError, match=r"need 11\.9 GiB \(100,000,067 token rows over 2 layers, the sliding-window"):
        generate(m, [[1, 2, 3]], max_new_tokens=100_000_000)


def test_a_planned_cache_grows_with_what_is_written_not_with_the_plan():
    """A plan sets the length methods read; the buffers hold only what was written (doubling up to the plan)."""
    from rope_lm.model.kv_cache import KVCache

    m = tiny()
    cache = KVCache(planned_len=1_000_000)
    with torch.no_grad():
        m(torch.tensor([[1, 2, 3, 4, 5]]), cache=cache)
        for t in range(70):
            m(torch.tensor([[t % 61]]), cache=cache)
    capacities = {b.shape[2] for layer in cache.layers.values() for b in layer.buffers.values()}
    assert capacities == {128}  # 75 tokens: 64, then doubled once
