# Copyright: dcu-serving contributors
# Apache License 2.0 (see the collection's LICENSE)
"""The options of a dcu.serving.bundle_send task: one spec for the action plugin on the controller, which
validates the task, and for the module on the host, which adds its phase options to it."""

TASK_ARGUMENT_SPEC = {
    "src": {"type": "path", "required": True},
    "dest": {"type": "path", "required": True},
    "sha256": {"type": "str", "required": True},
    "chunk_mib": {"type": "int", "default": 512},
    "parts": {"type": "path"},
    "name": {"type": "str"},
    "mode": {"type": "raw", "default": "0644"},
    "cache": {"type": "path"},
}
