"""The fresh node was never converged: check mode, a corrupted bundle and a missing prerequisite.

Each case must stop before touching the host, so the node stays fresh for the next one — but the last,
which converges it with a standalone hyhal in the bundle.
"""

from __future__ import annotations

import hashlib
import json
import shutil

testinfra_hosts = ["fresh"]
INSTALLER = "driver/rock-6.3.30-V1.4.1a.run"


def _untouched(host):
    assert not host.package("rock").is_installed
    assert not host.file("/opt/dtk").exists
    assert not host.file("/var/lib/dcu-serving/bundle").exists
    assert not host.file("/etc/udev/rules.d/70-dcu.rules").exists


def test_check_mode_reports_changes_and_makes_none(host, run_drivers, recap):
    rc, out = run_drivers("fresh", "--check", "--diff")
    assert rc == 0, out[-3000:]
    assert recap(out, "fresh")["changed"] > 0
    assert "Would run driver/rock-6.3.30-V1.4.1a.run to install rock 6.3.30-V1.4.1a" in out
    assert '+KERNEL=="kfd", GROUP="render", MODE="0660"' in out  # --diff shows the udev rules
    _untouched(host)


def test_corrupted_installer_fails_with_file_expected_and_actual(host, run_drivers, bundle_dir, bundle_index,
                                                                tmp_path):
    bundle = tmp_path / "bundle"
    shutil.copytree(bundle_dir, bundle, ignore=shutil.ignore_patterns("images", "wheels", "collections"))
    installer = bundle / INSTALLER
    data = bytearray(installer.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, one byte flipped
    installer.write_bytes(bytes(data))
    expected = next(a["sha256"] for a in bundle_index["artifacts"] if a["file"] == INSTALLER)
    actual = hashlib.sha256(data).hexdigest()

    rc, out = run_drivers("fresh", extra_vars={"dcu_bundle_dir": str(bundle)})
    assert rc != 0
    assert f"checksum mismatch for {INSTALLER}: expected sha256 {expected}, actual {actual}" in out
    _untouched(host)


def test_corrupted_installer_staged_on_the_host_fails_too(host, run_drivers, bundle_dir, bundle_index, tmp_path):
    """dcu_driver_bundle_source: host reads index.json on the host and verifies the files in place."""
    bundle = tmp_path / "staged"
    for name in ("index.json", INSTALLER, next(a["file"] for a in bundle_index["artifacts"] if a["kind"] == "dtk")):
        (bundle / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(bundle_dir / name, bundle / name)
    (bundle / INSTALLER).write_bytes((bundle / INSTALLER).read_bytes() + b"# appended\n")
    host.ansible("ansible.builtin.copy", f"src={bundle}/ dest=/srv/dcu-bundle/", check=False, become=True)

    rc, out = run_drivers("fresh", extra_vars={"dcu_driver_bundle_source": "host",
                                               "dcu_driver_bundle_dir": "/srv/dcu-bundle"})
    assert rc != 0
    assert f"checksum mismatch for {INSTALLER}: expected sha256" in out
    assert "(/srv/dcu-bundle/driver/rock-6.3.30-V1.4.1a.run)" in out
    _untouched(host)


def test_missing_prerequisites_are_listed_by_package(host, run_drivers):
    kernel = host.check_output("uname -r")
    host.run_expect([0], "dpkg --remove --force-depends cmake")
    host.run_expect([0], f"mv /lib/modules/{kernel}/build/Makefile /lib/modules/{kernel}/build/Makefile.away")
    rc, out = run_drivers("fresh")
    assert rc != 0
    assert f"The rock driver build needs packages this host lacks: cmake linux-headers-{kernel}." in out
    _untouched(host)


def test_a_standalone_hyhal_in_the_bundle_goes_over_the_drivers(host, run_drivers, recap, bundle_dir, tmp_path):
    """Last: it converges the node. The prerequisite check stays off (the case above removed cmake)."""
    kernel = host.check_output("uname -r")
    host.run_expect([0], f"mv /lib/modules/{kernel}/build/Makefile.away /lib/modules/{kernel}/build/Makefile")
    bundle = tmp_path / "bundle"
    shutil.copytree(bundle_dir, bundle, ignore=shutil.ignore_patterns("images", "wheels", "collections"))
    tarball = bundle_dir.parent / "vendor" / "hyhal" / "hyhal-2.4.1-x86_64.tar.gz"  # tools/build-vendor-artifacts
    (bundle / "hyhal").mkdir()
    shutil.copy(tarball, bundle / "hyhal" / tarball.name)
    digest = hashlib.sha256(tarball.read_bytes()).hexdigest()
    index = json.loads((bundle / "index.json").read_text())
    index["artifacts"].append({"name": "hyhal", "kind": "hyhal", "version": "2.4.1", "file": f"hyhal/{tarball.name}",
                               "sha256": digest, "size": tarball.stat().st_size})
    (bundle / "index.json").write_text(json.dumps(index))
    settings = {"dcu_bundle_dir": str(bundle), "dcu_driver_check_prerequisites": False}

    rc, out = run_drivers("fresh", extra_vars=settings)
    assert rc == 0, out[-3000:]
    assert host.file("/opt/hyhal/.info/version").content_string.strip() == "2.4.1"
    assert host.file("/opt/hyhal/.dcu-serving-hyhal").content_string.split() == [
        f"hyhal/{tarball.name}", f"sha256:{digest}", "over", "rock", "6.3.30-V1.4.1a"]
    assert "HCU" in host.check_output("/opt/hyhal/bin/hy-smi")
    # The tarball's files are its build user's (uid 1000): unpacked, they are root's.
    assert host.check_output("find /opt/hyhal/ ! -user root -o ! -group root") == ""

    rc, out = run_drivers("fresh", extra_vars=settings)
    assert rc == 0 and recap(out, "fresh")["changed"] == 0, out[-3000:]
