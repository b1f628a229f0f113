"""Committed results name run folders relative to the repository, and the
comparisons write them so: a path under the working directory is written
relative to it."""

import csv
import glob
import os
import re

from rope_lm.compare.task_compare import compare_tasks
from tests.conftest import ROOT
from tests.test_published import task_run


def test_task_comparison_names_run_folders_relative_to_the_working_directory(tmp_path, monkeypatch):
    task_run(tmp_path / "sweep" / "0", "copy", "nope", (0.5, 0.1))
    monkeypatch.chdir(tmp_path)
    compare_tasks([str(tmp_path / "sweep")], str(tmp_path / "cmp"))
    with open(tmp_path / "cmp" / "compare_tasks.csv", newline="") as f:
        assert {r["run_dir"] for r in csv.DictReader(f)} == {os.path.join("sweep", "0")}


def test_committed_results_hold_no_absolute_paths():
    absolute = re.compile(r"(^|[,;\s\"'(`])/(work|tmp|home|root|Users)/")
    found = [
        f"{os.path.relpath(p, ROOT)}:{i}"
        for p in glob.glob(os.path.join(ROOT, "docs", "results", "**", "*"), recursive=True)
        if p.endswith((".csv", ".json", ".md", ".yaml"))
        for i, line in enumerate(open(p), 1)
        if absolute.search(line)
    ]
    assert not found, f"absolute paths in committed results: {found[:5]}"
