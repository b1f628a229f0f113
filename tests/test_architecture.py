"""The shape of the house (docs/architecture.md), checked over the source:
which folder may import which, and where Hydra, conf/ and scheme names may
appear. A failure names the file and the import that broke the rule."""

import ast
import os

import pytest

from tests.conftest import ROOT

LIB = os.path.join(ROOT, "rope_lm")


def modules(folder: str) -> list[str]:
    out = []
    for here, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        out += [os.path.join(here, f) for f in sorted(files) if f.endswith(".py")]
    return sorted(out)


def imports(path: str) -> list[str]:
    """Every module a file imports, anywhere in it (function-level imports included)."""
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
            # `from package import module` imports that module; `from module import name` only a name.
            names += [f"{node.module}.{a.name}" for a in node.names if is_module(f"{node.module}.{a.name}")]
    return names


def is_module(name: str) -> bool:
    path = os.path.join(ROOT, *name.split("."))
    return os.path.isfile(path + ".py") or os.path.isdir(path)


def strings(path: str) -> list[str]:
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
                  and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [n.value for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings]


def rel(path: str) -> str:
    return os.path.relpath(path, ROOT)


def violations(files, forbidden) -> list[str]:
    return [f"{rel(f)} imports {name}" for f in files for name in imports(f) if forbidden(name)]


def test_positional_schemes_never_import_methods():
    assert violations(modules(os.path.join(LIB, "positional")), lambda n: n.startswith("rope_lm.scaling")) == []


def test_methods_read_schemes_only_through_the_interface():
    allowed = ("rope_lm.positional.base",)
    bad = violations(modules(os.path.join(LIB, "scaling")),
                     lambda n: n.startswith("rope_lm.positional") and not n.startswith(allowed))
    assert bad == []


def test_the_frequency_formulas_are_a_leaf():
    bad = violations([os.path.join(LIB, "frequencies.py")],
                     lambda n: n.startswith("rope_lm") and n not in ("rope_lm.errors", "rope_lm.errors.ConfigError"))
    assert bad == []


def test_the_library_imports_no_tool_and_reads_no_config_folder():
    files = modules(LIB)
    assert violations(files, lambda n: n.split(".")[0] in ("scripts", "benchmarks", "train", "tests")) == []
    reads_conf = [f"{rel(f)}: {s!r}" for f in files for s in strings(f)
                  if s == "conf" or s.startswith(("conf/", "conf" + os.sep))]
    assert reads_conf == []


def test_only_the_cli_glue_knows_hydra():
    bad = violations([f for f in modules(LIB) if not f.endswith(os.path.join("rope_lm", "cli.py"))],
                     lambda n: n.split(".")[0] == "hydra")
    assert bad == []


def test_the_model_names_no_scheme_and_no_method():
    from rope_lm.positional import SCHEMES
    from rope_lm.scaling import METHODS

    for name in ("model.py", "attention.py"):
        path = os.path.join(LIB, name)
        named = [s for s in strings(path) if s in set(SCHEMES.names()) | set(METHODS.names()) - {"none"}]
        assert named == [], f"{name} names {named}"
        assert violations([path], lambda n: n.startswith("rope_lm.positional.") and n != "rope_lm.positional.base"
                          or n.startswith("rope_lm.scaling.")) == []


@pytest.mark.parametrize("folder", ["scripts", "benchmarks", "."])
def test_no_entry_point_edits_sys_path(folder):
    where = os.path.join(ROOT, folder)
    if not os.path.isdir(where):
        pytest.skip(f"no {folder}/ folder")
    files = [os.path.join(where, f) for f in sorted(os.listdir(where)) if f.endswith(".py")]
    bad = [rel(f) for f in files if "sys.path.insert" in open(f).read() or "sys.path.append" in open(f).read()]
    assert bad == []
