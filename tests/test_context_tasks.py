"""The battery's reasoning tasks (qa1, qa2, cwe, fwe, factqa), their training
mix and the effective length: every prompt is exactly as long as asked and
deterministic, its answer is recomputed from the prompt's text by an
independent reading (a story simulated, words counted), distractors are
there; the retrieval_mix corpus writes the same format with the right
answers; effective lengths from hand-made score tables; greedy judging of
words in any order; the script end to end on a tiny checkpoint, its
effective lengths in retrieval.json / retrieval.md and a compare.py row."""

from collections import Counter
import json
import os
import re
import sys

import pytest

from rope_lm.core.errors import ConfigError
from rope_lm.data.corpus import SourceConfig, load_documents
from rope_lm.probes import retrieval as R
from tests import forked
from tests.conftest import ROOT
from tests.test_diagnostics import assert_one_paragraph, save_tiny_checkpoint
from tests.test_retrieval import LOOKUPS, Scripted, hay, tokenizer  # noqa: F401 (hay, tokenizer: the battery tests' fixtures)

NEW = ["qa1", "qa2", "cwe", "fwe", "factqa"]
MOVE = r"(\w+) (?:went|moved|travelled|journeyed) to the (\w+)\."
TAKE = r"(\w+) (?:picked up|grabbed|took|got) the (\w+)\."
FACT_QUESTIONS = [
    (r"Where does (\w+) live\?", r"{p} lives in (\w+)\."),
    (r"What is (\w+)'s job\?", r"{p} works as a (\w+)\."),
    (r"What is (\w+)'s favourite colour\?", r"{p}'s favourite colour is (\w+)\."),
    (r"What pet does (\w+) keep\?", r"{p} keeps a (\w+) as a pet\."),
]


def _top(counts: Counter, k: int) -> list[str]:
    """The k most frequent, checked to be more frequent than every other."""
    ranked = counts.most_common()
    assert len(ranked) > k and ranked[k - 1][1] > ranked[k][1], ranked
    return [w for w, _ in ranked[:k]]


def reread(name: str, text: str, question: str) -> list[str]:
    """The answer a reader finds in the text before the question, without the generator's bookkeeping."""
    if name == "qa1":
        who = re.search(r"Where is (\w+)\?", question).group(1)
        return [[room for person, room in re.findall(MOVE, text) if person == who][-1]]
    if name == "qa2":
        thing = re.search(r"Where is the (\w+)\?", question).group(1)
        where, holder = {}, {}
        for m in re.finditer(f"{MOVE}|{TAKE}", text):  # the story in order: who is where, who holds what
            if m.group(1):
                where[m.group(1)] = m.group(2)
            else:
                holder[m.group(4)] = m.group(3)
        return [where[holder[thing]]]
    if name == "cwe":
        k = int(re.search(r"Which (\d+) words", question).group(1))
        listed = re.findall(r"Word: (\w+)\.", text)
        common = set(_top(Counter(listed), k))
        return list(dict.fromkeys(w for w in listed if w in common))  # in order of first mention
    if name == "fwe":
        k = int(re.search(r"Which (\d+) codes", question).group(1))
        counts = Counter(re.findall(r"Code: ([a-z]{4})\.", text))
        top = _top(counts, k)
        assert len({counts[w] for w in top}) == k  # a strict ranking: one right order
        return top
    for asked, fact in FACT_QUESTIONS:
        m = re.search(asked, question)
        if m:
            found = re.findall(fact.format(p=m.group(1)), text)
            assert len(found) == 1, found
            return found
    raise AssertionError(f"no question of {name} in {question!r}")


def distractors(name: str, text: str, question: str, values: list[str]) -> bool:
    """Something in the text that a careless reader would answer with."""
    if name == "qa1":
        who = re.search(r"Where is (\w+)\?", question).group(1)
        moves = re.findall(MOVE, text)
        return len(moves) > len([m for m in moves if m[0] == who]) and (
            len({room for person, room in moves if person == who}) > 1 or moves[-1][0] != who
        )
    if name == "qa2":
        return len(re.findall(TAKE, text)) > 1 or len(re.findall(MOVE, text)) > 1
    if name in ("cwe", "fwe"):
        listed = re.findall(r"(?:Word|Code): (\w+)\.", text)
        return len(set(listed) - set(values)) >= 2
    facts = re.findall(r"(Sandra|Mary|John|Daniel|Emma|Oliver|Lucas|Sofia)(?:'s| )", text)
    return len(facts) >= 3


def test_every_registered_task_has_an_independent_reading():
    """Every task keeps the battery's contract (tests/test_retrieval.py, registry-wide); this list is the one
    deliberate edit a new task needs: add it to LOOKUPS (tests/test_retrieval.py) or NEW here, with a reading
    of its answer from the prompt's text that does not use the generator (`reread`)."""
    assert R.task_names() == LOOKUPS + NEW


@pytest.mark.parametrize("name", NEW)
@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_prompts_are_exact_deterministic_and_answerable(name, depth, hay, tokenizer):
    for needles, length in ((3, 400), (4, 300)):
        task = R.RETRIEVAL_TASKS.get(name)(needles)
        for sample in range(3):
            a = hay.build(task, name, length, depth, sample=sample)
            assert a == hay.build(task, name, length, depth, sample=sample)
            room = max(R.P.ANSWER_ROOM, len(a.answer_ids) + R.GREEDY_EXTRA)
            assert len(a.ids) + room == length
            text, question = tokenizer.decode(a.ids[: a.question_start]), tokenizer.decode(a.ids[a.question_start :])
            assert reread(name, text, question) == a.values
            assert distractors(name, text, question, a.values)
            assert tokenizer.decode(a.answer_ids).strip() == ", ".join(a.values)
            target = tokenizer.decode(a.ids[a.target_start : a.target_start + 30])
            assert re.match(
                r"\s*(\w+ (went|moved|travelled|journeyed|picked|grabbed|took|got)|Word|Code|\w+('s)? "
                r"(lives|works|favourite|keeps))",
                target,
            ), target
        assert a.ids != hay.build(task, name, length, depth, sample=5).ids


def test_the_target_sits_at_its_depth_and_the_story_keeps_its_order(hay, tokenizer):
    for name in NEW:
        for depth in (0.0, 0.25, 0.75, 1.0):
            p = hay.build(R.RETRIEVAL_TASKS.get(name)(4), name, 700, depth, sample=1)
            at = round(depth * p.fill)
            assert at <= p.target_offset <= at + 13 * hay.snap  # moved past needles placed at the same depth
    # qa2: the pick-up (the target) comes before the carrier's move that answers
    p = hay.build(R.TwoFacts(4), "qa2", 400, 1.0, sample=0)
    tail = tokenizer.decode(p.ids[p.target_start : p.question_start])
    assert re.match(rf"\s*{TAKE}", tail) and re.search(MOVE, tail)


def test_training_examples_have_the_battery_format(tiny_corpus):
    cfg = SourceConfig(
        source="retrieval_mix",
        valid_fraction=0.2,
        test_fraction=0.2,
        extra={"base": tiny_corpus, "examples": 25, "max_chars": 300, "seed": 3},
    )
    docs = load_documents(cfg)
    assert load_documents(cfg) == docs  # deterministic
    questions = {
        "qa1": r" Where is \w+\? \w+ is in the",
        "qa2": r" Where is the \w+\? The \w+ is in the",
        "cwe": r" Which 3 words are listed most often\? In order of first mention, they are",
        "fwe": r" Which 3 codes are listed most often\? From most to least often, they are",
        "factqa": "|".join(r" " + q + " " + f.split(r" (\w+)")[0].replace("{p}", r"\w+") for q, f in FACT_QUESTIONS),
    }
    found = Counter()
    for doc in (d for split in ("train", "valid") for d in docs[split]):
        for name, q in questions.items():
            m = re.search(f"({q}) (?P<answer>.+)\\.$", doc)
            if m:
                text, question = doc[: m.start()], m.group(1)
                assert reread(name, text, question) == m.group("answer").split(", "), doc
                found[name] += 1
    assert sum(found.values()) == 25 + 5 and set(found) == set(NEW)  # every example read, every task taking turns
    assert not any(re.search(r"(Word|Code): \w+\.", d) for d in docs["test"])  # the battery's haystacks stay clean
    alone = load_documents(
        SourceConfig(
            source="retrieval_mix",
            valid_fraction=0.2,
            test_fraction=0.2,
            extra={"base": "none", "examples": 10, "tasks": ["qa1", "multikey"]},
        )
    )
    assert {s: len(d) for s, d in alone.items()} == {"train": 10, "valid": 2, "test": 2}
    assert sum("magic number" in d for d in alone["train"]) == 5


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"bogus": 1}, "data.extra.bogus"),
        ({"tasks": ["qa1", "qa9"]}, "data.extra.tasks=['qa1', 'qa9']: qa9; valid tasks are passkey"),
        ({"tasks": "qa1"}, "data.extra.tasks='qa1' must be a list"),
        ({"needles": 1}, "data.extra.needles=1 must be a whole number of at least 2"),
        ({"needles": 40, "tasks": ["cwe"]}, "data.extra.needles= must be between 2 and 27"),
        ({"min_chars": 50, "max_chars": 10}, "data.extra.min_chars=50 is larger"),
    ],
)
def test_bad_mix_settings_are_one_paragraph(extra, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_documents(SourceConfig(source="retrieval_mix", extra=extra))


def test_greedy_judges_words_in_any_order_for_aggregation():
    cwe, qa1 = R.CommonWords(4), R.SingleFact(4)
    assert cwe.judge(["river", "apple", "candle"], ["apple", "river", "candle"]) == (True, 1.0)
    assert cwe.judge(["apple", "apple", "river", "meadow"], ["apple", "river", "candle"]) == (False, 2 / 3)
    assert cwe.judge(["meadow", "apple", "river", "candle"], ["apple", "river", "candle"]) == (False, 2 / 3)
    assert qa1.judge(["garden"], ["garden"]) == (True, 1.0)
    assert qa1.parse(" the garden. Then the kitchen") == ["garden", "kitchen"]
    assert R.FrequentWords(2).parse(" abcd, efgh and ijkl.") == ["abcd", "efgh", "ijkl"]


# --- effective length from hand-made tables ------------------------------------------

LENGTHS = [128, 256, 512, 1024, 2048]


@pytest.mark.parametrize(
    "scores, length, at_least, label",
    [
        ([0.9, 0.8, 0.6, 0.4, 0.1], 512, False, "512 (4×)"),  # falls below past 4x
        ([0.4, 0.9, 0.9, 0.9, 0.9], None, False, "<128"),  # not above at the shortest: nothing
        ([0.3, 0.2, 0.1, 0.0, 0.0], None, False, "<128"),  # never above
        ([0.9, 0.9, 0.8, 0.7, 0.6], 2048, True, "≥2048 (16×)"),  # above at every length: at least the longest
        ([0.9, 0.3, 0.8, 0.7, 0.2], 128, False, "128 (1×)"),  # a dip, then recovery: the dip ends it
        ([0.9, 0.5, 0.9, 0.9, 0.9], 128, False, "128 (1×)"),  # exactly at the bar is not above it
    ],
)
def test_effective_length_by_hand(scores, length, at_least, label):
    e = R.effective_length(LENGTHS, scores, 0.5)
    assert (e["length"], e["at_least"]) == (length, at_least)
    assert R.effective_label(e, train_len=128) == label
    assert e["lengths_above"] == [L for L, s in zip(LENGTHS, scores) if s > 0.5]
    assert R.effective_length(LENGTHS[::-1], scores[::-1], 0.5) == e  # lengths in any order


def _results(table: dict[str, list[float]]) -> dict:
    return {
        name: {"lengths": LENGTHS, "by_length": [{"length": L, "accuracy": a} for L, a in zip(LENGTHS, scores)]}
        for name, scores in table.items()
    }


def test_effective_length_of_tasks_their_mean_and_a_relative_bar():
    results = _results({"qa1": [1.0, 0.9, 0.6, 0.3, 0.0], "cwe": [0.6, 0.5, 0.2, 0.0, 0.0]})
    summary = R.add_effective(results, 0.5, train_len=128)
    assert results["qa1"]["effective"]["length"] == 512 and results["cwe"]["effective"]["length"] == 128
    assert summary["mean"]["accuracy"] == pytest.approx([0.8, 0.7, 0.4, 0.15, 0.0])
    assert summary["mean"]["length"] == 256 and summary["threshold"] == 0.5 and summary["relative"] is False
    # Relative: 0.8 x the task's own accuracy at L (cwe: 0.48, so 256's 0.5 is above it; qa1: 0.8).
    summary = R.add_effective(results, 0.8, relative=True, train_len=128)
    assert results["qa1"]["effective"]["bar"] == pytest.approx(0.8) and results["qa1"]["effective"]["length"] == 256
    assert results["cwe"]["effective"]["bar"] == pytest.approx(0.48) and results["cwe"]["effective"]["length"] == 256
    assert results["cwe"]["effective"]["reference_length"] == 128
    table = R.summary_table(
        {n: dict(r, by_length=[dict(row, accuracy_lo=None) for row in r["by_length"]]) for n, r in results.items()},
        128,
        summary,
    )
    assert "| effective length |" in table.splitlines()[0]
    assert "| mean of tasks | 80% | 70% | 40% | 15% | 0% | 256 (2×) |" in table


@pytest.mark.parametrize(
    "threshold, relative, message",
    [
        (1.0, False, "effective.threshold=1.0 must be an accuracy within [0, 1)"),
        (-0.1, False, "effective.threshold=-0.1 must be an accuracy"),
        ("high", False, "effective.threshold='high'"),
        (0.0, True, "with effective.relative=true must be a fraction within (0, 1)"),
        (0.5, "yes", "effective.relative='yes' must be true or false"),
    ],
)
def test_bad_thresholds_are_refused(threshold, relative, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        R.check_threshold(threshold, relative)


def test_a_model_right_only_within_its_reach_gets_that_effective_length(hay, tokenizer, tiny_cache):
    """A perfect reader up to 350 tokens and a wrong one beyond: effective length 350 for every task."""
    tasks = R.build_tasks(NEW, 2)
    seqs = {}
    for name, task in tasks.items():
        for L in (250, 350, 450):
            for d in (0.0, 1.0):
                for s in range(2):
                    p = hay.build(task, name, L, d, s)
                    seqs[tuple(p.ids[:40])] = p.ids + p.answer_ids

    def answer(b, seen):
        if len(seen) < 40:
            return 0
        full = seqs[tuple(seen[:40])]
        right = full[len(seen)] if len(seen) < len(full) else 0
        return right if len(full) <= 350 else (right + 1) % tokenizer.get_vocab_size()

    res = R.evaluate(
        Scripted(tokenizer.get_vocab_size(), answer),
        tokenizer,
        tiny_cache.tokens("test"),
        tasks,
        [250, 350, 450],
        [0.0, 1.0],
        samples=2,
        seed=5,
        resamples=0,
    )
    summary = R.add_effective(res, train_len=250)
    for name in NEW:
        assert [row["accuracy"] for row in res[name]["by_length"]] == [1.0, 1.0, 0.0]
        assert res[name]["effective"]["length"] == 350
    assert summary["mean"]["length"] == 350


# --- the command line ----------------------------------------------------------------


def run(script, *args, status=0, cwd=None):
    done = forked.run(
        [sys.executable, os.path.join(ROOT, "scripts", script), *map(str, args)],
        cwd=cwd or ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == status, done.stderr[-3000:]
    return done


def test_retrieval_script_reports_effective_lengths_and_compare_tabulates_them(tiny_cache, tiny_data_options, tmp_path):
    save_tiny_checkpoint(
        str(tmp_path / "run" / "checkpoints" / "last.ckpt"), tiny_cache, tiny_data_options, train_len=256
    )
    done = run(
        "retrieval.py",
        f"ckpt={tmp_path / 'run'}",
        f"tasks=[{','.join(NEW)}]",
        "multipliers=[1,2]",
        "depths=[0,1]",
        "samples=2",
        "needles=2",
        "bootstrap=0",
        "effective.threshold=0.25",
        cwd=tmp_path,
    )
    out = tmp_path / "run" / "diagnostics" / "retrieval"
    result = json.load(open(out / "retrieval.json"))
    assert list(result["tasks"]) == NEW
    assert result["effective"]["threshold"] == 0.25 and result["effective"]["relative"] is False
    for name, r in result["tasks"].items():
        e, acc = r["effective"], [row["accuracy"] for row in r["by_length"]]
        assert e == R.effective_length([256, 512], acc, 0.25)  # recomputable from the stored accuracies
        assert (out / f"retrieval_{name}.png").stat().st_size > 0
    md = (out / "retrieval.md").read_text()
    assert "| effective length |" in md and "| mean of tasks |" in md and "stays above 25% (RULER" in md
    assert "| qa1 |" in done.stdout

    done = run("compare.py", f"path={tmp_path / 'run'}", cwd=tmp_path)
    table = (tmp_path / "run" / "compare" / "compare_retrieval.md").read_text()
    row = next(line for line in table.splitlines() if line.startswith("| rope"))
    labels = [R.effective_label(result["tasks"][n]["effective"], 256) for n in NEW]
    assert (
        row == f"| rope | 256 | teacher | 25% | {' | '.join(labels)} | "
        f"{R.effective_label(result['effective']['mean'], 256)} |"
    )
    assert "| qa1 | qa2 | cwe | fwe | factqa | mean of tasks |" in table and row in done.stdout
    assert (tmp_path / "run" / "compare" / "compare_retrieval.csv").read_text().count("\n") == 1 + len(NEW) + 1


def test_retrieval_script_refuses_a_bad_threshold_before_loading(tmp_path):
    done = run("retrieval.py", "ckpt=nowhere", "effective.threshold=2", status=2, cwd=tmp_path)
    assert_one_paragraph(done, "effective.threshold=2 must be an accuracy within [0, 1)")
