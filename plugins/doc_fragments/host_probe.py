# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""The options of the one-call host looks (module_utils/host_probe.py), shared by dcu_facts and host_probe."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):
    DOCUMENTATION = r"""
options:
  stat:
    description:
      - Paths to look at, returned in RV(probe.stat) by path. The last component is not followed (a link
        reads as a link); links before it are.
    type: list
    elements: path
    default: []
  read:
    description: Small text files to read, returned in RV(probe.read) by path (null when missing or unreadable).
    type: list
    elements: path
    default: []
  commands:
    description:
      - Read-only commands to run (even in check mode), by name, each an argument list; RV(probe.commands)
        holds each one's C(rc), C(stdout) and C(stderr). A command that cannot start gives C(rc) 127.
    type: dict
    default: {}
  getent:
    description:
      - Databases to read with C(getent) (for example V(group), V(passwd)), returned as facts named
        C(getent_<database>) in the shape M(ansible.builtin.getent) gives (name to the other fields).
    type: list
    elements: str
    default: []
  host_facts:
    description:
      - Also read and parse the facts roles decide by - systemd's version (C(systemctl --version)) and the container
        engine's server version (C(<engine> version --format {{.Server.Version}})) - into the fact C(dcu_host)
        (C(ansible_facts.dcu_host)) - C(systemd_version) (a number, or null with C(systemd_error)), C(engine)
        (C(name), C(present), C(version) such as C(20.10.21) with leading zeros dropped - C(18.09.0) reads
        C(18.9.0) - C(version_tuple) such as C([20, 10, 21]), C(raw), and C(error) when it did not answer) and
        C(selinux) (V(enforcing), V(permissive) or V(disabled), as C(getenforce) says; disabled without the command).
      - A host without the engine, or whose daemon does not answer, gets C(version) null and the reason; it is not
        a failure.
      - Roles ask for them only while the host has none - V({{ ansible_facts.dcu_host is undefined }}) - so they
        are read once and every later role of the play reuses them.
    type: bool
    default: false
  engine:
    description: The container engine whose version O(host_facts) reads, a command name or path.
    type: str
    default: docker
"""
