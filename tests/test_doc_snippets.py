"""Every snippet the README and docs/ mark as runnable (an HTML comment `<!-- snippet: run -->`
right above the fence) runs as written: Python blocks in a fresh interpreter, shell blocks line by
line with bash (`set -e`), each in an empty folder, with this venv's `python` and `qfuse` on PATH."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARK = re.compile(r"<!-- snippet: run -->\s*\n```(\w+)\n(.*?)\n```", re.DOTALL)


def snippets() -> list[tuple[str, str, str]]:
    found = []
    for doc in DOCS:
        for i, match in enumerate(MARK.finditer(doc.read_text())):
            found.append((f"{doc.name}#{i}", match.group(1), match.group(2)))
    return found


def test_the_readme_marks_snippets() -> None:
    names = [name for name, _, _ in snippets()]
    assert sum(name.startswith("README.md") for name in names) >= 2


@pytest.mark.parametrize(("name", "lang", "code"), snippets(), ids=[s[0] for s in snippets()])
def test_snippet_runs(name: str, lang: str, code: str, tmp_path: Path) -> None:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    if lang == "python":
        cmd = [sys.executable, "-c", code]
    elif lang in ("sh", "bash", "shell"):
        cmd = ["bash", "-e", "-o", "pipefail", "-c", code]
    else:
        pytest.fail(f"{name}: snippet language {lang!r} is not runnable")
    done = subprocess.run(cmd, check=False, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, f"{name} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
