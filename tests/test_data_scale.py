"""Data at scale: streaming build under a memory bound, parallel and deterministic
tokenization, fast reuse, the user's own tokenizer, single-file corpora,
streaming hub datasets, and one cache shared by concurrent ranks."""

import json
import logging
import multiprocessing
import os
import sys
import textwrap

import numpy as np
import pytest

from rope_lm.core.errors import ConfigError
from rope_lm.data.corpus import SourceConfig, load_documents
from rope_lm.data.split import split_data
from rope_lm.data.token_cache import prepare
from tests import forked
from tests.conftest import ROOT, write_corpus


def _prepare(options, **changes):
    data, source = split_data({**options, **changes})
    return prepare(data, source)


def _files(directory):
    return {n: open(os.path.join(directory, n), "rb").read() for n in sorted(os.listdir(directory)) if n != "meta.json"}


def _lines(n, seed=0):
    """n lines of made-up words (deterministic), like prose with line breaks."""
    rng = np.random.default_rng(seed)
    words = ["".join(rng.choice(list("etaoinshrdlucmfw"), rng.integers(1, 9))) for _ in range(500)]
    picks = rng.integers(0, len(words), size=(n, 10))
    return [" ".join(words[i] for i in row) + ".\n" for row in picks]


def test_cache_is_byte_identical_for_one_and_two_processes_and_long_documents_keep_their_ids(
    tiny_data_options, tmp_path
):
    corpus = write_corpus(tmp_path / "corpus")
    # One document far longer than a batch at memory_mb=16 (65k characters), so it is encoded in pieces.
    long_doc = "".join(_lines(4000))
    (tmp_path / "corpus" / "long.txt").write_text(long_doc)
    opts = {**tiny_data_options, "path": corpus, "memory_mb": 16, "valid_fraction": 0.1, "test_fraction": 0.1}
    one = _prepare(opts, num_proc=1, cache_dir=str(tmp_path / "c1"))
    two = _prepare(opts, num_proc=2, cache_dir=str(tmp_path / "c2"))
    assert os.path.basename(one.dir) == os.path.basename(two.dir)
    assert _files(one.dir) == _files(two.dir)
    tok = one.tokenizer()
    docs = load_documents(split_data(opts)[1])
    for split in ("train", "valid", "test"):
        tokens, starts = one.tokens(split), list(one.doc_starts(split)) + [len(one.tokens(split))]
        assert len(starts) - 1 == len(docs[split])
        for text, a, b in zip(docs[split], starts[:-1], starts[1:]):
            assert tokens[b - 1] == one.eos_id
            assert list(tokens[a : b - 1]) == tok.encode(text).ids  # pieces encode as the whole document
    assert any(len(d) == len(long_doc) for split in docs.values() for d in split)


MEMORY_PROBE = textwrap.dedent("""
    import dataclasses, json, resource, sys
    import pyarrow, tokenizers, tqdm.auto  # imported by the build; their code is not its memory
    from rope_lm.data.token_cache import DataConfig, prepare
    from rope_lm.data.corpus import SourceConfig
    def rss_mb():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize() / 2**20
    options = json.loads(sys.argv[1])
    source_keys = {f.name for f in dataclasses.fields(SourceConfig)}
    data = DataConfig(**{k: v for k, v in options.items() if k not in source_keys})
    source = SourceConfig(**{k: v for k, v in options.items() if k in source_keys})
    base = rss_mb()
    cache = prepare(data, source)
    # VmHWM, not ru_maxrss: the latter keeps the parent's size from before exec.
    with open("/proc/self/status") as f:
        peak = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024
    print(json.dumps({"growth_mb": peak - base, "tokens": sum(cache.meta["tokens"].values())}))
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_build_memory_is_bounded_on_a_corpus_four_times_the_bound(tmp_path):
    """A 64 MB corpus (64 files of 1 MB, each one document) built with
    data.memory_mb=16: the process grows by well under the corpus size (the
    old in-memory build held all the text). The tokenizer maps each piece to
    one token, so this measures the streaming (read, plan, batch, write),
    not the speed of BPE; the BPE's own memory per batch is what
    benchmarks/data_bench.py measures on 1 GB."""
    from tokenizers import Tokenizer, models

    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "</s>": 1}, unk_token="[UNK]"))
    tok.add_special_tokens(["</s>"])
    tok.save(str(tmp_path / "tokenizer.json"))
    block = "".join(_lines(16_000))[: 1 << 20]
    (tmp_path / "corpus").mkdir()
    for i in range(64):
        (tmp_path / "corpus" / f"book{i:02d}.txt").write_text(f"book {i}\n" + block[: (1 << 20) - 16])
    opts = {
        "name": "big",
        "source": "files",
        "path": str(tmp_path / "corpus"),
        "tokenizer": str(tmp_path / "tokenizer.json"),
        "cache_dir": str(tmp_path / "cache"),
        "memory_mb": 16,
        "num_proc": 1,
    }
    env = {**os.environ, "PYTHONPATH": ROOT}
    out = forked.run(
        [sys.executable, "-c", MEMORY_PROBE, json.dumps(opts)], capture_output=True, text=True, env=env, timeout=600
    )
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["tokens"] > 64
    assert result["growth_mb"] < 32, result  # 16 MB bound + slack, against 64 MB of text


def test_reuse_reads_no_text_yet_a_changed_source_is_detected(tiny_data_options, tmp_path, monkeypatch):
    import rope_lm.data.token_cache as data_mod

    corpus = write_corpus(tmp_path / "corpus")
    big = tmp_path / "corpus" / "big.txt"
    big.write_text("".join(_lines(3000)))  # ~200 kB: a byte at 30% is outside the sampled blocks
    opts = {**tiny_data_options, "path": corpus, "cache_dir": str(tmp_path / "cache")}
    first = _prepare(opts)
    real_scan = data_mod.scan

    def no_full_read(*a, **k):
        raise AssertionError("the whole source was read")

    monkeypatch.setattr(data_mod, "scan", no_full_read)
    assert _prepare(opts).dir == first.dir  # unchanged: reused from sizes, mtimes and samples
    # Same size, same mtime, one byte changed between the sampled blocks: only a full check sees it.
    stat = os.stat(big)
    raw = bytearray(big.read_bytes())
    at = int(len(raw) * 0.3)
    while not chr(raw[at]).isalpha():
        at += 1
    raw[at] = ord("x") if raw[at] != ord("x") else ord("y")
    big.write_bytes(bytes(raw))
    os.utime(big, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert _prepare(opts).dir == first.dir
    monkeypatch.setattr(data_mod, "scan", real_scan)
    changed = _prepare(opts, full_check=True)
    assert changed.dir != first.dir and changed.corpus["fingerprint"] != first.corpus["fingerprint"]
    # A visible change (size and mtime) is caught without asking.
    with open(big, "a") as f:
        f.write("one more line\n")
    assert _prepare(opts).dir not in (first.dir, changed.dir)


def _llama_style_tokenizer(path, specials=("<unk>", "<s>", "</s>")):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        _lines(500),
        trainers.BpeTrainer(
            vocab_size=400,
            special_tokens=list(specials),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    if "<s>" in specials:
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))]
        )
    tok.save(str(path))
    return tok


def test_a_resumed_run_given_its_checkpoints_tokenizer_reuses_the_cache_it_trained_on(
    tiny_data_options, tmp_path, monkeypatch
):
    import shutil

    import rope_lm.data.token_cache as data_mod

    opts = {**tiny_data_options, "path": write_corpus(tmp_path / "corpus"), "cache_dir": str(tmp_path / "cache")}
    first = _prepare(opts)
    saved = tmp_path / "run" / "tokenizer.json"  # what a resume writes from the checkpoint
    saved.parent.mkdir()
    shutil.copyfile(os.path.join(first.dir, "tokenizer.json"), saved)

    def no_full_read(*a, **k):
        raise AssertionError("the text was read again")

    monkeypatch.setattr(data_mod, "scan", no_full_read)
    assert _prepare(opts, tokenizer_file=str(saved)).dir == first.dir
    other = tmp_path / "other.json"  # a file with other bytes is another tokenizer as far as the cache knows
    other.write_text(saved.read_text() + "\n")
    with pytest.raises(AssertionError, match="read again"):
        _prepare(opts, tokenizer_file=str(other))


def test_your_own_llama_style_tokenizer_ends_documents_with_its_eos(tiny_data_options, tmp_path):
    tok = _llama_style_tokenizer(tmp_path / "tokenizer.json")
    opts = {**tiny_data_options, "cache_dir": str(tmp_path / "cache"), "tokenizer": str(tmp_path / "tokenizer.json")}
    cache = _prepare(opts)
    assert cache.meta["eos_token"] == "</s>" and cache.eos_id == tok.token_to_id("</s>")
    assert cache.vocab_size == tok.get_vocab_size()
    tokens, starts = cache.tokens("train"), cache.doc_starts("train")
    assert all(tokens[s - 1] == cache.eos_id for s in starts[1:]) and tokens[-1] == cache.eos_id
    assert all(tokens[s] == tok.token_to_id("<s>") for s in starts)  # its BOS template is kept
    assert _prepare(opts, eos_token="</s>").dir != cache.dir  # an explicit choice is part of the key


def test_a_tokenizer_without_the_end_token_is_refused_in_one_paragraph_and_leaves_nothing(tiny_data_options, tmp_path):
    _llama_style_tokenizer(tmp_path / "plain.json", specials=("<unk>", "<pad>"))
    cache_dir = tmp_path / "cache"
    opts = {**tiny_data_options, "cache_dir": str(cache_dir), "tokenizer": str(tmp_path / "plain.json")}
    with pytest.raises(ConfigError, match="no end-of-document token") as e:
        _prepare(opts)
    assert "data.eos_token" in str(e.value) and "'<pad>'" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=r"data.eos_token='</s>' is not a token"):
        _prepare(opts, eos_token="</s>")
    assert not cache_dir.exists() or not [
        n for n in os.listdir(cache_dir) if ".tmp" in n or os.path.isdir(cache_dir / n)
    ]
    with pytest.raises(ConfigError, match="does not exist"):
        _prepare(opts, tokenizer=str(tmp_path / "missing" / "tokenizer.json"))


def test_a_single_file_corpus_is_split_by_position(tiny_data_options, tmp_path):
    lines = _lines(2000)
    text = "".join(lines)
    (tmp_path / "input.txt").write_text(text)
    source = SourceConfig(source="files", path=str(tmp_path / "input.txt"), valid_fraction=0.1, test_fraction=0.1)
    docs = load_documents(source)
    assert [len(docs[s]) for s in ("train", "valid", "test")] == [1, 1, 1]
    assert docs["train"][0] + docs["valid"][0] + docs["test"][0] == text
    assert docs["valid"][0] in lines[1600:] or docs["valid"][0].startswith(tuple(lines[1500:1700]))
    assert 0.78 < len(docs["train"][0]) / len(text) < 0.82 and docs["train"][0].endswith("\n")
    cache = _prepare(
        {
            **tiny_data_options,
            "path": str(tmp_path / "input.txt"),
            "cache_dir": str(tmp_path / "cache"),
            "valid_fraction": 0.1,
            "test_fraction": 0.1,
        }
    )
    assert cache.corpus["split_by_position"] and all(cache.meta["tokens"][s] > 100 for s in ("train", "valid", "test"))
    with pytest.raises(ConfigError, match="no line break"):
        (tmp_path / "one_line").mkdir()
        (tmp_path / "one_line" / "a.txt").write_text(text.replace("\n", " "))
        load_documents(SourceConfig(source="files", path=str(tmp_path / "one_line")))


@pytest.mark.parametrize("streaming", [True, False])
def test_hub_datasets_are_read_a_batch_at_a_time_and_can_stream(tiny_data_options, tmp_path, monkeypatch, streaming):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    ds_dir = tmp_path / "my_dataset"
    ds_dir.mkdir()
    lines = _lines(300)
    for split, n in (("train", 40), ("validation", 6), ("test", 6)):
        with open(ds_dir / f"{split}.jsonl", "w") as f:
            f.write("\n".join(json.dumps({"body": f"{split} {i} " + "".join(lines[i : i + 5])}) for i in range(n)))
    extra = {"streaming": True} if streaming else {}
    docs = load_documents(SourceConfig(source="hub", hf_name=str(ds_dir), text_field="body", extra=extra))
    assert [len(docs[s]) for s in ("train", "valid", "test")] == [40, 6, 6]
    assert docs["valid"][0].startswith("validation 0 ")
    opts = {
        **tiny_data_options,
        "source": "hub",
        "path": None,
        "hf_name": str(ds_dir),
        "text_field": "body",
        "extra": extra,
        "cache_dir": str(tmp_path / "cache"),
    }
    cache = _prepare(opts)
    assert len(cache.doc_starts("train")) == 40 and len(cache.doc_starts("test")) == 6
    with pytest.raises(ConfigError, match="text_field"):
        load_documents(SourceConfig(source="hub", hf_name=str(ds_dir), text_field="missing", extra=extra))


def _rank(opts, out):
    logger = logging.getLogger("rope_lm")
    logger.setLevel(logging.INFO)
    logger.addHandler(logging.FileHandler(out))
    data, source = split_data(opts)
    directory = prepare(data, source).dir
    with open(out, "a") as f:
        f.write(f"CACHE {directory}\n")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forks")
def test_two_ranks_starting_together_share_one_cache_built_once(tiny_data_options, tmp_path):
    """What every DDP rank does at start (pipeline -> data.prepare): the first
    takes the lock and builds, the other waits and reuses it without reading the text."""
    opts = {**tiny_data_options, "cache_dir": str(tmp_path / "cache"), "num_proc": 1}
    ctx = multiprocessing.get_context("fork")
    ranks = [ctx.Process(target=_rank, args=(opts, str(tmp_path / f"rank{r}.log"))) for r in range(2)]
    for r in ranks:
        r.start()
    for r in ranks:
        r.join(120)
    assert all(r.exitcode == 0 for r in ranks)
    logs = [(tmp_path / f"rank{r}.log").read_text() for r in range(2)]
    dirs = {line.split()[1] for log in logs for line in log.splitlines() if line.startswith("CACHE")}
    assert len(dirs) == 1
    assert sum("Building token cache" in log for log in logs) == 1
    assert sum("source unchanged" in log for log in logs) == 1


def test_build_settings_out_of_range_are_refused_before_any_work(tiny_data_options, tmp_path):
    opts = {**tiny_data_options, "cache_dir": str(tmp_path / "cache")}
    with pytest.raises(ConfigError, match=r"data.num_proc=0 must be a positive number of processes, or null"):
        _prepare(opts, num_proc=0)
    with pytest.raises(ConfigError, match=r"data.memory_mb=4 is too small"):
        _prepare(opts, memory_mb=4)
    with pytest.raises(ConfigError, match=r"data.doc_start='\(' is not a valid regular expression"):
        _prepare(opts, doc_start="(")
    assert not (tmp_path / "cache").exists()
