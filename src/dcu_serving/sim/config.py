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
    # What the model is and what it serves (model.py resolves these like vLLM 0.11 does).
    architecture: str = ""
    runner: str = "generate"                     # generate | pooling
    convert: str = "none"                        # none | embed | classify | reward
    tasks: frozenset[str] = frozenset({"generate"})
    encoder_only: bool = False                   # a BERT-like pooling model: [CLS] ... [SEP] around each text
    embedding_dim: int = 1024
    matryoshka: bool = False                     # config.json is_matryoshka / matryoshka_dimensions
    matryoshka_dimensions: list[int] | None = None
    tensor_parallel_size: int = 1
    max_audio_mb: float = 25.0                   # VLLM_MAX_AUDIO_CLIP_FILESIZE_MB
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
    tp_efficiency: float = 0.85
    tp_allreduce_ms: float = 2.0
    faults: list[Fault] = field(default_factory=list)

    @property
    def model_name(self) -> str:
        """The name metrics carry (vLLM labels them with the first served name)."""
        return self.served_model_names[0]

    @property
    def tp_speedup(self) -> float:
        """How much faster N cards compute than one: N x efficiency (1 on one card)."""
        n = self.tensor_parallel_size
        return 1.0 if n == 1 else n * self.tp_efficiency

    @property
    def token_ms(self) -> float:
        """Decode time per token: the compute share of each card plus one all-reduce per token across cards."""
        allreduce = self.tp_allreduce_ms if self.tensor_parallel_size > 1 else 0.0
        return self.itl_ms / self.tp_speedup + allreduce

    @property
    def prefill_speed(self) -> float:
        """Prompt tokens per second over all the instance's cards."""
        return self.prefill_tokens_per_s * self.tp_speedup
