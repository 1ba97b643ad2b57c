"""What a visitor of a shared app may do: every limit the service enforces, in one place, with its default.

The UI's slider ranges are a convenience; these are the defence.  Every
request, from the page, the HTTP API or a script, goes through
:class:`steer_ui.service.Service`, which checks them before any model work.
``python app.py --help`` lists the flags that change them.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

# Devices a model may be put on.  "meta" (no storage) and arbitrary strings are refused.
DEVICE_PATTERN = re.compile(r"^(auto|cpu|mps|multi|cuda(:\d{1,2})?)$")
DTYPES = ("auto", "float32", "bfloat16", "float16")
# Gradio's own session ids are 10+ random characters made by the browser or gradio_client.
SESSION_PATTERN = re.compile(r"^[A-Za-z0-9_-]{8,64}$")
# Stores of calls without a usable id live under this prefix, apart from real sessions (a few, briefly).
ANONYMOUS_PREFIX = "anonymous:"
MAX_ANONYMOUS = 64


@dataclass
class Policy:
    # ---- the model (an administrator's choice; see app.py --allow-model-switch)
    allow_model_switch: bool = False
    model_sources: tuple[str, ...] = field(default_factory=lambda: ("embedded",))
    device: str = "auto"  # where a switched-to model goes: the administrator's --device, never a visitor's
    dtype: str = "auto"
    # ---- text and generation
    max_prompt_chars: int = 4000
    max_new_tokens: int = 256
    max_top_k: int = 100
    max_sweep_points: int = 101
    max_alpha: float = 1e6  # |α| in either unit; NaN and inf are refused anyway
    max_detect_answers: int = 512
    # ---- sessions (one per browser tab or gradio_client.Client)
    max_sessions: int = 256
    max_vectors_per_session: int = 32
    max_session_bytes: int = 256 << 20  # tensors of the session's vectors plus its dataset
    max_total_session_bytes: int = 1 << 30  # the same, summed over every session: what all visitors may hold
    session_idle_seconds: float = 4 * 3600.0
    # ---- long jobs (training, probing every layer, detection)
    job_seconds: float = 900.0
    # rows a training job may read: TSV keeps every row's cached prefix in memory (~0.1 MB a row on Gemma 3
    # 270M), so this bounds memory as well as time; TruthfulQA's full expansion (~6,000 answers) fits
    max_train_rows: int = 8000
    # ---- the queue and the decode batch (many sessions' generations decode together, model/engine.py)
    queue_max_size: int = 64
    batch_requests: int = 8  # generations decoded together (3 rows each); more wait for a free place
    waiting_generations: int = 8  # beyond this a generation is refused with "busy, try again"
    generations_per_session: int = 2  # one visitor's generations at once (a slider release and a button)
    generation_seconds: float = 300.0  # one generation's time limit, waiting included
    # ---- disk
    export_max_bytes: int = 512 << 20  # all exported files kept for download, oldest removed first
    export_keep_seconds: float = 3600.0
    activation_cache_max_bytes: int = 2 << 30



def device_allowed(device: str | None) -> bool:
    return bool(DEVICE_PATTERN.match(str(device or "auto").strip()))


def valid_session_id(session: str | None) -> bool:
    return bool(session) and bool(SESSION_PATTERN.match(str(session)))
