"""dcu-vllm-sim: a vLLM-compatible OpenAI server that stands in for a DCU card."""
