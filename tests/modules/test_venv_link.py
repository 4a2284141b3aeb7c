"""dcu.serving.venv_link: a service's venv path switched to a venv built beside it, the previous one kept."""

from __future__ import annotations

import os


def _venv(parent, name):
    (parent / name / "bin").mkdir(parents=True)
    (parent / name / "pyvenv.cfg").write_text("home = /usr/bin\n")
    return str(parent / name)


def test_a_first_switch_makes_the_link_and_a_second_changes_nothing(tmp_path, module_runner):
    new = _venv(tmp_path, "venv-aaa")
    first = module_runner("venv_link", {"path": str(tmp_path / "venv"), "target": new})
    assert first["changed"] is True and first["previous"] is None, first
    assert os.readlink(tmp_path / "venv") == "venv-aaa"
    second = module_runner("venv_link", {"path": str(tmp_path / "venv"), "target": new})
    assert second["changed"] is False, second


def test_a_switch_keeps_the_previous_venv_and_removes_older_ones(tmp_path, module_runner):
    module_runner("venv_link", {"path": str(tmp_path / "venv"), "target": _venv(tmp_path, "venv-aaa")})
    _venv(tmp_path, "venv-old")  # left by a build that was never switched to
    _venv(tmp_path, "venv-bbb")
    (tmp_path / "venv-notes").mkdir()  # not a venv: left alone
    result = module_runner("venv_link", {"path": str(tmp_path / "venv"), "target": str(tmp_path / "venv-bbb"),
                                         "_ansible_diff": True})
    assert result["previous"] == "venv-aaa"
    assert result["removed"] == [str(tmp_path / "venv-old")]
    assert os.readlink(tmp_path / "venv") == "venv-bbb"
    assert os.readlink(tmp_path / "venv.previous") == "venv-aaa"
    left = sorted(p.name for p in tmp_path.glob("venv*") if p.suffix != ".json")
    assert left == ["venv", "venv-aaa", "venv-bbb", "venv-notes", "venv.previous"]
    assert "-> venv-aaa" in result["diff"]["before"] and "-> venv-bbb" in result["diff"]["after"]


def test_a_venv_built_in_place_is_moved_aside_and_kept(tmp_path, module_runner):
    _venv(tmp_path, "venv")
    new = _venv(tmp_path, "venv-aaa")
    result = module_runner("venv_link", {"path": str(tmp_path / "venv"), "target": new})
    assert result["previous"] == "venv-legacy"
    assert os.readlink(tmp_path / "venv") == "venv-aaa"
    assert os.readlink(tmp_path / "venv.previous") == "venv-legacy"
    assert (tmp_path / "venv-legacy" / "pyvenv.cfg").is_file()


def test_check_mode_says_what_would_move_and_moves_nothing(tmp_path, module_runner):
    _venv(tmp_path, "venv-aaa")
    module_runner("venv_link", {"path": str(tmp_path / "venv"), "target": str(tmp_path / "venv-aaa")})
    result = module_runner("venv_link", {"path": str(tmp_path / "venv"), "target": str(tmp_path / "venv-bbb"),
                                         "_ansible_check_mode": True})
    assert result["changed"] is True and result["previous"] == "venv-aaa"
    assert os.readlink(tmp_path / "venv") == "venv-aaa"


def test_check_mode_on_a_new_host_says_it_would_make_the_link(tmp_path, module_runner):
    opt = tmp_path / "opt"  # the venv's parent does not exist yet
    result = module_runner("venv_link", {"path": str(opt / "venv"), "target": str(opt / "venv-aaa"),
                                         "_ansible_check_mode": True})
    assert result["changed"] is True and result["previous"] is None and result["removed"] == []
    assert not (tmp_path / "opt").exists()


def test_an_unfinished_build_is_refused_and_the_running_venv_stays(tmp_path, module_runner):
    _venv(tmp_path, "venv-aaa")
    module_runner("venv_link", {"path": str(tmp_path / "venv"), "target": str(tmp_path / "venv-aaa")})
    (tmp_path / "venv-bbb").mkdir()  # a build that stopped before `python -m venv` finished
    result = module_runner("venv_link", {"path": str(tmp_path / "venv"), "target": str(tmp_path / "venv-bbb")})
    assert result["failed"] is True and "not a complete venv" in result["msg"]
    assert os.readlink(tmp_path / "venv") == "venv-aaa"


def test_a_target_elsewhere_is_refused_with_the_expected_name(tmp_path, module_runner):
    other = _venv(tmp_path / "elsewhere", "venv-aaa")
    result = module_runner("venv_link", {"path": str(tmp_path / "venv"), "target": other})
    assert result["failed"] is True and "must be beside path" in result["msg"]


def test_switching_away_from_a_legacy_venv_put_back_by_hand_keeps_it(tmp_path, module_runner):
    _venv(tmp_path, "venv")
    module_runner("venv_link", {"path": str(tmp_path / "venv"), "target": _venv(tmp_path, "venv-aaa")})
    os.unlink(tmp_path / "venv")
    os.symlink("venv-legacy", tmp_path / "venv")  # the README's rollback, by hand
    result = module_runner("venv_link", {"path": str(tmp_path / "venv"), "target": str(tmp_path / "venv-aaa")})
    assert result["changed"] is True and result["previous"] == "venv-legacy", result
    assert os.readlink(tmp_path / "venv") == "venv-aaa"
    assert (tmp_path / "venv-legacy" / "pyvenv.cfg").is_file()


def test_a_switch_before_the_restart_removes_nothing_and_the_call_after_it_removes_what_nothing_runs_from(
        tmp_path, module_runner):
    """An earlier run switched to venv-bbb and failed before the service restarted: it still runs from venv-aaa
    (now the previous one's previous). The next switch, before its restart, must not remove venv-aaa; the call
    after the restart does, and keeps the previous one for a rollback."""
    path = str(tmp_path / "venv")
    module_runner("venv_link", {"path": path, "target": _venv(tmp_path, "venv-aaa")})
    module_runner("venv_link", {"path": path, "target": _venv(tmp_path, "venv-bbb"), "remove_older": False})
    switched = module_runner("venv_link", {"path": path, "target": _venv(tmp_path, "venv-ccc"),
                                           "remove_older": False})
    assert switched["changed"] is True and switched["removed"] == [], switched
    assert (tmp_path / "venv-aaa" / "pyvenv.cfg").is_file()
    assert os.readlink(tmp_path / "venv") == "venv-ccc" and os.readlink(tmp_path / "venv.previous") == "venv-bbb"

    # the service restarted onto venv-ccc
    pruned = module_runner("venv_link", {"path": path, "target": str(tmp_path / "venv-ccc")})
    assert pruned["changed"] is True and pruned["removed"] == [str(tmp_path / "venv-aaa")], pruned
    assert sorted(p.name for p in tmp_path.glob("venv-*") if p.is_dir()) == ["venv-bbb", "venv-ccc"]
    again = module_runner("venv_link", {"path": path, "target": str(tmp_path / "venv-ccc")})
    assert again["changed"] is False and again["removed"] == [], again
