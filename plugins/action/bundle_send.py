# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""dcu.serving.bundle_send on the controller: a large artifact to the host in one pass, resumably. How the ranges
travel and are checked is plugins/plugin_utils/bundle_transfer.py; this plugin drives the connection. See the
module's documentation (plugins/modules/bundle_send.py)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import time

from ansible import constants as C
from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.text.converters import to_bytes, to_text
from ansible.module_utils.six.moves import shlex_quote
from ansible.plugins.action import ActionBase

from ansible_collections.dcu.serving.plugins.module_utils.bundle_send import TASK_ARGUMENT_SPEC
from ansible_collections.dcu.serving.plugins.plugin_utils.bundle_transfer import (
    MIB,
    RECEIVER,
    display,
    hash_ranges,
    load_sums,
    ranges_of,
    read_ahead,
    received,
    spec_of,
    store_sums,
    stream,
    sums_path,
)


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
