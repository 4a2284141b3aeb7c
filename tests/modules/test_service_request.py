"""service_request: the real request an upgrade's canary must answer before callers reach it."""

from __future__ import annotations

import pytest

from support import FAST_SIM

MODEL = "MiniCPM-V-4.5"


@pytest.mark.parametrize("kind", ["chat", "vision"])
def test_a_model_that_answers_passes(module_runner, start_sim, kind):
    sim = start_sim(*FAST_SIM, served_model_name=MODEL)
    result = module_runner("service_request", {"url": sim.url, "kind": kind, "model": MODEL, "orid": "canary-0"})
    assert not result.get("failed"), result
    assert (result["api"], result["status"], result["changed"]) == ("chat", 200, False)


def test_a_healthy_server_whose_completions_fail_is_refused_with_its_error(module_runner, start_sim):
    """/health answers 200 (what systemd's waiter checks) while every completion fails: the check names it."""
    sim = start_sim(*FAST_SIM, "--sim-fault", "error:status=500", served_model_name=MODEL)
    result = module_runner("service_request", {"url": sim.url, "model": MODEL})
    assert result.get("failed"), result
    assert result["status"] == 500
    assert result["msg"].startswith(f"chat request for {MODEL} to {sim.url}: answered 500"), result["msg"]


def test_a_model_name_the_server_does_not_serve_is_refused_with_its_404(module_runner, start_sim):
    sim = start_sim(*FAST_SIM, served_model_name=MODEL)
    result = module_runner("service_request", {"url": sim.url, "model": "Qwen3-8B"})
    assert result.get("failed") and result["status"] == 404, result
    assert "Qwen3-8B" in result["msg"], result["msg"]


def test_a_server_that_is_not_there_is_named_with_the_refused_connection(module_runner, start_sim):
    sim = start_sim(*FAST_SIM, served_model_name=MODEL)
    sim.stop()
    result = module_runner("service_request", {"url": sim.url, "model": MODEL, "timeout": 5})
    assert result.get("failed") and result["status"] is None, result
    assert "no answer (" in result["msg"] and "refused" in result["msg"], result["msg"]


def test_a_speech_service_must_answer_audio(module_runner, start_sim):
    """The canary of a TTS service asks for one sentence and wants WAV bytes back; a chat model's 200 with vLLM's
    'does not support' envelope is no audio, and is refused."""
    tts = start_sim("--omni", *FAST_SIM, served_model_name="CosyVoice3-0.5B",
                    model_config={"architectures": ["CosyVoice3ForConditionalGeneration"]})
    result = module_runner("service_request", {"url": tts.url, "kind": "speech", "model": "CosyVoice3-0.5B",
                                               "orid": "canary-tts"})
    assert not result.get("failed"), result
    assert (result["api"], result["status"]) == ("speech", 200)
    chat = start_sim(*FAST_SIM, served_model_name=MODEL)
    refused = module_runner("service_request", {"url": chat.url, "kind": "speech", "model": MODEL, "orid": "c"})
    assert refused.get("failed") and "Speech API" in refused["msg"], refused
