"""How dcu_proxy picks its runtime on the hosts DCU servers run, and what it installs from the wheelhouse."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.dcu.serving.plugins.plugin_utils import proxy_install as proxy

WHEELS_PY = "3.11"
REQUIRES = ">=3.11"


@pytest.mark.parametrize("host, version, runtime, why", [
    ("CentOS 7.6", "3.6.8", "container", "dcu-serving requires Python >=3.11"),
    ("Kylin V10 / openEuler 20.03", "3.7.9", "container", "requires Python >=3.11"),
    ("Ubuntu 20.04", "3.8.10", "container", "requires Python >=3.11"),
    ("Ubuntu 22.04", "3.10.12", "container", "requires Python >=3.11"),
    ("Debian 12", "3.11.2", "venv", "satisfies Requires-Python >=3.11"),
    ("Ubuntu 24.04", "3.12.3", "container", "the bundle's wheels are built for Python 3.11"),
])
def test_auto_runs_the_venv_only_where_the_hosts_python_can_run_the_bundles_wheels(host, version, runtime, why):
    result = proxy.proxy_runtime("auto", {"version": version, "venv": True}, REQUIRES, WHEELS_PY)
    assert result["runtime"] == runtime, host
    assert result["venv_possible"] is (runtime == "venv")
    assert why in result["reason"] and version in result["reason"]


def test_auto_takes_the_container_without_the_venv_module_or_without_python3():
    no_venv = proxy.proxy_runtime("auto", {"version": "3.11.2", "venv": False}, REQUIRES, WHEELS_PY)
    assert no_venv["runtime"] == "container" and "python3-venv" in no_venv["reason"]
    missing = proxy.proxy_runtime("auto", {"error": "python3: not found"}, REQUIRES, WHEELS_PY)
    assert missing["runtime"] == "container" and "python3: not found" in missing["reason"]


def test_an_explicit_runtime_is_kept_and_says_whether_the_venv_could_work():
    old = {"version": "3.6.8", "venv": True}
    assert proxy.proxy_runtime("venv", old, REQUIRES, WHEELS_PY) == {
        "runtime": "venv", "venv_possible": False,
        "reason": "the host's python3 is 3.6.8; dcu-serving requires Python >=3.11"}
    assert proxy.proxy_runtime("container", {"version": "3.11.4", "venv": True}, REQUIRES, WHEELS_PY)["runtime"] \
        == "container"


def test_no_requires_python_and_unknown_wheel_python_leave_only_the_interpreter_checks():
    assert proxy.proxy_runtime("auto", {"version": "3.9.2", "venv": True})["runtime"] == "venv"


def test_a_bundle_without_the_wheel_leaves_only_the_container():
    result = proxy.proxy_runtime("auto", {"version": "3.11.2", "venv": True}, wheel=False)
    assert result == {"runtime": "container", "venv_possible": False,
                      "reason": "the bundle holds no dcu-serving wheel"}


def test_requires_python_is_read_from_the_wheels_metadata(tmp_path):
    import base64

    path = _wheel(tmp_path, "dcu-serving", "0.1.0")
    assert proxy.wheel_requires_python(base64.b64encode(path.read_bytes()).decode()) is None
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("dcu_serving-0.1.0.dist-info/METADATA",
                   "Metadata-Version: 2.4\nName: dcu-serving\nVersion: 0.1.0\nRequires-Python: >=3.11\n")
    assert proxy.wheel_requires_python(base64.b64encode(path.read_bytes()).decode()) == ">=3.11"
    with pytest.raises(AnsibleFilterError, match="not a wheel"):
        proxy.wheel_requires_python(base64.b64encode(b"not a zip").decode())


def test_bad_values_are_errors_that_name_them():
    with pytest.raises(AnsibleFilterError, match="must be one of auto, venv, container"):
        proxy.proxy_runtime("host", {"version": "3.11.2", "venv": True})
    with pytest.raises(AnsibleFilterError, match="cannot compare Python"):
        proxy.proxy_runtime("auto", {"version": "3.11.2", "venv": True}, "~~3")


INDEX = [
    {"name": "aiohttp", "version": "3.14.5", "sha256": "a" * 64, "file": "wheels/aiohttp-3.14.5-cp311.whl"},
    {"name": "pyyaml", "version": "6.0.4", "sha256": "b" * 64, "file": "wheels/pyyaml-6.0.4-cp311.whl"},
    {"name": "typing-extensions", "version": "4.16.0", "sha256": "c" * 64, "file": "wheels/t.whl"},
    {"name": "pillow", "version": "13.0.0", "sha256": "d" * 64, "file": "wheels/pillow.whl"},
    {"name": "dcu-serving", "version": "0.1.0", "sha256": "e" * 64, "file": "wheels/dcu_serving-0.1.0.whl"},
]


def _report(*packages):
    return {"version": "1", "install": [{"metadata": {"name": n, "version": v},
                                         "download_info": {"url": f"file:///w/{n}-{v}.whl"}} for n, v in packages]}


def test_requirements_are_what_pip_resolved_pinned_to_the_sums_of_index_json():
    report = _report(("dcu-serving", "0.1.0"), ("PyYAML", "6.0.4"), ("aiohttp", "3.14.5"),
                     ("typing_extensions", "4.16.0"))
    assert proxy.proxy_requirements(json.dumps(report), INDEX) == [
        "aiohttp==3.14.5 --hash=sha256:" + "a" * 64,
        "dcu-serving==0.1.0 --hash=sha256:" + "e" * 64,
        "pyyaml==6.0.4 --hash=sha256:" + "b" * 64,
        "typing-extensions==4.16.0 --hash=sha256:" + "c" * 64,
    ]  # pillow is in the bundle, not in what the proxy needs


def test_a_resolved_package_that_index_json_does_not_list_is_refused():
    with pytest.raises(AnsibleFilterError, match=r"pip resolved aiohttp 3\.9\.0, stray 1\.0 .*not list"):
        proxy.proxy_requirements(_report(("aiohttp", "3.9.0"), ("stray", "1.0")), INDEX)
    with pytest.raises(AnsibleFilterError, match="resolved nothing"):
        proxy.proxy_requirements({"install": []}, INDEX)
    with pytest.raises(AnsibleFilterError, match="not JSON"):
        proxy.proxy_requirements("pip: error", INDEX)


def test_two_files_of_one_version_are_told_apart_by_the_file_pip_chose():
    index = [{"name": "uvloop", "version": "0.23.0", "sha256": "1" * 64, "file": "wheels/uvloop-a.whl"},
             {"name": "uvloop", "version": "0.23.0", "sha256": "2" * 64, "file": "wheels/uvloop-b.whl"}]
    report = {"install": [{"metadata": {"name": "uvloop", "version": "0.23.0"},
                           "download_info": {"url": "file:///stage/wheels/uvloop-b.whl"}}]}
    assert proxy.proxy_requirements(report, index) == ["uvloop==0.23.0 --hash=sha256:" + "2" * 64]


def _wheel(directory, name, version, requires=(), extras=None):
    """A minimal installable wheel (metadata only)."""
    dist = f"{name.replace('-', '_')}-{version}"
    path = directory / f"{dist}-py3-none-any.whl"
    meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    meta += [f"Requires-Dist: {r}" for r in requires]
    for extra, deps in (extras or {}).items():
        meta.append(f"Provides-Extra: {extra}")
        meta += [f"Requires-Dist: {d}; extra == \"{extra}\"" for d in deps]
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{dist}.dist-info/METADATA", "\n".join(meta) + "\n")
        z.writestr(f"{dist}.dist-info/WHEEL",
                   "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{dist}.dist-info/RECORD", "")
    return path


def test_pips_offline_report_of_an_extra_gives_exactly_its_dependencies(tmp_path):
    """The role's resolution step for real: pip --dry-run --report against --no-index --find-links."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    files = [_wheel(wheels, "app", "1.0", ["base-dep"], {"proxy": ["proxy-dep"], "sim": ["sim-dep"]}),
             _wheel(wheels, "base-dep", "2.0"), _wheel(wheels, "proxy-dep", "3.0"), _wheel(wheels, "sim-dep", "4.0")]
    out = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--no-index",
                          "--ignore-installed", "--find-links", str(wheels), "--report", "-", "app[proxy]==1.0"],
                         capture_output=True, text=True, check=True).stdout
    index = [{"name": f.name.split("-")[0].replace("_", "-"), "version": f.name.split("-")[1], "sha256": "f" * 64,
              "file": "wheels/" + f.name} for f in files]
    assert [line.split(" ")[0] for line in proxy.proxy_requirements(out, index)] == [
        "app==1.0", "base-dep==2.0", "proxy-dep==3.0"]


# --- where a bundle's venv is built: never over the venv a service runs from ----------------------------------

DIGEST = "3f2a9c1b07de" + "5" * 52


def test_a_bundles_venv_is_built_beside_the_running_one_and_the_running_one_is_kept_when_it_is_that_bundles():
    assert proxy.venv_build_dir("/opt/dcu-serving/venv", DIGEST, current="venv-0a1b2c3d4e5f") == \
        "/opt/dcu-serving/venv-3f2a9c1b07de"
    assert proxy.venv_build_dir("/opt/dcu-serving/venv", DIGEST) == "/opt/dcu-serving/venv-3f2a9c1b07de"
    # a -2 built after an unreadable marker, with its marker now: nothing to build, nothing to switch
    assert proxy.venv_build_dir("/opt/dcu-serving/venv", DIGEST, current="venv-3f2a9c1b07de-2",
                                current_digest=DIGEST + "\n") == "/opt/dcu-serving/venv-3f2a9c1b07de-2"


def test_a_running_venv_whose_marker_cannot_be_read_is_never_the_build_directory():
    """The link names this bundle's venv but its marker is gone or unreadable: building there would begin by
    removing the venv the service runs from. The build goes beside it."""
    for marker in (None, "", "garbage"):
        assert proxy.venv_build_dir("/opt/dcu-serving/venv", DIGEST, current="venv-3f2a9c1b07de",
                                    current_digest=marker) == "/opt/dcu-serving/venv-3f2a9c1b07de-2"
    # ... nor the previous venv when it is not this bundle's (a service not restarted yet runs from it): then -3
    assert proxy.venv_build_dir("/opt/dcu-serving/venv/", DIGEST, current="venv-3f2a9c1b07de-2",
                                previous="/opt/dcu-serving/venv-3f2a9c1b07de") == "/opt/dcu-serving/venv-3f2a9c1b07de-3"


def test_a_switch_back_to_the_previous_bundle_reuses_its_venv():
    """The previous venv is this bundle's (a rollback to the bundle before): switched back to, not built again."""
    assert proxy.venv_build_dir("/opt/dcu-serving/venv", DIGEST, current="venv-0a1b2c3d4e5f", current_digest="0" * 64,
                                previous="venv-3f2a9c1b07de", previous_digest=DIGEST) == \
        "/opt/dcu-serving/venv-3f2a9c1b07de"
