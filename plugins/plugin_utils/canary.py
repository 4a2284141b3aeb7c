# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""How a canary's soak judges its answers (role dcu_vllm, tasks/soak.yml): from dcu-proxy's /__lb_status read when
the canary joined and now, each backend's answers (`served`) and its answers with status >= 500 (`errors`)."""


def _totals(backends, urls):
    served = errors = 0
    for backend in backends or []:
        if backend.get("url") in urls:
            served += int(backend.get("served") or 0)
            errors += int(backend.get("errors") or 0)
    return served, errors


def canary_error_problem(now, start, canary_url, max_ratio, min_requests):
    """Why the canary's errors fail its soak, or '' when they do not: its answers with status >= 500 since it joined,
    over what it answered (at least `min_requests`, so that the first unlucky answer of a few fails nothing), above
    `max_ratio` - and above the other instances' own ratio over the same time (an error every card answers, such as a
    caller's request no model can serve, is not the change's doing). `now` and `start` are /__lb_status' backends."""
    others = {b.get("url") for b in start or []} & {b.get("url") for b in now or []} - {canary_url}
    served_now, errors_now = _totals(now, {canary_url})
    served_then, errors_then = _totals(start, {canary_url})
    answered, errors = served_now - served_then, errors_now - errors_then
    if errors <= 0 or errors / max(answered, int(min_requests), 1) <= float(max_ratio):
        return ""
    others_now, others_errors_now = _totals(now, others)
    others_then, others_errors_then = _totals(start, others)
    other_answered, other_errors = others_now - others_then, others_errors_now - others_errors_then
    ratio = errors / max(answered, 1)
    other_ratio = other_errors / other_answered if other_answered > 0 else 0.0
    if ratio <= other_ratio:
        return ""
    return ("it answered {} of its {} requests with status >= 500 ({:.0%}), against {} of {} ({:.0%}) on the other "
            "instances meanwhile; the limit is {:.0%} (dcu_vllm_canary_error_ratio, judged over at least {} "
            "requests: dcu_vllm_canary_min_requests)".format(errors, answered, ratio, other_errors, other_answered,
                                                             other_ratio, float(max_ratio), int(min_requests)))
