"""The layout: no import cycle between the project's own modules (docs/layout.md).

The import graph is read with ``ast`` (no module is imported): every ``import`` and ``from ... import``
in a file, at its top, inside a function (a lazy import) or under ``TYPE_CHECKING``, is an edge from
that file's module to the project module it names (``from package import name`` goes to
``package.name`` when that is a module, else to the package), and, for a module of another package,
to the packages above it too (importing ``sampling.common`` first runs ``sampling/__init__.py``). A
cycle is a strongly connected set of modules; each must lie within one of ``KNOWN_CYCLES``, a list
that may only shrink. ``python tests/test_layout.py [ROOT]`` prints the cycles of a checkout."""
import ast
import sys
from pathlib import Path
from typing import Dict, List, Set

ROOT = Path(sys.argv[1]).resolve() if __name__ == "__main__" and len(sys.argv) > 1 else Path(__file__).resolve().parents[1]
PACKAGES = ("app", "models", "runners", "kernels", "drafters", "eagle", "sampling", "ngram_assisted", "measure", "utils", "scripts")

# Cycles allowed to remain: none since the drafters moved to drafters/ and the runners to runners/
# (issue 28). The list may only shrink; a new cycle fails.
KNOWN_CYCLES: List[Set[str]] = []


def project_modules() -> Dict[str, Path]:
    """Dotted module name -> file, for the root's modules and every .py under ``PACKAGES``."""
    files = [p for p in ROOT.glob("*.py")] + [p for package in PACKAGES for p in (ROOT / package).rglob("*.py")]
    modules = {}
    for path in files:
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _resolve(name: str, modules: Dict[str, Path]) -> str | None:
    """The longest prefix of ``name`` that is a project module (None for another project's)."""
    parts = name.split(".")
    while parts:
        if ".".join(parts) in modules:
            return ".".join(parts)
        parts.pop()
    return None


def import_graph(modules: Dict[str, Path]) -> Dict[str, Set[str]]:
    graph = {}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)] if package else []
                    base = ".".join(anchor + ([base] if base else []))
                names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
            else:
                continue
            for found in filter(None, (_resolve(name, modules) for name in names)):
                edges.add(found)
                if found.split(".")[0] != module.split(".")[0]:  # importing another package's module runs its __init__ first
                    parts = found.split(".")
                    edges |= {".".join(parts[:i]) for i in range(1, len(parts)) if ".".join(parts[:i]) in modules}
        graph[module] = edges - {module}
    return graph


def cycles(graph: Dict[str, Set[str]]) -> List[Set[str]]:
    """The strongly connected sets of more than one module (Tarjan's algorithm, iteratively)."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], [0]
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def test_no_import_cycle_between_the_projects_modules():
    found = cycles(import_graph(project_modules()))
    new = [sorted(component) for component in found if not any(component <= known for known in KNOWN_CYCLES)]
    assert not new, f"new import cycles (docs/layout.md): {new}"


# Packages whose modules still import the package itself: none since measure/ named its modules (issue
# "faults found in a read of the new code", item 12). The list may only shrink.
KNOWN_SELF_IMPORTS: Set[str] = set()


def self_imports(modules: Dict[str, Path]) -> List[str]:
    """Modules of a package that import that package, i.e. its ``__init__`` (``from runners import
    static``, ``import runners``, ``from . import x``), as "module: line"."""
    found = []
    for module, path in modules.items():
        if path.name == "__init__.py" or "." not in module:
            continue
        package = module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                named = package if node.level == 1 and not node.module else node.module if not node.level else None
                hit = named == package
            elif isinstance(node, ast.Import):
                hit = any(alias.name == package for alias in node.names)
            else:
                continue
            if hit:
                found.append(f"{module}: {node.lineno}")
    return found


def test_no_module_imports_its_own_package():
    """A package's ``__init__`` imports its modules, so a module that imports the package reads a
    half-run ``__init__``: ``runners.config`` -> ``runners`` -> ``runners.compiled`` -> ``runners.config``
    was such a circle. A module names its siblings' modules (``from runners.static import carry``)."""
    found = [hit for hit in self_imports(project_modules()) if hit.split(".")[0] not in KNOWN_SELF_IMPORTS]
    assert not found, f"modules that import their own package's __init__ (docs/layout.md): {found}"


def test_a_module_that_imports_its_own_package_is_found(tmp_path):
    (tmp_path / "pkg").mkdir()
    files = {"pkg": "from pkg.a import x\n", "pkg.a": "from pkg import b\n", "pkg.b": "import pkg.a\n",
             "pkg.c": "from . import a\n"}
    modules = {}
    for name, text in files.items():
        path = tmp_path / "pkg" / ("__init__.py" if name == "pkg" else name.split(".")[1] + ".py")
        path.write_text(text)
        modules[name] = path
    assert self_imports(modules) == ["pkg.a: 1", "pkg.c: 1"]


def package_graph(graph: Dict[str, Set[str]]) -> Dict[str, Set[str]]:
    """The import graph between top-level packages (a root module is a package of its own)."""
    top = {module: module.split(".")[0] for module in graph}
    packages: Dict[str, Set[str]] = {name: set() for name in top.values()}
    for module, edges in graph.items():
        packages[top[module]] |= {top[edge] for edge in edges if top[edge] != top[module]}
    return packages


# Circles between top-level packages allowed to remain: none since the start-up measurement moved
# to measure/ (issue 41). The list may only shrink.
KNOWN_PACKAGE_CYCLES: List[Set[str]] = []


def test_no_import_circle_between_top_level_packages():
    """The packages are floors: utils and runners at the bottom, then the drafters, the loops, the
    programs; a package imports only from the floors below it."""
    found = cycles(package_graph(import_graph(project_modules())))
    new = [sorted(component) for component in found if not any(component <= known for known in KNOWN_PACKAGE_CYCLES)]
    assert not new, f"new circles between packages (docs/layout.md): {new}"


def test_a_circle_through_two_packages_is_found_even_without_a_module_cycle():
    graph = {"a": set(), "a.x": {"b.y"}, "a.w": set(), "b": set(), "b.y": set(), "b.z": {"a.w"}}
    assert not cycles(graph) and cycles(package_graph(graph)) == [{"a", "b"}]


def test_the_programs_have_no_cycle_at_all():
    """The programs' own modules (app/ and the root's entry points) are in no cycle, known or not."""
    programs = {"bench", "infer", "session", "strategies"}
    found = cycles(import_graph(project_modules()))
    assert not [sorted(c) for c in found if any(m.split(".")[0] == "app" or m in programs for m in c)]


def code_lines(function: ast.FunctionDef) -> int:
    """Lines of a function's body after its docstring."""
    body = function.body
    documented = isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) and isinstance(
        body[0].value.value, str)
    start = body[0].end_lineno + 1 if documented and len(body) > 1 else body[0].lineno
    return function.end_lineno - start + 1


def test_files_and_functions_stay_short():
    """No file over 400 lines, no function over 80 lines (docstrings aside), and each public
    ``*_generate`` a thin wrapper over the one entry (at most 25 lines)."""
    long_files, long_functions = [], []
    for name, path in project_modules().items():
        text = path.read_text()
        if len(text.splitlines()) > 400:
            long_files.append(name)
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                limit = 25 if node.name.endswith("_generate") and node.col_offset == 0 and name.split(".")[0] in (
                    "sampling", "ngram_assisted") else 80
                if code_lines(node) > limit:
                    long_functions.append(f"{name}.{node.name} ({code_lines(node)} > {limit})")
    assert not long_files and not long_functions, (long_files, long_functions)


MAX_PARAMETERS = 8


def parameter_count(function: ast.FunctionDef) -> int:
    """Its parameters, ``self``/``cls`` and ``*args``/``**kwargs`` aside."""
    a = function.args
    names = [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs]
    return len(names) - (1 if names and names[0] in ("self", "cls") else 0)


def test_no_function_takes_more_than_eight_parameters_but_the_references():
    """The reference's public functions keep their signatures (``test_reference_compat.REFERENCE``);
    every other function of the project takes at most eight parameters (a frozen options object
    carries the rest)."""
    from test_reference_compat import REFERENCE

    exempt = {name for _, name in REFERENCE}
    found = []
    for module, path in project_modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name not in exempt:
                if parameter_count(node) > MAX_PARAMETERS:
                    found.append(f"{module}.{node.name} ({parameter_count(node)})")
    assert not found, found


# The library's settings reach it through the run's configuration (``RunConfig``, ``RunnerConfig``), never
# through an environment switch. These modules read the environment, each for a reason that is no switch;
# the list may only shrink. The programs (``app``, ``scripts``, ``infer.py``, ``bench.py``) are not the library.
ENVIRONMENT_READERS = {
    "utils.models": "SPECDEC_CACHE: the project's cache folder (``cache_dir``)",
    "kernels.compile_cache": "TORCHINDUCTOR_CACHE_DIR: inductor's cache folder, pointed at ours",
    "utils.toolchain": "CC: the C compiler, as make reads it",
    "eagle.parallel": "WORLD_SIZE, RANK, LOCAL_RANK: torchrun's protocol",
    "peers_openvino": "SPECDEC_OPENVINO_VENV: the OpenVINO peer's own virtual environment, and its subprocess's",
    "utils.load": "SPECDEC_OTHERS_CORES: the cores every start-up measurement's load window reports (the suite: 0)",
}
PROGRAMS = ("app", "scripts", "infer", "bench")


def reads_environment(tree: ast.AST) -> bool:
    """Whether the code names ``os.environ``, ``os.getenv`` or ``os.putenv`` (or imports them by name)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "putenv"):
            return True
        if isinstance(node, ast.ImportFrom) and node.module == "os" and any(
                alias.name in ("environ", "getenv", "putenv") for alias in node.names):
            return True
    return False


def test_the_library_reads_no_environment_switch():
    """Beyond ``ENVIRONMENT_READERS``, no library module reads the environment (``SPECDEC_STEP_GRAPHS`` became
    ``RunnerConfig.graphs``, issue 70); the check finds a read where there is one."""
    found = {module for module, path in project_modules().items()
             if module.split(".")[0] not in PROGRAMS and reads_environment(ast.parse(path.read_text()))}
    assert found <= set(ENVIRONMENT_READERS), sorted(found - set(ENVIRONMENT_READERS))
    assert reads_environment(ast.parse("import os\nmode = os.environ.get('SPECDEC_STEP_GRAPHS', 'regional')"))
    assert reads_environment(ast.parse("from os import getenv"))
    assert not reads_environment(ast.parse("import os\npath = os.path.join('a', 'b')"))


if __name__ == "__main__":  # the cycles as they are now: between modules, then between packages
    for component in cycles(import_graph(project_modules())):
        print(sorted(component))
    for component in cycles(package_graph(import_graph(project_modules()))):
        print("packages:", sorted(component))
