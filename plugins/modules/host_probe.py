#!/usr/bin/python
# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0

DOCUMENTATION = r"""
---
module: host_probe
short_description: Many small read-only looks at a host in one call
version_added: 0.1.0
description:
  - Looks at paths (type, link target, group), reads small files, runs read-only commands and reads getent
    databases, all in one module call. A converged host's run is mostly such looks; with
    M(ansible.builtin.stat), M(ansible.builtin.slurp), M(ansible.builtin.command) and M(ansible.builtin.getent)
    each costs a round trip to the host.
  - Read-only, also in check mode (the commands must be read-only).
author:
  - dcu-serving contributors (@dcu-serving)
extends_documentation_fragment:
  - dcu.serving.attributes
  - dcu.serving.attributes.facts
  - dcu.serving.host_probe
attributes:
  check_mode:
    support: full
    details: Read-only; the commands run in check mode too.
  diff_mode:
    support: none
  facts:
    support: full
    details: Only the getent databases asked for.
seealso:
  - module: dcu.serving.dcu_facts
    description: The same looks, in the call that reads the DCU cards.
options: {}
"""

EXAMPLES = r"""
- name: Read the service user, systemd's version and the venv link in one call
  dcu.serving.host_probe:
    stat: [/opt/dcu-serving/venv]
    commands:
      systemd: [systemctl, --version]
    getent: [passwd, group]
  register: probed

- name: Say where the venv link points
  ansible.builtin.debug:
    msg: "{{ probed.probe.stat['/opt/dcu-serving/venv'].lnk_target }}"

- name: Read systemd's and Docker's versions, unless an earlier look of the play did
  dcu.serving.host_probe:
    host_facts: "{{ ansible_facts.dcu_host is undefined }}"

- name: Pass --pull=never only to an engine that knows it (Docker 20.10 and later)
  ansible.builtin.debug:
    msg: "{{ (ansible_facts.dcu_host.engine.version_tuple or [0]) >= [20, 10] }}"
"""

RETURN = r"""
ansible_facts:
  description: With O(host_facts), the parsed facts roles decide by; the O(getent) databases.
  returned: always
  type: dict
  contains:
    dcu_host:
      description:
        - C(systemd_version) (a number; null with C(systemd_error) when systemctl did not answer), and C(engine) - the
          container engine's C(name), C(present) (false when it is not installed), C(version) (leading zeros dropped -
          C(18.09.0) reads C(18.9.0); C(1.13.1) of EL7's docker as it is), C(version_tuple), C(raw) (what it printed)
          and C(error) (why there is no version, for example the daemon not answering); C(selinux) (V(enforcing),
          V(permissive) or V(disabled)).
      returned: with O(host_facts)
      type: dict
      sample: {"selinux": "disabled", "systemd_version": 252, "systemd_error": null,
               "engine": {"name": "docker", "present": true,
               "version": "20.10.24", "version_tuple": [20, 10, 24], "raw": "20.10.24+dfsg1", "error": null}}
probe:
  description: What O(stat), O(read) and O(commands) asked for.
  returned: always
  type: dict
  contains:
    stat:
      description: By path, C(exists), C(isdir), C(islnk), C(lnk_target) (a link's target, else null),
        C(gr_name) (the owning group's name, else null).
      type: dict
      sample: {"/dev/kfd": {"exists": true, "isdir": false, "islnk": false, "lnk_target": null, "gr_name": "render"}}
    read:
      description: By path, the file's text, or null.
      type: dict
      sample: {"/var/lib/dcu-serving/rock-install.json": "{\"sha256\": \"71608c09...\"}\n"}
    commands:
      description: By name, C(rc), C(stdout) and C(stderr).
      type: dict
      sample: {"systemd": {"rc": 0, "stdout": "systemd 252 (252.36-1~deb12u1)\n", "stderr": ""}}
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dcu.serving.plugins.module_utils import host_probe


def main():
    module = AnsibleModule(argument_spec=host_probe.ARGUMENT_SPEC, supports_check_mode=True)
    probe, facts = host_probe.probe(module)
    module.exit_json(changed=False, ansible_facts=facts, probe=probe)


if __name__ == "__main__":
    main()
