"""The hand-written tables of the docs, checked against the code's tables: every REPL command
(``app.repl.commands.COMMANDS``: the built-in ones and each strategy row's toggle and parameter
commands) is in the command table of docs/repl.md, and every command it lists exists; every strategy key (``strategies.EVERY``) is in docs/benchmark.md's table of keys, which
says which run by default (``app.bench.configs.default_strategies``). A row added to the strategy
table without its line in the docs fails here."""
import re
from pathlib import Path
from typing import Dict, List, Set

ROOT = Path(__file__).resolve().parents[1]
REPL_DOCS = (ROOT / "docs" / "repl.md",)  # the README links to it; it has no command table of its own
BENCHMARK_DOC = ROOT / "docs" / "benchmark.md"


def table(path: Path, header: str) -> List[List[str]]:
    """The cells of each row of the first markdown table of ``path`` whose header row starts with ``header``."""
    lines = path.read_text(encoding="utf-8").splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(header)), None)
    assert start is not None, f"{path.name} has no table starting {header!r}"
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]])
    return rows


def documented_commands(path: Path) -> Set[str]:
    """The commands named in the first column of ``path``'s command table."""
    return {name for row in table(path, "| command |") for name in re.findall(r"`(/\w+)", row[0])}


def command_drift(path: Path) -> Dict[str, Set[str]]:
    """What ``path``'s command table misses of ``COMMANDS``, and what it lists that is not a command."""
    from app.repl.commands import COMMANDS

    documented = documented_commands(path)
    return {"undocumented": set(COMMANDS) - documented, "not a command": documented - set(COMMANDS)}


def documented_keys(path: Path = BENCHMARK_DOC) -> Dict[str, bool]:
    """The strategy keys of docs/benchmark.md's table of keys, and whether it says each runs by default."""
    rows = table(path, "| key |")
    return {key: row[-1].startswith("yes") for row in rows for key in re.findall(r"`(\w+)`", row[0])}


def key_drift(path: Path = BENCHMARK_DOC) -> Dict[str, Set[str]]:
    from app.bench.configs import default_strategies
    from strategies import EVERY

    keys = documented_keys(path)
    return {"undocumented": set(EVERY) - set(keys), "not a key": set(keys) - set(EVERY),
            "default as documented, not as run": {k for k, on in keys.items() if on} ^ set(default_strategies().split(","))}


def test_every_repl_command_is_in_the_docs_command_tables_and_nothing_else():
    from app.repl.commands import COMMANDS
    from strategies import STRATEGIES

    assert all(f"/{s.key}" in COMMANDS for s in STRATEGIES) and all(f"/{p.name}" in COMMANDS for s in STRATEGIES for p in s.params)
    for path in REPL_DOCS:
        drift = command_drift(path)
        assert not any(drift.values()), f"{path.name}'s command table: {drift}"


def test_every_strategy_key_is_in_the_benchmark_docs_with_its_default():
    drift = key_drift()
    assert not any(drift.values()), f"docs/benchmark.md's table of keys: {drift}"


def test_a_row_added_without_its_docs_fails_the_checks():
    """The checks above fail for a registered row (its toggle and parameter command, its key) until documented."""
    import strategies
    from strategies import Param, Strategy

    row = Strategy("undocumented_row", "Undocumented", "cyan", False, True, True, drafter=lambda prompt, s: None,
                   params=(Param("undocumented_n", int, 2, 1, 8),))
    before = {path: command_drift(path) for path in REPL_DOCS}, key_drift()
    with strategies.register(row):
        for path in REPL_DOCS:
            assert command_drift(path)["undocumented"] - before[0][path]["undocumented"] == {"/undocumented_row", "/undocumented_n"}
        drift = key_drift()
        for kind in ("undocumented", "default as documented, not as run"):
            assert drift[kind] - before[1][kind] == {"undocumented_row"}, kind
    assert ({path: command_drift(path) for path in REPL_DOCS}, key_drift()) == before


def test_every_repl_toggle_runs_its_own_row():
    """The REPL's strategy toggles are the table's: each ``/key`` turns its row on (or refuses in one line)."""
    from types import SimpleNamespace

    from app.repl.commands import BUILT_IN, COMMANDS
    from conftest import llama
    from strategies import STRATEGIES, RunConfig, RunContext
    from utils.parsing import UsageError

    assert not {f"/{s.key}" for s in STRATEGIES} & set(BUILT_IN), "a built-in command would hide a row's toggle"
    for strategy in STRATEGIES:
        repl = SimpleNamespace(config=RunConfig(), context=RunContext(target=llama(), tokenizer=None), enabled={})
        try:
            said = COMMANDS[f"/{strategy.key}"](repl, [])
        except UsageError as refused:
            assert strategy.needs_drafter or strategy.needs_head, (strategy.key, refused)
            continue
        assert said == f"{strategy.title}: on" and repl.enabled == {strategy.key: True}


def test_every_page_of_docs_is_reached_from_the_readme():
    """Each docs/*.md is linked from the README or from a page it links (issue 41: the guide was not)."""
    def links(path: Path) -> Set[Path]:
        return {(path.parent / target).resolve() for target in re.findall(r"\]\(([\w./-]+\.md)", path.read_text(encoding="utf-8"))}

    reached, todo = set(), [ROOT / "README.md"]
    while todo:
        for page in links(todo.pop()) - reached:
            reached.add(page)
            if page.exists():
                todo.append(page)
    assert not {p.resolve() for p in (ROOT / "docs").glob("*.md")} - reached
    assert (ROOT / "docs" / "adding-a-drafter.md").resolve() in links(ROOT / "README.md")


def anchors(path: Path) -> Set[str]:
    """The anchors GitHub gives ``path``'s headings: lower case, punctuation dropped, spaces as hyphens,
    a repeated one suffixed -1, -2, ..."""
    found: Set[str] = set()
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    for heading in re.findall(r"^#+ (.+)$", text, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchor, n = slug, 0
        while anchor in found:
            n += 1
            anchor = f"{slug}-{n}"
        found.add(anchor)
    return found


def broken_links(path: Path) -> List[str]:
    """Each relative link of ``path`` whose file does not exist, or whose #anchor no heading of that file gives."""
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        if not linked.exists() or (anchor and linked.suffix == ".md" and anchor not in anchors(linked)):
            broken.append(target)
    return broken


def test_every_relative_link_of_the_readme_and_the_docs_resolves_to_a_file_and_heading():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    broken = {page.relative_to(ROOT).as_posix(): links for page in pages if (links := broken_links(page))}
    assert not broken, broken


def test_a_link_to_a_missing_file_or_heading_is_found(tmp_path):
    (tmp_path / "there.md").write_text("# A heading: with `code`, and more\n## Twice\n## Twice\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](there.md#a-heading-with-code-and-more) [ok](there.md#twice-1) [web](https://example.com/x)\n"
                    "[no file](gone.md) [no heading](there.md#nowhere) [ok](#here)\n# Here\n")
    assert broken_links(page) == ["gone.md", "there.md#nowhere"]
