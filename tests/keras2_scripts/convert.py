"""Turn a public notebook into one of the corpus's scripts: its code cells, in order.

    python tests/keras2_scripts/convert.py MIRROR COMMIT NOTEBOOK URL OUT.py

MIRROR is a git clone of the notebook's repository, COMMIT the commit it is read at. The one
change: a notebook-only line (`!pip install ...`, `%load_ext ...`), which Python cannot run,
becomes `pass` with the line in a comment, at its indentation; the header lists those
lines. Data downloads are not edited: tests/processes/test_keras2_scripts.py serves them offline.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

MARK = "# [corpus] notebook-only line, not Python: "


def convert(mirror: str, commit: str, notebook: str, url: str) -> str:
    text = subprocess.run(["git", "-C", mirror, "show", f"{commit}:{notebook}"],
                          check=True, capture_output=True, text=True).stdout
    cells = [c for c in json.loads(text)["cells"] if c["cell_type"] == "code"]
    body: list[str] = []
    changed: list[int] = []
    for cell in cells:
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        for line in source.splitlines():
            stripped = line.lstrip()
            if stripped.startswith(("!", "%")):
                indent = line[: len(line) - len(stripped)]
                body.append(f"{indent}pass  {MARK}{stripped}")
                changed.append(len(body))
            else:
                body.append(line)
        body.append("")
    header = [
        f"# Origin: {url}",
        f"# Commit: {commit} (the notebook's code cells, in order; its license applies)",
        "# Changed: notebook-only lines (shell `!`, magic `%`) became `pass`, with the line in",
        "# a comment (lines of the code below, counted from the marker: "
        f"{', '.join(map(str, changed)) or 'none'}). Nothing else is edited.",
        "# --- the notebook's code ---",
    ]
    return "\n".join(header + body).rstrip() + "\n"


if __name__ == "__main__":
    mirror, commit, notebook, url, out = sys.argv[1:6]
    Path(out).write_text(convert(mirror, commit, notebook, url))
