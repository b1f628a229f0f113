"""Retrieval battery: prompts are deterministic, exactly as long as asked,
cut from the corpus and carry the target needle at its depth; every task's
answer is recomputed from the prompt's text by an independent reading;
teacher-forced and greedy scoring on hand-made predictions; the script end to
end on a tiny checkpoint, and a bad task name refused before any work."""

import json
import re

import pytest
import torch

from rope_lm.core.errors import ConfigError
from rope_lm.probes import retrieval as R
from rope_lm.tasks.passkey_text import FILLER_SENTENCES
from tests.scripted import SequenceModel
from tests.test_diagnostics import assert_one_paragraph, run_script, save_tiny_checkpoint


@pytest.fixture(scope="module")
def tokenizer(tiny_cache):
    return tiny_cache.tokenizer()


@pytest.fixture(scope="module")
def hay(tiny_cache, tokenizer):
    return R.Haystacks(tokenizer, tiny_cache.tokens("test"), seed=5)


def reread(name: str, text: str, question: str) -> list[str]:
    """The answer a reader finds in the decoded prompt, without the generator's bookkeeping."""
    if name == "passkey":
        return re.findall(r"The pass key is (\d+)\. Remember it\.", text)
    if name == "multikey":
        word = re.search(r"magic number for (\w+)\?", question).group(1)
        return re.findall(rf"The special magic number for {word} is (\d+)\.", text)
    if name == "multivalue":
        word = re.search(r"numbers for (\w+)\?", question).group(1)
        return re.findall(rf"One of the special magic numbers for {word} is (\d+)\.", text)
    if name == "multiquery":
        listed = re.search(r"numbers for (.+?)\?", question).group(1)
        words = re.split(r", | and ", listed)
        return [re.search(rf"The special magic number for {w} is (\d+)\.", text).group(1) for w in words]
    value = re.search(r"assigned the value (\d+)", question).group(1)
    assign = dict((a, b) for a, b in re.findall(r"VAR ([A-Z]{5}) = (\w+)\.", text))

    def resolves(v, seen=()):
        x = assign[v]
        return x == value if x.isdigit() else (x not in seen and resolves(x, seen + (v,)))

    return [v for v in re.findall(r"VAR ([A-Z]{5}) =", text) if resolves(v)]


LOOKUPS = ["passkey", "multikey", "multivalue", "multiquery", "vartrack"]  # the reasoning tasks: test_context_tasks.py


@pytest.mark.parametrize("name", LOOKUPS)
@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_prompts_are_exact_deterministic_and_answerable(name, depth, hay, tokenizer):
    task = R.RETRIEVAL_TASKS.get(name)(3)
    length = 400
    a = hay.build(task, name, length, depth, sample=1)
    assert a == hay.build(task, name, length, depth, sample=1)
    assert a.ids != hay.build(task, name, length, depth, sample=2).ids
    room = max(R.P.ANSWER_ROOM, len(a.answer_ids) + R.GREEDY_EXTRA)
    assert len(a.ids) + room == length
    text, question = tokenizer.decode(a.ids[: a.question_start]), tokenizer.decode(a.ids[a.question_start :])
    assert reread(name, text, question) == a.values
    assert tokenizer.decode(a.answer_ids).strip() == ", ".join(a.values)


@pytest.mark.parametrize("name", ["passkey", "multikey", "vartrack"])
def test_the_target_needle_sits_at_its_depth(name, hay, tokenizer):
    task = R.RETRIEVAL_TASKS.get(name)(3)
    for depth in (0.0, 0.25, 0.75, 1.0):
        p = hay.build(task, name, 600, depth, sample=0)
        at = round(depth * p.fill)
        # Moved forward to the next sentence end (at most `snap` tokens), or past a needle placed just before.
        slack = hay.snap if name == "passkey" else 3 * hay.snap
        assert at <= p.target_offset <= at + slack
        if name == "passkey":
            assert p.target_start == p.target_offset
        target = tokenizer.decode(p.ids[p.target_start : p.target_start + 20])
        assert re.match(r"\s*(The pass key|The special mag|VAR)", target), target


def check_task(name: str, hay, tokenizer) -> None:
    """What every registered task owes the battery, read off its prompts: they
    are exactly as long as asked and deterministic; every needle's sentence
    is in the haystack, in the order of its depth, the target where the prompt
    says; the answer decodes to its values, which the task's own greedy reader
    parses back and judges right (and a wrong value wrong); needles= past its
    max_needles is refused. tests/test_extension_points.py runs it on a new task."""
    cls = R.RETRIEVAL_TASKS.get(name)
    assert cls.name == name and name in R.task_names()
    for needles in (2, 3):
        task = cls(needles)
        for depth in (0.0, 0.5, 1.0):
            a = hay.build(task, name, 400, depth, sample=1)
            assert a == hay.build(task, name, 400, depth, sample=1)
            assert a.ids != hay.build(task, name, 400, depth, sample=2).ids
            assert len(a.ids) + max(R.P.ANSWER_ROOM, len(a.answer_ids) + R.GREEDY_EXTRA) == 400
            inst = task.instance(R.random.Random(f"retrieval:{hay.seed}:{name}:400:{depth}:1"), depth)
            assert inst.values == a.values and len(inst.needles) >= 1
            text = tokenizer.decode(a.ids[: a.question_start])
            cursor = 0
            for i in sorted(range(len(inst.needles)), key=lambda i: (inst.needles[i].depth, i)):
                cursor = text.find(inst.needles[i].text.strip(), cursor)
                assert cursor >= 0, (name, inst.needles[i].text, text)
                cursor += len(inst.needles[i].text.strip())
            target = tokenizer.decode(a.ids[a.target_start : a.question_start]).strip()
            assert target.startswith(inst.needles[0].text.strip())
            assert tokenizer.decode(a.answer_ids).strip() == ", ".join(a.values)
            assert task.parse(inst.answer) == a.values
            assert task.judge(task.parse(inst.answer), a.values) == (True, 1.0)
            assert task.judge([], a.values) == (False, 0.0)
    if cls.max_needles is not None:
        R.build_tasks([name], cls.max_needles)
        with pytest.raises(ConfigError, match=f"more than {name} can hold"):
            R.build_tasks([name], cls.max_needles + 1)


@pytest.mark.parametrize("name", R.task_names())
def test_every_registered_task_keeps_the_battery_contract(name, hay, tokenizer):
    check_task(name, hay, tokenizer)


def test_the_battery_order_is_the_registry_order():
    """The order results report (and `valid tasks are ...` lists): each task's
    battery_order, the built-in tasks first in the order they always had."""
    builtin = ["passkey", "multikey", "multivalue", "multiquery", "vartrack", "qa1", "qa2", "cwe", "fwe", "factqa"]
    assert R.task_names()[: len(builtin)] == builtin
    assert list(R.build_tasks(["cwe", "passkey"], 2)) == ["cwe", "passkey"]  # a request keeps its own order


def test_haystacks_are_corpus_text_not_filler(hay, tokenizer, tiny_cache):
    p = hay.build(R.Passkey(2), "passkey", 500, 0.5, sample=0)
    stream = [int(t) for t in tiny_cache.tokens("test")]
    head = p.ids[:50]
    assert any(stream[i : i + 50] == head for i in range(len(stream) - 50))
    assert "The grass is green" not in tokenizer.decode(p.ids)


def test_filler_haystacks_are_the_passkey_papers_sentences(tokenizer):
    stream = R.filler_stream(tokenizer, 700)
    assert len(stream) == R.FILLER_TOKENS and list(R.filler_stream(tokenizer, 5000)[:900]) == list(stream[:900])
    hay = R.Haystacks(tokenizer, stream, seed=5)
    p = hay.build(R.Passkey(2), "passkey", 600, 0.5, sample=0)
    text = tokenizer.decode(p.ids[: p.question_start])
    assert reread("passkey", text, "") == p.values
    # Everything but the needle is the five sentences, in their cycle.
    rest = re.sub(r"\s*The pass key is \d+\. Remember it\. \d+ is the pass key\.", "", text)
    words = set(re.findall(r"[A-Za-z]+", "".join(FILLER_SENTENCES)))
    assert set(re.findall(r"[A-Za-z]+", rest)[1:-1]) <= words  # the cut at either end may split a word
    assert "The grass is green." in rest and "There and back again." in rest


def test_a_tokenizer_that_puts_a_bos_before_a_text_gets_it_once_at_the_start(tokenizer):
    """Gemma's tokenizer adds <bos> to every text it encodes: encoded piece by piece, a prompt held one
    before every needle, the question and the answer, which no model predicts (0% everywhere)."""
    from tokenizers import Tokenizer
    from tokenizers.processors import TemplateProcessing

    from rope_lm.data.special_tokens import text_prefix
    from rope_lm.probes import passkey as P

    tok = Tokenizer.from_str(tokenizer.to_str())
    tok.add_special_tokens(["<bos>"])
    bos = tok.token_to_id("<bos>")
    tok.post_processor = TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", bos)])
    assert tok.encode("The grass").ids[0] == bos and text_prefix(tok) == [bos] and text_prefix(tokenizer) == []
    stream = R.filler_stream(tok, 700)
    assert bos not in stream.tolist()
    plain = R.Haystacks(tokenizer, R.filler_stream(tokenizer, 700), seed=5)
    for name, task in R.build_tasks(["passkey", "multikey"], 2).items():
        p, q = R.Haystacks(tok, stream, seed=5).build(task, name, 600, 0.5, 0), plain.build(task, name, 600, 0.5, 0)
        assert p.ids[0] == bos and (p.ids + p.answer_ids).count(bos) == 1 and len(p.ids) == len(q.ids)
        assert p.answer_ids == q.answer_ids and p.ids[p.question_start :] == q.ids[q.question_start :]
        assert tok.decode(p.ids[p.target_start : p.question_start]).startswith(
            tokenizer.decode(q.ids[q.target_start :])[:20]
        )
    key = P.build_prompt(tok, 400, 0.5, "12345")
    assert key.ids[0] == bos and key.ids.count(bos) == 1 and bos not in key.answer_ids
    assert tok.decode(key.ids[key.key_start :]).lstrip().startswith("The pass key is 12345")
    assert len(key.ids) == len(P.build_prompt(tokenizer, 400, 0.5, "12345").ids)


def test_too_short_and_bad_settings_are_refused(hay):
    with pytest.raises(ConfigError, match="too short"):
        hay.build(R.MultiQuery(4), "multiquery", 40, 0.5, 0)
    with pytest.raises(ConfigError, match="depth"):
        hay.build(R.Passkey(2), "passkey", 400, 1.5, 0)
    with pytest.raises(ConfigError, match="valid tasks are passkey, multikey"):
        R.build_tasks(["passkey", "haystack"], 4)
    with pytest.raises(ConfigError, match="needles=1"):
        R.build_tasks(["multikey"], 1)


def test_evaluate_refuses_before_the_first_forward_pass(hay, tokenizer, tiny_cache):
    def never(b, seen):
        raise AssertionError("the model ran before the settings were checked")

    model = Scripted(tokenizer.get_vocab_size(), never)
    with pytest.raises(ConfigError, match="too short"):  # the long length comes first; the short one is refused
        R.evaluate(model, tokenizer, tiny_cache.tokens("test"), R.build_tasks(["multiquery"], 4), [400, 40], [0.5], 1)
    with pytest.raises(ConfigError, match="fewer than one"):
        R.evaluate(model, tokenizer, tiny_cache.tokens("test")[:100], R.build_tasks(["passkey"], 2), [200], [0.5], 1)
    with pytest.raises(ConfigError, match="scoring='beam'"):
        R.evaluate(
            model, tokenizer, tiny_cache.tokens("test"), R.build_tasks(["passkey"], 2), [200], [0.5], 1, scoring="beam"
        )


# --- scoring on hand-made predictions ------------------------------------------------


class Scripted(SequenceModel):
    """Predicts, at every position, the token the script gives for the
    sequence so far: `answer(prompt_row, generated_so_far)`."""

    def __init__(self, vocab, answer):
        super().__init__(vocab)
        self.answer = answer

    def logits_of(self, rows):
        logits = torch.zeros(len(rows), len(rows[0]), self.cfg.vocab_size)
        for b, row in enumerate(rows):
            for t in range(len(row)):
                logits[b, t, self.answer(b, row[: t + 1])] = 1.0
        return logits


def test_teacher_forced_scoring(hay, tokenizer):
    # Different lengths in one batch: what numbers of different token counts give in a real cell.
    prompts = [hay.build(R.MultiValue(3), "multivalue", 300 + 7 * s, 0.5, s) for s in range(3)]
    assert len({len(p.ids) for p in prompts}) == 3

    def answer(b, seen):
        full = prompts[b].ids + prompts[b].answer_ids
        nxt = full[len(seen)] if len(seen) < len(full) else 0
        if b == 1 and len(seen) == len(prompts[1].ids) + 1:  # second prompt: its second answer token wrong
            return (nxt + 1) % tokenizer.get_vocab_size()
        return nxt

    model = Scripted(tokenizer.get_vocab_size(), answer)
    projected = []
    model.lm_head.register_forward_hook(lambda module, args, out: projected.append(args[0].shape[0]))
    verdicts = R.teacher_forced(model, prompts, "cpu")
    assert [v[0] for v in verdicts] == [True, False, True]
    k = len(prompts[1].answer_ids)
    assert verdicts[1][1] == pytest.approx((k - 1) / k) and verdicts[0][1] == 1.0
    # the head reads the answers' rows alone, never prompt x vocabulary (137 GB at 128k for Gemma 3's vocabulary)
    assert projected == [len(p.answer_ids) for p in prompts]


def test_greedy_scoring_parses_the_values(hay, tokenizer):
    task = R.MultiQuery(2)
    prompts = [hay.build(task, "multiquery", 300 + 5 * (s % 2), 0.0, s) for s in range(3)]
    texts = [
        " " + ",".join(prompts[0].values) + ".",  # right values, other spacing: correct
        " " + ", ".join(prompts[1].values[::-1]),  # wrong order
        " " + prompts[2].values[0] + " and nothing else",
    ]  # one of two
    outputs = [tokenizer.encode(t).ids for t in texts]

    which = {tuple(p.ids[:40]): i for i, p in enumerate(prompts)}  # greedy batches by length: rows reorder

    def answer(b, seen):
        if len(seen) < 40:  # inside the prompt: whatever
            return 0
        i = which[tuple(seen[:40])]
        done = len(seen) - len(prompts[i].ids)
        if done < 0:
            return 0
        return outputs[i][done] if done < len(outputs[i]) else tokenizer.encode(".").ids[0]

    verdicts = R.greedy(Scripted(tokenizer.get_vocab_size(), answer), prompts, task, tokenizer, "cpu")
    assert [v[0] for v in verdicts] == [True, False, False]
    assert [v[1] for v in verdicts] == [1.0, 0.0, 0.5]
    assert R.VariableTracking(2).parse(" ABCDE, FGHIJ and KLMNO") == ["ABCDE", "FGHIJ", "KLMNO"]


def test_evaluate_with_a_perfect_model_is_all_right(hay, tokenizer, tiny_cache):
    tasks = R.build_tasks(["passkey", "vartrack"], 2)
    seqs = {}
    # The model looks the prompt up among the ones the battery builds (same seed), then reads off the answer.
    for name, task in tasks.items():
        for L in (200, 300):
            for d in (0.0, 1.0):
                for s in range(2):
                    p = hay.build(task, name, L, d, s)
                    seqs[tuple(p.ids[:40])] = p.ids + p.answer_ids

    def answer(b, seen):
        if len(seen) < 40:  # inside the prompt: whatever
            return 0
        full = seqs[tuple(seen[:40])]
        return full[len(seen)] if len(seen) < len(full) else 0

    res = R.evaluate(
        Scripted(tokenizer.get_vocab_size(), answer),
        tokenizer,
        tiny_cache.tokens("test"),
        tasks,
        [200, 300],
        [0.0, 1.0],
        samples=2,
        seed=5,
        resamples=100,
    )
    for name in tasks:
        assert res[name]["accuracy"] == [[1.0, 1.0], [1.0, 1.0]]
        assert [r["accuracy"] for r in res[name]["by_length"]] == [1.0, 1.0]
    assert "| passkey | 100%" in R.summary_table(res, 100)


# --- the command line ----------------------------------------------------------------


def test_retrieval_script(tiny_cache, tiny_data_options, tmp_path):
    save_tiny_checkpoint(
        str(tmp_path / "run" / "checkpoints" / "last.ckpt"), tiny_cache, tiny_data_options, train_len=256
    )
    done = run_script(
        "retrieval.py",
        f"ckpt={tmp_path / 'run'}",
        "multipliers=[1,2]",
        "depths=[0,1]",
        "samples=2",
        "needles=2",
        "bootstrap=50",
        cwd=tmp_path,
    )
    out = tmp_path / "run" / "diagnostics" / "retrieval"
    result = json.load(open(out / "retrieval.json"))
    assert list(result["tasks"]) == R.task_names()
    for name, r in result["tasks"].items():
        assert r["lengths"] == [256, 512] and len(r["accuracy"]) == 2 and len(r["accuracy"][0]) == 2
        assert (out / f"retrieval_{name}.png").stat().st_size > 0
    assert "| vartrack |" in done.stdout and (out / "retrieval.md").exists()


def test_a_run_goes_on_from_its_cells(tiny_cache, tiny_data_options, tmp_path):
    save_tiny_checkpoint(
        str(tmp_path / "run" / "checkpoints" / "last.ckpt"), tiny_cache, tiny_data_options, train_len=256
    )
    common = [
        f"ckpt={tmp_path / 'run'}",
        "tasks=[passkey,vartrack]",
        "depths=[0,1]",
        "samples=2",
        "needles=2",
        "bootstrap=50",
    ]
    whole = tmp_path / "whole"
    run_script("retrieval.py", *common, "multipliers=[1,2]", f"out={whole}", cwd=tmp_path)
    part = tmp_path / "part"
    run_script("retrieval.py", *common, "multipliers=[1]", f"out={part}", cwd=tmp_path)
    # A run killed mid-write leaves a cut line; the next run ignores it and scores that cell again.
    with open(part / "cells.jsonl", "a") as f:
        f.write('{"task": "passkey", "len')
    done = run_script("retrieval.py", *common, "multipliers=[1,2]", f"out={part}", "existing=continue", cwd=tmp_path)
    assert "4 cell(s) scored before" in done.stderr
    scored_now = [line for line in done.stderr.splitlines() if "depth" in line and "accuracy" in line]
    assert len(scored_now) == 4 and all("length 512" in line for line in scored_now)
    assert json.load(open(part / "retrieval.json"))["tasks"] == json.load(open(whole / "retrieval.json"))["tasks"]
    # Other settings are refused before any forward pass, naming what differs.
    done = run_script(
        "retrieval.py",
        *common[:-2],
        "needles=3",
        "bootstrap=50",
        "multipliers=[1,2]",
        f"out={part}",
        "existing=continue",
        status=2,
        cwd=tmp_path,
    )
    assert_one_paragraph(done, "other settings (needles")
    # A rerun into a battery's folder without existing=continue is refused, naming the way to finish it.
    done = run_script("retrieval.py", *common, "multipliers=[1]", f"out={part}", status=2, cwd=tmp_path)
    assert_one_paragraph(done, "Add existing=continue")


def test_retrieval_script_refuses_a_bad_task(tmp_path):
    done = run_script("retrieval.py", "ckpt=nowhere", "tasks=[passkey,needle]", status=2, cwd=tmp_path)
    assert_one_paragraph(done, "valid tasks are passkey, multikey")
    done = run_script("retrieval.py", "ckpt=nowhere", "haystack=grass", status=2, cwd=tmp_path)
    assert_one_paragraph(done, "must be corpus")
