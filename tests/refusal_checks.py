"""The refusals' check: exit 2, one error line (a config validation error may add its one problem
on the next line), no traceback; and invoking a command with any path-like arguments."""

from __future__ import annotations

from typer.testing import CliRunner


def one_line_error(result, *parts: str) -> None:
    """Exit 2, one ``error:`` line, no traceback, naming ``parts`` (a config validation
    error lists its one problem on the line after ``error: invalid config:``)."""
    out = result.output
    assert result.exit_code == 2, out
    assert "Traceback" not in out and not isinstance(result.exception, AssertionError), out
    lines = [line for line in out.strip().splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, out
    tail = out[out.index(lines[0]) :].strip().splitlines()
    assert len(tail) <= 2, out  # the error line, and the config problem it introduces
    for part in parts:
        assert part in out, (part, out)


def invoke(app, args: list[object]):
    return CliRunner().invoke(app, [str(a) for a in args])
