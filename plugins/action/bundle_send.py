# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""dcu.serving.bundle_send on the controller: a large artifact to the host in one pass, range by range.

Each range the host lacks is read once from the controller's file, piped through the connection
(`exec_command` with in_data: ssh, docker exec and local all take it, ssh's `piped` transfer method works the
same way) into RECEIVER on the host, which writes it at its offset into the scratch data file, hashes it as it
writes and records `<index> <sha256>` in the progress file. The host side of the module (phase status /
finish) says what the host holds, and puts the file in place once it verifies. Memory: one range at a time.
See the module's documentation (plugins/modules/bundle_send.py).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import hashlib
import json
import os
import tempfile
import threading
import time

from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.text.converters import to_text
from ansible.module_utils.six.moves import shlex_quote
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.dcu.serving.plugins.module_utils.bundle_send import TASK_ARGUMENT_SPEC
from ansible_collections.dcu.serving.plugins.module_utils.checksum import default_cache_path

display = Display()

MIB = 1048576
READ = 8 * MIB

# Runs on the host with the interpreter the module ran with: Python 2.7 and 3.6+ (no f-strings).
# argv: data file, progress file, index, offset, size. Reads the range from stdin, writes it at its offset,
# fsyncs, and only then records `<index> <sha256>`; prints {"index", "size", "sha256"}.
RECEIVER = """
import hashlib, json, os, sys, threading
path, progress = sys.argv[1], sys.argv[2]
index, offset, size = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
try:
    import fcntl
    fcntl.fcntl(0, 1031, 1048576)  # F_SETPIPE_SZ: fewer, larger reads from a pipe
except Exception:
    pass
digest = hashlib.sha256()
got = 0
fd = os.open(path, os.O_WRONLY | os.O_CREAT, 384)
# Dirty pages go to disk while the range still arrives, so the fsync at its end has little left to write.
wake = threading.Event()
state = {"done": False}


def flush():
    while not state["done"]:
        wake.wait()
        wake.clear()
        try:
            os.fdatasync(fd)
        except OSError:
            pass


flusher = threading.Thread(target=flush)
flusher.daemon = True
flusher.start()
try:
    os.lseek(fd, offset, 0)
    since = 0
    while True:
        block = os.read(0, 4194304)
        if not block:
            break
        digest.update(block)
        got += len(block)
        since += len(block)
        while block:
            written = os.write(fd, block)
            block = block[written:] if written < len(block) else b""
        if since >= 67108864:
            since = 0
            wake.set()
    state["done"] = True
    wake.set()
    flusher.join()
    if got == size:
        os.fsync(fd)
finally:
    state["done"] = True
    wake.set()
    os.close(fd)
out = {"index": index, "size": got, "sha256": digest.hexdigest()}
if got == size:
    handle = open(progress, "a")
    handle.write("%d %s\\n" % (index, out["sha256"]))
    handle.flush()
    os.fsync(handle.fileno())
    handle.close()
sys.stdout.write(json.dumps(out) + "\\n")
sys.exit(0 if got == size else 3)
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


def read_range(handle, offset, size):
    """The bytes of one range."""
    handle.seek(offset)
    data = handle.read(size)
    if len(data) != size:
        raise AnsibleActionFail("read {0} bytes at offset {1} of the source, expected {2}: did it change?".format(
            len(data), offset, size))
    return data


class Hashing(object):
    """The controller's sums of what it reads: each range's, and the whole file's (ranges come in order).

    `submit(data)` hashes one range in a thread (hashlib releases the GIL), while the range is sent."""

    def __init__(self):
        self.whole = hashlib.sha256()
        self.sums = []
        self._thread = None

    def _hash(self, data):
        self.sums.append(hashlib.sha256(data).hexdigest())
        self.whole.update(data)

    def submit(self, data):
        self.wait()
        self._thread = threading.Thread(target=self._hash, args=(data,))
        self._thread.start()

    def wait(self):
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        return self.sums[-1] if self.sums else None

    def add_from(self, handle, offset, size):
        """Hash a range that is not sent (the host held it), reading it in blocks."""
        self.wait()
        handle.seek(offset)
        digest = hashlib.sha256()
        left = size
        while left:
            block = handle.read(min(READ, left))
            if not block:
                raise AnsibleActionFail("the source ended before offset {0}: did it change?".format(offset + size))
            digest.update(block)
            self.whole.update(block)
            left -= len(block)
        self.sums.append(digest.hexdigest())
        return self.sums[-1]


class ActionModule(ActionBase):

    TRANSFERS_FILES = False
    _requires_connection = True

    def _receive(self, python, status, index, offset, data):
        cmd = " ".join(shlex_quote(to_text(a)) for a in (
            python, "-c", RECEIVER, status["data"], status["progress"], index, offset, len(data)))
        res = self._low_level_execute_command(cmd, sudoable=True, in_data=data)
        lines = [line for line in res.get("stdout", "").splitlines() if line.startswith("{")]
        try:
            report = json.loads(lines[-1])
        except (IndexError, ValueError):
            report = {}
        if res.get("rc") != 0 and not report:
            raise AnsibleActionFail("the receiver on the host failed (rc {0}) for range {1}: {2}{3}".format(
                res.get("rc"), index, res.get("stdout", "")[-2000:], res.get("stderr", "")[-2000:]))
        if report.get("size") != len(data):
            raise AnsibleActionFail("range {0}: the host received {1} bytes of {2}: {3}".format(
                index, report.get("size"), len(data), res.get("stderr", "")[-2000:]))
        return report["sha256"]

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        del tmp
        validation, _args = self.validate_argument_spec(argument_spec=dict(TASK_ARGUMENT_SPEC))
        params = validation.validated_parameters
        src = params["src"]
        name = params["name"] or params["dest"]
        chunk_bytes = params["chunk_mib"] * MIB
        if chunk_bytes <= 0:
            raise AnsibleActionFail("chunk_mib must be positive, got {0}".format(params["chunk_mib"]))
        expected_file = params["sha256"].strip().lower()
        try:
            size = os.stat(src).st_size
        except OSError as exc:
            raise AnsibleActionFail("{0}: cannot read the source {1}: {2}".format(name, src, exc)) from exc
        ranges = ranges_of(size, chunk_bytes)
        module_args = dict(params, sha256=expected_file, size=size)
        try:
            status = self._execute_module(module_name="dcu.serving.bundle_send",
                                          module_args=dict(module_args, phase="status"), task_vars=task_vars)
            if status.get("failed"):
                return status
            result.update(dest=params["dest"], sha256=None, sent=[], ranges=[], changed=False)
            if status.get("in_place"):
                result.update(sha256=expected_file, ranges=[
                    {"index": i, "offset": o, "size": n, "sha256": None, "status": "in place"} for i, o, n in ranges])
                return result

            held = dict((int(k), v) for k, v in status.get("held", {}).items())
            known_path = sums_path(expected_file, chunk_bytes)
            # Remembered sums spare the controller hashing anything; without them it hashes what it reads.
            known = load_sums(known_path, expected_file, len(ranges))
            hashing = None if known else Hashing()
            reports = []
            started = time.time()
            with open(src, "rb") as handle:
                for index, offset, length in ranges:
                    entry = {"index": index, "offset": offset, "size": length,
                             "sha256": known[index] if known else None}
                    reports.append(entry)
                    if index in held:
                        if hashing:
                            entry["sha256"] = hashing.add_from(handle, offset, length)
                        if held[index] == entry["sha256"]:
                            entry["status"] = "present"
                            continue
                    result["sent"].append(index)
                    result["changed"] = True
                    if self._task.check_mode:
                        entry["status"] = "to send"
                        continue
                    data = read_range(handle, offset, length)
                    hash_now = entry["sha256"] is None  # not remembered, not hashed above
                    if hash_now:
                        hashing.submit(data)
                    got = self._receive(status["python"], status, index, offset, data)
                    if hash_now:
                        entry["sha256"] = hashing.wait()
                    if got != entry["sha256"]:
                        display.warning("{0}: range {1} arrived with sha256 {2}, expected {3}; sending it again"
                                        .format(name, index, got, entry["sha256"]))
                        got = self._receive(status["python"], status, index, offset, data)
                    del data
                    if got != entry["sha256"]:
                        raise AnsibleActionFail("{0}: range {1} (offset {2}) arrived twice with sha256 {3}, "
                                                "expected {4}".format(name, index, offset, got, entry["sha256"]))
                    entry["status"] = "sent"
                    display.vvv("{0}: range {1}/{2} sent, {3:.1f} s".format(
                        name, index + 1, len(ranges), time.time() - started))
            result["ranges"] = reports
            if hashing and not self._task.check_mode:
                hashing.wait()
                if hashing.whole.hexdigest() != expected_file:
                    raise AnsibleActionFail("{0}: {1} has sha256 {2} now, expected {3}: the source changed".format(
                        name, src, hashing.whole.hexdigest(), expected_file))
                store_sums(known_path, expected_file, hashing.sums)
            if self._task.check_mode:
                return result
            # Every range was hashed as it was written and matched the controller's sum of it, whose ranges
            # make the artifact's sum: the host need not read the file again (it does when a range is from an
            # earlier run: those bytes waited on disk).
            whole_sent = len(result["sent"]) == len(ranges)
            finish = self._execute_module(module_name="dcu.serving.bundle_send", task_vars=task_vars,
                                          module_args=dict(module_args, phase="finish", hashed=whole_sent))
            display.vvv("{0}: in place, {1:.1f} s".format(name, time.time() - started))
            if finish.get("failed"):
                return dict(finish, ranges=reports, sent=result["sent"])
            result.update(sha256=finish.get("sha256"), changed=True)
            if finish.get("warnings"):
                result["warnings"] = finish["warnings"]
            return result
        finally:
            self._remove_tmp_path(self._connection._shell.tmpdir)
