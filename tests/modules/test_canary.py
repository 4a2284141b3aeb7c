"""How a canary's soak judges its answers (plugin_utils/canary.py): dcu-proxy's per-backend counts of answers and of
answers with status >= 500, read when the canary joined and now."""

from __future__ import annotations

from ansible_collections.dcu.serving.plugins.plugin_utils.canary import canary_error_problem

CANARY, OTHER, THIRD = "http://127.0.0.1:8002", "http://127.0.0.1:8003", "http://127.0.0.1:8004"


def backends(canary: tuple, other: tuple = (0, 0), third: tuple = (0, 0)) -> list[dict]:
    """/__lb_status' backends, each (served, errors)."""
    return [{"url": url, "served": served, "errors": errors, "healthy": True}
            for url, (served, errors) in ((CANARY, canary), (OTHER, other), (THIRD, third))]


START = backends((100, 3), (500, 1), (400, 0))


def test_a_canary_answering_one_in_ten_with_a_500_fails_once_two_errors_are_in():
    assert canary_error_problem(backends((110, 4), (560, 1), (450, 0)), START, CANARY, 0.05, 20) == ""  # 1 of 10
    problem = canary_error_problem(backends((120, 5), (620, 1), (500, 0)), START, CANARY, 0.05, 20)
    assert problem == ("it answered 2 of its 20 requests with status >= 500 (10%), against 0 of 220 (0%) on the other "
                       "instances meanwhile; the limit is 5% (dcu_vllm_canary_error_ratio, judged over at least 20 "
                       "requests: dcu_vllm_canary_min_requests)")


def test_one_unlucky_answer_among_the_first_few_fails_nothing():
    assert canary_error_problem(backends((102, 4), (510, 1), (410, 0)), START, CANARY, 0.05, 20) == ""  # 1 of 2


def test_errors_every_instance_answers_are_not_the_changes_doing():
    """A caller sending what no model can serve: every card answers 10 % with a 500."""
    now = backends((200, 13), (600, 11), (500, 10))
    assert canary_error_problem(now, START, CANARY, 0.05, 20) == ""


def test_a_proxy_that_counts_no_errors_and_a_canary_it_no_longer_lists_fail_nothing_here():
    """Older dcu-proxy answers without `errors`; a canary gone from the list fails the soak's other checks."""
    old = [{k: v for k, v in b.items() if k != "errors"} for b in START]
    assert canary_error_problem(old, old, CANARY, 0.05, 20) == ""
    assert canary_error_problem(backends((0, 0))[1:], START, CANARY, 0.05, 20) == ""
