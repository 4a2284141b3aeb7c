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
from ansible_collections.dcu.serving.plugins.plugin_utils.quirks import vllm_version


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


# What an instance with tensor parallelism needs besides the devices: its workers share GPU buffers, and a worker
# takes another's file descriptor with pidfd_getfd(2), a ptrace access check that Docker passes only with
# CAP_SYS_PTRACE (docs/field-evidence.md C10).
TENSOR_PARALLEL_CAPABILITIES = ("SYS_PTRACE",)


def vllm_run_options(instances, nodes, env=None, device_isolation="card", numa_pinning=False,
                     container_options=(), hyhal_dir="/opt/hyhal", dtk_dir="", capabilities=None, pids_limit=0):
    """Each instance's `docker run` options: {instance name: [option, ...]}.

    instances: vllm_services; nodes: {path: {gid, group}} (dcu_facts' device_nodes). Every container gets /dev/kfd (and
    /dev/mkfd where the host has it), the device nodes' groups by gid except root's (the image's user is not
    in the host's groups by name), and the names of its environment (the instance's `env`, or `env` given
    here; VLLM_PORT always), sorted without regard to case. device_isolation `card` passes only the
    instance's cards' card and render nodes (inside they become devices 0..N-1); `visible_devices` passes
    /dev/dri and HIP_VISIBLE_DEVICES. The model directory is mounted read-only. Runtime `image` (Hygon's recipe: the
    image's own DTK, the host's hyhal) mounts hyhal at /opt/hyhal (where images look for it, whatever the host
    calls it), read-only; runtime `host` also mounts the host's DTK over the image's; runtime `bundled` mounts
    nothing of the host's. An instance with placement `cpu` gets no DCU device or group (and `--cpus` from its
    cpu_limit). numa_pinning pins an instance to its NUMA node's CPUs and memory when its CPU list is
    known. capabilities (a list: those the inventory adds): every default capability dropped, no new privileges,
    and only these - plus SYS_PTRACE for an instance with tensor parallelism - added back; None leaves Docker's
    defaults. pids_limit caps the tasks of a container (0: none); an instance's memory_max caps its memory.
    container_options come last.
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
        if instance.get("placement") == "cpu":
            # On the host's processors: no DCU node, no device group, no HIP_VISIBLE_DEVICES; its own CPU share.
            devices = ["--cpus={}".format(instance["cpu_limit"])] if instance.get("cpu_limit") else []
        elif device_isolation == "card":
            devices = ["--device={}".format(node) for node in
                       instance.get("card_nodes", [instance.get("card_node")])
                       + instance.get("render_nodes", [instance.get("render_node")]) if node]
        else:
            devices = ["--device=/dev/dri", "--env=HIP_VISIBLE_DEVICES"]
        mounts = []
        if instance.get("model_dir"):
            mounts.append("--volume={0}:{0}:ro".format(instance["model_dir"]))
        runtime = instance.get("runtime", "image")
        if runtime in ("image", "host"):
            mounts.append("--volume={}:/opt/hyhal:ro".format(hyhal_dir))
        if runtime == "host" and dtk_dir:
            mounts.append("--volume={}:/opt/dtk:ro".format(dtk_dir))
        numa = []
        if numa_pinning and instance.get("cpus") and instance.get("numa_node") is not None:
            numa = ["--cpuset-cpus={}".format(instance["cpus"]), "--cpuset-mems={}".format(instance["numa_node"])]
        walls = []
        if capabilities is not None:
            added = set(str(c).upper().replace("CAP_", "", 1) for c in capabilities)
            if int(instance.get("tensor_parallel") or 1) > 1:
                added.update(TENSOR_PARALLEL_CAPABILITIES)
            walls = (["--cap-drop=ALL"] + ["--cap-add={}".format(c) for c in sorted(added)]
                     + ["--security-opt=no-new-privileges"])
        if int(pids_limit or 0) > 0:
            walls.append("--pids-limit={}".format(int(pids_limit)))
        if instance.get("memory_max"):
            walls.append("--memory={}".format(instance["memory_max"]))
        key = instance.get("name", instance.get("card"))
        options[key] = (devices + (shared if instance.get("placement") != "cpu" else [])
                        + ["--env={}".format(name) for name in names] + mounts + numa + walls
                        + list(container_options or []))
    return options


# host_probe's name for the inspect of an image: 'image <ref>'.
_INSPECT = "image "


def image_inspect_commands(instances, engine):
    """host_probe's `commands` that inspect each image the instances run, once each: {'image <ref>': argv}."""
    commands = {}
    for instance in instances or []:
        if instance.get("image"):
            commands[_INSPECT + instance["image"]] = [engine, "image", "inspect", instance["image"]]
    return commands


def image_inspect_results(commands):
    """host_probe's answers to image_inspect_commands as a command loop registers them: [{item (the ref), rc,
    stdout, stderr}], the form vllm_images takes."""
    return [dict(done, item=name[len(_INSPECT):]) for name, done in sorted((commands or {}).items())
            if name.startswith(_INSPECT)]


_DTK_TAG = re.compile(r"dtk[-_]?(\d{2})\.?(\d{2}(?:\.\d+)?)", re.IGNORECASE)
# What each runtime takes from the host (docs/services.md, Runtimes; docs/field-evidence.md C8).
RUNTIME_MOUNTS = {"image": "the host's hyhal (the image's own DTK)", "host": "the host's hyhal and DTK",
                  "bundled": "nothing of the host's"}


def _image_tag(ref):
    name = str(ref).rsplit("/", 1)[-1]
    return name.split(":", 1) if ":" in name else (name, "")


def vllm_images(inspect_results):
    """{image ref: {id, dtk, runtime, vllm, dtk_env}} from a loop of `docker image inspect REF` (registered results).

    The DTK an image was built on, the runtime it expects and its vLLM version come from its labels dcu-serving.dtk,
    dcu-serving.runtime and dcu-serving.vllm, else from the reference's tag as Hygon names images
    (vllm:0.9.2-ubuntu22.04-dtk26.04-py3.10, ...-dtk2604-...); '' where unknown. dtk_env says whether the image's
    ENV holds the DTK's environment (ROCM_PATH): `image`, else `source` (the unit sources /opt/dtk/env.sh first).
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
        config = found.get("Config") or {}
        labels = config.get("Labels") or {}
        dtk = _DTK_TAG.search(_image_tag(ref)[1])
        vllm = vllm_version(ref)
        images[ref] = {
            "id": found.get("Id") or "unknown (not loaded yet)",
            "dtk": labels.get("dcu-serving.dtk") or ("{}.{}".format(dtk.group(1), dtk.group(2)) if dtk else ""),
            "runtime": labels.get("dcu-serving.runtime") or "",
            "vllm": labels.get("dcu-serving.vllm") or (".".join(str(part) for part in vllm) if vllm else ""),
            "dtk_env": "image" if any(str(e).startswith("ROCM_PATH=") for e in config.get("Env") or []) else "source",
        }
    return images


def vllm_image_problems(instances, images, driver_version, dtk_version, check_dtk=True):
    """What keeps each service's image from running on this host, once per service; [] when nothing does.

    An image that states its runtime (label dcu-serving.runtime) must run as it says: a `bundled` image run as
    `image` or `host` would get the host's hyhal mounted over its own, an `image` or `host` image run as `bundled`
    would have no hyhal. An image's DTK must go with the host's driver (the published DTK <-> driver table), and a
    `host` image's DTK with the host's DTK (filter dtk_driver_check).
    """
    problems, seen = [], set()
    for instance in instances or []:
        key = (instance.get("service"), instance.get("image"))
        if key in seen:
            continue
        seen.add(key)
        if instance.get("placement") == "cpu":
            continue  # a CPU build of vLLM: no DCU runtime to match, none of the host's mounted
        image = (images or {}).get(instance.get("image")) or {}
        who = "service {} (image {})".format(instance.get("service") or instance.get("model"), instance.get("image"))
        runtime = instance.get("runtime", "image")
        stated = image.get("runtime")
        if stated and stated != runtime and stated in RUNTIME_MOUNTS:
            problems.append("{who}: the image is built to run with {needs} (label dcu-serving.runtime={stated}), but "
                            "the service runs it as {runtime}, which mounts {mounts}. Fix: set runtime: {stated} for "
                            "this service".format(who=who, needs=RUNTIME_MOUNTS[stated], stated=stated, runtime=runtime,
                                                  mounts=RUNTIME_MOUNTS.get(runtime, "?")))
            continue
        if check_dtk and image.get("dtk"):
            problem = dtk_driver_check(image["dtk"], driver_version, dtk_version, image=instance.get("image"),
                                       runtime=runtime)
            if problem:
                problems.append("{}: {}".format(who, problem))
    return problems
