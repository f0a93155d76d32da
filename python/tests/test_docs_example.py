"""docs/python.md's complete example, extracted and run: it cannot drift from the module."""

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "python.md"


def test_the_documented_example_runs(capsys):
    text = DOC.read_text()
    match = re.search(r"<!-- python_example:[^>]*-->\s*```python\n(.*?)```", text, re.S)
    assert match, "docs/python.md has no marked example"
    exec(compile(match.group(1), str(DOC), "exec"), {"__name__": "python_example"})
    assert "python example: ok" in capsys.readouterr().out
