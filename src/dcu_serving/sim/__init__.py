"""dcu-vllm-sim: a vLLM-compatible OpenAI server that stands in for a DCU card.

Seen from the network it behaves like `vllm serve` 0.11 (endpoints, validation errors, streaming,
metrics, connection refused while the model loads); generation is simulated: deterministic text,
configurable timing, at most --max-num-seqs sequences at once, and injectable faults.

Installed with the `sim` extra (`pip install 'dcu-serving[sim]'`: aiohttp, pydantic, Pillow, prometheus-client).
"""

VLLM_VERSION = "0.11.0"  # the vLLM release whose API the simulator imitates (/version, `vllm --version`)
