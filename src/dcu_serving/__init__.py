"""dcu-serving: the runtime pieces of the dcu.serving collection (proxy, client, simulator)."""

__version__ = "0.1.0"
