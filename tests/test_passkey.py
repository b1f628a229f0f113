"""Passkey retrieval: deterministic prompts of exact length, answer parsing,
accuracy with an oracle and a wrong model, the data=passkey corpus source."""

import json
import os

import pytest
import torch

from rope_lm.core.errors import ConfigError
from rope_lm.data.corpus import SourceConfig, load_documents
from rope_lm.probes import passkey as P
from tests.scripted import SequenceModel
from tests.test_diagnostics import run_script, save_tiny_checkpoint


@pytest.fixture(scope="module")
def tokenizer(tiny_cache):
    return tiny_cache.tokenizer()


def test_prompts_are_deterministic_and_exact(tokenizer):
    a = P.prompts(tokenizer, 120, 0.5, 4, seed=3)
    b = P.prompts(tokenizer, 120, 0.5, 4, seed=3)
    assert [p.ids for p in a] == [p.ids for p in b] and [p.key for p in a] == [p.key for p in b]
    assert [p.key for p in P.prompts(tokenizer, 120, 0.5, 4, seed=4)] != [p.key for p in a]
    assert len({p.key for p in a}) == 4 and all(len(p.key) == 5 and p.key.isdigit() for p in a)
    for p in a:
        assert len(p.ids) == 120 - P.ANSWER_ROOM
        text = tokenizer.decode(p.ids)
        assert P.KEY_SENTENCE.format(key=p.key) in text and text.endswith(P.QUESTION)
        assert tokenizer.decode(p.answer_ids) == P.ANSWER.format(key=p.key)


def test_depth_places_the_key(tokenizer):
    key = "12345"
    key_ids = tokenizer.encode(P.KEY_SENTENCE.format(key=key)).ids
    question = tokenizer.encode(P.QUESTION).ids
    first = P.build_prompt(tokenizer, 200, 0.0, key)
    last = P.build_prompt(tokenizer, 200, 1.0, key)
    middle = P.build_prompt(tokenizer, 200, 0.5, key)
    assert first.key_start == 0 and first.ids[: len(key_ids)] == key_ids
    assert last.ids[-len(question) - len(key_ids) : -len(question)] == key_ids
    n_fill = len(middle.ids) - len(key_ids) - len(question)
    assert middle.key_start == round(0.5 * n_fill)
    with_instructions = P.build_prompt(tokenizer, 200, 0.0, key, instructions=True)
    assert tokenizer.decode(with_instructions.ids).startswith(P.INSTRUCTIONS)


def test_bad_prompt_settings(tokenizer):
    with pytest.raises(ConfigError, match="too short"):
        P.build_prompt(tokenizer, 20, 0.5, "12345")
    with pytest.raises(ConfigError, match="depth"):
        P.build_prompt(tokenizer, 200, 1.5, "12345")
    assert P.min_length(tokenizer) <= 120 < P.min_length(tokenizer) + 120


@pytest.mark.parametrize(
    "text, answer",
    [
        (" 71432.", "71432"),
        ("71432 is it", "71432"),
        (" 7143 2", "7143"),
        (" 714321", "714321"),
        (" the key", None),
        ("", None),
        (" x9y", "9"),
    ],
)
def test_parse_answer(text, answer):
    assert P.parse_answer(text) == answer


class Oracle(SequenceModel):
    """Reads the key out of the prompt and emits its tokens, then '.'; or, if
    wrong=True, always emits the first key token only."""

    def __init__(self, tokenizer, wrong=False):
        super().__init__(tokenizer.get_vocab_size())
        self.marker = tokenizer.encode(" The pass key is").ids
        self.question = tokenizer.encode(P.QUESTION).ids
        self.dot = tokenizer.encode(".").ids[0]
        self.wrong = wrong

    @staticmethod
    def _find(row, pattern, last=False):
        hits = [i for i in range(len(row) - len(pattern) + 1) if row[i : i + len(pattern)] == pattern]
        return hits[-1] if last else hits[0]

    def logits_of(self, rows):
        logits = torch.zeros(len(rows), len(rows[0]), self.cfg.vocab_size)
        for b, row in enumerate(rows):
            start = self._find(row, self.marker) + len(self.marker)
            key = row[start : row.index(self.dot, start)]
            done = len(row) - (self._find(row, self.question, last=True) + len(self.question))
            nxt = key[0] if self.wrong else (key[done] if done < len(key) else self.dot)
            logits[b, -1, nxt] = 1.0
        return logits


def test_accuracy_of_oracle_and_wrong_model(tokenizer):
    good = P.evaluate_passkey(Oracle(tokenizer), tokenizer, [100, 140], [0.0, 0.5, 1.0], samples=3, seed=1)
    assert good["accuracy"] == [[1.0] * 3] * 2
    cell = good["cells"][0]
    assert all(e["correct"] and e["answer"] == e["key"] and e["token_accuracy"] == 1.0 for e in cell["examples"])
    bad = P.evaluate_passkey(Oracle(tokenizer, wrong=True), tokenizer, [100], [0.5], samples=3, seed=1)
    assert bad["accuracy"] == [[0.0]]
    assert 0 < bad["cells"][0]["token_accuracy"] < 1  # the first token still matches


def test_passkey_corpus_source(tiny_corpus):
    cfg = SourceConfig(
        source="passkey",
        valid_fraction=0.2,
        test_fraction=0.2,
        extra={"base": "none", "examples": 10, "max_filler": 3, "seed": 7},
    )
    docs = load_documents(cfg)
    assert {s: len(d) for s, d in docs.items()} == {"train": 10, "valid": 2, "test": 2}
    assert load_documents(cfg) == docs  # deterministic
    for doc in docs["train"]:
        answer = P.parse_answer(doc.rsplit(P.QUESTION, 1)[1])
        assert P.KEY_SENTENCE.format(key=answer).strip() in doc
    mixed = load_documents(
        SourceConfig(
            source="passkey",
            path=None,
            valid_fraction=0.2,
            test_fraction=0.2,
            extra={"base": tiny_corpus, "examples": 20},
        )
    )
    assert sum(P.QUESTION in d for d in mixed["train"]) == 20 and sum(P.QUESTION not in d for d in mixed["train"]) > 0
    assert P.QUESTION not in mixed["train"][0]  # interleaved, not appended as a block
    with pytest.raises(ConfigError, match="data.extra.bogus"):
        load_documents(SourceConfig(source="passkey", extra={"bogus": 1}))
    with pytest.raises(ConfigError, match="min_filler"):
        load_documents(SourceConfig(source="passkey", extra={"min_filler": 5, "max_filler": 2}))


def test_passkey_script(tiny_cache, tiny_data_options, tmp_path):
    ckpt = save_tiny_checkpoint(
        str(tmp_path / "run" / "checkpoints" / "last.ckpt"), tiny_cache, tiny_data_options, train_len=128
    )
    done = run_script(
        "passkey.py", f"ckpt={tmp_path / 'run'}", "multipliers=[1,2]", "depths=[0,1]", "samples=2", cwd=tmp_path
    )
    # Per-cell progress as eval_extrapolation.py logs: `[rope_lm] ...` on stderr; stdout holds the table alone.
    assert "[rope_lm] passkey length 128 depth 0: accuracy" in done.stderr
    assert "passkey length" not in done.stdout and "HYDRA" not in done.stdout + done.stderr
    out = tmp_path / "run" / "diagnostics" / "passkey"
    result = json.load(open(out / "passkey.json"))
    assert result["lengths"] == [128, 256] and len(result["accuracy"]) == 2 and len(result["accuracy"][0]) == 2
    assert result["checkpoint"] == os.path.relpath(ckpt, tmp_path)  # relative to where it ran: no home folder
    assert (out / "passkey.png").stat().st_size > 0
