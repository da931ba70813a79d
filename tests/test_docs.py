"""The README and docs/ stay true: links resolve, named make targets, subcommands and
package paths exist, and code cites docs/ sections that exist.

Each check is a function over text, run on the real files and, once, on a broken
input, so a check that can no longer fail is noticed.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
MARKDOWN = [README, *DOCS]
README_MAX_LINES = 160
CITING_DIRS = ("eagle3_backend", "tests", "benchmarks", "scripts")

_LINK_RE = re.compile(r"!?\[[^\]]*\]\(\s*([^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")
_FENCE_RE = re.compile(r"^\s*(```|~~~)")
_HEADING_RE = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_SPAN_RE = re.compile(r"`([^`]+)`")


# ----------------------------------------------------------------------------- markdown helpers
def _split(text: str) -> tuple[list[str], list[str]]:
    """(prose lines, code lines): fenced blocks and 4-space-indented lines are code."""
    prose, code, fenced = [], [], False
    for line in text.splitlines():
        if _FENCE_RE.match(line):
            fenced = not fenced
            continue
        if fenced or line.startswith(("    ", "\t")):
            code.append(line)
        else:
            prose.append(line)
    return prose, code


def _code_text(text: str) -> list[str]:
    """Every piece of code in a markdown text: code-block lines and inline code spans."""
    prose, code = _split(text)
    return code + [m.group(1) for line in prose for m in _SPAN_RE.finditer(line)]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def headings(text: str) -> list[str]:
    prose, _ = _split(text)
    return [m.group(2) for line in prose if (m := _HEADING_RE.match(line))]


def anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for h in headings(text):
        base = slug(h)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(path: Path, text: str) -> list[str]:
    """Relative links in ``text`` (the file at ``path``) whose file or heading is missing."""
    prose, _ = _split(text)
    problems = []
    for line in prose:
        line = _SPAN_RE.sub("", line)
        for m in _LINK_RE.finditer(line):
            target = m.group(1)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            if file_part and not dest.exists():
                problems.append(f"{path.name}: link {target!r}: {dest} does not exist")
                continue
            if anchor:
                if dest.suffix != ".md" or dest.is_dir():
                    problems.append(f"{path.name}: link {target!r}: anchor on a non-markdown file")
                elif anchor not in anchors(dest.read_text(encoding="utf-8") if file_part
                                           else text):
                    problems.append(f"{path.name}: link {target!r}: no heading "
                                    f"#{anchor} in {dest.name}")
    return problems


# ----------------------------------------------------------------------------- links
@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path: Path):
    assert broken_links(path, path.read_text(encoding="utf-8")) == []


def test_docs_exist_and_readme_links_them():
    names = {p.name for p in DOCS}
    assert {"serving.md", "design.md", "tools.md"} <= names, names
    linked = {Path(t.partition("#")[0]).name
              for t in _LINK_RE.findall(README.read_text(encoding="utf-8"))}
    assert names - linked == set(), f"docs not linked from README.md: {sorted(names - linked)}"


def test_link_check_catches_a_missing_file_and_heading(tmp_path):
    (tmp_path / "other.md").write_text("# Title\n\n## Some `code` here (tp 8)\n")
    page = tmp_path / "page.md"
    text = ("[ok](other.md) [ok](other.md#some-code-here-tp-8) [ok](#top) [web](https://x.y/z)\n"
            "# Top\n[gone](missing.md) [bad](other.md#nope)\n"
            "    [in code](missing-too.md)\n")
    problems = broken_links(page, text)
    assert len(problems) == 2, problems
    assert "missing.md" in problems[0] and "#nope" in problems[1]


# ----------------------------------------------------------------------------- README
def test_readme_is_short():
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n <= README_MAX_LINES, (f"README.md has {n} lines (at most {README_MAX_LINES}); "
                                   "move detail into docs/")


def test_readme_states_the_test_command():
    pieces = [c.strip() for c in _code_text(README.read_text(encoding="utf-8"))]
    assert any(re.match(r"make test(\s|$)", c) for c in pieces), "README.md must say `make test`"


def make_targets(makefile_text: str) -> set[str]:
    targets = set()
    for line in makefile_text.splitlines():
        m = re.match(r"^([A-Za-z0-9_.\-/$() ]+?)\s*::?(?!=)", line)
        if m and not line.startswith("\t"):
            targets.update(t for t in m.group(1).split() if "$" not in t)
    return targets


def named_make_targets(markdown_text: str) -> set[str]:
    """Targets of every ``make X`` written as code (a code block or an inline span)."""
    found = set()
    for piece in _code_text(markdown_text):
        found.update(re.findall(r"(?:^|[\s;&|(])make\s+([A-Za-z0-9][\w.-]*)", piece))
    return found


def test_readme_make_targets_exist():
    named = named_make_targets(README.read_text(encoding="utf-8"))
    assert {"demo", "test"} <= named, named  # the two quick-start commands are there
    missing = named - make_targets((ROOT / "Makefile").read_text(encoding="utf-8"))
    assert missing == set(), f"README.md names make targets the Makefile lacks: {sorted(missing)}"


def test_make_target_check_catches_a_missing_target():
    makefile = "setup: .venv/x\n\t./x\ndemo: setup\n\techo\nA := 1\n.PHONY: setup demo\n"
    assert make_targets(makefile) == {"setup", "demo", ".PHONY"}
    assert named_make_targets("    make demo\n\nRun `make nope` or make believe.\n") == {"demo",
                                                                                       "nope"}


# ----------------------------------------------------------------------------- CLI table
@functools.lru_cache(maxsize=1)
def subcommands() -> frozenset[str]:
    import argparse

    from eagle3_backend.cli import build_parser

    parser = build_parser()
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert len(actions) == 1
    return frozenset(actions[0].choices)


def cli_table_commands(markdown_text: str) -> list[str]:
    """The subcommand of each row of the table under the ``eagle3`` command heading."""
    lines = markdown_text.splitlines()
    start = next(i for i, line in enumerate(lines)
                 if _HEADING_RE.match(line) and "eagle3" in line and "command" in line)
    rows = []
    for line in lines[start + 1:]:
        if _HEADING_RE.match(line):
            break
        m = re.match(r"^\|\s*`eagle3\s+([A-Za-z0-9][\w-]*)", line)
        if m:
            rows.append(m.group(1))
    return rows


def test_readme_cli_table_names_real_subcommands_and_all_of_them():
    table = cli_table_commands(README.read_text(encoding="utf-8"))
    real = subcommands()
    assert len(table) >= 5, table
    assert set(table) - real == set(), f"README's CLI table names no such subcommand: " \
                                       f"{sorted(set(table) - real)} (real: {sorted(real)})"
    assert real - set(table) == set(), f"subcommands missing from README's CLI table: " \
                                       f"{sorted(real - set(table))}"


@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: str(p.relative_to(ROOT)))
def test_eagle3_subcommands_written_in_docs_are_real(path: Path):
    real = subcommands()
    named = {m for piece in _code_text(path.read_text(encoding="utf-8"))
             for m in re.findall(r"(?:^|[\s;&|(])eagle3\s+([a-z][\w-]*)", piece)}
    assert named - real == set(), f"{path.name} names no such subcommand: {sorted(named - real)}"


def test_cli_table_check_reads_only_its_table():
    text = ("## The `eagle3` command\n\n| command | what |\n|---|---|\n"
            "| `eagle3 inspect DRAFT` | x |\n| `eagle3 bogus` | y |\n\n## Next\n"
            "| `eagle3 other` | z |\n")
    assert cli_table_commands(text) == ["inspect", "bogus"]
    assert "bogus" not in subcommands()


# ----------------------------------------------------------------------------- package map
def map_paths(markdown_text: str) -> list[str]:
    """Paths named in the README's repository map (indented names are inside the one above)."""
    lines = markdown_text.splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(r"^##\s+Repository\b", line))
    paths, parent = [], ""
    for line in lines[start + 1:]:
        if _HEADING_RE.match(line):
            break
        m = re.match(r"^( {4,})(\S+)", line)
        if not m:
            continue
        depth, name = len(m.group(1)) - 4, m.group(2)
        if depth == 0:
            parent = name if name.endswith("/") else ""
            paths.append(name)
        elif parent:
            paths.append(parent + name)
    return paths


def test_readme_repository_map_paths_exist():
    paths = map_paths(README.read_text(encoding="utf-8"))
    assert "eagle3_backend/" in paths and len(paths) >= 8, paths
    missing = [p for p in paths if not (ROOT / p).exists()]
    assert missing == [], f"README.md's repository map names paths that do not exist: {missing}"


# ----------------------------------------------------------------------------- citations
_CITE_RE = re.compile(r"(docs/[\w.-]+\.md)(?:,\s*\"([^\"]+)\")?")


def citations(text: str) -> list[tuple[str, str | None]]:
    flat = re.sub(r"\s+", " ", text.replace("#", " "))
    return [(m.group(1), m.group(2)) for m in _CITE_RE.finditer(flat)]


def bad_citations(cites: list[tuple[str, str | None]]) -> list[str]:
    problems = []
    for doc, section in cites:
        path = ROOT / doc
        if not path.exists():
            problems.append(f"{doc} does not exist")
        elif section and not any(h.replace("`", "").startswith(section)
                                 for h in headings(path.read_text(encoding="utf-8"))):
            problems.append(f"{doc} has no section starting {section!r}")
    return problems


def _source_files() -> list[Path]:
    files = []
    for d in CITING_DIRS:
        for p in sorted((ROOT / d).rglob("*")):
            if p.is_file() and p.suffix in {".py", ".sh", ".md", ".cu", ".cpp", ".h"} \
                    and p != Path(__file__).resolve():
                files.append(p)
    return files


def test_code_cites_existing_docs_sections():
    problems, n = [], 0
    for p in _source_files():
        cites = citations(p.read_text(encoding="utf-8", errors="replace"))
        n += len(cites)
        problems += [f"{p.relative_to(ROOT)}: {e}" for e in bad_citations(cites)]
    assert n >= 4, "expected the layout code and its tests to cite docs/design.md"
    assert problems == []


def test_no_citation_of_a_design_file_outside_docs():
    stale = "DESIGN" + ".md"
    offenders = [str(p.relative_to(ROOT)) for p in _source_files()
                 if stale in p.read_text(encoding="utf-8", errors="replace")]
    assert offenders == [], f"cite docs/design.md instead of {stale} in: {offenders}"


def test_citation_check_catches_a_missing_section():
    text = '# see docs/design.md,\n# "The bug class this project exists to end"; docs/nope.md'
    assert citations(text) == [("docs/design.md", "The bug class this project exists to end"),
                               ("docs/nope.md", None)]
    assert bad_citations(citations(text)) == ["docs/nope.md does not exist"]
    assert bad_citations([("docs/design.md", "No such section")]) != []
