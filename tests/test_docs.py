"""The README and docs/ against the tree: links and their anchors, the Layout, the commands, scripts, configs
and files the pages name. Plain text checks, standard library only: no JAX, no bertjax import
(`python -m pytest --noconftest tests/test_docs.py` runs them where JAX is not installed).
"""

import os
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
LAYOUT_PAGE = ROOT / "docs" / "layout.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
SKIPPED_DIRS = {"__pycache__", ".ipynb_checkpoints", ".pytest_cache"}


def _rel(path: pathlib.Path) -> str:
    return str(path.relative_to(ROOT))


def _split_fences(text: str) -> tuple[str, list[str]]:
    """(the text outside fenced code blocks, the code blocks' bodies); line count kept outside."""
    prose, blocks, block, fence = [], [], None, None
    for line in text.splitlines():
        stripped = line.lstrip()
        if fence is None and stripped.startswith(("```", "~~~")):
            fence, block = stripped[:3], []
            prose.append("")
        elif fence is not None and stripped.startswith(fence):
            blocks.append("\n".join(block))
            fence, block = None, None
            prose.append("")
        elif fence is not None:
            block.append(line)
            prose.append("")
        else:
            prose.append(line)
    return "\n".join(prose), blocks


def _prose(path: pathlib.Path) -> str:
    return _split_fences(path.read_text(encoding="utf-8"))[0]


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: link targets and formatting dropped, lower case, punctuation dropped
    (letters, digits, '_', '-' and spaces stay), spaces become hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())
    text = re.sub(r"<[^>]+>", "", text).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: pathlib.Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors = set()
    for line in _prose(path).splitlines():
        m = re.match(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = _slug(m.group(1))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def _links(path: pathlib.Path) -> list[str]:
    """Targets of inline links outside code: [text](target), code spans in the text allowed."""
    prose = re.sub(r"``[^`]+``|`[^`\n]+`", "", _prose(path))
    return [m.group(1) for m in re.finditer(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", prose)]


def _all_text(path: pathlib.Path) -> str:
    return path.read_text(encoding="utf-8")


def _is_placeholder(name: str) -> bool:
    return any(part.isupper() for part in re.split(r"[/._-]", name) if part)


# --- links ----------------------------------------------------------------------------------------------


def test_there_are_docs_pages_and_the_readme_links_every_one():
    pages = sorted((ROOT / "docs").glob("*.md"))
    assert pages, "docs/ has no pages"
    linked = {os.path.normpath(t.split("#")[0]) for t in _links(README)}
    missing = [_rel(p) for p in pages if _rel(p) not in linked]
    assert not missing, f"README.md links none of {missing}"


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_relative_link_points_to_a_file_and_heading_that_exist(page):
    bad = []
    for target in _links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
            continue
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        if not dest.exists():
            bad.append(f"{target}: no file {dest}")
        elif anchor:
            if dest.suffix != ".md":
                bad.append(f"{target}: an anchor into a file that is not markdown")
            elif anchor not in _anchors(dest):
                bad.append(f"{target}: {_rel(dest)} has no heading '#{anchor}' (it has {sorted(_anchors(dest))})")
    assert not bad, f"{_rel(page)}: " + "; ".join(bad)


@pytest.mark.parametrize("page", sorted((ROOT / "docs").glob("*.md")), ids=_rel)
def test_each_docs_page_opens_with_a_summary_and_a_link_back_to_the_readme(page):
    lines = _all_text(page).splitlines()
    assert lines and lines[0].startswith("# "), f"{_rel(page)} does not start with a title"
    paragraph = []
    for line in lines[1:]:
        if line.strip():
            paragraph.append(line)
        elif paragraph:
            break
    opening = " ".join(paragraph)
    assert opening and not opening.startswith(("#", "-", "|", "```")), f"{_rel(page)}: no summary under the title"
    assert "](../README.md" in opening, f"{_rel(page)}: the summary has no link back to ../README.md"


def test_the_readme_stays_short():
    n = len(_all_text(README).splitlines())
    assert n <= 220, f"README.md has {n} lines: move reference material to docs/"


# --- the Layout -----------------------------------------------------------------------------------------


def _layout() -> dict[str, str]:
    """{path relative to the root: its description} from the first code block of docs/layout.md.

    An entry is a line indented by two spaces per folder level (fewer than 16), its first word a name
    relative to the folder above it (a folder ends in '/'); lines indented further continue the
    description above; lines starting with '#' are comments."""
    _, blocks = _split_fences(_all_text(LAYOUT_PAGE))
    assert blocks, "docs/layout.md has no code block"
    entries: dict[str, str] = {}
    folders: list[str] = []
    last = None
    for line in blocks[0].splitlines():
        if not line.strip() or line.strip().startswith("#"):
            continue
        indent = len(line) - len(line.lstrip(" "))
        if indent >= 16:
            assert last is not None, f"a continuation line before any entry: {line!r}"
            entries[last] += " " + line.strip()
            continue
        assert indent % 2 == 0, f"layout entry not indented by whole levels: {line!r}"
        depth = indent // 2
        assert depth <= len(folders), f"layout entry deeper than the folder above it: {line!r}"
        folders = folders[:depth]
        name, _, description = line.strip().partition(" ")
        path = "".join(folders) + name
        assert path.rstrip("/") not in {p.rstrip("/") for p in entries}, f"{path} is listed twice"
        entries[path] = description.strip()
        last = path
        if name.endswith("/"):
            folders.append(name)
    return entries


def _tree_files(folder: str, pattern: str, recursive: bool) -> set[str]:
    base = ROOT / folder
    found = set()
    for path in base.rglob(pattern) if recursive else base.glob(pattern):
        rel = path.relative_to(ROOT)
        if path.is_file() and not SKIPPED_DIRS & set(rel.parts) and not path.name.startswith("."):
            found.add(str(rel))
    return found


def test_every_file_the_layout_names_exists():
    missing = [p for p in _layout() if not os.path.lexists(ROOT / p.rstrip("/"))]
    assert not missing, f"docs/layout.md names files that do not exist: {missing}"


def test_what_the_layout_calls_a_symlink_is_one():
    entries = _layout()
    links = [p for p, d in entries.items() if "symlink" in d]
    assert "configs/" in links, "the Layout no longer says that configs/ is a symlink"
    wrong = [p for p in links if not (ROOT / p.rstrip("/")).is_symlink()]
    assert not wrong, f"docs/layout.md calls these symlinks, but they are not: {wrong}"


@pytest.mark.parametrize(
    "folder, pattern, recursive",
    [
        ("bertjax", "*.py", True),
        ("benchmarks", "*.py", False),
        ("launch", "*", True),
        ("tests", "*.py", False),
        ("docs", "*.md", False),
    ],
)
def test_every_file_in_the_tree_is_in_the_layout(folder, pattern, recursive):
    named = set(_layout())
    missing = sorted(_tree_files(folder, pattern, recursive) - named)
    assert not missing, f"docs/layout.md does not list {missing}"


# --- commands, scripts, configs and files the pages name -----------------------------------------------


def _mentions(regex: str) -> list[tuple[str, re.Match]]:
    return [(_rel(page), m) for page in PAGES for m in re.finditer(regex, _all_text(page))]


def test_every_python_m_command_is_a_module_of_the_package():
    bad = set()
    for page, m in _mentions(r"python3? -m (bertjax(?:\.\w+)+)"):
        if _is_placeholder(m.group(1)):
            continue
        module = ROOT / (m.group(1).replace(".", "/") + ".py")
        if not module.is_file():
            bad.add(f"{page}: python -m {m.group(1)} ({_rel(module)} does not exist)")
    assert not bad, sorted(bad)


def test_every_benchmark_script_named_exists():
    bad = {
        f"{page}: {m.group(0)}"
        for page, m in _mentions(r"(?<![\w/.-])benchmarks/(\w+)\.py")
        if not _is_placeholder(m.group(1)) and not (ROOT / m.group(0)).is_file()
    }
    assert not bad, sorted(bad)


def test_every_config_file_named_exists():
    names = []
    for page, m in _mentions(r"(?<![\w/.-])(?:bertjax/)?configs/(\{[\w,]+\}|\w+)\.py"):
        for name in m.group(1).strip("{}").split(","):
            if not _is_placeholder(name):
                names.append((page, name))
    bad = {
        f"{page}: configs/{name}.py"
        for page, name in names
        if not (ROOT / "bertjax" / "configs" / f"{name}.py").is_file()
        and not (ROOT / "configs" / f"{name}.py").is_file()
    }
    assert not bad, sorted(bad)


def test_every_repository_file_named_exists():
    regex = r"(?<![\w/.-])((?:bertjax|tests|launch|benchmarks|docs|\.ci)/[\w/.-]*?\.(?:py|ipynb|sbatch|md|jsonl))\b"
    generated = {"benchmarks/results/gpu_table.jsonl"}  # written by benchmarks/gpu_table.py when it runs
    bad = {
        f"{page}: {m.group(1)}"
        for page, m in _mentions(regex)
        if m.group(1) not in generated and not _is_placeholder(m.group(1)) and not (ROOT / m.group(1)).is_file()
    }
    assert not bad, sorted(bad)


def test_the_checks_above_would_catch_drift():
    """The parsers find what they must: a test that matched nothing would pass on any text."""
    assert "bertjax/main.py" in _layout() and "bertjax/data/pretraining/packing.py" in _layout()
    assert len(_mentions(r"python3? -m (bertjax(?:\.\w+)+)")) > 10
    assert (
        _slug("Will it fit? TPU slices, compiled before you rent them")
        == "will-it-fit-tpu-slices-compiled-before-you-rent-them"
    )
    assert _slug("What `make demo` does, and what it measured") == "what-make-demo-does-and-what-it-measured"
    assert _slug("Starting from Google's TF1 BERT checkpoints") == "starting-from-googles-tf1-bert-checkpoints"
    assert "docs/demo.md" in _links(README)


# Claims the code has outgrown: each pattern is a thing a page once said was impossible and the tree now does (the
# test that shows it works is named). A page saying it again is stale.
OUTGROWN_CLAIMS = {
    # tests/test_bucket.py trains, resumes and exports with --workdir=gs://...
    r"gs://[^.]*?\b(?:refused|not supported|unsupported|not yet|for now)\b": "a workdir or export in a bucket works",
    # tests/test_bucket.py: init_from=gs://BUCKET/run/hf in main, finetune and extract_features
    r"init_from[^.]*?\b(?:local only|must be local|not (?:in|from) a bucket)\b": "init_from may be in a bucket",
}


def _stale_claims(text: str) -> list[str]:
    sentences = re.split(r"(?<=[.!?])\s+", " ".join(text.split()))
    return [s for s in sentences for regex in OUTGROWN_CLAIMS if re.search(regex, s, re.IGNORECASE)]


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_no_page_repeats_a_claim_the_code_has_outgrown(page):
    assert not _stale_claims(_prose(page)), _stale_claims(_prose(page))


def test_the_stale_claim_check_finds_the_sentence_it_was_written_for():
    planted = "Plain text. A gs:// workdir or export directory is refused for now; use a local one. More text."
    assert _stale_claims(planted) == ["A gs:// workdir or export directory is refused for now; use a local one."]
    assert _stale_claims("Every path may be gs://BUCKET/..., workdirs included.") == []


DEMO_TRANSCRIPT = ROOT / "benchmarks" / "results" / "demo.txt"


def _demo_block() -> list[str]:
    """The README's block of `make demo` output."""
    blocks = [b for b in _split_fences(README.read_text(encoding="utf-8"))[1] if "train step 200/2000" in b]
    assert len(blocks) == 1, "the README shows make demo's output in one block"
    return [line.rstrip() for line in blocks[0].splitlines() if line.strip()]


def test_the_readme_shows_what_make_demo_prints():
    """Every line of the README's demo block is a line of the recorded output (benchmarks/demo_transcript.py),
    and the figures docs/demo.md quotes from it are there too: a figure the command no longer prints fails."""
    printed = set(DEMO_TRANSCRIPT.read_text(encoding="utf-8").splitlines())
    missing = [line for line in _demo_block() if line not in printed]
    assert not missing, f"not in {_rel(DEMO_TRANSCRIPT)} (rerun python benchmarks/demo_transcript.py): {missing}"
    quoted = re.search(
        r"`make demo` today (.*?) Earlier builds", " ".join(_prose(LAYOUT_PAGE.parent / "demo.md").split())
    )
    assert quoted, "docs/demo.md quotes `make demo` today"
    figures = re.findall(r"\d+\.\d\d%", quoted.group(1))
    text = DEMO_TRANSCRIPT.read_text(encoding="utf-8")
    assert len(figures) >= 6 and [f for f in figures if f not in text] == []
