"""The RAG host (host_vars/node.yml), converged twice: every service in its own API through the proxy - speech
both ways, embeddings on the CPU beside the card-placed services -, verify.yml over the data services, and the
vector store's backup and restore bringing back the same search results. Tests run in file order."""

from __future__ import annotations

import io
import json
import math
import wave
from pathlib import Path

import pytest
import requests
import yaml
from openai import OpenAI
from testkit import results_line

from support import wait_until

testinfra_hosts = ["node"]
UNITS = ["vllm@chat-0", "vllm@mineru-vlm-0", "vllm@tts-0", "vllm@asr-0", "vllm@embed-0", "vllm@rerank-0",
         "dcu-proxy", "dcu-etcd", "dcu-milvus", "dcu-mineru"]
PASSWORD = "rag-Root-pw-1"  # host_vars/node.yml, vaulted (molecule/rag/vault-password)
AUTH = {"Authorization": f"Bearer root:{PASSWORD}"}


@pytest.fixture(scope="module")
def milvus_url(proxy_url):
    return proxy_url.rsplit(":", 1)[0] + ":19530"


def test_every_unit_runs(host):
    for unit in UNITS:
        assert host.service(unit).is_running and host.service(unit).is_enabled, unit


def test_the_cpu_services_have_no_dcu_device_or_environment(host):
    for container in ("vllm-embed-0", "vllm-rerank-0"):
        config = json.loads(host.check_output(f"docker inspect --format '{{{{json .HostConfig}}}}' {container}"))
        assert not config["Devices"] and not config["GroupAdd"], (container, config["Devices"])
        assert not [b for b in config["Binds"] or [] if "hyhal" in b or "dtk" in b], config["Binds"]
    assert json.loads(host.check_output("docker inspect --format '{{json .HostConfig.NanoCpus}}' vllm-embed-0")) \
        == 10**9, "cpu_limit 1"
    env = host.file("/etc/dcu-serving/vllm/embed-0.env").content_string
    assert "HIP_VISIBLE_DEVICES" not in env and "DCU_VLLM_PORT=8066" in env and "VLLM_CPU_KVCACHE_SPACE=4" in env
    assert "--gpu-memory-utilization" not in env
    devices = json.loads(host.check_output("docker inspect --format '{{json .HostConfig.Devices}}' vllm-chat-0"))
    assert {d["PathOnHost"] for d in devices} >= {"/dev/kfd", "/dev/dri/renderD128"}


def test_embeddings_on_the_cpu_beside_the_card_placed_services(host, proxy_url):
    client = OpenAI(base_url=f"{proxy_url}/v1", api_key="unused", timeout=60)
    raw = client.embeddings.with_raw_response.create(model="bge-m3", input=["a DCU card", "a loaf"], user="mol-rag-e")
    assert raw.headers["X-Backend"] == "127.0.0.1:8066", "the CPU instance's port"
    assert len(raw.parse().data) == 2
    chat = client.chat.completions.with_raw_response.create(
        model="Qwen2.5-14B-Instruct", messages=[{"role": "user", "content": "Say OK."}], max_tokens=16,
        user="mol-rag-c")
    assert chat.headers["X-Backend"] == "127.0.0.1:8002"
    rerank = requests.post(f"{proxy_url}/v1/rerank", timeout=60, json={
        "model": "bge-reranker-v2-m3", "query": "DCU driver", "documents": ["bread", "the DCU driver is loaded"]})
    assert rerank.headers["X-Backend"] == "127.0.0.1:8067" and rerank.json()["results"][0]["index"] == 1


def test_speech_is_synthesised_and_transcribed_through_the_proxy(host, proxy_url):
    client = OpenAI(base_url=f"{proxy_url}/v1", api_key="unused", timeout=60)
    spoken = client.audio.speech.with_raw_response.create(model="CosyVoice3-0.5B", voice="vivian",
                                                          input="The invoice is due on Friday.")
    assert spoken.headers["X-Backend"] == "127.0.0.1:8004"
    audio = spoken.content
    with wave.open(io.BytesIO(audio)) as w:
        assert (w.getnchannels(), w.getframerate()) == (1, 24000)
        assert w.getnframes() / w.getframerate() == pytest.approx(6 * 0.4, rel=0.01)  # six words, 0.4 s each
    text = requests.post(f"{proxy_url}/v1/audio/transcriptions", files={"file": ("speech.wav", audio)}, timeout=60,
                         data={"model": "whisper-large-v3", "language": "en", "user": "mol-rag-asr"})
    assert text.status_code == 200 and text.headers["X-Backend"] == "127.0.0.1:8005" and text.json()["text"]
    record = results_line(host, "mol-rag-asr")
    assert (record["api"], record["model"], record["status"]) == ("transcriptions", "whisper-large-v3", 200)


def test_verify_covers_the_data_services(run_playbook):
    rc, out = run_playbook("verify.yml")
    assert rc == 0, out[-3000:]
    flat = " ".join(out.split())
    assert "dcu-etcd and dcu-milvus healthy; inserted 2 vectors, the nearest of [0.9, 0.1, 0, 0] is a" in flat
    assert "MinerU parsed rag-check.pdf into" in flat
    for model in ("CosyVoice3-0.5B (speech)", "bge-m3 (embeddings)", "whisper-large-v3 (transcriptions)"):
        assert model in flat, model


def test_verify_names_a_stopped_etcd(host, run_playbook):
    host.check_output("systemctl stop dcu-milvus dcu-etcd")
    try:
        rc, out = run_playbook("verify.yml", "--limit", "node")
        assert rc != 0
        assert "dcu-etcd.service is inactive (Milvus keeps its metadata there" in " ".join(out.split()), out[-3000:]
    finally:
        host.check_output("systemctl start dcu-etcd dcu-milvus")
    rc, out = run_playbook("data.yml")  # waits until both are healthy again
    assert rc == 0, out[-3000:]


# --- The chain and MinerU ---------------------------------------------------------------------------------------

def test_the_chain_answers_from_the_bundles_pdf_citing_its_chunks(host, run_playbook):
    rc, out = run_playbook("rag_check.yml")
    assert rc == 0, out[-4000:]
    flat = " ".join(out.split())
    assert "node: the chain answered from rag-check.pdf; the answer cites c1; seconds per hop: parse" in flat, \
        out[-3000:]
    for hop in ("chunk", "embed", "store", "embed_question", "search", "rerank", "answer"):
        assert f", {hop} " in flat, hop
    record = results_line(host, "rag-check-node")
    assert record["status"] == 200


UPLOAD = """python3 - <<'PY'
import urllib.error, urllib.request
request = urllib.request.Request("http://127.0.0.1:8010/file_parse", data=b"0" * (2 * 2**20),
                                 headers={"Content-Type": "multipart/form-data; boundary=x"})
try:
    urllib.request.urlopen(request, timeout=30)
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode())
PY"""


def test_a_parse_over_the_upload_limit_is_refused_naming_it(host):
    answer = host.run(UPLOAD)
    assert answer.stdout.startswith("413 ") and "limit of 1 MiB (dcu_mineru_max_upload_mb)" in answer.stdout, answer


PDF = Path(__file__).resolve().parents[3] / "roles" / "dcu_mineru" / "files" / "rag-check.pdf"


def test_a_pdf_is_parsed_through_the_proxys_entrance_recorded_and_measured(host, proxy_url):
    """dcu_mineru_entrance: proxy - a caller on the network parses at dcu-proxy's port; MinerU stays on loopback."""
    health = requests.get(f"{proxy_url}/mineru/health", timeout=30)
    assert health.status_code == 200 and health.json()["status"] == "healthy", health.text
    assert not host.socket("tcp://0.0.0.0:8010").is_listening and host.socket("tcp://127.0.0.1:8010").is_listening
    with PDF.open("rb") as f:
        answer = requests.post(f"{proxy_url}/mineru/file_parse", timeout=600, headers={"X-Orid": "mol-rag-parse"},
                               files=[("files", (PDF.name, f, "application/pdf"))],
                               data={"backend": "vlm-http-client", "server_url": "http://127.0.0.1:8000",
                                     "return_md": "true", "lang_list": "en"})
    assert answer.status_code == 200, answer.text[:2000]
    assert answer.headers["X-Backend"] == "127.0.0.1:8010"
    markdown = "".join(r.get("md_content") or "" for r in answer.json()["results"].values())
    assert len(markdown) > 200, answer.text[:2000]
    record = results_line(host, "mol-rag-parse")
    assert record["api"] == "parse" and record["status"] == 200 and record["backend"] == "127.0.0.1:8010"
    assert markdown[:40] not in host.file("/var/log/dcu-serving/results.jsonl").content_string  # no document text
    metrics = {name: float(value) for name, value in (line.rsplit(" ", 1) for line in requests.get(
        f"{proxy_url}/metrics", timeout=30).text.splitlines() if line and not line.startswith("#"))}
    assert metrics['dcu_proxy_requests_total{api="parse",model="",status="200"}'] >= 1
    assert metrics["dcu_proxy_mineru_parse_duration_seconds_count"] >= 1
    assert metrics["dcu_proxy_mineru_concurrency"] == 2 and metrics["dcu_proxy_mineru_healthy"] == 1
    assert metrics["dcu_proxy_mineru_max_upload_bytes"] == 2**20  # dcu_mineru_max_upload_mb: 1


def test_an_upload_over_the_limit_is_refused_at_the_entrance_naming_it(host, proxy_url):
    answer = requests.post(f"{proxy_url}/mineru/file_parse", timeout=60, headers={"X-Orid": "mol-rag-big"},
                           files=[("files", ("big.pdf", b"0" * (2 * 2**20), "application/pdf"))])
    assert answer.status_code == 413 and answer.headers["X-Backend"] == "dcu-proxy", answer.text
    assert "dcu_mineru_max_upload_mb" in answer.json()["error"]["message"]
    assert results_line(host, "mol-rag-big")["status"] == 413


# --- Backup and restore ----------------------------------------------------------------------------------------

def vector(i: int) -> list[float]:
    return [math.sin(i * (k + 1)) for k in range(8)]


def milvus(url: str, path: str, **body) -> dict:
    answer = requests.post(f"{url}/v1/vector/{path}", json=body, headers=AUTH, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()


def search(url: str) -> list:
    found = milvus(url, "search", collectionName="docs", vector=vector(3), limit=5, outputFields=["chunk"])
    return [row["chunk"] for row in found.get("data", [])] if found["code"] == 200 else found


def test_a_restore_brings_back_the_same_search_results(host, run_playbook, milvus_url):
    assert milvus(milvus_url, "collections/create", collectionName="docs", dimension=8, metricType="L2")["code"] == 200
    inserted = milvus(milvus_url, "insert", collectionName="docs",
                      data=[{"vector": vector(i), "chunk": f"chunk-{i}"} for i in range(50)])
    assert inserted["code"] == 200 and inserted["data"]["insertCount"] == 50
    before = wait_until(lambda: (lambda r: r if isinstance(r, list) and len(r) == 5 else None)(search(milvus_url)),
                        30, what="the inserted vectors searchable")
    assert before[0] == "chunk-3"

    rc, out = run_playbook("vector_backup.yml")
    assert rc == 0, out[-3000:]
    archive = host.check_output("ls /var/backups/dcu-serving/milvus/ | grep 'tar.gz$' | tail -1")
    assert host.run(f"cd /var/backups/dcu-serving/milvus && sha256sum -c {archive}.sha256").rc == 0

    assert milvus(milvus_url, "collections/drop", collectionName="docs")["code"] == 200  # the data is gone
    assert not isinstance(search(milvus_url), list)

    rc, out = run_playbook("vector_restore.yml")
    assert rc == 0, out[-3000:]
    assert f"Restored /var/backups/dcu-serving/milvus/{archive}" in " ".join(out.split())
    after = wait_until(lambda: (lambda r: r if isinstance(r, list) else None)(search(milvus_url)), 60,
                       what="the restored collection searchable")
    assert after == before
    aside = host.check_output("ls -d /var/lib/dcu-serving/milvus.before-restore-*")
    assert host.file(f"{aside}/etcd").is_directory, "the replaced data is kept"


# --- Changes that do not serve ---------------------------------------------------------------------------------

def unit_files(host, *units: str) -> dict:
    return {u: host.file(f"/etc/systemd/system/{u}.service").content_string for u in units}


def test_a_change_the_vector_store_cannot_serve_on_is_rolled_back_with_its_data(host, run_playbook, milvus_url):
    """A changed Milvus unit that does not answer healthy (its health port taken by dcu-proxy's, as a new image that
    fails would): data.yml snapshots etcd and Milvus first, waits the start grace on the new unit, then puts the
    earlier units back and restores the snapshot. The searches answer as before; the failed start's data is kept."""
    assert milvus(milvus_url, "collections/create", collectionName="kept", dimension=8, metricType="L2")["code"] == 200
    assert milvus(milvus_url, "insert", collectionName="kept",
                  data=[{"vector": vector(i), "chunk": f"kept-{i}"} for i in range(20)])["data"]["insertCount"] == 20

    def found():
        answer = milvus(milvus_url, "search", collectionName="kept", vector=vector(7), limit=3, outputFields=["chunk"])
        rows = [row["chunk"] for row in answer.get("data", [])] if answer["code"] == 200 else []
        return rows if len(rows) == 3 else None

    before = wait_until(found, 30, what="the inserted vectors searchable")
    assert before[0] == "kept-7"
    units = unit_files(host, "dcu-etcd", "dcu-milvus")
    archives = set(host.check_output("ls /var/backups/dcu-serving/milvus").split())
    asides = set(host.check_output("ls -d /var/lib/dcu-serving/milvus.before-restore-* || true").split())

    # Keep 1: the snapshot prunes the restore test's archive (dcu_milvus_backup_keep), never itself.
    rc, out = run_playbook("data.yml", extra_vars={"dcu_milvus_metrics_port": 8000, "dcu_milvus_start_grace": 45,
                                                   "dcu_milvus_backup_keep": 1})
    flat = " ".join(out.split())
    assert rc != 0, out[-3000:]
    assert "Rolled back on node: Not healthy within the start grace" in flat, out[-3000:]
    assert "dcu-milvus did not answer healthy at http://127.0.0.1:8000/healthz" in flat, out[-3000:]
    assert "--env=METRICS_PORT=8000" in flat and "--env=METRICS_PORT=9091" in flat, out[-3000:]  # the change
    snapshots = [a for a in set(host.check_output("ls /var/backups/dcu-serving/milvus").split()) - archives
                 if a.endswith(".tar.gz")]
    assert len(snapshots) == 1, snapshots
    left = set(host.check_output("ls /var/backups/dcu-serving/milvus").split())
    assert left == {snapshots[0], f"{snapshots[0]}.sha256"}, f"older archives not pruned, or the snapshot was: {left}"
    assert f"snapshot /var/backups/dcu-serving/milvus/{snapshots[0]}" in flat, out[-3000:]
    assert "etcd and Milvus answer healthy again" in flat

    assert unit_files(host, "dcu-etcd", "dcu-milvus") == units
    assert host.service("dcu-milvus").is_running and host.service("dcu-etcd").is_running
    assert wait_until(found, 60, what="the collection searchable after the rollback") == before
    aside = set(host.check_output("ls -d /var/lib/dcu-serving/milvus.before-restore-*").split()) - asides
    assert len(aside) == 1 and host.file(f"{aside.pop()}/milvus").is_directory, "the failed start's data is kept"


def test_a_change_minerus_api_cannot_serve_on_is_rolled_back(host, run_playbook, proxy_url):
    """MinerU on a port another service holds (etcd's): it never answers healthy within its start grace, and the
    earlier unit comes back - MinerU holds no data, so nothing else moves."""
    unit = unit_files(host, "dcu-mineru")
    milvus_pid = host.check_output("systemctl show --property=MainPID --value dcu-milvus")
    # The grace also bounds the rollback's wait for the earlier unit: 40 s was too short for MinerU to start on
    # 2026-12-06's slow machine with three scenarios at once ("did not answer healthy at :8010" after the rollback).
    grace = 60
    rc, out = run_playbook("data.yml", extra_vars={"dcu_mineru_listen": "127.0.0.1:2379",
                                                   "dcu_mineru_start_grace": grace})
    flat = " ".join(out.split())
    assert rc != 0, out[-3000:]
    assert ("Rolled back on node: dcu-mineru did not answer healthy at http://127.0.0.1:2379/health within its start "
            f"grace of {grace} s") in flat, out[-3000:]
    assert "--port=2379" in flat and "(was" in flat and "--port=8010" in flat, out[-3000:]
    assert "MinerU answers healthy again" in flat
    assert unit_files(host, "dcu-mineru") == unit
    assert host.check_output("systemctl show --property=MainPID --value dcu-milvus") == milvus_pid
    health = requests.get(f"{proxy_url}/mineru/health", timeout=30)
    assert health.status_code == 200 and health.json()["status"] == "healthy", health.text


# --- Refusals -------------------------------------------------------------------------------------------------

def test_a_missing_vault_password_is_refused_naming_the_fix(host, run_playbook, tmp_path):
    before = host.check_output("systemctl show --property=MainPID --value dcu-milvus")
    rc, out = run_playbook("data.yml", extra_vars={"dcu_milvus_root_password": ""})
    assert rc != 0
    flat = " ".join(out.split())
    assert "dcu_milvus_root_password is empty" in flat and "ansible-vault encrypt_string" in flat, out[-2000:]
    assert host.check_output("systemctl show --property=MainPID --value dcu-milvus") == before

    wrong = tmp_path / "wrong-vault-password"
    wrong.write_text("not the scenario's vault password\n")
    rc, out = run_playbook("data.yml", env={"ANSIBLE_VAULT_PASSWORD_FILE": str(wrong)})
    assert rc != 0 and "no vault secrets were found that could decrypt" in out, out[-2000:]
    assert host.check_output("systemctl show --property=MainPID --value dcu-milvus") == before


def test_the_embed_service_cannot_move_back_to_a_card_another_service_holds(host, run_playbook):
    layout = yaml.safe_load((Path(__file__).resolve().parents[1] / "host_vars/node/services.yml").read_text())[
        "dcu_vllm_services"]
    moved = [dict(s, placement="dcu") if s["name"] == "embed" else s for s in layout]
    before = host.check_output("systemctl show --property=MainPID --value vllm@asr-0")
    rc, out = run_playbook("serving.yml", extra_vars={"dcu_vllm_services": moved})
    assert rc != 0 and "card 3 is given to service asr and service embed" in out, out[-2000:]
    assert host.check_output("systemctl show --property=MainPID --value vllm@asr-0") == before
