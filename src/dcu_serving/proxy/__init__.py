"""dcu-proxy: the aiohttp reverse proxy in front of the per-card vLLM instances."""
