#!/usr/bin/env python3
"""Run an interactive installer on a pseudo-terminal and answer its prompts by matching them.

    answer_prompts.py --spec SPEC_JSON -- COMMAND [ARG...]

SPEC_JSON: {"prompts": [{"pattern": REGEX, "answer": TEXT}, ...],   # answered each time they appear
            "expect": [REGEX, ...],                                 # must appear in the output
            "log": PATH, "timeout": SECONDS, "prompt_idle": SECONDS}

The rock installer asks its questions only in some situations and in no fixed order, and reads the
answers from the terminal, so a fixed stdin cannot answer it. pexpect is not available on an
air-gapped host; this needs only the Python standard library. The whole transcript goes to stdout and
to the log file.

Only prompts a pattern recognises are answered. Silence never ends the installer: the real one compiles
kernel modules for minutes without a word, and a line that merely ends in ':' is not a question. When it
has been silent for prompt_idle seconds at something that looks like a question, a note says so in the
transcript, and the overall timeout alone stops it. Exit status: the installer's, or 2 on a timeout
(naming the question it seemed to wait at), 3 when it exited 0 without printing every expected line.
"""

import argparse
import json
import os
import pty
import re
import select
import shlex
import signal
import subprocess
import sys
import time

# A partial last line that looks like a question: the installer waits for an answer we do not have.
QUESTION = re.compile(r"(\?|:|\]|>)\s*$")


def run(command, prompts, timeout, prompt_idle, transcript):
    master, slave = pty.openpty()
    proc = subprocess.Popen(command, stdin=slave, stdout=slave, stderr=slave, start_new_session=True,
                            close_fds=True)
    os.close(slave)
    compiled = [(re.compile(p["pattern"]), p["answer"]) for p in prompts]
    pending = ""  # output since the last answered prompt
    started = last_output = time.monotonic()
    error = noted = None
    while True:
        ready = select.select([master], [], [], 0.5)[0]
        now = time.monotonic()
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the installer closed the terminal (it exited)
                chunk = b""
            if not chunk:
                break
            text = chunk.decode("utf-8", "replace").replace("\r\n", "\n")
            transcript.append(text)
            sys.stdout.write(text)
            pending += text
            last_output = now
            # Answer only the line the installer is waiting at: the unterminated last line. Prompt
            # text earlier in the output (a log of an earlier answer, say) must not be answered again.
            waiting_at = pending.rsplit("\n", 1)[-1]
            for pattern, answer in compiled:
                if pattern.search(waiting_at):
                    os.write(master, (answer + "\n").encode())
                    pending = ""
                    break
            pending = pending[-4096:]
        elif proc.poll() is not None:
            break
        tail = pending.rsplit("\n", 1)[-1].rsplit("\r", 1)[-1].strip()
        if now - last_output > prompt_idle and tail and QUESTION.search(tail) and tail != noted:
            note = (f"\n[answer_prompts] no output for {prompt_idle:.0f}s after {tail!r}; no prompt pattern matches "
                    "it: if it is a question, add its answer (dcu_driver_installer_extra_prompts). Still waiting.\n")
            transcript.append(note)
            sys.stdout.write(note)
            noted = tail
        if now - started > timeout:
            error = f"the installer did not finish within {timeout:.0f}s"
            if tail and QUESTION.search(tail):
                error += f"; it seems to wait for an answer to {tail!r} and no prompt pattern matches it"
            os.killpg(proc.pid, signal.SIGTERM)
            break
    os.close(master)
    rc = proc.wait()
    return rc, error


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--spec", required=True, help="JSON: prompts, expect, log, timeout, prompt_idle")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    spec = json.loads(args.spec)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command to run")

    transcript = []
    rc, error = run(command, spec.get("prompts", []), float(spec.get("timeout", 1800)),
                    float(spec.get("prompt_idle", 20)), transcript)
    output = "".join(transcript)
    missing = [p for p in spec.get("expect", []) if not re.search(p, output)]
    if error:
        message, status = error, 2
    elif rc != 0:
        message, status = f"the installer exited with status {rc}", rc if rc > 0 else 1
    elif missing:
        message, status = "the installer exited 0 but did not print {}".format(
            " and ".join(repr(p) for p in missing)), 3
    else:
        message, status = None, 0
    if spec.get("log"):
        os.makedirs(os.path.dirname(spec["log"]), mode=0o750, exist_ok=True)
        fd = os.open(spec["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as log:
            log.write("[answer_prompts] ran: {}\n".format(" ".join(shlex.quote(arg) for arg in command)))
            log.write(output)
            if message:
                log.write(f"\n[answer_prompts] {message}\n")
    if message:
        sys.stdout.write(f"\n[answer_prompts] {message}\n")
        sys.stderr.write(message + "\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
