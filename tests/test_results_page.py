"""The results pages' generated tables (rope_lm/compare/results_page.py): the committed
pages equal what their CSVs give, and a changed CSV makes its block stale."""

import os
import re
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


def test_a_control_block_reads_each_run_against_its_own_window_control(tmp_path):
    """compare.csv's control_ratio per run and length: yes where the paired interval lies below 1, no above,
    tied holding 1, in three decimals; the control's own rows and runs without one are left out."""
    path = tmp_path / "compare.csv"
    head = HEADER.rstrip("\n") + ",control_ratio,control_ratio_lo,control_ratio_hi\n"
    rows = [
        ("", "fox", "fox", "none", 0, 64, 64, 1.0, 20.0, 19.0, 21.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0),
        ("", "fox", "fox", "none", 0, 64, 128, 2.0, 19.0, 18.0, 20.0, 0.95, 0.93, 0.97, 0.9962, 0.9951, 0.9973),
        ("", "rope", "rope", "none", 0, 64, 128, 2.0, 25.0, 24.0, 26.0, 1.2, 1.1, 1.3, 1.19, 1.18, 1.2),
        ("", "alibi", "alibi", "none", 0, 64, 128, 2.0, 20.0, 19.0, 21.0, 1.0, 0.9, 1.1, 1.0001, 0.9996, 1.0005),
        ("", "fox + window", "fox", "window", 0, 64, 128, 2.0, 19.1, 18.0, 20.0, 0.95, 0.93, 0.97, "", "", ""),
        ("", "t5", "t5", "none", 0, 64, 128, 2.0, 20.0, 19.0, 21.0, 1.0, 0.9, 1.1, "", "", ""),
    ]
    path.write_text(head + "".join(",".join(map(str, r)) + "\n" for r in rows))
    assert render(f"{path} control") == (
        "| run | 128 (2×) |\n|---|---|\n"
        "| fox | **yes** (0.996 [0.995, 0.997]) |\n"
        "| rope | no (1.190 [1.180, 1.200]) |\n"
        "| alibi | tied (1.000 [1.000, 1.000]) |"
    )
    with pytest.raises(ConfigError, match="no run of .* has one"):
        render(f"{small(tmp_path)} control")
    # A model trained at 1,024 read against itself cut to 64 (eval.control_window): the lengths past 64.
    bound = tmp_path / "bound.csv"
    rows = [
        ("", "rope", "rope", "none", 0, 1024, 64, 0.0625, 158.0, 154.0, 162.0, 1.12, 1.1, 1.13, 1.0, 1.0, 1.0),
        ("", "rope", "rope", "none", 0, 1024, 128, 0.125, 150.0, 146.0, 154.0, 1.07, 1.06, 1.07, 0.995, 0.993, 0.997),
        ("", "rope", "rope", "none", 0, 1024, 1024, 1.0, 140.0, 133.0, 148.0, 1.0, 1.0, 1.0, 0.97, 0.96, 0.98),
    ]
    bound.write_text(head + "".join(",".join(map(str, r)) + "\n" for r in rows))
    assert render(f"{bound} control") == (
        "| run | 128 (0.125×) | 1024 (1×) |\n|---|---|---|\n"
        "| rope | **yes** (0.995 [0.993, 0.997]) | **yes** (0.970 [0.960, 0.980]) |"
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
        {
            "none": (72.0, 60.0, 86.0),
            "window (L)": (48.0, 40.0, 57.0),
            "yarn defaults": (44.0, 37.0, 52.0),
            "longrope searched": (41.0, 35.0, 49.0),
        },
        paired={"longrope searched / yarn defaults": (0.91, 0.95), "longrope searched / window (L)": (0.84, 0.87)},
    )
    search_json(  # a search from before the window row
        tmp_path / "s" / "x8", 512, {"yarn defaults": (34.0, 30.0, 38.0), "longrope searched": (32.0, 28.0, 37.0)}
    )
    for s in ("x16", "x8"):  # search.json's trial count
        p = tmp_path / "s" / s / "search.json"
        p.write_text(p.read_text().replace('"method"', '"trials": 30, "method"'))
    assert render(f"{tmp_path / 's'} search") == (
        "| method | target | none | window (L) | defaults | searched | searched / defaults (paired) | "
        "searched / window (paired) | trials |\n"
        "|---|---|---|---|---|---|---|---|---|\n"
        "| longrope | 512 (8×) | – | – | yarn: 34.00 [30.00, 38.00] | 32.00 [28.00, 37.00] | – | – | 30 |\n"
        f"| longrope | 1024 (16×) | 72.00 [60.00, 86.00] | 48.00 [40.00, 57.00] | yarn: 44.00 [37.00, 52.00] | "
        f"41.00 [35.00, 49.00] | {41 / 44:.3f} [0.910, 0.950] | {41 / 48:.3f} [0.840, 0.870] | 30 |"
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
            "kind one of ppl, rel, summary, window, control, pairs, seeds, accuracy, effective, md, search, lm_eval",
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


# --- Findings bound to verdicts ------------------------------------------------------------------


def _verdict(cid, results, verdict, ours, claim="a claim"):
    """One row of check_published.json as scripts/check_published.py writes it."""
    return {
        "id": cid,
        "claim": claim,
        "source": "a paper",
        "published": "what it says",
        "rule": "its rule",
        "study": "a study",
        "results": results,
        "ours": ours,
        "verdict": verdict,
    }


def _findings_files(tmp_path, rows, takeaways):
    import json

    import yaml

    (tmp_path / "check_published.json").write_text(json.dumps(rows))
    spec = tmp_path / "findings.yaml"
    spec.write_text(yaml.safe_dump({"findings": {"verdicts": "check_published.json", "takeaways": takeaways}}))
    return spec


VERDICT_ROWS = [
    _verdict("flat", "res/old", "not comparable", "0.98 at 2 x L; no intervals or seeds in this study"),
    _verdict("flat", "res/new", "matched", "0.94 [0.93, 0.95] at 16 x L", "ALiBi is flat"),
    _verdict("order", "res/new", "matched", "a 1.0 [0.9, 1.1] < b 2.0 [1.9, 2.1]", "a before b"),
    _verdict("base", "res/base", "tied", "x 2.2 [2.0, 2.6] vs y 3.1 [2.6, 4.0]; within the intervals: x", "x beats y"),
]
TAKEAWAYS = [
    {"title": "Flat as published", "claims": ["flat"], "results": "res/new"},
    {"title": "Ordered", "claims": ["order"]},
]


def test_a_finding_is_shown_only_while_its_claim_is_matched(tmp_path):
    """The takeaways carry their claims' figures; a claim that flips from matched moves its takeaway to
    Not shown with the verdict and why, and the page's blocks go stale (the check fails)."""
    _findings_files(tmp_path, VERDICT_ROWS, TAKEAWAYS)
    shown, missing = (render(f"findings.yaml {kind}", str(tmp_path)) for kind in ("findings", "not_shown"))
    assert shown == (
        "* **Flat as published** (matched on `new`): `flat` 0.94 [0.93, 0.95] at 16 x L\n"
        "* **Ordered** (matched on `new`): `order` a 1.0 [0.9, 1.1] < b 2.0 [1.9, 2.1]"
    )
    assert missing == "* `base` (x beats y): **tied** on `base`, within the intervals: x"
    page = tmp_path / "page.md"
    page.write_text(
        f"## Findings\n\n<!-- table: findings.yaml findings -->\n{shown}\n<!-- end table -->\n\n"
        f"<!-- table: findings.yaml not_shown -->\n{missing}\n<!-- end table -->\n"
    )
    assert regenerate(page.read_text(), str(tmp_path))[1] == []

    flipped = [dict(r) for r in VERDICT_ROWS]
    flipped[1].update(verdict="tied", ours="0.97 [0.93, 1.08] at 16 x L; interval straddling 1.05 at 16 x L")
    _findings_files(tmp_path, flipped, TAKEAWAYS)
    new, stale = regenerate(page.read_text(), str(tmp_path))
    assert stale == ["findings.yaml findings", "findings.yaml not_shown"]
    assert "Flat as published" not in render("findings.yaml findings", str(tmp_path))
    assert render("findings.yaml not_shown", str(tmp_path)).splitlines()[0] == (
        "* **Flat as published** (on `new`): `flat` **tied**, interval straddling 1.05 at 16 x L"
    )
    from rope_lm.compare.results_page import regenerate_pages

    assert regenerate_pages([str(page)], str(tmp_path), check=True) == {str(page): stale}

    # A claim that becomes matched with no takeaway naming it is shown too, on one line.
    flipped[3].update(verdict="matched")
    _findings_files(tmp_path, flipped, TAKEAWAYS)
    assert render("findings.yaml findings", str(tmp_path)).endswith("* Also matched: `base` (x beats y)")
    assert "`base`" not in render("findings.yaml not_shown", str(tmp_path))


def test_prose_cannot_give_a_claim_a_verdict_it_does_not_have(tmp_path):
    """Hand-written text beside a findings block may name a folder's verdict, never one no folder gave."""
    from rope_lm.compare.results_page import contradictions

    _findings_files(tmp_path, VERDICT_ROWS, TAKEAWAYS)
    blocks = "".join(
        f"<!-- table: findings.yaml {k} -->\n{render(f'findings.yaml {k}', str(tmp_path))}\n<!-- end table -->\n"
        for k in ("findings", "not_shown")
    )
    fine = blocks + "The `base` claim (its rule on PPL) is **tied**; `flat` is\nnot comparable on the old folder.\n"
    assert contradictions(fine, str(tmp_path)) == []
    wrong = blocks + "Men et al.'s finding holds (`base`: matched), and `flat` is not robust.\n"
    assert [c.split(" (its")[0] for c in contradictions(wrong, str(tmp_path))] == [
        "prose contradicts a verdict: `base`: matched",
        "prose contradicts a verdict: `flat` is not robust",
    ]


def _seed_rows(values: dict, length=1024):
    """compare.csv rows: {scheme: [(ratio at 16 x L, lo, hi) per seed]}, each seed at L too."""
    rows = []
    for scheme, seeds in values.items():
        for seed, (v, lo, hi) in enumerate(seeds):
            label = f"{scheme} (seed={seed})"
            rows += [
                ("", label, scheme, "none", seed, 64, 64, 1.0, 20.0, 19.0, 21.0, 1.0, 1.0, 1.0),
                ("", label, scheme, "none", seed, 64, length, 16.0, 20 * v, 19 * v, 21 * v, v, lo, hi),
            ]
    return rows


def test_a_seeds_finding_needs_three_seeds_apart(tmp_path):
    """Shown where every seed's interval of one group lies below every seed's of the next; tied where
    two seeds overlap, not matched where reversed for every seed, not comparable under 3 seeds."""
    apart = {"alibi": [(0.94, 0.93, 0.95)] * 3, "rope": [(2.4, 2.2, 2.6), (4.5, 4.2, 4.8), (4.1, 3.9, 4.3)]}
    write_csv(tmp_path / "compare.csv", _seed_rows(apart))
    take = [{"title": "Order", "seeds": "compare.csv", "multiplier": 16, "order": ["alibi", "rope"]}]
    _findings_files(tmp_path, VERDICT_ROWS, take)
    shown = render("findings.yaml findings", str(tmp_path)).splitlines()[0]
    assert shown == (
        f"* **Order** (comparison `{tmp_path.name}`, 3 seeds each, relative PPL at 16 × L, mean ± sd over seeds): "
        "alibi 0.94 ± 0.00 < rope 3.67 ± 1.12; at each < every seed's 95% interval lies below every seed's of the next"
    )
    cases = {
        "**tied**, within the seeds' intervals: alibi ~ rope": {**apart, "rope": [(2.4, 0.9, 2.6), *apart["rope"][1:]]},
        "**not matched**, reversed for every seed: alibi ~ rope": {
            "alibi": apart["alibi"],
            "rope": [(0.5, 0.4, 0.6)] * 3,
        },
        "**not comparable**, rope with fewer than 3 seeds": {**apart, "rope": apart["rope"][:2]},
    }
    for verdict, values in cases.items():
        write_csv(tmp_path / "compare.csv", _seed_rows(values))
        assert "**Order**" not in render("findings.yaml findings", str(tmp_path))
        assert render("findings.yaml not_shown", str(tmp_path)).splitlines()[0].endswith(verdict)


def test_a_window_finding_moves_when_a_run_beats_the_control(tmp_path):
    rows = [
        ("", "rope + window", "rope", "window", "", 64, 64, 1.0, 20.0, 19.0, 21.0, 1.0, 1.0, 1.0),
        ("", "rope + window", "rope", "window", "", 64, 128, 2.0, 19.0, 18.0, 20.0, 0.95, 0.93, 0.97),
        ("", "alibi", "alibi", "none", "", 64, 64, 1.0, 20.0, 19.0, 21.0, 1.0, 1.0, 1.0),
        ("", "alibi", "alibi", "none", "", 64, 128, 2.0, 19.0, 18.0, 20.0, 0.95, 0.92, 0.98),
    ]
    write_csv(tmp_path / "compare.csv", rows)
    _findings_files(tmp_path, VERDICT_ROWS, [{"title": "None reads past L", "window": "compare.csv"}])
    assert render("findings.yaml findings", str(tmp_path)).splitlines()[0] == (
        f"* **None reads past L** (comparison `{tmp_path.name}` against `rope + window`): "
        "0 of 1 run × length cells below it, 1 tied (alibi 1 of 1), 0 above"
    )
    rows[-1] = ("", "alibi", "alibi", "none", "", 64, 128, 2.0, 17.0, 16.0, 18.0, 0.85, 0.82, 0.88)
    write_csv(tmp_path / "compare.csv", rows)
    assert "None reads past L" not in render("findings.yaml findings", str(tmp_path))
    assert (
        render("findings.yaml not_shown", str(tmp_path))
        .splitlines()[0]
        .endswith("**no longer holds**, below the control: alibi at 2 × L")
    )


@pytest.mark.parametrize(
    "takeaways, words",
    [
        ([{"title": "x", "claims": ["nowhere"]}], "names claim 'nowhere', which the verdicts do not hold"),
        (
            [{"title": "x", "claims": ["flat"]}],
            "reads claim 'flat' without results:; it was checked on res/old; res/new",
        ),
        ([{"title": "x", "claims": ["flat"], "results": "res/other"}], "give the one folder"),
        ([{"title": "x", "claims": ["flat"], "window": "compare.csv"}], "exactly one of claims, seeds, window"),
        ([{"title": f"t{i}", "claims": ["order"]} for i in range(8)], "at most 7"),
    ],
)
def test_a_bad_finding_is_one_paragraph(tmp_path, takeaways, words):
    _findings_files(tmp_path, VERDICT_ROWS, takeaways)
    with pytest.raises(ConfigError, match=re.escape(words) if words.startswith("reads") else words):
        render("findings.yaml findings", str(tmp_path))


def test_the_findings_open_the_page_in_at_most_8_lines_and_name_their_evidence():
    with open(os.path.join(ROOT, "docs", "results.md")) as f:
        text = f.read()
    section = text.split("## Findings\n\n", 1)[1]
    assert section.startswith("<!-- table: conf/results_page.yaml findings -->\n")
    lines = render("conf/results_page.yaml findings", ROOT).splitlines()
    assert 1 <= len(lines) <= 8
    # each shown line names a registered claim (a backticked id after "matched on") or a comparison
    assert all(re.search(r"\((matched on|comparison) `", line) or line.startswith("* Also matched") for line in lines)
    from rope_lm.compare.results_page import contradictions

    assert contradictions(text, ROOT) == []


def test_the_page_states_the_tiny_model_size_once_as_the_runs_logged_it():
    """The tiny model's parameter count is written once (Findings, "Scale") and equals what a committed
    run of the headline table logged; a second, different count anywhere on the page fails."""
    with open(os.path.join(ROOT, "docs", "results.md")) as f:
        text = f.read()
    log = os.path.join(ROOT, "docs/results/pe_headline_pg19_6000/runs/rope_seed0_none_L64/train.log")
    with open(log) as f:
        total, inner = re.search(r"Model: ([\d.]+)M parameters \(([\d.]+)M without embeddings\)", f.read()).groups()
    stated = re.findall(r"\b(\d+(?:\.\d+)?)M[- ]parameters?\b", re.sub(r"\*\*", "", text))
    tiny = [v for v in stated if 1 <= float(v) < 10]  # 0.40M (the tasks' 2-layer model) and 124M+ are others
    assert tiny == [total], tiny
    assert f"{inner}M outside the tied embedding" in text.replace("\n", " ")


def test_why_is_what_decided_the_verdict():
    """The trailing clauses of a verdict's `ours` without an interval, cut at top-level "; " only."""
    from rope_lm.compare.results_page import _why

    tasks = "a 0.83 > b 0.71 (over 4 tasks; not comparable: addition); the claim holds under 1 of 6 readings (x)"
    assert _why(tasks) == "the claim holds under 1 of 6 readings (x)"
    pairs = (
        "0.5 x L: a 62.7 [51.5, 71.3] vs b 28.2 [23.0, 32.6]; 2 x L: a 63.7 [56, 69] vs b 63.3 [62, 64]; within 2 x L"
    )
    assert _why(pairs) == "within 2 x L"
    order = "a 208.8 [193, 229] < b 655.2 [616, 703]; reversed beyond the intervals: b < a; within the intervals: c ~ d"
    assert _why(order) == "reversed beyond the intervals: b < a; within the intervals: c ~ d"
    assert _why("not run (docs/results/nowhere)") == "not run (docs/results/nowhere)"
