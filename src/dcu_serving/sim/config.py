"""What one simulator process serves and how it behaves (parsed by cli.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from dcu_serving.sim.faults import Fault


@dataclass
class SimConfig:
    model_path: Path
    served_model_names: list[str]
    host: str | None = None
    port: int = 8000
    max_num_seqs: int = 256
    max_model_len: int = 32768
    image_limit: int = 999
    reasoning_parser: str | None = None
    enable_server_load_tracking: bool = False
    # Simulation knobs (--sim-* flags, DCU_SIM_* environment).
    ttft_ms: float = 50.0
    itl_ms: float = 20.0
    itl_jitter: float = 0.1
    prefill_tokens_per_s: float = 8000.0
    image_ms: float = 30.0
    think_tokens: int = 350
    answer_tokens: int = 150
    load_seconds: float = 0.0
    seed: int = 0
    faults: list[Fault] = field(default_factory=list)

    @property
    def model_name(self) -> str:
        """The name metrics carry (vLLM labels them with the first served name)."""
        return self.served_model_names[0]
