"""Each evaluated length records its wall time and the peak memory while it
was scored (rope_lm/eval/cost.py), and results.md shows them."""

import mmap
import time

import numpy as np
import pytest
import torch

from rope_lm.eval import cost
from rope_lm.eval.evaluation import EvalConfig, evaluate_lengths
from rope_lm.eval.report import markdown_table
from rope_lm.model.transformer import build_model
from tests.conftest import TINY_MODEL

CPU_PEAK = "peak resident memory of the process (VmHWM)"


def test_the_peak_is_this_block_s_own_not_the_process_lifetime_s():
    if not cost.reset_cpu_peak():
        pytest.skip("the peak-RSS mark cannot be reset on this kernel")
    with cost.measured("cpu") as big:
        # Fresh anonymous pages, resident once touched: a tensor could reuse memory the allocator kept from
        # earlier tests in this process (rope_lm.train.compile.keep_freed_memory keeps it), growing nothing.
        block = mmap.mmap(-1, 64 * 2**20)
        for at in range(0, len(block), mmap.PAGESIZE):
            block[at] = 1
        block.close()
    with cost.measured("cpu") as small:
        time.sleep(0.01)
    assert big["peak_memory"] == small["peak_memory"] == CPU_PEAK
    # Without the reset the second block would report the first one's peak.
    assert big["peak_memory_mb"] - small["peak_memory_mb"] > 48
    assert small["seconds"] >= 0.01
    assert big["seconds"] > 0


def test_without_a_resettable_mark_the_memory_is_said_to_be_missing(monkeypatch):
    monkeypatch.setattr(cost, "reset_cpu_peak", lambda: False)
    with cost.measured("cpu") as spent:
        pass
    assert spent["peak_memory_mb"] is None
    assert spent["peak_memory"].startswith("not measured")


@pytest.mark.parametrize("protocol", ["stream", "sliding", "documents"])
def test_every_length_s_row_carries_its_seconds_and_peak(protocol):
    torch.manual_seed(0)
    model = build_model(TINY_MODEL, {"name": "rope"}, None, vocab_size=50, train_len=8).eval()
    stream = np.random.default_rng(0).integers(0, 50, size=400).astype(np.uint16)
    options = {"documents": {"max_documents": 2}, "sliding": {"sliding_stride": 4}}.get(protocol, {})
    cfg = EvalConfig(multipliers=[1, 2], token_budget=64, batch_tokens=64, protocol=protocol, **options)
    starts = np.array([0, 100, 250]) if protocol == "documents" else None
    rows = evaluate_lengths(model, stream, cfg, train_len=8, doc_starts=starts)
    assert [r["length"] for r in rows] == [8, 16]
    for row in rows:
        assert row["seconds"] > 0
        assert row["peak_memory_mb"] is None or row["peak_memory_mb"] > 10
        assert row["peak_memory"]


def test_results_md_shows_the_cost_and_marks_lengths_scored_before_it_was_recorded():
    common = {"method": "none", "ppl": 10.0, "tokens": 64, "windows": 8, "protocol": "stream"}
    results = {
        "scheme": "rope",
        "train_len": 8,
        "corpus": {"source": "tokens", "fingerprint": "0123"},
        "results": [
            {**common, "length": 8},  # from a run before rows carried their cost
            {**common, "length": 16, "seconds": 2.25, "peak_memory_mb": 1536.0, "peak_memory": CPU_PEAK},
        ],
    }
    md = markdown_table(results)
    section = md.split("## Wall time and peak memory per length")[1].split("##")[0]
    assert CPU_PEAK in section
    assert "| none | not recorded | 2.2 s, 1,536 MB |" in section
