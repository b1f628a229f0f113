"""Corpus reading, splits, the token cache (reuse, invalidation, integrity)."""

import json
import logging
import os

import numpy as np
import pytest

from rope_lm.core.errors import ConfigError
from rope_lm.data.corpus import (
    SPLIT_BITS,
    SPLITS,
    SourceConfig,
    _stable_hash,
    load_documents,
    split_by_hash,
    stdlib_dir,
)
from rope_lm.data.loaders import StepSampler, TokenWindows
from rope_lm.data.split import split_data  # noqa: E402
from rope_lm.data.token_cache import prepare
from tests.conftest import write_corpus


def _prepare(options, **changes):
    data, source = split_data({**options, **changes})
    return prepare(data, source)


def test_stdlib_corpus_is_the_interpreters_own_source_without_tests():
    docs = load_documents(SourceConfig(source="stdlib", valid_fraction=0.05, test_fraction=0.05))
    n = sum(len(v) for v in docs.values())
    with open(os.path.join(stdlib_dir(), "textwrap.py"), encoding="utf-8") as f:
        textwrap_src = f.read()
    assert any(d == textwrap_src for split in docs.values() for d in split)
    assert n > 300
    all_docs = [d for v in docs.values() for d in v]
    # site-packages and test suites are excluded
    with open(os.path.join(stdlib_dir(), "unittest", "test", "__init__.py"), encoding="utf-8") as f:
        excluded = f.read()
    assert not any(d == excluded and len(d) > 200 for d in all_docs) or len(excluded) < 200
    assert len(docs["test"]) >= 0.03 * n and len(docs["valid"]) >= 0.03 * n
    again = load_documents(SourceConfig(source="stdlib", valid_fraction=0.05, test_fraction=0.05))
    assert again == docs  # deterministic order and split


def assign_splits(keys: list[str], valid_fraction: float, test_fraction: float) -> dict[str, list[int]]:
    """split -> indices of the keys the hash split puts there, as load_documents splits files."""
    masks = split_by_hash(np.array([_stable_hash(k) for k in keys], dtype=np.uint64), valid_fraction, test_fraction)
    return {s: np.flatnonzero(masks & SPLIT_BITS[s]).tolist() for s in SPLITS}


def test_hash_split_is_stable_and_never_empty():
    keys = [f"file{i}.py" for i in range(40)]
    a = assign_splits(keys, 0.1, 0.1)
    b = assign_splits(list(reversed(keys)), 0.1, 0.1)
    assert {keys[i] for i in a["test"]} == {list(reversed(keys))[i] for i in b["test"]}
    assert len(a["test"]) == 4 and len(a["valid"]) == 4 and len(a["train"]) == 32
    small = assign_splits(["a", "b", "c"], 0.05, 0.05)
    assert len(small["test"]) == 1 and len(small["valid"]) == 1 and len(small["train"]) == 1


def test_files_named_by_split_keep_their_split_and_doc_start_splits_articles(tmp_path):
    for split in ("train", "valid", "test"):
        (tmp_path / f"{split}.txt").write_text(
            f" = First {split} = \n text one \n = = Sub = = \n more \n = Second {split} = \n text two \n"
        )
    docs = load_documents(SourceConfig(source="files", path=str(tmp_path), doc_start=" = [^=].* = $"))
    assert [len(docs[s]) for s in ("train", "valid", "test")] == [2, 2, 2]
    assert docs["test"][0].startswith(" = First test = ") and "= = Sub = =" in docs["test"][0]


def test_jsonl_and_parquet_rows_are_documents(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"text": f"document number {i} " * 5} for i in range(30)]
    with open(tmp_path / "a.jsonl", "w") as f:
        f.write("\n".join(json.dumps(r) for r in rows))
    pq.write_table(pa.table({"text": [r["text"] for r in rows]}), tmp_path / "b.parquet")
    docs = load_documents(SourceConfig(source="files", path=str(tmp_path), valid_fraction=0.1, test_fraction=0.1))
    assert sum(len(v) for v in docs.values()) == 60


def test_hub_loading_path_on_local_files(tmp_path, monkeypatch):
    """The real datasets.load_dataset code path, pointed at a local dataset folder."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    ds_dir = tmp_path / "my_dataset"
    ds_dir.mkdir()
    for split, n in (("train", 20), ("validation", 4), ("test", 4)):
        with open(ds_dir / f"{split}.jsonl", "w") as f:
            f.write("\n".join(json.dumps({"body": f"{split} text {i} " * 10}) for i in range(n)))
    docs = load_documents(SourceConfig(source="hub", hf_name=str(ds_dir), text_field="body"))
    assert [len(docs[s]) for s in ("train", "valid", "test")] == [20, 4, 4]
    assert docs["valid"][0].startswith("validation text 0")
    with pytest.raises(ConfigError, match="text_field"):
        load_documents(SourceConfig(source="hub", hf_name=str(ds_dir), text_field="missing"))


def test_cache_is_reused_and_rebuilt_when_source_or_tokenizer_change(tiny_data_options, tmp_path, caplog):
    corpus = write_corpus(tmp_path / "corpus")
    opts = {**tiny_data_options, "path": corpus, "cache_dir": str(tmp_path / "cache")}
    first = _prepare(opts)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="rope_lm.data.loaders"):
        second = _prepare(opts)
    assert second.dir == first.dir and "Reusing token cache" in caplog.text
    assert _prepare(opts, vocab_size=300).dir != first.dir  # tokenizer setting changed
    with open(os.path.join(corpus, "heapq.txt"), "a") as f:
        f.write("\n# one more line\n")
    assert _prepare(opts).dir != first.dir  # source changed


def test_cache_contents_and_document_boundaries(tiny_cache):
    tok = tiny_cache.tokenizer()
    for split in ("train", "valid", "test"):
        tokens, starts = tiny_cache.tokens(split), tiny_cache.doc_starts(split)
        assert starts[0] == 0 and len(tokens) == tiny_cache.meta["tokens"][split]
        # every document ends with the end-of-text token, right before the next start
        assert all(tokens[s - 1] == tiny_cache.eos_id for s in starts[1:])
        assert tokens[-1] == tiny_cache.eos_id
    first_doc = (
        tiny_cache.tokens("test")[: tiny_cache.doc_starts("test")[1] - 1]
        if len(tiny_cache.doc_starts("test")) > 1
        else tiny_cache.tokens("test")[:-1]
    )
    assert "def " in tok.decode(list(map(int, first_doc)))  # round-trips to the source text


def test_damaged_cache_is_detected_and_rebuilt(tiny_data_options, tmp_path, caplog):
    opts = {**tiny_data_options, "cache_dir": str(tmp_path / "cache")}
    cache = _prepare(opts)
    path = os.path.join(cache.dir, "train.bin")
    good = np.array(cache.tokens("train"))
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    with caplog.at_level(logging.WARNING, logger="rope_lm.data.loaders"):
        rebuilt = _prepare(opts)
    assert "damaged" in caplog.text and np.array_equal(np.array(rebuilt.tokens("train")), good)
    # same size, flipped bytes: caught by the checksum
    with open(path, "r+b") as f:
        f.seek(10)
        f.write(b"\xff\xff")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rope_lm.data.loaders"):
        rebuilt = _prepare(opts)
    assert "checksum" in caplog.text and np.array_equal(np.array(rebuilt.tokens("train")), good)
    os.remove(os.path.join(cache.dir, "tokenizer.json"))
    assert _prepare(opts).tokenizer() is not None


def test_windows_and_sampler_order_is_a_function_of_the_sample_index():
    tokens = np.arange(101, dtype=np.uint16)
    w = TokenWindows(tokens, 10)
    assert len(w) == 10
    x, y = w[3]
    assert x.tolist() == list(range(30, 40)) and y.tolist() == list(range(31, 41))
    full = list(StepSampler(10, seed=3, total=35))
    assert sorted(full[:10]) == list(range(10)) and full[:10] != full[10:20]
    assert list(StepSampler(10, seed=3, total=35, start=17)) == full[17:]
    ranks = [list(StepSampler(10, 3, 36, start=0, rank=r, world=2)) for r in (0, 1)]
    assert [v for pair in zip(*ranks) for v in pair] == list(StepSampler(10, 3, 36))


def test_too_small_vocab_and_bad_paths_are_refused(tiny_data_options, tmp_path):
    with pytest.raises(ConfigError, match="at least 257"):
        _prepare(tiny_data_options, vocab_size=200)
    with pytest.raises(ConfigError, match="does not exist"):
        _prepare(tiny_data_options, path=str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "a.txt").write_text("   \n")
    with pytest.raises(ConfigError, match="empty"):
        _prepare(tiny_data_options, path=str(tmp_path / "empty"))
    (tmp_path / "latin").mkdir()
    (tmp_path / "latin" / "a.txt").write_bytes("caf\xe9 ".encode("latin-1") * 10)
    with pytest.raises(ConfigError, match="not valid UTF-8"):
        _prepare(tiny_data_options, path=str(tmp_path / "latin"))
