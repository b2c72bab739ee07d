"""Running the CLI in-process from a test: its exit code and output, and its one error line."""

from __future__ import annotations

from pyrunner import cli


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    """``cli.main(argv)``'s exit code, stdout and stderr (``capsys`` is pytest's fixture)."""
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def one_error(err: str) -> str:
    """The single ``error: ...`` line a bad input must produce, asserting there is no traceback."""
    lines = [x for x in err.splitlines() if x.startswith("error:")]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]
