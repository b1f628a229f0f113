"""The results pages' generated tables (rope_lm/compare/results_page.py): the committed
pages equal what their CSVs give, and a changed CSV makes its block stale."""

import os
import sys

import pytest

from rope_lm.compare.results_page import BLOCK, regenerate, render
from rope_lm.core.errors import ConfigError
from tests import forked
from tests.conftest import ROOT

HEADER = "group,label,scheme,method,seed,train_len,length,ratio,ppl,ppl_lo,ppl_hi,ppl_rel,ppl_rel_lo,ppl_rel_hi\n"


def write_csv(path, rows):
    path.write_text(HEADER + "".join(",".join(map(str, r)) + "\n" for r in rows))
    return str(path)


def small(tmp_path, rope_at_128=30.0):
    return write_csv(
        tmp_path / "compare.csv",
        [
            ("", "rope", "rope", "none", "", 64, 64, 1.0, 20.0, 19.0, 21.0, 1.0, 1.0, 1.0),
            ("", "rope", "rope", "none", "", 64, 128, 2.0, rope_at_128, 28.0, 32.0, rope_at_128 / 20, 1.4, 1.6),
            ("", "alibi", "alibi", "none", "", 64, 64, 1.0, 21.0, 20.0, 22.0, 1.0, 1.0, 1.0),
            ("", "alibi", "alibi", "none", "", 64, 128, 2.0, 1234.5, 1200.0, 1300.0, 0.95, 0.9, 1.0),
        ],
    )


def test_a_block_is_the_hand_written_table(tmp_path):
    csv = small(tmp_path)
    assert render(f"{csv} ppl") == (
        "| run | 64 (1×) | 128 (2×) |\n|---|---|---|\n"
        "| rope | 20.00 [19.00, 21.00] | 30.00 [28.00, 32.00] |\n"
        "| alibi | 21.00 [20.00, 22.00] | 1234 [1200, 1300] |"
    )
    assert render(f"{csv} rel labels=alibi") == (
        "| run | 64 (1×) | 128 (2×) |\n|---|---|---|\n| alibi | 1.00 [1.00, 1.00] | 0.95 [0.90, 1.00] |"
    )
    assert render(f"{csv} summary") == (
        "| run | 64 (1×) | 2× | relative at 2× |\n|---|---|---|---|\n"
        "| rope | 20.00 | 30.00 | 1.50 |\n| alibi | 21.00 | 1234 | 0.95 |"
    )


def test_a_window_block_reads_each_run_against_the_control(tmp_path):
    """yes below the control's relative-PPL interval, no above it, tied overlapping; a table without
    exactly one window control is refused."""
    rows = [
        ("", "rope + window", "rope", "window", "", 64, 64, 1.0, 20.0, 19.0, 21.0, 1.0, 1.0, 1.0),
        ("", "rope + window", "rope", "window", "", 64, 128, 2.0, 19.0, 18.0, 20.0, 0.95, 0.93, 0.97),
    ]
    for label, rel, lo, hi in (("alibi", 0.90, 0.88, 0.92), ("rope", 1.5, 1.4, 1.6), ("nope", 0.96, 0.9, 1.0)):
        rows += [
            ("", label, label, "none", "", 64, 64, 1.0, 20.0, 19.0, 21.0, 1.0, 1.0, 1.0),
            ("", label, label, "none", "", 64, 128, 2.0, 20 * rel, 19.0, 21.0, rel, lo, hi),
        ]
    csv = write_csv(tmp_path / "compare.csv", rows)
    assert render(f"{csv} window") == (
        "| run | 128 (2×) |\n|---|---|\n| alibi | **yes** (0.90 vs 0.95) |\n"
        "| rope | no (1.50 vs 0.95) |\n| nope | tied (0.96 vs 0.95) |"
    )
    with pytest.raises(ConfigError, match="needs exactly one window-L control .* it has 0"):
        render(f"{small(tmp_path)} window")
    # A train-long reference row (compare.py's trained_at column) is left out: it was not trained at 64.
    longer = tmp_path / "with_reference.csv"
    reference = [
        ("", "rope (trained at 1024)", "rope", "none", "", 64, 64, 1.0, 30.0, 29.0, 31.0, 1.0, "", ""),
        ("", "rope (trained at 1024)", "rope", "none", "", 64, 128, 2.0, 24.0, 23.0, 25.0, 0.8, "", ""),
    ]
    longer.write_text(
        HEADER.rstrip("\n")
        + ",trained_at\n"
        + "".join(
            ",".join(map(str, r)) + f",{1024 if r[1].endswith('(trained at 1024)') else 64}\n" for r in rows + reference
        )
    )
    assert render(f"{longer} window") == (
        "| run | 128 (2×) |\n|---|---|\n| alibi | **yes** (0.90 vs 0.95) |\n"
        "| rope | no (1.50 vs 0.95) |\n| nope | tied (0.96 vs 0.95) |"
    )


def test_an_accuracy_block_is_the_hand_written_table(tmp_path):
    path = tmp_path / "compare_retrieval.csv"
    path.write_text(
        "label,scheme,method,train_len,task,lengths,accuracy,accuracy_lo,accuracy_hi\n"
        "rope,rope,none,64,passkey,64 128,0.9 0.25,0.7 0,1 0.5\n"
        "rope,rope,none,64,vartrack,64 128,0.5 0,0.2 0,0.8 0\n"
        "rope + yarn,rope,yarn,64,passkey,64 128,1 0.6,,\n"
    )
    assert render(f"{path} accuracy") == (
        "| run | 64 (1×) | 128 (2×) |\n|---|---|---|\n"
        "| rope | 90% [70%, 100%] | 25% [0%, 50%] |\n"
        "| rope + yarn | 100% | 60% |"
    )
    assert render(f"{path} accuracy task=vartrack").endswith("| rope | 50% [20%, 80%] | 0% [0%, 0%] |")
    with pytest.raises(ConfigError, match="no qa1 rows"):
        render(f"{path} accuracy task=qa1")


def test_an_effective_length_block_is_the_hand_written_table(tmp_path):
    path = tmp_path / "compare_retrieval.csv"
    path.write_text("label,task,effective\nrope,qa1,128 (1×)\nrope,qa2,<128\nalibi,qa1,≥2048\nalibi,qa2,256 (2×)\n")
    assert render(f"{path} effective") == (
        "| run | qa1 | qa2 |\n|---|---|---|\n| rope | 128 (1×) | <128 |\n| alibi | ≥2048 | 256 (2×) |"
    )
    assert render(f"{path} effective tasks=qa2 labels=alibi") == "| run | qa2 |\n|---|---|\n| alibi | 256 (2×) |"
    with pytest.raises(ConfigError, match="no cwe rows"):
        render(f"{path} effective tasks=cwe")


def test_a_search_block_is_the_hand_written_table(tmp_path):
    from tests.test_published import search_json

    search_json(
        tmp_path / "s" / "x16",
        1024,
        {"none": (72.0, 60.0, 86.0), "yarn defaults": (44.0, 37.0, 52.0), "longrope searched": (41.0, 35.0, 49.0)},
        paired={"longrope searched / yarn defaults": (0.91, 0.95)},
    )
    search_json(
        tmp_path / "s" / "x8", 512, {"yarn defaults": (34.0, 30.0, 38.0), "longrope searched": (32.0, 28.0, 37.0)}
    )
    for s in ("x16", "x8"):  # search.json's trial count
        p = tmp_path / "s" / s / "search.json"
        p.write_text(p.read_text().replace('"method"', '"trials": 30, "method"'))
    assert render(f"{tmp_path / 's'} search") == (
        "| method | target | none | defaults | searched | searched / defaults (paired) | trials |\n"
        "|---|---|---|---|---|---|---|\n"
        "| longrope | 512 (8×) | – | yarn: 34.00 [30.00, 38.00] | 32.00 [28.00, 37.00] | – | 30 |\n"
        f"| longrope | 1024 (16×) | 72.00 [60.00, 86.00] | yarn: 44.00 [37.00, 52.00] | 41.00 [35.00, 49.00] | "
        f"{41 / 44:.3f} [0.910, 0.950] | 30 |"
    )
    with pytest.raises(ConfigError, match="as a folder"):
        render(f"{tmp_path / 'nowhere'} search")


def test_an_md_block_can_take_one_table_of_its_file(tmp_path):
    """table=N is the N-th run of `|` lines, whatever text lies between."""
    md = tmp_path / "compare_tasks.md"
    md.write_text(
        "# title\n\nExact match:\n\n| task | rope |\n|---|---|\n| copy | 100% / 0% |\n\n## copy\n\n"
        "| run | 1-2 |\n|---|---|\n| rope | 100% |\n"
    )
    assert render(f"{md} md table=1") == "| task | rope |\n|---|---|\n| copy | 100% / 0% |"
    assert render(f"{md} md table=2") == "| run | 1-2 |\n|---|---|\n| rope | 100% |"
    assert render(f"{md} md").startswith("# title")
    for bad in ("3", "0", "x"):
        with pytest.raises(ConfigError, match=f"table={bad} of .* which has 2 table"):
            render(f"{md} md table={bad}")


def test_an_lm_eval_block_is_the_hand_written_table(tmp_path):
    """A row per lm-eval result file: model arguments without the checkpoint, the metrics (no stderr,
    no sample_len), lm-eval's own time."""
    import json

    def result(name, scaling, word, byte, seconds):
        (tmp_path / name).write_text(
            json.dumps(
                {
                    "results": {
                        "wikitext": {
                            "alias": "wikitext",
                            "sample_len": 62,
                            "word_perplexity,none": word,
                            "word_perplexity_stderr,none": "N/A",
                            "byte_perplexity,none": byte,
                        }
                    },
                    "config": {"model_args": {"ckpt": "outputs/x", "scaling": scaling}},
                    "total_evaluation_time_seconds": seconds,
                }
            )
        )

    result("none.json", "none", 123456.7, 2.5, 60.4)
    result("yarn.json", "yarn", 99.5, 2.25, 9.6)
    assert render(f"{tmp_path} lm_eval") == (
        "| model arguments | word_perplexity | byte_perplexity | evaluation time |\n|---|---|---|---|\n"
        "| scaling=none | 123,457 | 2.500 | 60 s |\n| scaling=yarn | 99.500 | 2.250 | 10 s |"
    )
    (tmp_path / "other.json").write_text("{}")
    with pytest.raises(ConfigError, match="other.json is not an lm-evaluation-harness result file"):
        render(f"{tmp_path} lm_eval")
    with pytest.raises(ConfigError, match="holds no lm-eval result JSON"):
        render(f"{_empty(tmp_path)} lm_eval")


def _empty(tmp_path):
    d = tmp_path / "empty"
    d.mkdir()
    return d


def test_a_changed_csv_makes_its_block_stale_and_regenerating_mends_it(tmp_path):
    csv = small(tmp_path)
    page = f"text\n\n<!-- table: {csv} ppl -->\n{render(csv + ' ppl')}\n<!-- end table -->\n\nmore\n"
    assert regenerate(page) == (page, [])
    small(tmp_path, rope_at_128=31.0)
    new, stale = regenerate(page)
    assert stale == [f"{csv} ppl"] and "31.00 [28.00, 32.00]" in new and new.endswith("<!-- end table -->\n\nmore\n")
    assert regenerate(new) == (new, [])


@pytest.mark.parametrize(
    "spec, words",
    [
        (
            "docs/results/pe_pg19_6000/compare.csv",
            "kind one of ppl, rel, summary, window, seeds, accuracy, effective, md, search, lm_eval",
        ),
        ("docs/results/pe_pg19_6000/compare.csv seeds", "no compare_seeds.csv with relative PPL"),
        ("docs/results/nowhere/compare.csv ppl", "does not exist"),
        ("docs/results/pe_pg19_6000/compare.csv ppl labels=rope,xpos", "has no run labelled xpos"),
    ],
)
def test_a_bad_block_is_one_paragraph(spec, words):
    with pytest.raises(ConfigError, match=words):
        render(spec, ROOT)


def test_the_committed_pages_are_what_their_csvs_give():
    for page in ("docs/results.md", "docs/results_archive.md"):
        with open(os.path.join(ROOT, page)) as f:
            text = f.read()
        assert len(BLOCK.findall(text)) >= 3, page
        assert regenerate(text, ROOT)[1] == [], f"{page}: run python scripts/results_page.py"


def test_the_script_checks_and_rewrites(tmp_path):
    csv = small(tmp_path)
    page = tmp_path / "page.md"
    page.write_text(f"<!-- table: {csv} rel -->\n| stale |\n<!-- end table -->\n")
    script = [sys.executable, os.path.join(ROOT, "scripts", "results_page.py"), f"pages=[{page}]", f"root={tmp_path}"]
    done = forked.run(script + ["check=true"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "1 block(s) stale" in done.stdout and page.read_text().count("| stale |") == 1
    done = forked.run(script, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "1.50 [1.40, 1.60]" in page.read_text()
    again = forked.run(script + ["check=true"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "Every generated block is current" in again.stdout
