#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: serving_audit
short_description: Read in one call what the roles installed on a host, for an audit report
description:
  - Reads the records the roles leave - C(rock-install.json) and C(dtk-install.json) in O(state_dir) (the
    installer or tarball file, its SHA-256 and version), the standalone hyhal's marker and C(.info/version) - and
    where C(/opt/dtk) and C(/opt/hyhal) point.
  - Asks the container engine, with one C(inspect), for the config digest of each of O(images) and the image
    each of O(containers) runs.
  - For each of O(model_dirs), the total size and file count, and the SHA-256 of C(config.json) and of the
    weight index (C(model.safetensors.index.json) or C(pytorch_model.bin.index.json)), with one content hash
    over both. Weight files are sized, never read.
  - The proxy's installed C(dcu-serving) version (the venv's package metadata) and the SHA-256 of its
    configuration file.
  - Never changes anything; what is missing is returned as null, so a report can say so.
version_added: "0.1.0"
author:
  - dcu-serving contributors (@dcu-serving)
extends_documentation_fragment:
  - dcu.serving.attributes
attributes:
  check_mode:
    support: full
    details: Read-only; runs the same in check mode.
  diff_mode:
    support: none
seealso:
  - module: dcu.serving.dcu_facts
    description: The cards, the loaded driver and the active DTK.
  - module: dcu.serving.model_info
    description: What a model directory says about its size in VRAM.
options:
  state_dir:
    description: Where role dcu_driver writes its install records.
    type: path
    default: /var/lib/dcu-serving
  hyhal_dir:
    description: The hyhal directory (role dcu_driver's C(dcu_driver_hyhal_dir)).
    type: path
    default: /opt/hyhal
  dtk_link:
    description: The link to the active DTK.
    type: path
    default: /opt/dtk
  images:
    description: Image references to look up in the engine.
    type: list
    elements: str
    default: []
  containers:
    description: Container names whose image to report, for example C(vllm-0).
    type: list
    elements: str
    default: []
  engine:
    description: The container engine's executable (name or path); when absent images and containers are null.
    type: str
    default: docker
  model_dirs:
    description: Model directories to size and hash.
    type: list
    elements: path
    default: []
  proxy_venv:
    description: The proxy's virtual environment (role dcu_proxy's C(dcu_proxy_venv)).
    type: path
    default: /opt/dcu-serving/venv
  proxy_config:
    description: The proxy's configuration file.
    type: path
    default: /etc/dcu-serving/proxy.yml
  report_dir:
    description:
      - A directory on the controller. When given, the action plugin puts the audit report together from what
        the module read and O(report), and writes C(<inventory_hostname>.json) and C(.md) there, then
        C(fleet.json) and C(fleet.md) from the reports there of the play's hosts (RV(report)).
      - Written also in check mode, and never reported as a change - a report is the output of a read-only check.
    type: path
  report:
    description:
      - The other inputs of the report, each optional - C(facts) (C(ansible_facts.dcu) of dcu.serving.dcu_facts),
        C(health) (the registered result of dcu.serving.cluster_health), C(access) (the results of
        dcu.serving.dcu_device_access), C(bundle) (the bundle's C(index.json)), C(expected) (C(cards),
        C(driver_version), C(dtk_version), C(instances) from the inventory), C(orid), C(generated) and
        C(instances) (the role's C(dcu_vllm_instances), to say which of them run Python from their model directory,
        C(trust_remote_code)).
      - Drift is what differs from C(expected) and C(bundle).
    type: dict
  gateway:
    description:
      - What verify.yml's gateway play found (the result of the filter dcu.serving.audit_gateway). With O(report_dir),
        the action plugin writes it as C(gateway.json) there and rewrites C(fleet.json) and C(fleet.md) with it, from
        the reports there of the hosts it names; the host itself is not read.
      - The fleet report keeps it until the gateway play runs again.
    type: dict
"""

EXAMPLES = r"""
- name: Read what the converge installed
  dcu.serving.serving_audit:
    images: [dcu-serving/vllm-sim:0.11.0]
    containers: [vllm-0, vllm-1]
    model_dirs: [/srv/models/MiniCPM-V-4.5]
  register: __audit

- name: Write reports/<host>.json and .md, and the fleet's summary
  dcu.serving.serving_audit:
    images: [dcu-serving/vllm-sim:0.11.0]
    model_dirs: [/srv/models/MiniCPM-V-4.5]
    report_dir: ./reports
    report:
      facts: "{{ ansible_facts.dcu }}"
      expected: {cards: 8}
"""

RETURN = r"""
driver:
  description: Role dcu_driver's install record (file, sha256, version, package, how), or null.
  returned: always
  type: dict
  sample: {file: driver/rock-6.3.30-V1.4.1a.run, sha256: 7160..., version: 6.3.30-V1.4.1a, package: rock-6.3.30,
           how: installed by dcu.serving.dcu_driver}
dtk:
  description: The DTK record (file, sha256, version, dir) and C(link), where O(dtk_link) points.
  returned: always
  type: dict
hyhal:
  description: C(path) (resolved), C(version) (its C(.info/version), null when the driver's own) and
    C(marker), which standalone tarball (file and sha256) was laid over which driver, or null.
  returned: always
  type: dict
images:
  description: One entry per O(images) with C(ref) and C(id), the engine's config digest (null when absent).
  returned: always
  type: list
  elements: dict
containers:
  description: One entry per O(containers) with C(name), C(image) (the ref it was started from, or its label
    C(dcu-serving.image) when it was started by ID), C(image_id) and
    C(running) (null when there is no such container).
  returned: always
  type: list
  elements: dict
models:
  description: One entry per O(model_dirs) with C(path), C(exists), C(size_bytes), C(files), C(config_sha256),
    C(index) and C(index_sha256), and C(content_sha256), the SHA-256 of the lines C(<sha256>  <name>) of both.
  returned: always
  type: list
  elements: dict
report:
  description: The audit report (docs/operations.md, Audit) - each part with the bundle file and SHA-256 it came
    from, the units, N/N healthy, device access, C(problems), C(drift) and C(ok).
  returned: when O(report_dir) is given
  type: dict
files:
  description: The files written.
  returned: when O(report_dir) is given
  type: list
  elements: str
proxy:
  description: C(version) of dcu-serving in O(proxy_venv) (null when no venv), C(config) and C(config_sha256).
  returned: always
  type: dict
"""

import glob
import hashlib
import json
import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dcu.serving.plugins.module_utils import host_paths

INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def sha256_of(path):
    """Hex SHA-256 of a small file, or None when it cannot be read."""
    try:
        with open(path, "rb") as handle:
            return hashlib.sha256(handle.read()).hexdigest()
    except (IOError, OSError):
        return None


def read_json(path):
    try:
        with open(path) as handle:
            data = json.load(handle)
        return data if isinstance(data, dict) else None
    except (IOError, OSError, ValueError):
        return None


def read_text(path):
    try:
        with open(path) as handle:
            return handle.read().strip() or None
    except (IOError, OSError):
        return None


def model_dir(path):
    """Size and the sums of a model directory's config and weight index; weights are only stat'ed."""
    out = {"path": path, "exists": os.path.isdir(path), "size_bytes": None, "files": None,
           "config_sha256": None, "index": None, "index_sha256": None, "content_sha256": None}
    if not out["exists"]:
        return out
    size = files = 0
    for root, _dirs, names in os.walk(path, followlinks=True):
        for name in names:
            try:
                size += os.stat(os.path.join(root, name)).st_size
                files += 1
            except OSError:
                pass  # a dangling link: nothing vLLM could load either
    out.update(size_bytes=size, files=files, config_sha256=sha256_of(os.path.join(path, "config.json")))
    for name in INDEX_FILES:
        if os.path.isfile(os.path.join(path, name)):
            out.update(index=name, index_sha256=sha256_of(os.path.join(path, name)))
            break
    sums = [(out["config_sha256"], "config.json"), (out["index_sha256"], out["index"])]
    lines = "".join("%s  %s\n" % (digest, name) for digest, name in sums if digest)
    out["content_sha256"] = hashlib.sha256(lines.encode()).hexdigest() if lines else None
    return out


def inspect(module, engine, names):
    """{image ref or id, or container name: inspect entry} from one `<engine> inspect` of images and containers
    together; a name the engine lacks is simply absent."""
    if not names or not engine:
        return {}
    _rc, out, _err = module.run_command([engine, "inspect", *names])
    try:
        entries = json.loads(out or "[]")  # printed for the names found, also when one is missing (rc 1)
    except ValueError:
        return {}
    found = {}
    for entry in entries:
        if "State" in entry:  # a container
            found[entry.get("Name", "").lstrip("/")] = entry
        else:
            for ref in entry.get("RepoTags") or []:
                found[ref] = entry
    return found


def container(name, entry):
    # vllm@.service runs the image by its ID and names the tag in the label dcu-serving.image.
    config = entry.get("Config") or {}
    image = (config.get("Labels") or {}).get("dcu-serving.image") or config.get("Image")
    return {"name": name, "image": image, "image_id": entry.get("Image"),
            "running": (entry.get("State") or {}).get("Running")}


def proxy_version(venv):
    for metadata in sorted(glob.glob(os.path.join(venv, "lib", "python*", "site-packages",
                                                  "dcu_serving-*.dist-info", "METADATA"))):
        for line in (read_text(metadata) or "").splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    return None


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state_dir=dict(type="path", default=host_paths.host_path("state_dir")),
            hyhal_dir=dict(type="path", default="/opt/hyhal"),
            dtk_link=dict(type="path", default="/opt/dtk"),
            images=dict(type="list", elements="str", default=[]),
            containers=dict(type="list", elements="str", default=[]),
            engine=dict(type="str", default="docker"),
            model_dirs=dict(type="list", elements="path", default=[]),
            proxy_venv=dict(type="path", default=host_paths.host_path("proxy_venv")),
            proxy_config=dict(type="path", default=host_paths.host_path("proxy_config")),
            report_dir=dict(type="path"),  # the action plugin's, on the controller
            report=dict(type="dict"),
            gateway=dict(type="dict"),  # the action plugin's, on the controller
        ),
        supports_check_mode=True,
    )
    p = module.params
    engine = module.get_bin_path(p["engine"]) if p["images"] or p["containers"] else None
    found = inspect(module, engine, p["images"] + p["containers"])
    # The records' names in the role's state directory (state_dir moves them all, as on a test tree).
    dtk = read_json(os.path.join(p["state_dir"], os.path.basename(host_paths.host_path("dtk_record")))) or {}
    module.exit_json(
        changed=False,
        driver=read_json(os.path.join(p["state_dir"], os.path.basename(host_paths.host_path("install_record")))),
        dtk=dict(dtk, link=os.path.realpath(p["dtk_link"]) if os.path.exists(p["dtk_link"]) else None),
        hyhal={"path": os.path.realpath(p["hyhal_dir"]) if os.path.exists(p["hyhal_dir"]) else None,
               "version": read_text(os.path.join(p["hyhal_dir"], ".info", "version")),
               "marker": read_text(os.path.join(p["hyhal_dir"], ".dcu-serving-hyhal"))},
        images=[{"ref": ref, "id": (found.get(ref) or {}).get("Id")} for ref in p["images"]],
        containers=[container(name, found.get(name) or {}) for name in p["containers"]],
        models=[model_dir(path) for path in p["model_dirs"]],
        proxy={"version": proxy_version(p["proxy_venv"]), "config": p["proxy_config"],
               "config_sha256": sha256_of(p["proxy_config"])},
    )


if __name__ == "__main__":
    main()
