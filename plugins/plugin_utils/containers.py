# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""How each vLLM instance's container runs: the device nodes it gets, its `docker run` options, the images the
engine holds (their DTK and runtime) and what keeps an image from running on this host. The instances come from
services.vllm_services (the one list of them)."""

import json
import re

from ansible.errors import AnsibleFilterError

from ansible_collections.dcu.serving.plugins.plugin_utils.dtk_check import dtk_driver_check


def vllm_device_nodes(stat_lines):
    """The device nodes that exist, from `stat --format='%n %g %G' NODE...`: {path: {gid, group}}.

    stat prints a line for each node it finds and only an error (on stderr) for a missing one, so a node
    absent from the result is missing on the host.
    """
    nodes = {}
    for line in stat_lines or []:
        fields = line.split()
        if len(fields) < 3:
            raise AnsibleFilterError("vllm_device_nodes: expected 'path gid group', got {!r}".format(line))
        nodes[fields[0]] = {"gid": int(fields[1]), "group": fields[2]}
    return nodes


def vllm_run_options(instances, nodes, env=None, device_isolation="card", numa_pinning=False,
                     container_options=(), hyhal_dir="/opt/hyhal", dtk_dir=""):
    """Each instance's `docker run` options: {instance name: [option, ...]}.

    instances: vllm_services; nodes: {path: {gid, group}} (dcu_facts' device_nodes). Every container gets /dev/kfd (and
    /dev/mkfd where the host has it), the device nodes' groups by gid except root's (the image's user is not
    in the host's groups by name), and the names of its environment (the instance's `env`, or `env` given
    here; VLLM_PORT always), sorted without regard to case. device_isolation `card` passes only the
    instance's cards' card and render nodes (inside they become devices 0..N-1); `visible_devices` passes
    /dev/dri and HIP_VISIBLE_DEVICES. The model directory is mounted read-only; runtime `host` (the image uses
    the host's user-space runtime) also mounts hyhal at /opt/hyhal (where images look for it, whatever the
    host calls it) and the host's DTK, read-only; runtime `bundled` mounts nothing of the host's. numa_pinning
    pins an instance to its NUMA node's CPUs and memory when its CPU list is known. container_options come last.
    """
    if device_isolation not in ("card", "visible_devices"):
        raise AnsibleFilterError("vllm_run_options: device_isolation must be card or visible_devices, got {!r}".format(
            device_isolation))
    gids = sorted({node["gid"] for node in nodes.values() if node["gid"] != 0})
    shared = (["--device=/dev/kfd"] + (["--device=/dev/mkfd"] if "/dev/mkfd" in nodes else [])
              + ["--group-add={}".format(gid) for gid in gids])
    options = {}
    for instance in instances:
        names = instance.get("env", env if env is not None else ())
        names = sorted(set(["VLLM_PORT", *names]), key=lambda name: name.lower())
        if device_isolation == "card":
            devices = ["--device={}".format(node) for node in
                       instance.get("card_nodes", [instance.get("card_node")])
                       + instance.get("render_nodes", [instance.get("render_node")]) if node]
        else:
            devices = ["--device=/dev/dri", "--env=HIP_VISIBLE_DEVICES"]
        mounts = []
        if instance.get("model_dir"):
            mounts.append("--volume={0}:{0}:ro".format(instance["model_dir"]))
        if instance.get("runtime", "host") == "host":
            mounts.append("--volume={}:/opt/hyhal:ro".format(hyhal_dir))
            if dtk_dir:
                mounts.append("--volume={}:/opt/dtk:ro".format(dtk_dir))
        numa = []
        if numa_pinning and instance.get("cpus") and instance.get("numa_node") is not None:
            numa = ["--cpuset-cpus={}".format(instance["cpus"]), "--cpuset-mems={}".format(instance["numa_node"])]
        key = instance.get("name", instance.get("card"))
        options[key] = (devices + shared + ["--env={}".format(name) for name in names] + mounts + numa
                        + list(container_options or []))
    return options


_DTK_TAG = re.compile(r"dtk[-_]?(\d{2})\.?(\d{2}(?:\.\d+)?)", re.IGNORECASE)


def vllm_images(inspect_results):
    """{image ref: {id, dtk, runtime}} from a loop of `docker image inspect REF` (registered results).

    The DTK an image was built on and the runtime it expects come from its labels dcu-serving.dtk and
    dcu-serving.runtime (host: uses the host's hyhal/DTK; bundled: carries its own), else the DTK from the
    reference's tag as Hygon names images (...-dtk26.04-py3.10, ...-dtk2604-...); '' where unknown.
    """
    images = {}
    for result in inspect_results or []:
        ref = result.get("item")
        found = {}
        if result.get("rc") == 0:
            try:
                found = (json.loads(result.get("stdout") or "[]") or [{}])[0]
            except ValueError:
                found = {}
        labels = (found.get("Config") or {}).get("Labels") or {}
        tag = _DTK_TAG.search(str(ref).rsplit("/", 1)[-1].split(":", 1)[-1] if ":" in str(ref) else "")
        images[ref] = {
            "id": found.get("Id") or "unknown (not loaded yet)",
            "dtk": labels.get("dcu-serving.dtk") or ("{}.{}".format(tag.group(1), tag.group(2)) if tag else ""),
            "runtime": labels.get("dcu-serving.runtime") or "",
        }
    return images


def vllm_image_problems(instances, images, driver_version, dtk_version, check_dtk=True):
    """What keeps each service's image from running on this host, once per service; [] when nothing does.

    An image that states its runtime must run as it says: a `bundled` image run as `host` would get the host's
    hyhal and DTK mounted over its own runtime, a `host` image run as `bundled` would have no hyhal. An
    image's DTK must go with the host's driver (the published DTK <-> driver table), and a `host` image's DTK
    with the host's DTK (filter dtk_driver_check).
    """
    problems, seen = [], set()
    for instance in instances or []:
        key = (instance.get("service"), instance.get("image"))
        if key in seen:
            continue
        seen.add(key)
        image = (images or {}).get(instance.get("image")) or {}
        who = "service {} (image {})".format(instance.get("service") or instance.get("model"), instance.get("image"))
        runtime = instance.get("runtime", "host")
        stated = image.get("runtime")
        if stated and stated != runtime:
            if stated == "bundled":
                problems.append("{}: the image carries its own runtime (label dcu-serving.runtime=bundled) but the "
                                "service runs it as host, which mounts the host's hyhal and DTK over it. Fix: set "
                                "runtime: bundled for this service".format(who))
            else:
                problems.append("{}: the image uses the host's runtime (label dcu-serving.runtime=host) but the "
                                "service runs it as bundled, which mounts no hyhal. Fix: set runtime: host".format(who))
            continue
        if check_dtk and image.get("dtk"):
            problem = dtk_driver_check(image["dtk"], driver_version, dtk_version, image=instance.get("image"),
                                       runtime=runtime)
            if problem:
                problems.append("{}: {}".format(who, problem))
    return problems
