"""dcu-serving: the runtime pieces of the dcu.serving collection.

Each part installs with its own extra, so a host gets only what it runs:

    dcu_serving.proxy     dcu-proxy, on every serving host          pip install 'dcu-serving[proxy]'
    dcu_serving.exporter  dcu-exporter (card metrics), same hosts   pip install 'dcu-serving[proxy]'
    dcu_serving.doctor    dcu-doctor (a host's read-only checks)    the base install (standard library only)
    dcu_serving.client    dcu-recognize and the Python client       pip install 'dcu-serving[client]'
    dcu_serving.sim       dcu-vllm-sim, where no DCU card exists     pip install 'dcu-serving[sim]'
    dcu_serving.bundle    dcu-bundle: build and verify offline bundles (the base install: PyYAML only)

`[all]` is every part (development). Python 3.11 or newer.
"""

__version__ = "0.1.0"
