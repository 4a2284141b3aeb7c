"""Role dcu_bundle's staging, worked out by filter plugins: where each artifact is and whether it is ready,
the directories it needs, what a staged copy holds that the bundle
no longer lists."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.dcu.serving.plugins.plugin_utils.bundle_stage import (
    bundle_debs_to_install,
    bundle_stage_dirs,
    bundle_staged,
    bundle_unlisted,
)

STAGE = "/var/lib/dcu-serving/bundle"
RUN = {"file": "driver/rock-6.3.30-V1.4.1a.run", "sha256": "a" * 64, "size": 10611}
IMAGE = {"file": "images/vllm-sim.tar", "sha256": "b" * 64, "size": 190513152}
WHEEL = {"file": "wheels/pyyaml-6.0.4.whl", "sha256": "c" * 64, "size": 828016}


def checks(*pairs):
    """bundle_artifact's loop results: [(artifact, verified)] -> results."""
    return [{"item": a, "verified": v, "status": "verified" if v else "missing", "changed": False} for a, v in pairs]


def test_staged_paths_and_readiness():
    results = checks((RUN, True), (IMAGE, False))
    assert bundle_staged(results, STAGE) == [
        {"artifact": RUN, "path": STAGE + "/driver/rock-6.3.30-V1.4.1a.run", "ready": True},
        {"artifact": IMAGE, "path": STAGE + "/images/vllm-sim.tar", "ready": True},  # copied by now
    ]
    # in check mode nothing was copied: a file the host lacked is not there to use
    assert [s["ready"] for s in bundle_staged(results, STAGE, check_mode=True)] == [True, False]
    assert bundle_staged([], STAGE) == []


def test_stage_dirs_the_directory_first_each_once():
    assert bundle_stage_dirs([RUN, IMAGE, dict(IMAGE, file="images/other.tar")], STAGE + "/") == [
        STAGE, STAGE + "/driver", STAGE + "/images"]
    assert bundle_stage_dirs([], STAGE) == [STAGE]
    assert bundle_stage_dirs([{"file": "top.bin"}], STAGE) == [STAGE]


def test_unlisted_files_go_and_chunks_of_listed_artifacts_stay():
    present = [
        STAGE + "/index.json", STAGE + "/SHA256SUMS",
        STAGE + "/driver/rock-6.3.30-V1.4.1a.run",
        STAGE + "/driver/rock-6.3.27-V1.2.5.run",  # the previous driver, no longer in the bundle
        STAGE + "/images/.hidden",
        STAGE + "/.parts/" + "b" * 64 + "/00000",  # an interrupted transfer of a listed image: resumes
        STAGE + "/.parts/" + "d" * 64 + "/00000",  # chunks of an image the bundle dropped
        STAGE + "/.parts/" + "d" * 64 + "/00001",
    ]
    assert bundle_unlisted(present, STAGE + "/", [RUN, IMAGE, WHEEL]) == [
        STAGE + "/.parts/" + "d" * 64,
        STAGE + "/driver/rock-6.3.27-V1.2.5.run",
        STAGE + "/images/.hidden",
    ]
    assert bundle_unlisted([], STAGE, [RUN]) == []


def test_unlisted_refuses_a_path_outside_the_stage_dir():
    with pytest.raises(AnsibleFilterError, match="not under"):
        bundle_unlisted(["/etc/passwd"], STAGE, [RUN])


def test_the_roles_check_the_index_format_with_the_verifiers_own_words():
    from ansible_collections.dcu.serving.plugins.module_utils.bundle_index import index_problem

    good = {"format": 1, "artifacts": [{"name": "rock", "kind": "driver", "version": "6.3", "file": "driver/r.run",
                                        "sha256": "0" * 64, "size": 1}]}
    assert index_problem(good, "/b/index.json") == ""
    assert index_problem({"format": 2, "artifacts": []}, "/b/index.json") == (
        '/b/index.json: expected {"format": 1, "artifacts": [...]}')
    bad = {"format": 1, "artifacts": [dict(good["artifacts"][0], kind="firmware")]}
    assert index_problem(bad, "/b/index.json").startswith("/b/index.json: artifacts[0].kind 'firmware' is not one of")
    escape = {"format": 1, "artifacts": [dict(good["artifacts"][0], file="driver/../../../etc/cron.d/x")]}
    assert index_problem(escape, "/b/index.json") == (
        "/b/index.json: artifacts[0].file 'driver/../../../etc/cron.d/x' is not a plain path (an empty, . or .. part)")


def test_debs_to_install_are_those_not_fully_installed_at_the_bundles_version():
    debs = [{"name": n, "version": v} for n, v in (("prometheus", "2.42.0+ds-5+deb12u1"), ("libjs-d3", "3.5.17-4"),
                                                    ("prometheus-alertmanager", "0.25.0-1+b4"), ("tzdata", "2025b"))]
    dpkg = ["prometheus 2.42.0+ds-5+deb12u1 ii ",  # installed at the bundle's version
            "libjs-d3 3.5.17-3 ii ",  # another version
            "prometheus-alertmanager 0.25.0-1+b4 rc ",  # removed, its configuration left
            ]  # tzdata: dpkg-query names it on stderr, not installed
    assert [d["name"] for d in bundle_debs_to_install(debs, dpkg)] == ["libjs-d3", "prometheus-alertmanager", "tzdata"]
    assert bundle_debs_to_install(debs[:1], dpkg) == []
