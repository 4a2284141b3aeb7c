"""dcu-rag-check: one document through the whole RAG chain, each hop checked, the first broken one named.

  parse    the PDF to Markdown by MinerU's API (its vlm-http-client backend reads the pages through dcu-proxy)
  chunk    the Markdown into paragraphs, ids c1..cN
  embed    the chunks, through dcu-proxy's /v1/embeddings
  store    into a Milvus collection (created with the embedding's dimension; an existing one of another
           dimension is refused, never dropped)
  search   the question's embedding in Milvus
  rerank   the hits, through dcu-proxy's /v1/rerank
  answer   the chat model, given the best chunks labelled [cN], must answer citing the ids it used

Exit 0 with a JSON report (each hop's time and what it found), or exit 1 with `hop <name> failed: <why>`.
Standard library and requests only: it runs wherever dcu-serving[client] is installed.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import requests

CITATION = re.compile(r"\[(c\d+)\]")


class HopFailed(Exception):
    def __init__(self, hop: str, why: str):
        super().__init__(f"hop {hop} failed: {why}")
        self.hop, self.why = hop, why


def _json(answer: requests.Response, hop: str, what: str) -> dict:
    try:
        body = answer.json()
    except ValueError:
        raise HopFailed(hop, f"{what} answered {answer.status_code} with no JSON: {answer.text[:200]!r}") from None
    if answer.status_code != 200 or not isinstance(body, dict) or body.get("error"):
        message = body.get("error", body) if isinstance(body, dict) else body
        if isinstance(message, dict):
            message = message.get("message", message)
        raise HopFailed(hop, f"{what} answered {answer.status_code}: {message}")
    return body


def _post(hop: str, url: str, timeout: float, **kwargs) -> requests.Response:
    try:
        return requests.post(url, timeout=timeout, **kwargs)
    except requests.RequestException as e:
        raise HopFailed(hop, f"{url} cannot be reached: {e}") from None


class Chain:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.report: dict = {"hops": {}}
        self.milvus_headers = {"Authorization": f"Bearer root:{args.milvus_password}"} if args.milvus_password \
            else {}

    def hop(self, name: str, step, *values):
        started = time.monotonic()
        result, note = step(*values)
        self.report["hops"][name] = {"seconds": round(time.monotonic() - started, 3), **note}
        return result

    # -- the hops --

    def parse(self, pdf: Path):
        a = self.args
        with pdf.open("rb") as f:
            answer = _post("parse", a.mineru_url.rstrip("/") + "/file_parse", a.parse_timeout,
                           files=[("files", (pdf.name, f, "application/pdf"))],
                           data={"backend": "vlm-http-client", "server_url": a.proxy_url, "return_md": "true",
                                 "lang_list": "en"})
        body = _json(answer, "parse", f"MinerU ({a.mineru_url})")
        markdown = [r.get("md_content") for r in (body.get("results") or {}).values() if isinstance(r, dict)]
        markdown = "\n\n".join(m for m in markdown if m)
        if not markdown.strip():
            raise HopFailed("parse", f"MinerU returned no Markdown for {pdf.name} (its answer: "
                                     f"{json.dumps(body)[:300]})")
        return markdown, {"bytes": pdf.stat().st_size, "markdown_chars": len(markdown)}

    def chunk(self, markdown: str):
        paragraphs = [p.strip() for p in re.split(r"\n\s*\n", markdown) if p.strip()]
        chunks = {f"c{i}": text for i, text in enumerate(paragraphs, 1)}
        if not chunks:
            raise HopFailed("chunk", "the Markdown holds no paragraph")
        return chunks, {"chunks": len(chunks)}

    def embed(self, texts: list[str], hop: str = "embed"):
        a = self.args
        answer = _post(hop, a.proxy_url.rstrip("/") + "/v1/embeddings", a.timeout,
                       json={"model": a.embedding_model, "input": texts, "user": a.orid})
        data = _json(answer, hop, f"dcu-proxy's embeddings ({a.embedding_model})").get("data") or []
        vectors = [item.get("embedding") for item in sorted(data, key=lambda d: d.get("index", 0))]
        if len(vectors) != len(texts) or not all(vectors):
            raise HopFailed(hop, f"{len(texts)} texts sent, {len(vectors)} embeddings back")
        return vectors, {"vectors": len(vectors), "dimension": len(vectors[0])}

    def milvus(self, hop: str, path: str, method: str = "POST", **body) -> dict:
        a = self.args
        url = f"{a.milvus_url.rstrip('/')}/v1/vector/{path}"
        try:
            answer = requests.request(method, url, headers=self.milvus_headers, timeout=a.timeout,
                                      json=body if method == "POST" else None,
                                      params=body if method == "GET" else None)
        except requests.RequestException as e:
            raise HopFailed(hop, f"Milvus ({url}) cannot be reached: {e}") from None
        try:
            result = answer.json()
        except ValueError:
            raise HopFailed(hop, f"Milvus ({url}) answered {answer.status_code}: {answer.text[:200]!r}") from None
        if result.get("code") == 1800:
            raise HopFailed(hop, "Milvus refuses root's password (code 1800): give the vault's "
                                 "dcu_milvus_root_password (--milvus-password or DCU_MILVUS_PASSWORD)")
        return result

    def store(self, chunks: dict, vectors: list):
        a = self.args
        dimension = len(vectors[0])
        described = self.milvus("store", "collections/describe", "GET", collectionName=a.collection)
        if described.get("code") == 200:
            fields = (described.get("data") or {}).get("fields") or []
            kinds = [f.get("type", "") for f in fields if str(f.get("type", "")).startswith("FloatVector")]
            have = int(re.sub(r"\D", "", kinds[0]) or 0) if kinds else None
            if have != dimension:
                raise HopFailed("store", f"collection {a.collection} holds vectors of dimension {have}, and "
                                         f"{a.embedding_model} embeds in {dimension}: its vectors cannot be "
                                         f"compared. Give another --collection, or drop {a.collection} if its "
                                         f"data is not needed (nothing was changed)")
        else:
            created = self.milvus("store", "collections/create", collectionName=a.collection, dimension=dimension,
                                  metricType="COSINE")
            if created.get("code") != 200:
                raise HopFailed("store", f"Milvus could not create {a.collection}: {created}")
        rows = [{"vector": v, "chunk_id": cid, "text": text[:4000]}
                for (cid, text), v in zip(chunks.items(), vectors, strict=True)]
        inserted = self.milvus("store", "insert", collectionName=a.collection, data=rows)
        if inserted.get("code") != 200:
            raise HopFailed("store", f"Milvus refused the insert: {inserted}")
        return None, {"collection": a.collection, "inserted": inserted["data"]["insertCount"]}

    def search(self, question_vector: list, expected: int):
        a = self.args
        deadline = time.monotonic() + a.timeout
        while True:  # rows are searchable once Milvus has consumed them
            found = self.milvus("search", "search", collectionName=a.collection, vector=question_vector,
                                limit=a.top_k, outputFields=["chunk_id", "text"])
            hits = found.get("data") or [] if found.get("code") == 200 else []
            if len(hits) >= min(a.top_k, expected) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        if found.get("code") != 200 or not hits:
            raise HopFailed("search", f"Milvus found nothing in {a.collection}: {found}")
        return hits, {"hits": [h["chunk_id"] for h in hits]}

    def rerank(self, question: str, hits: list):
        a = self.args
        answer = _post("rerank", a.proxy_url.rstrip("/") + "/v1/rerank", a.timeout, json={
            "model": a.rerank_model, "query": question, "documents": [h["text"] for h in hits], "user": a.orid})
        results = _json(answer, "rerank", f"dcu-proxy's rerank ({a.rerank_model})").get("results") or []
        if not results:
            raise HopFailed("rerank", "the reranker ranked no document")
        ranked = [hits[r["index"]] for r in results][:a.context]
        return ranked, {"order": [h["chunk_id"] for h in ranked]}

    def answer(self, question: str, ranked: list):
        a = self.args
        context = "\n".join(f"[{h['chunk_id']}] {h['text']}" for h in ranked)
        prompt = (f"Answer the question from these sources only, and cite the ids in brackets of the sources you "
                  f"used, e.g. [c1].\n\nSources:\n{context}\n\nQuestion: {question}")
        answer = _post("answer", a.proxy_url.rstrip("/") + "/v1/chat/completions", a.parse_timeout, json={
            "model": a.chat_model, "messages": [{"role": "user", "content": prompt}], "max_tokens": a.max_tokens,
            "user": a.orid, "chat_template_kwargs": {"enable_thinking": False}})
        body = _json(answer, "answer", f"dcu-proxy's chat ({a.chat_model})")
        text = ((body.get("choices") or [{}])[0].get("message") or {}).get("content") or ""
        given = {h["chunk_id"] for h in ranked}
        cited = [c for c in dict.fromkeys(CITATION.findall(text)) if c in given]
        if not cited:
            raise HopFailed("answer", f"the answer cites none of the chunks it was given ({', '.join(sorted(given))})"
                                      f": {text[:300]!r}")
        return text, {"cited": cited}

    def run(self, pdf: Path, question: str | None) -> dict:
        markdown = self.hop("parse", self.parse, pdf)
        chunks = self.hop("chunk", self.chunk, markdown)
        if self.args.parse_only:
            return self.report
        vectors = self.hop("embed", self.embed, list(chunks.values()))
        self.hop("store", self.store, chunks, vectors)
        question = question or next(iter(chunks.values()))
        self.report["question"] = question
        (question_vector,) = self.hop("embed_question", self.embed, [question], "embed")
        hits = self.hop("search", self.search, question_vector, len(chunks))
        ranked = self.hop("rerank", self.rerank, question, hits)
        self.report["answer"] = self.hop("answer", self.answer, question, ranked)
        return self.report


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dcu-rag-check", description=__doc__.split("\n\n")[0])
    p.add_argument("pdf", type=Path, help="the document")
    p.add_argument("--question", help="what to ask (default: the first chunk's text)")
    p.add_argument("--proxy-url", default="http://127.0.0.1:8000", help="dcu-proxy")
    p.add_argument("--mineru-url", default="http://127.0.0.1:8010", help="MinerU's API")
    p.add_argument("--milvus-url", default="http://127.0.0.1:19530", help="Milvus' REST API")
    p.add_argument("--milvus-password", default=None,
                   help="root's password (default: the environment's DCU_MILVUS_PASSWORD)")
    p.add_argument("--collection", default="dcu_rag_check")
    p.add_argument("--parse-only", action="store_true",
                   help="the first two hops only (parse, chunk): MinerU and its VLM work (verify.yml)")
    p.add_argument("--embedding-model")
    p.add_argument("--rerank-model")
    p.add_argument("--chat-model")
    p.add_argument("--top-k", type=int, default=5)
    p.add_argument("--context", type=int, default=3, help="chunks given to the chat model")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--timeout", type=float, default=60)
    p.add_argument("--parse-timeout", type=float, default=600)
    p.add_argument("--orid", default="dcu-rag-check", help="the `user` of every request (the results log's orid)")
    return p


def main(argv: list[str] | None = None) -> int:
    import os

    parser = build_parser()
    args = parser.parse_args(argv)
    missing = [f"--{name}-model" for name in ("embedding", "rerank", "chat")
               if not args.parse_only and not getattr(args, f"{name}_model")]
    if missing:
        parser.error(f"{', '.join(missing)} required (or --parse-only)")
    args.milvus_password = args.milvus_password or os.environ.get("DCU_MILVUS_PASSWORD")
    if not args.pdf.is_file():
        print(f"hop parse failed: {args.pdf} is not a file", file=sys.stderr)
        return 1
    chain = Chain(args)
    try:
        report = chain.run(args.pdf, args.question)
    except HopFailed as e:
        print(str(e), file=sys.stderr)
        print(json.dumps({**chain.report, "failed": {"hop": e.hop, "why": e.why}}, indent=2))
        return 1
    print(json.dumps(report, indent=2, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
