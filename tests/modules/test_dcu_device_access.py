"""dcu_device_access: a real privilege drop (needs root) against nodes in a temporary /dev tree.

Regular files stand in for the character devices: opening read-write goes through the same permission
check. The tree lives in a world-traversable directory so only the nodes' own modes decide.
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="dropping privileges to another user needs root")

OUTSIDER = "nobody"


@pytest.fixture
def dev_root():
    path = Path(tempfile.mkdtemp(prefix="dcu-dev-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def _node(path: Path, group: str, mode: int = 0o660):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.parent.chmod(0o755)
    path.touch()
    os.chown(path, 0, grp.getgrnam(group).gr_gid)
    path.chmod(mode)


def _devices(dev_root: Path, group: str, cards: int = 2, mode: int = 0o660, mkfd: bool = True):
    _node(dev_root / "kfd", group, mode)
    if mkfd:
        _node(dev_root / "mkfd", group, mode)
    for i in range(cards):
        _node(dev_root / "dri" / f"renderD{128 + i}", group, mode)


def _group_of(user: str) -> str:
    return grp.getgrgid(pwd.getpwnam(user).pw_gid).gr_name


def test_user_whose_primary_group_owns_the_nodes_passes(fake_sysfs, dev_root, module_runner):
    _devices(dev_root, _group_of(OUTSIDER))
    result = module_runner("dcu_device_access", {
        "user": OUTSIDER, "sysfs_root": str(fake_sysfs(cards=2)), "dev_root": str(dev_root)})
    assert not result.get("failed"), result.get("msg", result)
    assert [n["path"] for n in result["nodes"]] == [
        f"{dev_root}/kfd", f"{dev_root}/mkfd", f"{dev_root}/dri/renderD128", f"{dev_root}/dri/renderD129"]
    assert {n["result"] for n in result["nodes"]} == {"ok"}
    assert result["nodes"][0]["mode"] == "0660" and result["nodes"][0]["owner"] == "root"


def test_outsider_gets_the_group_diagnosis_and_fix(fake_sysfs, dev_root, module_runner):
    _devices(dev_root, "video")
    result = module_runner("dcu_device_access", {
        "user": OUTSIDER, "sysfs_root": str(fake_sysfs(cards=2)), "dev_root": str(dev_root)})
    assert result["failed"] is True
    assert f"user {OUTSIDER} is not in group video" in result["msg"]
    assert f"usermod -aG video {OUTSIDER}" in result["msg"]
    assert {n["result"] for n in result["nodes"]} == {"permission denied"}
    assert result["nodes"][0]["group"] == "video"


def test_group_member_denied_by_mode_is_told_about_the_mode(fake_sysfs, dev_root, module_runner):
    _devices(dev_root, _group_of(OUTSIDER), mode=0o600)
    result = module_runner("dcu_device_access", {
        "user": OUTSIDER, "sysfs_root": str(fake_sysfs(cards=2)), "dev_root": str(dev_root)})
    assert result["failed"] is True
    assert "mode 0600" in result["msg"] and 'MODE="0660"' in result["msg"]


def test_missing_kfd_means_driver_not_loaded(fake_sysfs, dev_root, module_runner):
    _devices(dev_root, _group_of(OUTSIDER))
    (dev_root / "kfd").unlink()
    (dev_root / "mkfd").unlink()
    result = module_runner("dcu_device_access", {
        "user": OUTSIDER, "sysfs_root": str(fake_sysfs(cards=2)), "dev_root": str(dev_root)})
    assert result["failed"] is True
    assert f"{dev_root}/kfd is missing: the DCU driver is not loaded" in result["msg"]
    assert "hy-smi --loaddriver" in result["msg"]
    # mkfd is optional: only checked when present.
    assert [n["path"] for n in result["nodes"]][0:2] == [f"{dev_root}/kfd", f"{dev_root}/dri/renderD128"]


def test_fewer_render_nodes_than_cards_names_the_missing(fake_sysfs, dev_root, module_runner):
    _devices(dev_root, _group_of(OUTSIDER), cards=8)
    (dev_root / "dri" / "renderD133").unlink()
    root = fake_sysfs(cards=8, render_missing=(7,))
    result = module_runner("dcu_device_access", {
        "user": OUTSIDER, "sysfs_root": str(root), "dev_root": str(dev_root), "expected_cards": 8})
    assert result["failed"] is True
    assert "card 7 (0000:8c:00.0) has no render node" in result["msg"]
    assert f"{dev_root}/dri/renderD133 is missing" in result["msg"]
    assert "expected 8 cards but only 6 render nodes are present" in result["msg"]


def test_unknown_user(fake_sysfs, dev_root, module_runner):
    result = module_runner("dcu_device_access", {"user": "no-such-user-dcu", "dev_root": str(dev_root)})
    assert result["failed"] is True and "user no-such-user-dcu does not exist" in result["msg"]


def test_explicit_render_nodes(fake_sysfs, dev_root, module_runner):
    _devices(dev_root, _group_of(OUTSIDER), cards=2)
    result = module_runner("dcu_device_access", {
        "user": OUTSIDER, "sysfs_root": str(fake_sysfs(cards=8)), "dev_root": str(dev_root),
        "render_nodes": [str(dev_root / "dri" / "renderD129")]})
    assert not result.get("failed"), result
    assert [n["path"] for n in result["nodes"]][-1] == f"{dev_root}/dri/renderD129"
    assert len(result["nodes"]) == 3


def test_a_bw_host_whose_driver_binds_its_switch_endpoints_passes_with_its_8_cards(fake_sysfs, dev_root,
                                                                                    module_runner):
    # The a110 endpoints bound to hycu without DRM nodes are not cards (field evidence P8): 8 of 8.
    _devices(dev_root, _group_of(OUTSIDER), cards=8)
    root = fake_sysfs(cards=8, module=("hycu", "6.3.30-V1.4.1a"), platform=True, switches_bound=True)
    result = module_runner("dcu_device_access", {
        "user": OUTSIDER, "sysfs_root": str(root), "dev_root": str(dev_root), "expected_cards": 8})
    assert not result.get("failed"), result.get("msg", result)
    assert len([n for n in result["nodes"] if "renderD" in n["path"]]) == 8


def test_a_card_bound_without_drm_nodes_is_named_with_its_driver(fake_sysfs, dev_root, module_runner):
    _devices(dev_root, _group_of(OUTSIDER), cards=2)
    root = fake_sysfs(cards=2, module=("hycu", "6.3.30-V1.4.1a"), drm=False)
    result = module_runner("dcu_device_access", {
        "user": OUTSIDER, "sysfs_root": str(root), "dev_root": str(dev_root), "expected_cards": 2})
    assert result["failed"] is True
    assert "cards without DRM nodes: 0000:04:00.0 (0x6210 K100_AI): driver hycu, no DRM nodes" in result["msg"]
