"""The command line fails politely: a bad option or value is one line on stderr and exit
status 2, never a traceback (unless SMALLEM_DEBUG=1 asks for one)."""

import os
import subprocess
import sys

import pytest

from smallem.checks import printable

BAD = [
    (["train", "--config", "nope"], "--config"),
    (["train", "--corpus", "/nonexistent/texts", "--steps", "1"], "no such file or folder"),
    (["train", "--minutes", "-1"], "--minutes"),
    (["train", "--minutes", "nan"], "--minutes"),
    (["train", "--steps", "0"], "--steps"),
    (["train", "--batch-size", "0"], "--batch-size"),
    (["train", "--seq-len", "x"], "--seq-len"),
    (["train", "--threads", "0"], "--threads"),
    (["train", "--lr", "0"], "--lr"),
    (["generate", "--config", "s", "--tokens", "-1"], "--tokens"),
    (["generate", "--config", "s", "--temperature", "-0.5"], "--temperature"),
    (["generate", "--config", "s", "--top-k", "-2"], "--top-k"),
    (["generate", "--config", "s", "--top-p", "0"], "--top-p"),
    (["generate", "--config", "s", "--top-p", "1.5"], "--top-p"),
    (["generate", "--config", "nope"], "nope"),
    (["export", "--config", "s"], "--gguf"),
    (["bench-train", "--threads", "0"], "--threads"),
    (["bench-generate", "--threads", "-3"], "--threads"),
    (["nonsense"], "invalid choice"),
]


def _run(args, **env):
    return subprocess.run([sys.executable, "-m", "smallem", *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **env})


@pytest.mark.parametrize("args,names", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_command_line_is_one_line(args, names, tmp_path):
    r = _run(args, SMALLEM_RECORDS=str(tmp_path))
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert names in lines[0] and "Traceback" not in r.stderr
    assert not list(tmp_path.iterdir())  # nothing was measured or written


def test_debug_shows_the_traceback():
    r = _run(["train", "--corpus", "/nonexistent/texts", "--steps", "1"], SMALLEM_DEBUG="1")
    assert r.returncode != 0 and "Traceback" in r.stderr and "no such file or folder" in r.stderr


def test_printable_escapes_control_bytes():
    assert printable("a\tb\nc\x1b[2Jd\x07\x7f") == "a\tb\nc\\x1b[2Jd\\x07\\x7f"


def test_generate_escapes_on_a_terminal_only():
    """Through a pipe the bytes come raw; the terminal writer escapes control bytes and
    bad UTF-8, and waits for the rest of a character split across tokens."""
    import io

    from smallem.commands.generate import Terminal

    out = io.StringIO()
    t = Terminal(out)
    for piece in (b"ok \xc3", b"\xa9 \x1b[31m", b"\xff", b"\n"):
        t.write(piece)
    assert out.getvalue() == "ok é \\x1b[31m\\xff\n"
