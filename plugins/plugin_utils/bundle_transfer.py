# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""bundle_send's controller side, run by its action plugin: a large artifact to the host in one pass, resumably.

The ranges the host lacks travel in one remote command: a thread reads them from the controller's file (hashing
them when their sums are not known yet) a few blocks ahead of the sender, which writes them back to back into
the stdin of a local process that runs RECEIVER on the host - the ssh command the connection itself would run
(its options and control socket), `docker exec -i`, or a local shell. RECEIVER writes each range at its offset
into the scratch data file, hashes it as it writes, records `<index> <sha256>` in the progress file once the
range is on disk, and reports every range's sum at the end; the controller compares them with its own. A
connection that is not a local process, or that waits for a password, gets one `exec_command` per range (its
bytes as in_data). The host side of the module (phase status / finish) says what the host holds, and puts the
file in place once it verifies. Memory: a few blocks (one range per command in the fallback).
See the module's documentation (plugins/modules/bundle_send.py).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import hashlib
import json
import os
import queue
import subprocess
import tempfile
import threading

from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.text.converters import to_text
from ansible.utils.display import Display

from ansible_collections.dcu.serving.plugins.module_utils.checksum import default_cache_path

display = Display()

MIB = 1048576
READ = 8 * MIB
READ_AHEAD = 8  # blocks of READ bytes the reading thread may be ahead of the sender

# Runs on the host with the interpreter the module ran with: Python 2.7 and 3.6+ (no f-strings).
# argv: data file, progress file, the ranges as `index:offset:size,...`, 1 when they are the whole file in order
# (else 0). Reads the ranges from stdin back to back, writes each at its offset and hashes it as it arrives (and
# the whole file, with 1). A thread syncs the file as it fills and records a whole
# range (`<index> <sha256>`) once a sync that began after its last byte ended: receiving never waits for the disk,
# and a range cut short (the run interrupted) is never recorded. Prints {"ranges": [{"index", "size", "sha256"}],
# "whole": the file's sha256 (with 1, once every range arrived), "error"}.
RECEIVER = """
import hashlib, json, os, sys, threading
path, progress = sys.argv[1], sys.argv[2]
ranges = [[int(n) for n in spec.split(":")] for spec in sys.argv[3].split(",")]
whole = hashlib.sha256() if sys.argv[4] == "1" else None
SYNC = 67108864
try:
    import fcntl
    fcntl.fcntl(0, 1031, 1048576)  # F_SETPIPE_SZ: fewer, larger reads from a pipe
except Exception:
    pass
fd = os.open(path, os.O_WRONLY | os.O_CREAT, 384)
records = open(progress, "a")
cond = threading.Condition()
state = {"ready": [], "dirty": 0, "done": False, "error": None}


def flush():
    try:
        while True:
            with cond:
                while not (state["done"] or state["ready"] or state["dirty"] >= SYNC):
                    cond.wait()
                ready, done = state["ready"], state["done"]
                state["ready"], state["dirty"] = [], 0
            os.fsync(fd)
            if ready:
                records.write("".join("%d %s\\n" % pair for pair in ready))
                records.flush()
                os.fsync(records.fileno())
            if done:
                return
    except Exception as exc:
        state["error"] = str(exc)


flusher = threading.Thread(target=flush)
flusher.daemon = True
flusher.start()
out = []
try:
    for index, offset, size in ranges:
        os.lseek(fd, offset, 0)
        digest = hashlib.sha256()
        left = size
        while left and state["error"] is None:
            block = os.read(0, min(left, 4194304))
            if not block:
                break
            digest.update(block)
            if whole:
                whole.update(block)
            got = len(block)
            left -= got
            while block:
                written = os.write(fd, block)
                block = block[written:] if written < len(block) else b""
            with cond:
                state["dirty"] += got
                if state["dirty"] >= SYNC:
                    cond.notify()
        if left:
            out.append({"index": index, "size": size - left, "sha256": None})
            break
        out.append({"index": index, "size": size, "sha256": digest.hexdigest()})
        with cond:
            state["ready"].append((index, out[-1]["sha256"]))
            cond.notify()
finally:
    with cond:
        state["done"] = True
        cond.notify()
    flusher.join()
    os.close(fd)
    records.close()
complete = state["error"] is None and len(out) == len(ranges) and all(r["sha256"] for r in out)
report = {"ranges": out, "error": state["error"], "whole": whole.hexdigest() if whole and complete else None}
sys.stdout.write(json.dumps(report) + "\\n")
sys.exit(0 if complete else 3)
"""


def ranges_of(size, chunk_bytes):
    """[(index, offset, size)] of a file of `size` bytes in ranges of `chunk_bytes`."""
    if chunk_bytes <= 0:
        raise ValueError("the range size must be positive, got {0}".format(chunk_bytes))
    return [(i, offset, min(chunk_bytes, size - offset)) for i, offset in enumerate(range(0, size, chunk_bytes))]


def sums_path(sha256, chunk_bytes, cache_path=None):
    """Where the controller keeps the range sums of an artifact: beside its checksum cache."""
    base = os.path.dirname(cache_path or default_cache_path())
    return os.path.join(base, "ranges", "{0}-{1}.json".format(sha256, chunk_bytes))


def load_sums(path, sha256, count):
    """[sha256 of each range] remembered for an artifact, or None (absent, unreadable, of another shape).

    Only sums whose concatenated ranges were seen to have the artifact's SHA-256 are ever stored."""
    try:
        with open(path) as handle:
            known = json.load(handle)
        sums = known["ranges"]
    except (IOError, OSError, ValueError, KeyError, TypeError):
        return None
    if known.get("sha256") != sha256 or not isinstance(sums, list) or len(sums) != count \
            or not all(isinstance(s, str) and len(s) == 64 for s in sums):
        return None
    return sums


def store_sums(path, sha256, sums):
    """Remember the range sums of an artifact (a controller that cannot write just hashes again)."""
    try:
        if not os.path.isdir(os.path.dirname(path)):
            os.makedirs(os.path.dirname(path))
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".ranges.")
        with os.fdopen(fd, "w") as handle:
            json.dump({"sha256": sha256, "ranges": sums}, handle)
        os.chmod(tmp, 0o644)
        os.rename(tmp, path)
    except (IOError, OSError) as exc:
        display.warning("cannot remember the range sums in {0}: {1}".format(path, exc))


def hash_ranges(path, ranges):
    """([sha256 of each range], sha256 of the file) of the file at `path`, read once in order."""
    whole, sums = hashlib.sha256(), []
    with open(path, "rb") as handle:
        for _index, offset, size in ranges:
            digest = hashlib.sha256()
            left = size
            while left:
                block = handle.read(min(READ, left))
                if not block:
                    raise AnsibleActionFail("{0} ended before offset {1}: did it change?".format(path, offset + size))
                digest.update(block)
                whole.update(block)
                left -= len(block)
            sums.append(digest.hexdigest())
    return sums, whole.hexdigest()


def read_ahead(path, todo, depth=READ_AHEAD):
    """Yield (index, block) for each block of the ranges `todo` [(index, offset, size)] of the file at `path`, in
    order, and (index, None) at the end of each range. A thread reads up to `depth` blocks ahead of the consumer,
    so reading the next bytes overlaps sending these; memory: `depth` blocks."""
    blocks = queue.Queue(depth)
    stop = threading.Event()

    def put(item):
        while not stop.is_set():
            try:
                blocks.put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def read():
        try:
            with open(path, "rb") as handle:
                for index, offset, size in todo:
                    handle.seek(offset)
                    left = size
                    while left:
                        block = handle.read(min(READ, left))
                        if not block:
                            raise AnsibleActionFail("{0} ended before offset {1}: did it change?".format(
                                path, offset + size))
                        left -= len(block)
                        if not put((index, block)):
                            return
                    if not put((index, None)):
                        return
            put(None)
        except Exception as exc:  # pylint: disable=broad-except  # raised in the consumer's thread
            put(exc)

    reader = threading.Thread(target=read)
    reader.daemon = True
    reader.start()
    try:
        while True:
            item = blocks.get()
            if item is None:
                break
            if isinstance(item, Exception):
                raise item
            yield item
    finally:
        stop.set()  # the consumer stopped early: the reader's next put gives up
        reader.join()


def spec_of(todo):
    """The receiver's argument for the ranges `todo`."""
    return ",".join("{0}:{1}:{2}".format(*r) for r in todo)


def stream(argv, blocks, shell=False):
    """Run `argv` (a local process that runs the receiver on the host) with `blocks` ((index, block) pairs from
    read_ahead) written to its stdin back to back: one command for every range. Returns (rc, stdout, stderr)."""
    proc = subprocess.Popen(argv, shell=shell, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    output = {}

    def collect(name, handle):
        output[name] = handle.read()

    readers = [threading.Thread(target=collect, args=pair) for pair in (("out", proc.stdout), ("err", proc.stderr))]
    for thread in readers:
        thread.start()
    try:
        for _index, block in blocks:
            if block is not None:
                proc.stdin.write(block)
        proc.stdin.close()
    except (IOError, OSError):  # the receiver ended early: its report says how far it got
        pass
    except BaseException:
        # Interrupted: the end of the stream tells the receiver, which records the whole ranges, not this one.
        proc.stdin.close()
        raise
    finally:
        rc = proc.wait()
        for thread in readers:
            thread.join()
        if hasattr(blocks, "close"):
            blocks.close()  # stops read_ahead's thread when the receiver ended early
    return rc, to_text(output.get("out", b""), errors="surrogate_or_strict"), to_text(output.get("err", b""))


def received(rc, stdout, stderr, todo):
    """({index: sha256 the host computed} for every range of `todo`, the whole file's sha256 or None) from the
    receiver's report; fails naming the ranges that did not arrive whole and the receiver's error."""
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    try:
        report = json.loads(lines[-1])
        got = dict((int(r["index"]), r["sha256"]) for r in report["ranges"] if r["sha256"])
    except (IndexError, ValueError, KeyError, TypeError):
        report, got = {}, {}
    missing = [index for index, _offset, _size in todo if index not in got]
    if missing or rc != 0:
        raise AnsibleActionFail("the receiver on the host ended (rc {0}) with ranges {1} of {2} not received{3}: "
                                "{4}{5}".format(rc, missing, len(todo), ", error " + report["error"]
                                                if report.get("error") else "", stdout[-2000:], stderr[-2000:]))
    return got, report.get("whole")
