"""The fleet's gateway: the pieces LiteLLM's proxy loads (docs/fleet.md).

- auth.py: `general_settings.custom_auth`, the callers' keys from a file (no database), each key with its alias and
  limits, which LiteLLM's own limiter enforces in memory.
- hooks.py: a `litellm_settings.callbacks` entry that tells the host's dcu-proxy who called (`X-Caller`) and
  leaves drained (drained.py) and unreachable (unreachable.py) hosts out of routing.

Both import nothing beyond the standard library and LiteLLM: the gateway's venv installs dcu-serving without its
dependencies. The config itself comes from the inventory (the collection's gateway_config filter).
"""
