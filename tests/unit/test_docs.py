"""The README is a front page and docs/ holds the rest (issue 47): the checks that keep it so.

* README.md is at most 250 lines;
* every docs/*.md page is linked from the README's map;
* every relative link in README.md and docs/*.md names a file that exists, and a ``#anchor`` names a heading
  of that page (GitHub's heading ids);
* the README's two commands are the ones the project runs: the app's install-and-launch line, and
  ``bash .ci/run``, which CI runs and which runs the test suite.

The link checker is a plain function, tested on a synthetic text with a planted dead link and a dead anchor,
so a checker that finds nothing cannot pass by accident.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
README_MAX_LINES = 250

# Pages the README and docs/ may link to before they exist on this branch, each with the reason. Keep this
# short and remove an entry as soon as the page is merged.
ALLOWED_MISSING: frozenset = frozenset()  # pages a link may name before they exist (none now)

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~)")
INLINE_CODE = re.compile(r"`+[^`]*`+")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def _prose_lines(text: str):
    """(line number, line) outside fenced code blocks."""
    fenced = False
    for number, line in enumerate(text.split("\n"), 1):
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            yield number, line


def slug(heading: str) -> str:
    """GitHub's id for a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = text.replace("`", "").replace("*", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)  # \w keeps letters and digits of every script, and _
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading id of a Markdown text, duplicates numbered as GitHub numbers them."""
    seen: dict[str, int] = {}
    out = set()
    for _, line in _prose_lines(text):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


def links(text: str):
    """(line number, target) of every Markdown link and image outside code."""
    for number, line in _prose_lines(text):
        for match in LINK.finditer(INLINE_CODE.sub("", line)):
            yield number, match.group(1)


def dead_links(text: str, page: Path, root: Path = ROOT, allowed_missing=frozenset()) -> list[str]:
    """The relative links of ``text`` (the contents of ``page``) that name no file, or no heading of it."""
    problems = []
    for number, target in links(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto: …
            continue
        path_part, _, anchor = target.partition("#")
        where = f"{page.name}:{number}: {target}"
        if path_part:
            resolved = (page.parent / path_part).resolve()
            try:
                name = resolved.relative_to(root.resolve()).as_posix()
            except ValueError:
                problems.append(f"{where} leaves the repository")
                continue
            if not resolved.exists():
                if name not in allowed_missing:
                    problems.append(f"{where} names no file")
                continue
            if anchor and resolved.suffix == ".md" and anchor not in anchors(resolved.read_text("utf-8")):
                problems.append(f"{where} names no heading of {name}")
        elif anchor and anchor not in anchors(text):
            problems.append(f"{where} names no heading of this page")
    return problems


def pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def section(text: str, title: str) -> str:
    """The body of the ``## title`` section."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"the README has no '## {title}' section"
    return match.group(1)


# ---------------------------------------------------------------- the checker itself


def test_checker_finds_a_planted_dead_link_and_a_dead_anchor(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "real.md").write_text("# Real page\n\n## A section, with `code`\n", "utf-8")
    page = tmp_path / "README.md"
    text = "\n".join([
        "# Title",
        "[fine](docs/real.md) and [fine too](docs/real.md#a-section-with-code), [here](#title)",
        "[dead](docs/missing.md)",
        "[dead anchor](docs/real.md#no-such-heading)",
        "[dead here](#nowhere)",
        "[outside](../../etc/passwd)",
        "![picture](assets/none.png)",
        "[web](https://example.com/x.md) and `[in code](docs/missing2.md)`",
        "```",
        "[in a fence](docs/missing3.md)",
        "```",
        "[allowed](docs/later.md)",
    ])
    problems = dead_links(text, page, root=tmp_path, allowed_missing={"docs/later.md"})
    assert problems == [
        "README.md:3: docs/missing.md names no file",
        "README.md:4: docs/real.md#no-such-heading names no heading of docs/real.md",
        "README.md:5: #nowhere names no heading of this page",
        "README.md:6: ../../etc/passwd leaves the repository",
        "README.md:7: assets/none.png names no file",
    ]
    # the allowance is what lets the last link through
    assert "README.md:12: docs/later.md names no file" in dead_links(text, page, root=tmp_path)


def test_slugs_follow_github():
    assert slug("What is kept, and sharing") == "what-is-kept-and-sharing"
    assert slug("API (gradio_client)") == "api-gradio_client"
    assert slug("Many users at once (`many_users_*`, `slider_p95_load_over_idle_p50`)") == \
        "many-users-at-once-many_users_-slider_p95_load_over_idle_p50"
    assert anchors("# A\n## A\n```\n# not a heading\n```\n") == {"a", "a-1"}


# ---------------------------------------------------------------- the project's pages


def test_readme_is_a_front_page():
    lines = README.read_text("utf-8").split("\n")
    count = len(lines) - (lines[-1] == "")
    assert count <= README_MAX_LINES, f"README.md has {count} lines; the front page keeps to {README_MAX_LINES}"


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(ROOT / target.partition("#")[0]).resolve() for _, target in links(README.read_text("utf-8"))}
    unlinked = [p.name for p in sorted(DOCS.glob("*.md")) if p.resolve() not in linked]
    assert not unlinked, f"docs pages the README's map does not link: {unlinked}"


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(page):
    assert dead_links(page.read_text("utf-8"), page, allowed_missing=ALLOWED_MISSING) == []


def test_the_two_commands_are_the_ones_the_project_runs():
    text = section(README.read_text("utf-8"), "Two commands")
    commands = re.findall(r"```bash\n(.*?)\n```", text, re.S)
    assert commands == ["python3 -m pip install -r requirements.txt && python3 app.py", "bash .ci/run"]
    # the first: the runtime requirements and the app's entry point
    assert (ROOT / "requirements.txt").is_file()
    assert 'if __name__ == "__main__"' in (ROOT / "app.py").read_text("utf-8")
    # the second: what CI runs, installing the test requirements and running the whole suite
    ci = (ROOT / ".ci" / "run").read_text("utf-8")
    assert "The README's test command" in ci
    assert "requirements-dev.txt" in ci and "-m pytest" in ci


def test_the_readme_says_how_to_run_the_slow_tests():
    text = section(README.read_text("utf-8"), "Tests")
    assert "python -m pytest -m slow" in text
    assert "`.ci/run` runs everything except the tests marked `slow`" in text
    assert "30 minutes" in text
