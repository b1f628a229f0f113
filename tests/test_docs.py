"""The README and the docs pages point at things that exist.

Docs rot quietly: a page is renamed, a section retitled, a script removed, and
the links and the README's map of the repository go on naming them. These
tests read only text and the file tree, so they cost nothing."""

import glob
import os
import re

from tests.conftest import ROOT

PAGES = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def outside_fences(text: str) -> list[str]:
    lines, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def anchors(path: str) -> set[str]:
    """GitHub's heading ids: lower case, punctuation dropped, spaces to hyphens,
    a repeated id numbered -1, -2, ..."""
    seen: dict[str, int] = {}
    out = set()
    for line in outside_fences(read(path)):
        m = re.match(r"#+\s+(.*)", line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_every_relative_link_of_the_readme_and_the_docs_reaches_a_file_and_a_heading():
    broken = []
    for page in PAGES:
        for line in outside_fences(read(page)):
            for target in LINK.findall(line):
                if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                    continue
                path, _, anchor = target.partition("#")
                full = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
                name = f"{os.path.relpath(page, ROOT)} -> {target}"
                if not os.path.exists(full):
                    broken.append(f"{name} (no such file)")
                elif anchor and full.endswith(".md") and anchor not in anchors(full):
                    broken.append(f"{name} (no such heading)")
    assert broken == []


def test_the_readme_is_a_front_page():
    """Reference text belongs in docs/; the README opens with the two commands."""
    text = read(os.path.join(ROOT, "README.md"))
    assert len(text.splitlines()) <= 300
    assert "bash scripts/setup.sh && python train.py" in text
    assert "bash scripts/setup.sh && python3 -m pytest" in text
    assert "ruff check ." in text and "ruff format --check ." in text


def test_the_readme_layout_names_what_exists_and_all_of_it():
    """Every path in the README's repository block, and every script and rope_lm/ folder it
    lists, is in the tree (an old README listed scripts that had gone), and no script or
    folder is left out of it."""
    text = read(os.path.join(ROOT, "README.md"))
    block = text[text.index("## Repository layout") :]
    block = block[block.index("```") + 3 :]
    block = block[: block.index("```")]
    rows: dict[str, str] = {}
    key = None
    for line in block.strip("\n").splitlines():
        if line[:1].strip():
            key, _, rest = line.partition(" ")
            rows[key] = rest
        else:
            rows[key] += " " + line
    missing = [p for p in rows if not os.path.exists(os.path.join(ROOT, p))]
    listed = set(re.findall(r"[\w]+\.(?:py|sh)", rows["scripts/"]))
    missing += [f"scripts/{f}" for f in sorted(listed) if not os.path.isfile(os.path.join(ROOT, "scripts", f))]
    unlisted = sorted(set(os.listdir(os.path.join(ROOT, "scripts"))) - listed - {"__pycache__"})
    folders = set(re.split(r",\s*", re.search(r"\(([^)]*)\)", rows["rope_lm/"]).group(1)))
    missing += [f"rope_lm/{f}" for f in sorted(folders) if not os.path.isdir(os.path.join(ROOT, "rope_lm", f))]
    packages = {
        f
        for f in os.listdir(os.path.join(ROOT, "rope_lm"))
        if os.path.isfile(os.path.join(ROOT, "rope_lm", f, "__init__.py"))
    }
    unlisted += [f"rope_lm/{f}" for f in sorted(packages - folders)]
    assert (missing, unlisted) == ([], [])


def test_module_paths_in_the_readme_and_docs_exist():
    """A path under rope_lm/, scripts/, benchmarks/ or tests/ in backticks names a real file
    or folder (placeholders such as <name> and globs aside). The results pages are records of
    runs made at a commit, so a file they name may have gone since; they are left out."""
    path = re.compile(r"`((?:rope_lm|scripts|benchmarks|tests)/[\w./-]*)")
    records = {os.path.join(ROOT, "docs", f) for f in ("results.md", "results_archive.md")}
    missing = []
    for page in [p for p in PAGES if p not in records]:
        for p in path.findall(read(page)):
            p = p.split("::")[0].rstrip(".")
            if not os.path.exists(os.path.join(ROOT, p)):
                missing.append(f"{os.path.relpath(page, ROOT)}: {p}")
    assert missing == []
