"""dcu-proxy: the aiohttp reverse proxy in front of a host's vLLM instances, routing by model (docs/proxy.md).

Installed with the `proxy` extra (`pip install 'dcu-serving[proxy]'`); it imports nothing of the client or
the simulator, nor their dependencies (tests/test_packaging.py).

One module per responsibility, the path of a request first:

    cli.py        the command line: the configuration, then serve() on uvloop's event loop
    server.py     the wiring: the proxy's lifecycle (start, health loop, SIGHUP reload, drain on SIGTERM),
                  the routes of its two listeners, serve()
    relay.py      the API paths: read and check the request, find its model's pool, take a slot, send it to
                  a card (once more elsewhere if that card could not be reached), pass the answer back, record it
    routing.py    the APIs, the kinds of model serving each, model -> pool, and the 404/400 of a miss
    uploads.py    model and user from a multipart/form-data upload, read as it arrives
    answers.py    what the results log takes from an answer or a stream's events (pure functions)
    contract.py   the service contract, checked before a request costs a card anything
    balancer.py   pools by model list: least-active routing and a FIFO queue each; health checks, ejection, drain
    upstream.py   keep-alive connections to the cards, responses parsed with httptools
    status.py     the proxy's own endpoints: /health, /v1/models, /__lb_status, /metrics
    admin.py      the admin API: drain, undrain, backends; bearer-token auth
    responses.py  request ids, X-Backend and vLLM's error envelope on the answers the proxy makes itself
    errors.py     ProxyError and the envelope's JSON
    config.py     proxy.yml: schema, defaults, validation
    metrics.py    counters and histograms, rendered by prometheus-client at scrape time
    results.py    the JSONL results log, written by a thread
    fastjson.py   orjson, with the standard library as the referee
"""
