# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""dcu.serving.bundle_send on the controller: a large artifact to the host in one pass, resumably.

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
import time

from ansible import constants as C
from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.text.converters import to_bytes, to_text
from ansible.module_utils.six.moves import shlex_quote
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.dcu.serving.plugins.module_utils.bundle_send import TASK_ARGUMENT_SPEC
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


class ActionModule(ActionBase):

    TRANSFERS_FILES = False
    _requires_connection = True

    def _host_command(self, cmd):
        """`cmd` as _low_level_execute_command runs it: with become, ending in `sleep 0`, through the executable."""
        conn = self._connection
        ruser = self._get_remote_user()
        buser = self.get_become_option("become_user")
        if conn.become and (C.BECOME_ALLOW_SAME_USER or (buser != ruser or not any((ruser, buser)))):
            cmd = conn.become.build_become_command(cmd, conn._shell)
        if conn.allow_executable and self._play_context.executable:
            cmd = conn._shell.append_command(cmd, "sleep 0")
            cmd = self._play_context.executable + " -c " + shlex_quote(cmd)
        return cmd

    def _stream_argv(self, cmd):
        """(argv, shell) of a local process that runs the shell command `cmd` on the host with our stdin, for the
        connections whose commands are local processes (ssh, local, docker) when neither ssh nor become waits
        for a password; None otherwise (each range then goes through exec_command with its bytes as in_data)."""
        conn = self._connection
        transport = conn.transport
        cmd = self._host_command(cmd)
        if conn.become and conn.become.expect_prompt():
            return None
        if transport in ("ssh", "ansible.builtin.ssh"):
            if conn.get_option("password") or self._play_context.password or conn.get_option("pkcs11_provider"):
                return None  # sshpass would need its pipe, which only the connection's own run sets up
            conn.host = conn.get_option("host") or self._play_context.remote_addr
            return conn._build_command(conn.get_option("ssh_executable"), "ssh", conn.host, cmd), False
        if transport in ("local", "ansible.builtin.local"):
            return cmd, True
        if transport == "community.docker.docker":
            conn._set_conn_data()
            return [to_bytes(a) for a in conn._build_exec_cmd([self._play_context.executable, "-c", cmd])], False
        return None

    def _send(self, status, src, todo, whole=False):
        """Send the ranges `todo` of `src` to the host: ({index: sha256 the host computed as it wrote}, with `whole`
        (`todo` is the whole file, in order) the file's sha256 on the host, else None)."""
        def receiver(ranges):
            return " ".join(shlex_quote(to_text(a)) for a in (
                status["python"], "-c", RECEIVER, status["data"], status["progress"], spec_of(ranges), int(whole)))

        blocks = read_ahead(src, todo)
        streaming = self._stream_argv(receiver(todo))
        if streaming:
            display.vvv("bundle_send: one stream for {0} ranges".format(len(todo)))
            return received(*stream(streaming[0], blocks, shell=streaming[1]), todo=todo)
        whole = False  # one command per range: the host sees no whole file
        got, pieces = {}, []
        for index, block in blocks:  # one command per range, its bytes as in_data (held in memory)
            if block is not None:
                pieces.append(block)
                continue
            one = [r for r in todo if r[0] == index]
            res = self._low_level_execute_command(receiver(one), sudoable=True, in_data=b"".join(pieces))
            pieces = []
            got.update(received(res.get("rc"), res.get("stdout", ""), res.get("stderr", ""), one)[0])
        return got, None

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

            started = time.time()
            held = dict((int(k), v) for k, v in status.get("held", {}).items())
            known_path = sums_path(expected_file, chunk_bytes)
            # The controller hashes nothing when it sends the whole file. Only when the host holds ranges of an
            # earlier run, and no sums are remembered, does it hash its file first, to know which of them are right.
            sums = load_sums(known_path, expected_file, len(ranges))
            if held and not sums:
                sums = self._source_sums(name, src, ranges, expected_file, known_path)
            todo = [r for r in ranges if not (sums and r[0] in held and held[r[0]] == sums[r[0]])]
            result["sent"] = [index for index, _offset, _size in todo]
            result["changed"] = True  # not in place: at least the finish puts it there
            result["ranges"] = [
                {"index": i, "offset": o, "size": n, "sha256": sums[i] if sums else None,
                 "status": ("to send" if self._task.check_mode else "sent") if i in result["sent"] else "present"}
                for i, o, n in ranges]
            if self._task.check_mode:
                return result

            # Sums come only from a file whose whole sum was the artifact's. Without them, the host hashes the
            # whole file as it writes it (when it receives all of it), and the controller nothing.
            full = bool(todo) and len(todo) == len(ranges)
            if todo:
                got, whole = self._send(status, src, todo, whole=full and not sums)
                if whole == expected_file:  # the host's copy is the artifact: its range sums are the artifact's
                    sums = [got[i] for i, _offset, _size in ranges]
                    store_sums(known_path, expected_file, sums)
                elif not sums:
                    sums = self._source_sums(name, src, ranges, expected_file, known_path)
                for entry in result["ranges"]:
                    entry["sha256"] = sums[entry["index"]]
                wrong = [r for r in todo if got[r[0]] != sums[r[0]]]
                if wrong:
                    display.warning("{0}: ranges {1} arrived with other sums than the controller's; sending them "
                                    "again".format(name, [r[0] for r in wrong]))
                    got.update(self._send(status, src, wrong)[0])
                for index, offset, _size in wrong:
                    if got[index] != sums[index]:
                        raise AnsibleActionFail("{0}: range {1} (offset {2}) arrived twice with sha256 {3}, "
                                                "expected {4}".format(name, index, offset, got[index], sums[index]))
                if whole not in (None, expected_file) and not wrong:
                    full = False  # cannot be (every range right, the whole not): the finish reads it and decides
                display.vvv("{0}: {1} ranges sent, {2:.1f} s".format(name, len(todo), time.time() - started))
            # Every range was sent in this run, hashed on the host as it was written, and has its sum among sums that
            # make the artifact's: the finish need not read the file again (it does after a resume: the ranges of
            # the earlier run waited on disk).
            finish = self._execute_module(module_name="dcu.serving.bundle_send", task_vars=task_vars,
                                          module_args=dict(module_args, phase="finish", hashed=full))
            display.vvv("{0}: in place, {1:.1f} s".format(name, time.time() - started))
            if finish.get("failed"):
                return dict(finish, ranges=result["ranges"], sent=result["sent"])
            result.update(sha256=finish.get("sha256"), changed=True)
            if finish.get("warnings"):
                result["warnings"] = finish["warnings"]
            return result
        finally:
            self._remove_tmp_path(self._connection._shell.tmpdir)

    @staticmethod
    def _source_sums(name, src, ranges, expected, known_path):
        """The range sums of the controller's file, once its whole sum is the artifact's; remembered."""
        sums, actual = hash_ranges(src, ranges)
        if actual != expected:
            raise AnsibleActionFail("{0}: {1} has sha256 {2} now, expected {3}: the source changed".format(
                name, src, actual, expected))
        store_sums(known_path, expected, sums)
        return sums
