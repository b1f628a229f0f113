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


def module_name(path: str) -> str:
    name = os.path.relpath(path, ROOT)[: -len(".py")].replace(os.sep, ".")
    return name[: -len(".__init__")] if name.endswith(".__init__") else name


def resolved_imports(path: str) -> set[str]:
    """Every module a file imports, anywhere in it (lazy, function-level imports
    and relative imports included), `from package import module` as that module."""
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    name = module_name(path)
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            out.add(base)
            out |= {f"{base}.{a.name}" for a in node.names if is_module(f"{base}.{a.name}")}
    return out


def import_graph() -> dict[str, set[str]]:
    """rope_lm module -> the rope_lm modules it imports (an import of a
    name inside a module counts as an import of that module)."""
    files = {module_name(f): f for f in modules(LIB)}

    def owner(name):
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name

    return {m: {owner(n) for n in resolved_imports(f) if owner(n) and owner(n) != m} for m, f in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every rope_lm module importing `start` may run: what it imports, transitively,
    with the packages each of those sits in (importing a.b runs a/__init__.py)."""
    seen, todo = set(), [start]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        parents = [m.rsplit(".", k)[0] for k in range(1, m.count(".") + 1)]
        todo += [n for n in list(graph[m]) + parents if n in graph]
    return seen


def is_module(name: str) -> bool:
    path = os.path.join(ROOT, *name.split("."))
    return os.path.isfile(path + ".py") or os.path.isdir(path)


def strings(path: str) -> list[str]:
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    docstrings = {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
        and n.body
        and isinstance(n.body[0], ast.Expr)
        and isinstance(n.body[0].value, ast.Constant)
    }
    return [
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings
    ]


def rel(path: str) -> str:
    return os.path.relpath(path, ROOT)


def violations(files, forbidden) -> list[str]:
    return [f"{rel(f)} imports {name}" for f in files for name in imports(f) if forbidden(name)]


# The layers of docs/architecture.md, lowest first: a module imports only from its own layer
# or a lower one. The top-level modules (cli.py, the package's __init__) stand above them all,
# except the package's __init__, which re-exports core's ConfigError and so sits with core.
LAYERS = [
    "core",
    "tasks",
    "positional",
    "kernels",
    "scaling",
    "train_positions",
    "model",
    "data",
    "train",
    "eval",
    "infer",
    "hf",
    "runs",
    "probes",
    "compare",
]


def layer(module: str) -> int:
    if module == "rope_lm":
        return LAYERS.index("core")
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) >= 2 and parts[1] in LAYERS else len(LAYERS)


def test_every_subpackage_is_a_layer_and_few_modules_sit_at_the_top():
    entries = sorted(os.listdir(LIB))
    folders = [e for e in entries if os.path.isfile(os.path.join(LIB, e, "__init__.py"))]
    assert sorted(folders) == sorted(LAYERS), (
        "a new folder of rope_lm/ needs its place in LAYERS and docs/architecture.md"
    )
    top = [e for e in entries if e.endswith(".py")]
    assert len(top) <= 12, top


def test_the_architecture_page_maps_every_folder():
    page = open(os.path.join(ROOT, "docs", "architecture.md"), encoding="utf-8").read()
    missing = [f for f in LAYERS if f"rope_lm/{f}/" not in page]
    assert missing == []


def test_no_import_points_up_a_layer_lazy_imports_included():
    graph = import_graph()
    up = sorted(f"{m} imports {n}" for m, targets in graph.items() for n in targets if layer(n) > layer(m))
    assert up == []


def folder_violations(folder: str, forbidden) -> list[str]:
    return violations(modules(os.path.join(LIB, folder)), forbidden)


@pytest.mark.parametrize(
    "folder, allowed",
    [
        ("core", ("rope_lm.core",)),
        ("tasks", ("rope_lm.core", "rope_lm.tasks")),
        ("kernels", ("rope_lm", "rope_lm.core", "rope_lm.kernels", "rope_lm.positional.base")),
        ("train_positions", ("rope_lm.core", "rope_lm.train_positions")),
    ],
)
def test_the_lowest_folders_import_only_what_they_are_allowed(folder, allowed):
    """core is a leaf; tasks is text (no model, no data); kernels import no model/ and
    no scheme, only the scheme interface."""
    own = lambda n: n.startswith("rope_lm") and not any(n == a or n.startswith(a + ".") for a in allowed)
    assert folder_violations(folder, own) == []


def test_positional_schemes_never_import_methods():
    assert folder_violations("positional", lambda n: n.startswith("rope_lm.scaling")) == []


def test_methods_read_schemes_only_through_the_interface_and_the_formulas():
    allowed = ("rope_lm.positional.base", "rope_lm.positional.frequencies")
    bad = folder_violations("scaling", lambda n: n.startswith("rope_lm.positional") and not n.startswith(allowed))
    assert bad == []


def test_the_frequency_formulas_are_a_leaf():
    bad = violations(
        [os.path.join(LIB, "positional", "frequencies.py")],
        lambda n: n.startswith("rope_lm") and n not in ("rope_lm.core.errors", "rope_lm.core.errors.ConfigError"),
    )
    assert bad == []


def test_the_library_imports_no_tool_and_reads_no_config_folder():
    files = modules(LIB)
    assert violations(files, lambda n: n.split(".")[0] in ("scripts", "benchmarks", "train", "tests")) == []
    reads_conf = [
        f"{rel(f)}: {s!r}" for f in files for s in strings(f) if s == "conf" or s.startswith(("conf/", "conf" + os.sep))
    ]
    assert reads_conf == []


def test_only_the_cli_glue_knows_hydra():
    bad = violations(
        [f for f in modules(LIB) if not f.endswith(os.path.join("rope_lm", "cli.py"))],
        lambda n: n.split(".")[0] == "hydra",
    )
    assert bad == []


def test_the_model_and_its_kernels_name_no_scheme_and_no_method():
    from rope_lm.positional import SCHEMES
    from rope_lm.scaling import METHODS

    named_set = set(SCHEMES.names()) | set(METHODS.names()) - {"none"}
    for name in ("model/transformer.py", "model/kv_cache.py", "kernels/attention.py"):
        path = os.path.join(LIB, *name.split("/"))
        named = [s for s in strings(path) if s in named_set]
        assert named == [], f"{name} names {named}"
        bad = violations(
            [path],
            lambda n: (
                (n.startswith("rope_lm.positional.") and n != "rope_lm.positional.base")
                or n.startswith("rope_lm.scaling.")
            ),
        )
        assert bad == []


@pytest.mark.parametrize("folder", ["scripts", "benchmarks", "."])
def test_no_entry_point_edits_sys_path(folder):
    where = os.path.join(ROOT, folder)
    if not os.path.isdir(where):
        pytest.skip(f"no {folder}/ folder")
    files = [os.path.join(where, f) for f in sorted(os.listdir(where)) if f.endswith(".py")]
    bad = [rel(f) for f in files if "sys.path.insert" in open(f).read() or "sys.path.append" in open(f).read()]
    assert bad == []


def test_no_import_cycles_lazy_imports_included():
    """A cycle makes import order matter and hides which layer a module is in;
    a lazy import inside a function is still an arrow."""
    graph = import_graph()
    assert "rope_lm.runs.pipeline" in graph and graph["rope_lm.runs.trained"]  # the graph sees the library
    found = cycles(graph)
    detail = [" -> ".join(c) + ": " + "; ".join(f"{m} imports {sorted(graph[m] & set(c))}" for m in c) for c in found]
    assert found == [], "\n".join(detail)


@pytest.mark.parametrize(
    "module",
    [
        "rope_lm.data.corpus",
        "rope_lm.data.token_cache",
        "rope_lm.data.encode",
        "rope_lm.tasks.synthetic",
        "rope_lm.tasks.retrieval",
    ],
)
def test_the_token_cache_layer_and_the_task_text_never_import_torch(module):
    """A cache build (scripts/prepare_data.py, every rank at start, its worker
    processes) stays light: nothing it can reach imports torch or Lightning,
    lazy imports included."""
    graph = import_graph()
    files = {module_name(f): f for f in modules(LIB)}
    heavy = sorted(
        f"{m} imports {n}"
        for m in reachable(graph, module)
        for n in resolved_imports(files[m])
        if n.split(".")[0] in ("torch", "lightning", "pytorch_lightning")
    )
    assert heavy == []
