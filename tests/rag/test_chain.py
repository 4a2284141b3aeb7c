"""The RAG chain end to end on this machine, every part real except the models: MinerU's own API (its
vlm-http-client backend) reads a PDF through dcu-proxy from the simulator serving MinerU's VLM, the chunks are
embedded through dcu-proxy, stored in and searched by Milvus (the bundle's image, with its etcd), reranked, and
the chat model answers citing the chunk ids it used (dcu-rag-check). A broken hop is named.

Needs Docker (the Milvus and etcd images: tools/build-milvus-image) and MinerU in a venv of its own
(DCU_MINERU, default build/mineru-venv: `make rag`)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import urllib.error
import urllib.request
import uuid
import zipfile
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import requests
from PIL import Image, ImageDraw
from sim.simtools import DECODER, EMBEDDER, RERANKER

from dcu_serving.rag import check
from support import ServerProcess, free_port, wait_until

REPO = Path(__file__).resolve().parents[2]
MINERU = Path(os.environ.get("DCU_MINERU", REPO / "build/mineru-venv"))
VLM, EMBED, RERANK, CHAT = "MinerU2.5-2509-1.2B", "bge-m3", "bge-reranker-v2-m3", "Qwen2.5-14B-Instruct"
PASSWORD = "chain-Root-pw"
pytestmark = [pytest.mark.docker, pytest.mark.rag]
QUICK = ("--sim-ttft-ms", "5", "--sim-itl-ms", "1", "--sim-itl-jitter", "0", "--sim-think-tokens", "0",
         "--sim-answer-tokens", "20")


def docker(*args: str, check_rc: bool = True) -> str:
    run = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 or not check_rc, run.stderr
    return run.stdout.strip()


@pytest.fixture(scope="module")
def milvus_url():
    """Milvus standalone and etcd from the bundle's images, sharing one network namespace; root's password set."""
    port, name = free_port(), f"dcu-rag-chain-{os.getpid()}"
    docker("run", "-d", "--rm", f"--name={name}-etcd", f"--publish=127.0.0.1:{port}:19530", "--env=ETCDCTL_API=3",
           "dcu-serving/etcd:3.4.23", "etcd", "--data-dir=/tmp/etcd",
           "--listen-client-urls=http://127.0.0.1:2379", "--advertise-client-urls=http://127.0.0.1:2379")
    try:
        docker("run", "-d", "--rm", f"--name={name}-milvus", f"--network=container:{name}-etcd",
               "--env=ETCD_ENDPOINTS=127.0.0.1:2379", "--env=COMMON_SECURITY_AUTHORIZATIONENABLED=true",
               "--env=MILVUS_RUN_DIR=/tmp/run", "dcu-serving/milvus:2.3.5", "sh", "-c",
               "mkdir -p /tmp/m && sed 's#/var/lib/milvus#/tmp/m#' /milvus/configs/milvus.yaml > /tmp/m/milvus.yaml "
               "&& cp /milvus/configs/glog.conf /tmp/m/ && MILVUSCONF=/tmp/m/ exec /milvus/bin/milvus run standalone")
        wait_until(lambda: subprocess.run(["docker", "exec", f"{name}-milvus", "/milvus/bin/milvus-admin", "health",
                                           "9091"], capture_output=True).returncode == 0, 180, interval=1,
                   what="Milvus healthy")
        changed = subprocess.run(["docker", "exec", "-i", f"{name}-milvus", "/milvus/bin/milvus-admin",
                                  "root-password", "19530"], input=json.dumps({"new": PASSWORD, "old": ["Milvus"]}),
                                 capture_output=True, text=True, timeout=60)
        assert changed.returncode == 0, changed.stderr
        yield f"http://127.0.0.1:{port}"
    finally:
        docker("rm", "--force", f"{name}-milvus", f"{name}-etcd", check_rc=False)


@pytest.fixture
def mineru(tmp_path_factory, request):
    if not (MINERU / "bin/mineru-api").exists():
        pytest.fail(f"MinerU is not installed at {MINERU}: run `make rag` (or set DCU_MINERU to a venv holding it)")
    tmp = tmp_path_factory.mktemp("mineru")
    port = free_port()
    # dcu-proxy serves several models: MinerU's http client must be told which is its VLM (it refuses to guess).
    # MinerU's own API behind dcu_mineru's launcher (its upload limit, its one VLM address: the proxy's).
    server = ServerProcess([str(MINERU / "bin/python"), "-m", "dcu_serving.mineru.launcher", "--max-upload-mb", "1",
                            "--vlm-url", request.getfixturevalue("host")[0].url, "--host", "127.0.0.1",
                            "--port", str(port)], port,
                           env={"MINERU_MODEL_SOURCE": "local", "HF_HUB_OFFLINE": "1", "MINERU_VL_MODEL_NAME": VLM,
                                "MINERU_API_OUTPUT_ROOT": str(tmp / "out"), "TMPDIR": str(tmp),
                                "PYTHONPATH": str(REPO / "src")},
                           log=tmp / "mineru.log")
    server.start(ready_path="/health", timeout=180)
    yield server
    server.stop()


@pytest.fixture
def host(start_sim, start_proxy):
    sims = {
        "vlm": start_sim(*QUICK, served_model_name=VLM,
                         model_config={"architectures": ["Qwen2VLForConditionalGeneration"],
                                       "max_position_embeddings": 16384}),
        "embed": start_sim("--sim-ttft-ms", "5", served_model_name=EMBED, model_config=EMBEDDER),
        "rerank": start_sim("--sim-ttft-ms", "5", served_model_name=RERANK, model_config=RERANKER),
        "chat": start_sim(*QUICK, served_model_name=CHAT, model_config=DECODER),
    }
    proxy = start_proxy([{"url": sims["vlm"].url, "models": [VLM], "kind": "vision"},
                         {"url": sims["embed"].url, "models": [EMBED], "kind": "embedding"},
                         {"url": sims["rerank"].url, "models": [RERANK], "kind": "rerank"},
                         {"url": sims["chat"].url, "models": [CHAT], "kind": "chat"}], healthy=4, models=None)
    return proxy, sims


def pdf(tmp_path: Path) -> Path:
    """A two-page PDF of printed lines (PIL's bitmap font), paragraphs apart."""
    pages = []
    for number in range(2):
        page = Image.new("RGB", (850, 1100), "white")
        draw = ImageDraw.Draw(page)
        for block in range(3):
            for line in range(3):
                y = 120 + block * 250 + line * 22
                draw.text((80, y), f"Page {number + 1} block {block + 1}: DCU cards serve models behind a proxy "
                                   f"on port 8000.", fill="black")
        pages.append(page)
    path = tmp_path / "handbook.pdf"
    pages[0].save(path, save_all=True, append_images=pages[1:])
    return path


def run_check(*args: str) -> tuple[int, dict, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = check.main(list(args))
    return rc, json.loads(out.getvalue() or "{}"), err.getvalue()


def chain_args(proxy, mineru, milvus_url, document: Path, collection: str) -> list[str]:
    return [str(document), "--proxy-url", proxy.url, "--mineru-url", mineru.url, "--milvus-url", milvus_url,
            "--milvus-password", PASSWORD, "--collection", collection, "--embedding-model", EMBED,
            "--rerank-model", RERANK, "--chat-model", CHAT, "--parse-timeout", "300"]


def test_a_pdf_goes_through_every_hop_and_the_answer_cites_its_chunks(host, mineru, milvus_url, tmp_path):
    proxy, _ = host
    rc, report, err = run_check(*chain_args(proxy, mineru, milvus_url, pdf(tmp_path), "chain_ok"))
    assert rc == 0, err + mineru.tail()
    print(json.dumps(report, indent=2))  # pytest -s: the report docs/rag.md shows
    hops = report["hops"]
    assert list(hops) == ["parse", "chunk", "embed", "store", "embed_question", "search", "rerank", "answer"]
    assert hops["chunk"]["chunks"] >= 4, "MinerU found the page's blocks (two pages, three blocks each)"
    assert hops["store"]["inserted"] == hops["chunk"]["chunks"]
    assert hops["search"]["hits"][0] == "c1", "the question is chunk c1's text: Milvus finds it first"
    assert hops["rerank"]["order"][0] == "c1"
    assert hops["answer"]["cited"] == ["c1"] and "[c1]" in report["answer"]
    every = {("chat", VLM), ("embeddings", EMBED), ("rerank", RERANK), ("chat", CHAT)}
    wait_until(lambda: every <= {(r["api"], r["model"]) for r in proxy.results()}, 10,
               what="every hop's requests in the proxy's results log, MinerU's VLM requests among them")


def test_a_stopped_reranker_is_named(host, mineru, milvus_url, tmp_path):
    proxy, sims = host
    sims["rerank"].stop()
    rc, report, err = run_check(*chain_args(proxy, mineru, milvus_url, pdf(tmp_path), "chain_rerank"))
    assert rc == 1 and err.startswith("hop rerank failed: dcu-proxy's rerank (bge-reranker-v2-m3) answered 50"), err
    assert report["failed"]["hop"] == "rerank" and "search" in report["hops"]


def test_a_collection_of_another_dimension_is_refused_and_kept(host, mineru, milvus_url, tmp_path):
    proxy, _ = host
    headers = {"Authorization": f"Bearer root:{PASSWORD}"}
    created = requests.post(f"{milvus_url}/v1/vector/collections/create", headers=headers, timeout=30,
                            json={"collectionName": "chain_dim8", "dimension": 8}).json()
    assert created["code"] == 200, created
    rc, _, err = run_check(*chain_args(proxy, mineru, milvus_url, pdf(tmp_path), "chain_dim8"))
    assert rc == 1 and "hop store failed: collection chain_dim8 holds vectors of dimension 8, and bge-m3 embeds " \
                       "in 1024" in err, err
    described = requests.get(f"{milvus_url}/v1/vector/collections/describe", headers=headers, timeout=30,
                             params={"collectionName": "chain_dim8"}).json()
    assert described["code"] == 200, "the collection is still there"


def test_a_pdf_mineru_cannot_read_is_named(host, mineru, milvus_url, tmp_path):
    proxy, _ = host
    broken = tmp_path / "broken.pdf"
    broken.write_bytes(b"%PDF-1.7\nthis is not a PDF body\n")
    rc, _, err = run_check(*chain_args(proxy, mineru, milvus_url, broken, "chain_broken"))
    assert rc == 1 and err.startswith("hop parse failed: MinerU"), err




def test_an_upload_over_the_limit_is_refused_naming_it(host, mineru, milvus_url, tmp_path):
    proxy, _ = host
    big = tmp_path / "big.pdf"
    big.write_bytes(b"%PDF-1.7\n" + b"0" * (2 * 2**20))
    rc, report, err = run_check(*chain_args(proxy, mineru, milvus_url, big, "chain_big"))
    assert rc == 1 and "hop parse failed" in err and "over this MinerU's limit of 1 MiB (dcu_mineru_max_upload_mb)" \
        in err, err
    assert "store" not in report["hops"], "nothing stored"


@pytest.mark.parametrize("megabytes", [2, 48])
def test_a_caller_that_sends_an_upload_over_the_limit_whole_still_reads_the_413(host, mineru, megabytes):
    """urllib (like requests) sends its body whole before it reads the answer: the launcher reads and drops a
    refused body first, as nginx's lingering close does, so the caller gets the 413 naming the limit rather than a
    connection reset under its send (seen as 'Broken pipe' in molecule rag)."""
    request = urllib.request.Request(mineru.url + "/file_parse", data=b"0" * (megabytes * 2**20),
                                     headers={"Content-Type": "multipart/form-data; boundary=x"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=60)
    assert refused.value.code == 413
    assert "over this MinerU's limit of 1 MiB (dcu_mineru_max_upload_mb)" in refused.value.read().decode()


def test_a_caller_that_asks_before_sending_gets_the_413_without_sending(host, mineru, tmp_path):
    """curl asks `Expect: 100-continue` for a large body: the 413 comes at once, the body is never sent."""
    big = tmp_path / "big.pdf"
    big.write_bytes(b"0" * (100 * 2**20))
    done = subprocess.run(["curl", "-sS", "-H", "Expect: 100-continue", "-H", "Content-Type: application/pdf",
                           "--data-binary", f"@{big}", "-w", "\n%{http_code} %{size_upload}",
                           mineru.url + "/file_parse"], capture_output=True, text=True, timeout=60)
    answer, status = done.stdout.rsplit("\n", 1)
    assert status == "413 0", (status, done.stderr)
    assert "limit of 1 MiB (dcu_mineru_max_upload_mb)" in answer


def test_mineru_reads_through_the_proxy_only(host, mineru, tmp_path):
    with pdf(tmp_path).open("rb") as f:
        answer = requests.post(mineru.url + "/file_parse", timeout=60, files={"files": ("a.pdf", f)},
                               data={"backend": "vlm-http-client", "server_url": "http://10.0.0.1:30000"})
    assert answer.status_code == 400 and "is not this service's VLM" in answer.json()["detail"], answer.text


def test_parse_only_is_the_first_two_hops(host, mineru, tmp_path):
    proxy, _ = host
    rc, report, err = run_check(str(pdf(tmp_path)), "--parse-only", "--proxy-url", proxy.url, "--mineru-url",
                                mineru.url)
    assert rc == 0, err
    assert list(report["hops"]) == ["parse", "chunk"] and report["hops"]["chunk"]["chunks"] >= 4


def test_a_task_through_dcu_proxys_entrance_is_parsed_by_minerU_and_read_at_the_entrance(host, mineru, start_proxy,
                                                                                          tmp_path):
    """MinerU's own task API (POST /tasks, its status and its result as a zip) through dcu-proxy's entrance: the
    bound asked of MinerU's real /health, the URLs of its answers pointed at the entrance, the zip passed on."""
    proxy, sims = host
    entrance = start_proxy([{"url": sims["vlm"].url, "models": [VLM], "kind": "vision"}], healthy=1, models=None,
                           mineru={"url": mineru.url, "max_upload_mb": 1})
    with pdf(tmp_path).open("rb") as f:
        answer = requests.post(entrance.url + "/mineru/tasks", timeout=60, files={"files": ("handbook.pdf", f)},
                               data={"backend": "vlm-http-client", "server_url": proxy.url, "return_md": "true",
                                     "response_format_zip": "true"}, headers={"X-Orid": "ORD-TASK"})
    assert answer.status_code == 202, answer.text
    task = answer.json()
    where = f"{entrance.url}/mineru/tasks/{task['task_id']}"
    assert (task["status_url"], task["result_url"]) == (where, where + "/result")
    status = wait_until(lambda: (s := requests.get(task["status_url"], timeout=10).json())["status"]
                        in ("completed", "failed") and s, 240, interval=0.5, what="MinerU's task done")
    assert status["status"] == "completed", status
    result = requests.get(task["result_url"], timeout=60)
    assert result.status_code == 200 and result.headers["Content-Type"] == "application/zip", result.text[:300]
    with zipfile.ZipFile(io.BytesIO(result.content)) as archive:
        markdown = [archive.read(name).decode() for name in archive.namelist() if name.endswith(".md")]
    assert markdown and markdown[0].strip(), archive.namelist()
    gone = requests.get(f"{entrance.url}/mineru/tasks/{uuid.uuid4()}", timeout=10)
    assert gone.status_code == 404 and gone.json() == {"detail": "Task not found"}  # MinerU's own answer
    assert requests.get(f"{entrance.url}/mineru/tasks/..%2Fhealth", timeout=10).status_code == 400
    lines = entrance.results(2)
    assert [(line["api"], line["orid"], line["status"]) for line in lines] == [
        ("parse_task", "ORD-TASK", 202), ("parse_result", None, 200)]
