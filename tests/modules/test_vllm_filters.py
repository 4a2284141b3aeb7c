"""dcu_vllm's preflight: the device nodes a host has and each instance's `docker run` options, as the env
files carry them (DCU_VLLM_RUN_OPTIONS) — worked out by filter plugins, not Jinja loops."""

from __future__ import annotations

import json

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.dcu.serving.plugins.plugin_utils.containers import (
    vllm_device_nodes,
    vllm_image_problems,
    vllm_images,
    vllm_run_options,
)
from ansible_collections.dcu.serving.plugins.plugin_utils.services import (
    default_layout,
    env_file_problems,
    vllm_instances,
    vllm_services,
)

# `stat --format='%n %g %G' /dev/kfd /dev/mkfd <card nodes> <render nodes>` on a host set up by dcu_driver
# (render for kfd and renderD, video for card); /dev/dri/card2 is missing, so stat printed nothing for it.
STAT = [
    "/dev/kfd 992 render",
    "/dev/mkfd 992 render",
    "/dev/dri/card1 44 video",
    "/dev/dri/renderD128 992 render",
    "/dev/dri/renderD129 992 render",
]
NODES = vllm_device_nodes(STAT)
INSTANCES = [
    {"card": 0, "card_node": "/dev/dri/card1", "render_node": "/dev/dri/renderD128", "numa_node": 0, "cpus": "0-31"},
    {"card": 1, "card_node": "/dev/dri/card2", "render_node": "/dev/dri/renderD129", "numa_node": 1, "cpus": ""},
]
# dcu_vllm_offline_env's names and an inventory's own, in the order the inventory gives them.
ENV = ["HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "do_not_track", "VLLM_NO_USAGE_STATS"]


def test_device_nodes_from_stat():
    assert NODES == {
        "/dev/kfd": {"gid": 992, "group": "render"},
        "/dev/mkfd": {"gid": 992, "group": "render"},
        "/dev/dri/card1": {"gid": 44, "group": "video"},
        "/dev/dri/renderD128": {"gid": 992, "group": "render"},
        "/dev/dri/renderD129": {"gid": 992, "group": "render"},
    }
    assert "/dev/dri/card2" not in NODES  # preflight names it as missing
    assert vllm_device_nodes([]) == {}


def test_device_nodes_refuse_a_line_they_cannot_read():
    with pytest.raises(AnsibleFilterError, match="expected 'path gid group'"):
        vllm_device_nodes(["/dev/kfd 992"])


def test_each_card_gets_its_own_nodes_and_the_shared_ones():
    options = vllm_run_options(INSTANCES, NODES, ENV)
    assert options == {
        0: ["--device=/dev/dri/card1", "--device=/dev/dri/renderD128",
            "--device=/dev/kfd", "--device=/dev/mkfd", "--group-add=44", "--group-add=992",
            # sorted without regard to case, as Jinja's sort did
            "--env=do_not_track", "--env=HF_HUB_OFFLINE", "--env=TRANSFORMERS_OFFLINE",
            "--env=VLLM_NO_USAGE_STATS", "--env=VLLM_PORT",
            # runtime image (the default, Hygon's recipe): the host's hyhal where images look for it, not its DTK
            "--volume=/opt/hyhal:/opt/hyhal:ro"],
        1: ["--device=/dev/dri/card2", "--device=/dev/dri/renderD129",
            "--device=/dev/kfd", "--device=/dev/mkfd", "--group-add=44", "--group-add=992",
            "--env=do_not_track", "--env=HF_HUB_OFFLINE", "--env=TRANSFORMERS_OFFLINE",
            "--env=VLLM_NO_USAGE_STATS", "--env=VLLM_PORT", "--volume=/opt/hyhal:/opt/hyhal:ro"],
    }


def test_root_owned_nodes_add_no_group_and_mkfd_only_where_it_exists():
    nodes = vllm_device_nodes(["/dev/kfd 0 root", "/dev/dri/card1 0 root", "/dev/dri/renderD128 0 root"])
    assert vllm_run_options(INSTANCES[:1], nodes, {}) == {
        0: ["--device=/dev/dri/card1", "--device=/dev/dri/renderD128", "--device=/dev/kfd", "--env=VLLM_PORT",
            "--volume=/opt/hyhal:/opt/hyhal:ro"],
    }


def test_a_service_instance_gets_all_its_cards_its_model_and_only_its_runtimes_mounts():
    chat = {"name": "chat-0", "card_nodes": ["/dev/dri/card1", "/dev/dri/card2"],
            "render_nodes": ["/dev/dri/renderD128", "/dev/dri/renderD129"], "model_dir": "/srv/models/qwen",
            "runtime": "host", "env": {"HF_HUB_OFFLINE": "1"}}
    bundled = dict(chat, name="embed-0", runtime="bundled", card_nodes=["/dev/dri/card1"],
                   render_nodes=["/dev/dri/renderD128"])
    vendor = dict(chat, name="vision-0", runtime="image")
    options = vllm_run_options([chat, bundled, vendor], NODES, hyhal_dir="/usr/local/hyhal", dtk_dir="/opt/dtk")
    assert options["chat-0"][:4] == ["--device=/dev/dri/card1", "--device=/dev/dri/card2",
                                     "--device=/dev/dri/renderD128", "--device=/dev/dri/renderD129"]
    assert options["chat-0"][-3:] == ["--volume=/srv/models/qwen:/srv/models/qwen:ro",
                                      "--volume=/usr/local/hyhal:/opt/hyhal:ro", "--volume=/opt/dtk:/opt/dtk:ro"]
    assert "--env=HF_HUB_OFFLINE" in options["chat-0"]
    assert options["embed-0"][-1] == "--volume=/srv/models/qwen:/srv/models/qwen:ro", "nothing of the host's runtime"
    assert options["vision-0"][-2:] == ["--volume=/srv/models/qwen:/srv/models/qwen:ro",
                                        "--volume=/usr/local/hyhal:/opt/hyhal:ro"], "hyhal, and the image's own DTK"


def test_visible_devices_passes_all_of_dri():
    options = vllm_run_options(INSTANCES, NODES, [], device_isolation="visible_devices")
    assert options[1][:3] == ["--device=/dev/dri", "--env=HIP_VISIBLE_DEVICES", "--device=/dev/kfd"]
    assert "--device=/dev/dri/card2" not in options[1]


def test_numa_pinning_only_where_the_cpus_are_known_and_extra_options_last():
    options = vllm_run_options(INSTANCES, NODES, [], numa_pinning=True, container_options=["--shm-size=16g"])
    assert options[0][-3:] == ["--cpuset-cpus=0-31", "--cpuset-mems=0", "--shm-size=16g"]
    assert options[1][-1] == "--shm-size=16g" and not any(o.startswith("--cpuset") for o in options[1])
    unpinned = vllm_run_options(INSTANCES, NODES, [], numa_pinning=False)
    assert not any(o.startswith("--cpuset") for o in unpinned[0])


def test_containers_drop_every_capability_and_get_back_only_what_dcu_inference_needs():
    """Docker's defaults (CHOWN, DAC_OVERRIDE, SETUID, NET_RAW, ...) go; no new privileges; a tensor-parallel
    instance gets SYS_PTRACE (its workers exchange GPU buffers with pidfd_getfd); the inventory may add more.
    Tasks and memory are capped: per card for memory, so a two-card instance gets twice a card's."""
    tp = dict(INSTANCES[0], name="chat-0", tensor_parallel=2, memory_max="96G")
    options = vllm_run_options([INSTANCES[1], tp], NODES, [], capabilities=[], pids_limit=8192,
                               container_options=["--ipc=host"])
    assert options[1][-4:] == ["--cap-drop=ALL", "--security-opt=no-new-privileges", "--pids-limit=8192", "--ipc=host"]
    assert options["chat-0"][-6:] == ["--cap-drop=ALL", "--cap-add=SYS_PTRACE", "--security-opt=no-new-privileges",
                                      "--pids-limit=8192", "--memory=96G", "--ipc=host"]
    more = vllm_run_options(INSTANCES[:1], NODES, [], capabilities=["cap_ipc_lock", "SYS_NICE"])
    assert more[0][-4:] == ["--cap-drop=ALL", "--cap-add=IPC_LOCK", "--cap-add=SYS_NICE",
                            "--security-opt=no-new-privileges"]
    assert not any(o.startswith(("--cap-", "--pids", "--memory")) for o in vllm_run_options(INSTANCES, NODES, [])[0])


def test_an_instances_memory_is_its_cards_times_the_memory_per_card():
    services = [{"name": "chat", "kind": "chat", "models": ["qwen"], "model_dir": "/srv/models/qwen", "cards": [0, 1]},
                {"name": "embed", "kind": "embedding", "models": ["bge"], "model_dir": "/srv/models/bge", "cards": [2],
                 "memory_per_card": "1536M"},
                {"name": "free", "kind": "embedding", "models": ["e5"], "model_dir": "/srv/models/e5", "cards": [3],
                 "memory_per_card": ""}]
    cards = [{"index": i, "pci_bus": f"0000:0{i}:00.0", "numa_node": 0} for i in range(4)]
    by_name = {i["name"]: i for i in vllm_services(services, cards, {"base_port": 8002, "memory_per_card": "48G"})}
    assert (by_name["chat-0"]["memory_max"], by_name["embed-0"]["memory_max"], by_name["free-0"]["memory_max"]) == (
        "96G", "1536M", "")
    with pytest.raises(AnsibleFilterError, match=r"service embed: memory_per_card is the host memory .* got '48 GB'"):
        vllm_services([dict(services[1], memory_per_card="48 GB")], cards, {"base_port": 8002})


def test_an_unknown_isolation_is_refused():
    with pytest.raises(AnsibleFilterError, match="device_isolation"):
        vllm_run_options(INSTANCES, NODES, [], device_isolation="none")


CARDS = [{"index": i, "pci_bus": f"0000:{b}:00.0", "card_node": f"/dev/dri/card{i}",
          "render_node": f"/dev/dri/renderD{128 + i}", "numa_node": 0 if i < 4 else 1}
         for i, b in enumerate(["05", "2b", "14", "1a", "86", "b8", "c0", "9e"])]


def test_one_instance_per_card_on_its_port_with_its_own_internal_port_range():
    instances = vllm_instances(CARDS, cpulists={0: "0-31", "1": "32-63"}, model="MiniCPM-V-4.5", max_num_seqs=4)
    assert [i["unit"] for i in instances] == [f"vllm@{n}" for n in range(8)]
    assert [i["port"] for i in instances] == list(range(8002, 8010))
    assert [i["internal_port"] for i in instances] == [20000 + 100 * n for n in range(8)]
    assert instances[1]["pci_bus"] == "0000:2b:00.0" and instances[1]["render_node"] == "/dev/dri/renderD129"
    assert instances[5]["cpus"] == "32-63", "pinned to its card's NUMA node's CPUs"


def test_only_the_wanted_cards_and_ports_that_exist():
    assert [i["card"] for i in vllm_instances(CARDS, wanted=[6, 2], model="m")] == [2, 6]
    with pytest.raises(AnsibleFilterError, match="instance 6 would listen on port 65536, outside 1-65535"):
        vllm_instances(CARDS, base_port=65530, model="m")


def test_the_deprecated_vllm_instances_is_the_default_layout_of_vllm_services():
    """One list of instances: vllm_instances is vllm_services' default layout, seen through its old keys."""
    old = vllm_instances(CARDS, wanted=[1, 5], model="m", max_num_seqs=4, max_images=9)
    new = vllm_services(default_layout(CARDS, [1, 5], "m", "/"), CARDS,
                        {"max_num_seqs": 4, "limit_mm_per_prompt": {"image": 9}})
    assert old == [{key: instance[key] or (0 if key == "max_model_len" else instance[key]) for key in old[0]}
                   for instance in new]
    assert set(old[0]) == {"card", "port", "url", "unit", "container", "pci_bus", "card_node", "render_node",
                           "numa_node", "cpus", "internal_port", "model", "max_num_seqs", "max_model_len",
                           "max_images"}
    assert [i["max_images"] for i in old] == [9, 9]
    with pytest.raises(AnsibleFilterError, match="give model"):
        vllm_instances(CARDS)


def test_env_file_values_systemd_can_read():
    assert env_file_problems({"HF_HUB_OFFLINE": "1", "VLLM_HCU_USE_CUSTOM_OPS": 0}) == []
    problems = env_file_problems({"BAD-NAME": "1", "QUOTED": 'say "hi"', "MULTI": "a\nb", "SLASH": "a\\b"})
    assert problems == ["'BAD-NAME' is not an environment variable name",
                        "MULTI's value must be plain text without quotes, backslashes or line breaks",
                        "QUOTED's value must be plain text without quotes, backslashes or line breaks",
                        "SLASH's value must be plain text without quotes, backslashes or line breaks"]


HYGON = "harbor.sourcefind.cn:5443/dcu/admin/base/vllm:0.9.2-ubuntu22.04-dtk26.04-0130-py3.10-20260204"


def _inspect(ref, env=(), labels=None, rc=0):
    """A loop result of `docker image inspect REF` as the probe registers it."""
    return {"item": ref, "rc": rc, "stdout": json.dumps([{"Id": "sha256:" + "ab" * 32,
                                                          "Config": {"Env": list(env), "Labels": labels}}])}


def test_images_say_their_dtk_vllm_runtime_and_whether_their_env_holds_the_dtk():
    images = vllm_images([
        _inspect(HYGON, env=["PATH=/usr/bin", "ROCM_PATH=/opt/dtk", "LD_LIBRARY_PATH=/opt/dtk/lib"]),
        _inspect("dcu-serving/vllm-sim:0.11.0", env=["PATH=/usr/bin"],
                 labels={"dcu-serving.runtime": "image", "dcu-serving.dtk": "26.04"}),
        _inspect("harbor.local/sglang:0.5.12-dtk26.04"),
    ])
    assert images[HYGON] == {"id": "sha256:" + "ab" * 32, "dtk": "26.04", "runtime": "", "vllm": "0.9.2",
                             "dtk_env": "image"}
    sim = images["dcu-serving/vllm-sim:0.11.0"]
    assert (sim["runtime"], sim["vllm"], sim["dtk_env"]) == ("image", "0.11.0", "source"), \
        "no ROCM_PATH in its ENV: the unit sources /opt/dtk/env.sh first"
    assert images["harbor.local/sglang:0.5.12-dtk26.04"]["vllm"] == "", "not a vLLM image: no vLLM version"


def test_an_image_built_for_another_runtime_is_refused_with_the_fix():
    images = {"img": {"runtime": "bundled", "dtk": ""}}
    [problem] = vllm_image_problems([{"service": "chat", "image": "img", "runtime": "image"}], images, None, None)
    assert problem == ("service chat (image img): the image is built to run with nothing of the host's (label "
                       "dcu-serving.runtime=bundled), but the service runs it as image, which mounts the host's hyhal "
                       "(the image's own DTK). Fix: set runtime: bundled for this service")
    assert vllm_image_problems([{"service": "chat", "image": "img", "runtime": "bundled"}], images, None, None) == []
