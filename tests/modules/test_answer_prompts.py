"""The role's prompt answerer against an installer that asks like rock's: on the terminal, only in some
situations, in any order, with no newline after the question, giving up on end of input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from support import REPO

ANSWERER = REPO / "roles" / "dcu_driver" / "files" / "answer_prompts.py"
PROMPTS = [
    {"pattern": r"remove legacy hymgr config file\? \[[YyNn]/[YyNn]\]:", "answer": "y"},
    {"pattern": r"Update vbios\? \[[YyNn]/[YyNn]\]:", "answer": "n"},
]
EXPECT = ["Install successful", r"(?:HCU|DCU) online (\d+), total num \1\b"]

INSTALLER = r"""
set -e
[ -t 0 ] || { echo "not a terminal"; exit 9; }
ask() { printf '%s ' "$1" >&2; IFS= read -r a || { echo "no answer to $1"; exit 1; }; echo "$1 -> $a"; }
case "$ORDER" in
  vbios-first) ask 'Update vbios? [y/N]:'; ask 'Do you want to remove legacy hymgr config file? [Y/n]:' ;;
  legacy-only) ask 'Do you want to remove legacy hymgr config file? [Y/n]:' ;;
  quoted) echo "skipping 'Update vbios? [y/N]:' on this card"
          ask 'Do you want to remove legacy hymgr config file? [Y/n]:' ;;
  none) ;;
  unknown) ask 'Accept the license? (yes/no):' ;;
  silent) printf 'Building driver modules for kernel 6.1.0:'; sleep 3
          printf '\r[ 50%%] Built target hykcl\r[100%%] Built target hycu\n' ;;
esac
echo "HCU online ${ONLINE:-8}, total num 8"
echo "Install successful. Enjoy now!"
"""


def _run(tmp_path, order, online="8", timeout=30, prompt_idle=1, prompts=PROMPTS):
    installer = tmp_path / "rock.run"
    installer.write_text(INSTALLER)
    log = tmp_path / "log" / "install.log"
    spec = {"prompts": prompts, "expect": EXPECT, "log": str(log), "timeout": timeout,
            "prompt_idle": prompt_idle}
    proc = subprocess.run([sys.executable, str(ANSWERER), "--spec", json.dumps(spec), "--", "sh", str(installer)],
                          capture_output=True, text=True, timeout=60, env={"ORDER": order, "ONLINE": online,
                                                                           "PATH": "/usr/bin:/bin"})
    return proc, log


@pytest.mark.parametrize("order", ["vbios-first", "legacy-only", "none"])
def test_prompts_answered_in_any_order(tmp_path, order):
    proc, log = _run(tmp_path, order)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    if order == "vbios-first":
        assert "Update vbios? [y/N]: -> n" in proc.stdout
        assert proc.stdout.index("Update vbios") < proc.stdout.index("remove legacy")
    if order != "none":
        assert "remove legacy hymgr config file? [Y/n]: -> y" in proc.stdout
    assert "Install successful" in log.read_text()
    assert oct(log.stat().st_mode & 0o777) == "0o600"


def test_unknown_prompt_fails_at_the_timeout_naming_it(tmp_path):
    proc, log = _run(tmp_path, "unknown", timeout=3)
    assert proc.returncode == 2
    assert "did not finish within 3s" in proc.stderr
    assert "Accept the license? (yes/no):" in proc.stderr
    assert "no prompt pattern matches it" in log.read_text()


def test_a_silent_build_is_never_killed(tmp_path):
    """The real installer compiles for minutes without output, after a line that ends like a question."""
    proc, log = _run(tmp_path, "silent", prompt_idle=1)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = log.read_text()
    assert "Still waiting" in text, "the silence is noted in the log"
    assert "[100%] Built target hycu" in text and "Install successful" in text


def test_card_missing_fails_the_success_check(tmp_path):
    proc, _log = _run(tmp_path, "none", online="7")
    assert proc.returncode == 3
    assert "did not print" in proc.stderr and "total num" in proc.stderr


def test_only_the_question_being_asked_is_answered(tmp_path):
    """Prompt text in a finished line (a log, an echo) is not a question: answering it would feed the
    next real question the wrong answer."""
    # vbios first in the list: a search of the whole output would find the quoted one before the question
    proc, _ = _run(tmp_path, "quoted", prompts=PROMPTS[::-1])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "remove legacy hymgr config file? [Y/n]: -> y" in proc.stdout
