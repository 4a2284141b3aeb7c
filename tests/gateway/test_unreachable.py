"""Unreachable hosts (dcu_serving.gateway.unreachable): which failures mean the host's proxy is not listening, and
how long such a host stays out of routing. Plain Python: no LiteLLM needed (test_gateway.py runs it for real)."""

from __future__ import annotations

import socket

import pytest

from dcu_serving.gateway.unreachable import Unreachable, connect_failed
from support import free_port


class InternalServerError(Exception):  # LiteLLM's wrapper: the class says 500 whatever the cause
    pass


class ClientConnectorError(OSError):  # aiohttp's name for a connect that failed
    pass


def wrapped(cause: BaseException) -> InternalServerError:
    """An exception raised while handling `cause`, as LiteLLM raises its 500 from the transport's error."""
    try:
        try:
            raise cause
        except BaseException as e:
            raise InternalServerError("Connection error.") from e
    except InternalServerError as outer:
        return outer


def test_a_refused_connection_under_litellms_500_is_a_connect_that_failed():
    port = free_port()  # nothing listens there
    with pytest.raises(ConnectionRefusedError) as refused:
        socket.create_connection(("127.0.0.1", port), timeout=5)
    assert connect_failed(wrapped(refused.value))
    assert connect_failed(wrapped(ClientConnectorError("Cannot connect to host 127.0.0.1:8000")))


@pytest.mark.parametrize("cause", [TimeoutError("read timed out"), ConnectionResetError("reset by peer"),
                                   ValueError("bad answer")])
def test_a_failure_after_the_connection_was_made_is_not(cause):
    # The request may have reached a card: the host stays in routing (LiteLLM's own allowed_fails apply).
    assert not connect_failed(wrapped(cause))
    assert not connect_failed(None)


def test_a_marked_host_is_left_out_for_the_hold_then_tried_again():
    now = [100.0]
    unreachable = Unreachable(hold=30, clock=lambda: now[0])
    unreachable.mark("node-a")
    assert unreachable.hosts() == {"node-a"}
    now[0] += 29.9
    assert unreachable.hosts() == {"node-a"}
    now[0] += 0.2
    assert unreachable.hosts() == frozenset()
    unreachable.mark("node-a")  # refused again: out for another hold
    now[0] += 10
    assert unreachable.hosts() == {"node-a"}


def test_the_hold_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("DCU_GATEWAY_UNREACHABLE_HOLD", "12")
    assert Unreachable().hold == 12.0
    monkeypatch.delenv("DCU_GATEWAY_UNREACHABLE_HOLD")
    assert Unreachable().hold == 30.0
