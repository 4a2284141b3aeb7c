"""dcu-doctor against a converged host in a temporary tree, run as the operator runs it (a process), with
real executables standing in for hy-smi, systemctl and docker and real HTTP servers for vLLM and the proxy.
Each fault is one a host really gets; the test reads what the operator reads: the failure and its fix."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time

from doctor.doctorhost import IMAGE, IMAGE_ID, SRC, DoctorHost, of

from dcu_serving.doctor.checks import CHECKS

ORDER = [name for name, _check in CHECKS]


def statuses(findings):
    return {(f["check"], f["status"]) for f in findings}


def test_a_converged_serving_host_is_all_ok_in_the_issue_order(dcu_host: DoctorHost):
    dcu_host.with_instances()
    dcu_host.with_proxy()
    rc, findings = dcu_host.findings()
    assert rc == 0, findings
    assert [f["status"] for f in findings if f["status"] != "ok"] == [], findings
    checks = list(dict.fromkeys(f["check"] for f in findings))
    assert checks == ORDER == ["driver", "hymgr", "boot", "device nodes", "versions", "engine", "selinux", "kernel",
                               "images", "units", "ports", "proxy", "data", "disk", "shm"]
    assert "hycu 6.3.30-V1.4.1a loaded; 2 card(s) bound of 2 expected" in of(findings, "driver")[0]["message"]
    assert "dcu-serving, dcu-batch open them through render, video" in of(findings, "device nodes")[0]["message"]
    assert "2/2 backends healthy" in of(findings, "proxy")[0]["message"]
    assert of(findings, "versions")[0]["message"] == (
        "the DTK <-> driver table allows driver 6.3.30-V1.4.1a with the host's DTK: DTK 26.04; "
        f"image {IMAGE}: DTK 26.04")


def test_a_driver_only_host_reports_the_serving_parts_not_installed(dcu_host: DoctorHost):
    rc, findings = dcu_host.findings()
    assert rc == 0, findings
    for check in ("images", "ports", "proxy"):
        assert [f["status"] for f in of(findings, check)] == ["skip"], findings
    assert "not installed" in of(findings, "proxy")[0]["message"]
    assert "no vllm@ or dcu-proxy units installed" in of(findings, "units")[0]["message"]


def test_a_stopped_hymgr_is_named_with_its_fix(dcu_host: DoctorHost):
    dcu_host.unit("hymgr", "inactive")
    rc, findings = dcu_host.findings()
    assert rc == 1
    service, smi = of(findings, "hymgr", "fail")
    assert service["message"] == "hymgr.service is inactive: hy-smi answers nothing without it"
    assert service["fix"].startswith("systemctl start hymgr")
    assert "Connect server failed" in smi["message"]
    assert "start it (systemctl start hymgr)" in smi["fix"]


def test_a_removed_group_membership_is_named_with_its_fix(dcu_host: DoctorHost):
    dcu_host.set_members(render=["dcu-serving"], video=["dcu-serving", "dcu-batch"])
    rc, findings = dcu_host.findings()
    assert rc == 1
    [failure] = of(findings, "device nodes", "fail")
    assert failure["message"] == ("dcu-batch is not in group render, which owns /dev/kfd, /dev/dri/renderD128, "
                                  "/dev/dri/renderD129")
    assert failure["fix"] == "usermod -aG render dcu-batch (then restart its services), or run playbooks/drivers.yml"


def test_a_damaged_access_record_warns_instead_of_hiding_the_users(dcu_host: DoctorHost):
    (dcu_host.state / "device-access.json").write_text('{"users": ["dcu-batch"]}\\n')  # a literal backslash-n
    rc, findings = dcu_host.findings()
    assert rc == 0  # a warning: the rest of the host is fine
    [warning] = of(findings, "device nodes", "warn")
    assert warning["message"].endswith("device-access.json is not valid JSON: which service users need the nodes "
                                       "is not known, only dcu-serving and --user are checked")
    assert warning["fix"] == "run playbooks/drivers.yml (it writes the record again)"


def test_a_user_on_the_command_line_is_checked_too_and_a_missing_one_named(dcu_host: DoctorHost):
    rc, findings = dcu_host.findings("--user", "batch-jobs")
    assert rc == 1
    [failure] = of(findings, "device nodes", "fail")
    assert failure["message"] == "service user batch-jobs does not exist"


def test_text_output_prints_each_failure_with_its_fix_beneath(dcu_host: DoctorHost):
    dcu_host.unit("hymgr", "failed")
    rc, out, _err = dcu_host.run()
    assert rc == 1
    lines = out.splitlines()
    index = lines.index("[FAIL] hymgr         hymgr.service is failed: hy-smi answers nothing without it")
    assert lines[index + 1].strip().startswith("fix: systemctl start hymgr")
    assert lines[-1].startswith("2 failed, 0 warnings, ")


def test_no_driver_loaded_fails_first_and_the_nodes_follow(dcu_host: DoctorHost, tmp_path):
    shutil.rmtree(dcu_host.sysfs / "module")
    rc, findings = dcu_host.findings()
    assert rc == 1
    assert findings[0]["check"] == "driver" and findings[0]["status"] == "fail"
    assert "no DCU kernel module" in findings[0]["message"]
    assert "hy-smi --loaddriver" in findings[0]["fix"]


def test_fewer_cards_than_recorded_fails_naming_the_variable(dcu_host: DoctorHost):
    dcu_host.record({"users": ["dcu-serving"], "expected_cards": 8})
    rc, findings = dcu_host.findings()
    assert rc == 1
    [failure] = of(findings, "driver", "fail")
    assert "2 card(s) bound, 8 expected (dcu_driver_expected_cards)" in failure["message"]


def test_world_writable_nodes_warn_with_the_rules_fix(dcu_host: DoctorHost):
    (dcu_host.dev / "kfd").chmod(0o666)
    rc, findings = dcu_host.findings()
    assert rc == 0
    [warning] = of(findings, "device nodes", "warn")
    assert "world-accessible: /dev/kfd" in warning["message"]
    assert "70-dcu.rules" in warning["fix"]


def test_a_dtk_the_loaded_driver_does_not_support_fails_with_the_table_row(dcu_host: DoctorHost):
    (dcu_host.dtk / ".info" / "rocm_version").write_text("24.04.3\n")
    rc, findings = dcu_host.findings()
    assert rc == 1
    [failure] = of(findings, "versions", "fail")
    assert failure["message"].startswith("the host's DTK: DTK-24.04.3: driver >=5.7.1-V1.0")
    assert "does not allow the loaded driver 6.3.30-V1.4.1a" in failure["message"]
    assert "rock-5.7.1-6.2.26-V1.5.aio.run" in failure["fix"] and "26.04" in failure["fix"]


def test_an_installed_driver_that_is_not_the_loaded_one_asks_for_a_reboot(dcu_host: DoctorHost):
    (dcu_host.state / "rock-install.json").write_text(json.dumps({"file": "rock-6.3.31-V1.5.0a.run",
                                                                  "version": "6.3.31-V1.5.0a"}))
    rc, findings = dcu_host.findings()
    assert rc == 1
    [failure] = of(findings, "versions", "fail")
    assert "rock 6.3.31-V1.5.0a is installed" in failure["message"] and "6.3.30-V1.4.1a is loaded" in failure["message"]
    assert failure["fix"].startswith("reboot")


def test_the_images_dtk_is_held_against_the_driver_too(dcu_host: DoctorHost):
    dcu_host.with_instances(image="harbor.local/dcu/vllm:0.8.5-dtk24.04.3-py3.10")
    rc, findings = dcu_host.findings()
    assert rc == 1
    [failure] = of(findings, "versions", "fail")
    assert failure["message"].startswith("image harbor.local/dcu/vllm:0.8.5-dtk24.04.3-py3.10: DTK-24.04.3")


def test_an_images_dtk_label_wins_over_its_tag(dcu_host: DoctorHost):
    dcu_host.with_instances(image="registry.local/vllm:latest")
    rc, findings = dcu_host.findings()
    assert rc == 0
    [warning] = of(findings, "versions", "warn")
    assert warning["message"] == ("image registry.local/vllm:latest: no DTK version in its label or tag, so the "
                                  "DTK <-> driver table cannot be applied")
    assert "dcu-serving.dtk" in warning["fix"]

    dcu_host.stubs["labels"] = {"registry.local/vllm:latest": {"dcu-serving.dtk": "24.04.3"}}
    dcu_host.save()
    rc, findings = dcu_host.findings()
    assert rc == 1
    assert of(findings, "versions", "fail")[0]["message"].startswith("image registry.local/vllm:latest: DTK-24.04.3")


def test_a_missing_image_fails_and_a_replaced_one_warns(dcu_host: DoctorHost):
    dcu_host.with_instances()
    dcu_host.stubs["images"] = {}
    dcu_host.save()
    rc, findings = dcu_host.findings()
    assert rc == 1
    [failure] = of(findings, "images", "fail")
    assert failure["message"].startswith(f"{IMAGE} (for vllm@0, vllm@1) is not in Docker: Error response")
    assert failure["fix"].startswith("playbooks/images.yml loads it from the bundle")

    # The vendor re-released the tag: the units still run the old image by its ID (a rollback kept them on it).
    dcu_host.stubs["images"] = {IMAGE: "sha256:" + "cd" * 32}
    dcu_host.stubs["dangling"] = [IMAGE_ID]
    dcu_host.save()
    rc, findings = dcu_host.findings()
    assert rc == 0
    [warning] = of(findings, "images", "warn")
    assert "but vllm@0, vllm@1 run sha256:abababababab (by ID: a rollback keeps them on it)" in warning["message"]

    # ...and then someone deleted the old image: the units cannot start again.
    dcu_host.stubs["dangling"] = []
    dcu_host.save()
    rc, findings = dcu_host.findings()
    assert rc == 1
    [failure] = of(findings, "images", "fail")
    assert failure["message"] == (f"vllm@0, vllm@1 run {IMAGE} by its ID sha256:abababababab, which Docker no longer "
                                  "holds: their next start fails")
    assert failure["fix"] == f"playbooks/serving.yml converges them on the {IMAGE} loaded now (sha256:cdcdcdcdcdcd)"


def test_a_failed_unit_and_its_silent_port_are_named(dcu_host: DoctorHost):
    servers = dcu_host.with_instances()
    dcu_host.unit("vllm@1", "failed")
    servers[1].close()
    rc, findings = dcu_host.findings()
    assert rc == 1
    [unit] = of(findings, "units", "fail")
    assert unit["message"] == "vllm@1 is failed"
    assert "journalctl -u vllm@1" in unit["fix"] and "systemctl reset-failed vllm@1" in unit["fix"]
    [port] = of(findings, "ports", "fail")
    assert port["message"].startswith(f"vllm@1 (MiniCPM-V-4.5): nothing answers on 127.0.0.1:{servers[1].port}")


def test_the_proxy_with_a_backend_down_warns_and_with_none_fails(dcu_host: DoctorHost):
    dcu_host.with_instances()
    dcu_host.with_proxy(healthy=1)
    rc, findings = dcu_host.findings()
    assert rc == 0
    [warning] = of(findings, "proxy", "warn")
    assert "1/2 backends healthy" in warning["message"] and "connection refused" in warning["message"]
    assert "X-Backend" in warning["fix"] and "orid" in warning["fix"]

    dcu_host.lb_status.update(healthy=0, backends=[{**b, "healthy": False} for b in dcu_host.lb_status["backends"]])
    rc, findings = dcu_host.findings()
    assert rc == 1
    assert "0/2 backends healthy" in of(findings, "proxy", "fail")[0]["message"]


def test_a_proxy_that_does_not_answer_fails(dcu_host: DoctorHost):
    dcu_host.with_instances()
    proxy = dcu_host.with_proxy()
    proxy.close()
    rc, findings = dcu_host.findings()
    assert rc == 1
    assert of(findings, "proxy", "fail")[0]["message"].startswith(f"GET http://127.0.0.1:{proxy.port}/__lb_status")
    assert any(f["message"].startswith("dcu-proxy: nothing answers") for f in of(findings, "ports", "fail"))


def test_too_little_free_disk_fails_with_the_bound(dcu_host: DoctorHost):
    rc, findings = dcu_host.findings("--min-free-gib", "1000000")
    assert rc == 1
    failure = of(findings, "disk", "fail")[0]
    assert "(at least 1e+06 GiB wanted" in failure["message"]
    assert failure["fix"].startswith("no untagged image is left over; remove old bundles under ")


def test_the_disk_fix_never_removes_an_image_a_unit_runs_or_rolls_back_to(dcu_host: DoctorHost):
    """A same-tag re-release left the image the units run by ID untagged: `docker image prune` would delete it.
    The fix names only the untagged images no unit runs or rolls back to."""
    dcu_host.with_instances()
    leftover = "sha256:" + "ef" * 32
    dcu_host.stubs["images"] = {IMAGE: "sha256:" + "cd" * 32}
    dcu_host.stubs["dangling"] = [IMAGE_ID, leftover]
    dcu_host.save()
    rc, findings = dcu_host.findings("--min-free-gib", "1000000")
    assert rc == 1
    fix = of(findings, "disk", "fail")[0]["fix"]
    assert fix.startswith("docker image rm efefefefefef (not docker image prune: it would delete abababababab, "
                          "which vLLM units run or roll back to); remove old bundles"), fix
    assert "ababab" not in fix.split("(")[0]


def test_more_container_shm_than_memory_warns(dcu_host: DoctorHost):
    dcu_host.with_instances()
    (dcu_host.proc / "meminfo").write_text("MemTotal:       16777216 kB\n")
    rc, findings = dcu_host.findings()
    assert rc == 0
    [warning] = of(findings, "shm", "warn")
    assert warning["message"].startswith("2 containers x --shm-size 16g = 32.0 GiB of shared memory")
    assert "dcu_vllm_container_shm_size" in warning["fix"]


def test_a_hanging_hy_smi_is_cut_off_at_the_deadline(dcu_host: DoctorHost):
    dcu_host.stubs["hy_smi_hangs"] = True
    dcu_host.save()
    start = time.monotonic()
    rc, findings = dcu_host.findings("--timeout", "1")
    assert time.monotonic() - start < 20
    assert rc == 1
    assert "no answer within 1s" in of(findings, "hymgr", "fail")[0]["message"]


def test_bad_options_exit_2_naming_the_option(dcu_host: DoctorHost):
    rc, _out, err = dcu_host.run("--timeout", "0")
    assert rc == 2
    assert "--timeout must be more than 0 seconds, got 0" in err


def test_the_zipapp_runs_on_the_standard_library_alone(dcu_host: DoctorHost, tmp_path):
    pyz = tmp_path / "dcu-doctor.pyz"
    subprocess.run([sys.executable, "-m", "dcu_serving.doctor.pack", str(pyz)], check=True, capture_output=True,
                   env={**dcu_host.env(), "PYTHONPATH": str(SRC)})
    dcu_host.with_instances()
    dcu_host.with_proxy()
    dcu_host.set_members(render=["dcu-serving"], video=list(("dcu-serving", "dcu-batch")))
    # -I -S: no PYTHONPATH, no site-packages (no PyYAML, no installed dcu_serving).
    rc, findings = dcu_host.findings(command=[sys.executable, "-I", "-S", str(pyz)])
    assert rc == 1
    assert of(findings, "device nodes", "fail")[0]["message"].startswith("dcu-batch is not in group render")
    assert "2/2 backends healthy" in of(findings, "proxy")[0]["message"]  # proxy.yml read without PyYAML


def test_the_instances_are_reached_where_the_unit_says_they_listen(dcu_host: DoctorHost):
    servers = dcu_host.with_instances()
    unit = dcu_host.etc / "systemd" / "system" / "vllm@.service"
    unit.write_text(unit.read_text().replace("--host 127.0.0.1", "--host 127.0.0.2"))
    rc, findings = dcu_host.findings()
    assert rc == 1
    assert [f["message"] for f in of(findings, "ports", "fail")] == [
        f"vllm@{index} (MiniCPM-V-4.5): nothing answers on 127.0.0.2:{server.port} (Connection refused)"
        for index, server in enumerate(servers)]


# --- the host around the cards (docs/field-evidence.md, section 8) ----------------------------------------


def test_a_blacklisted_driver_without_the_boot_unit_will_not_come_back_after_a_reboot(dcu_host: DoctorHost):
    modprobe = dcu_host.etc / "modprobe.d"
    modprobe.mkdir()
    (modprobe / "hycu.conf").write_text("options hycu hygon_vbios=0\n")
    (modprobe / "blacklist-hycu.conf").write_text("blacklist hycu\n")
    rc, findings = dcu_host.findings()
    assert rc == 1
    [found] = of(findings, "boot", "fail")
    assert f"hycu is blacklisted in {modprobe}/blacklist-hycu.conf" in found["message"]
    assert "will not come back after a reboot" in found["message"]
    assert "hy-smi --loaddriver" in found["fix"] and "playbooks/drivers.yml" in found["fix"]
    units = dcu_host.etc / "systemd" / "system"
    (units / "multi-user.target.wants").mkdir(parents=True)
    (units / "dcu-driver.service").write_text("[Service]\nExecStart=/opt/hyhal/bin/hy-smi --loaddriver\n")
    (units / "multi-user.target.wants" / "dcu-driver.service").symlink_to("../dcu-driver.service")
    _rc, findings = dcu_host.findings()
    [boot] = of(findings, "boot")
    assert boot["status"] == "ok" and "dcu-driver.service loads it" in boot["message"]


def test_an_engine_older_than_a_units_flag_or_than_supported_fails_naming_both(dcu_host: DoctorHost):
    dcu_host.with_instances()
    unit = dcu_host.etc / "systemd" / "system" / "vllm@.service"
    unit.write_text("# --pull=never only from Docker 20.10 on (a comment names it: not a flag)\n"
                    + unit.read_text().replace("docker run --rm", "docker run --rm --pull=never"))
    dcu_host.stubs["engine"] = "18.09.0"
    dcu_host.save()
    _rc, findings = dcu_host.findings()
    [found] = of(findings, "engine", "fail")
    assert found["message"] == ("docker 18.09.0 does not know --pull, which vllm@.service pass: their containers "
                                "cannot start")
    dcu_host.stubs["engine"] = "1.13.1"
    dcu_host.save()
    _rc, findings = dcu_host.findings()
    [found] = of(findings, "engine", "fail")
    assert "docker 1.13.1 is older than the oldest engine supported (18.09)" in found["message"]
    assert "docker-engine 18.09" in found["fix"]
    unit.write_text(unit.read_text().replace(" --pull=never", ""))
    dcu_host.stubs["engine"] = "18.09.0"
    dcu_host.save()
    _rc, findings = dcu_host.findings()
    assert of(findings, "engine")[0]["message"] == "docker 18.09.0 runs vllm@.service"


def test_selinux_enforcing_with_unlabelled_mounts_fails_and_names_the_denials(dcu_host: DoctorHost):
    dcu_host.with_instances()
    (dcu_host.sysfs / "fs" / "selinux").mkdir(parents=True)
    (dcu_host.sysfs / "fs" / "selinux" / "enforce").write_text("1\n")
    (dcu_host.log / "audit").mkdir(parents=True)
    (dcu_host.log / "audit" / "audit.log").write_text(
        'type=AVC msg=audit(1764892800.123:77): avc:  denied  { read } for  pid=4242 comm="python3" '
        'name="lib" dev="dm-0" ino=0 scontext=system_u:system_r:container_t:s0:c1,c2 '
        'tcontext=unconfined_u:object_r:default_t:s0 tclass=dir permissive=0 path="/opt/hyhal"\n')
    rc, findings = dcu_host.findings()
    assert rc == 1
    unlabelled, denied = of(findings, "selinux", "fail")
    assert "SELinux is enforcing and vllm@.service mount host paths" in unlabelled["message"]
    assert "label=disable" in unlabelled["fix"]
    assert "1 SELinux denial(s) for containers" in denied["message"] and "/opt/hyhal" in denied["message"]
    unit = dcu_host.etc / "systemd" / "system" / "vllm@.service"
    unit.write_text(unit.read_text().replace("docker run --rm", "docker run --rm --security-opt=label=disable"))
    (dcu_host.log / "audit" / "audit.log").write_text("")
    rc, findings = dcu_host.findings()
    assert of(findings, "selinux")[0]["message"] == "SELinux is enforcing; the containers run with label=disable"


def test_tensor_parallel_over_pcie_warns_about_the_kernel_and_a_bw_host_needs_its_map_count(dcu_host: DoctorHost):
    dcu_host.with_instances(count=1)
    env = dcu_host.etc / "dcu-serving" / "vllm" / "0.env"
    env.write_text(env.read_text().replace("--max-num-seqs 4", "--max-num-seqs 4 --tensor-parallel-size 2"))
    (dcu_host.proc / "cmdline").write_text("BOOT_IMAGE=/vmlinuz-4.19.90 root=/dev/mapper/klas-root ro quiet\n")
    (dcu_host.proc / "sys" / "kernel").mkdir(parents=True)
    (dcu_host.proc / "sys" / "kernel" / "numa_balancing").write_text("1\n")
    rc, findings = dcu_host.findings()
    iommu, numa = of(findings, "kernel", "warn")
    assert "vllm@0 run tensor parallel over PCIe" in iommu["message"] and "iommu=pt" in iommu["fix"]
    assert "NUMA auto balancing is on" in numa["message"]
    (dcu_host.proc / "cmdline").write_text("BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro iommu=pt\n")
    (dcu_host.proc / "sys" / "kernel" / "numa_balancing").write_text("0\n")
    rc, findings = dcu_host.findings()
    assert [f["status"] for f in of(findings, "kernel")] == ["ok"]
    for card in dcu_host.sysfs.glob("bus/pci/devices/*"):
        if (card / "device").read_text().strip() == "0x6210":
            (card / "device").write_text("0x6430\n")  # BW1100
    (dcu_host.proc / "sys" / "vm").mkdir(parents=True)
    (dcu_host.proc / "sys" / "vm" / "max_map_count").write_text("65530\n")
    rc, findings = dcu_host.findings()
    assert rc == 1
    [found] = of(findings, "kernel", "fail")
    assert found["message"] == "vm.max_map_count is 65530 on a BW host; inference there needs 262144 or more"
    assert not of(findings, "kernel", "warn"), "BW1100 modules are OAM: no PCIe peer-to-peer to warn about"


def test_a_stopped_etcd_is_named_as_milvus_metadata_store(dcu_host: DoctorHost):
    units = dcu_host.etc / "systemd" / "system"
    units.mkdir(parents=True, exist_ok=True)
    for unit in ("dcu-etcd", "dcu-milvus"):
        (units / f"{unit}.service").write_text("[Service]\n")
        dcu_host.unit(unit, "active")
    dcu_host.unit("dcu-etcd", "inactive")
    rc, findings = dcu_host.findings()
    assert rc == 1
    [data] = of(findings, "data", "fail")
    assert data["message"] == "dcu-etcd is inactive (Milvus' metadata store: Milvus cannot serve without it)"
    assert "systemctl start dcu-etcd" in data["fix"]
    dcu_host.unit("dcu-etcd", "active")
    assert of(dcu_host.findings()[1], "data", "ok")[0]["message"] == "dcu-etcd, dcu-milvus active"
