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
WEIGHTS = ("float32", "bfloat16", "int8")  # --weights besides auto (steer_ui.model.precision)
DECODE_SETTINGS = ("auto", "static", "dynamic", "fused")  # --decode / STEER_UI_DECODE (steer_ui.model.static_decode)
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
    weights: str = "auto"  # float32, bfloat16, int8 or auto (steer_ui.model.precision); the administrator's too
    # ---- text and generation: a character cap as a cheap first gate, then tokens, which are what costs
    max_prompt_chars: int = 4000  # every dataset cell too, as the file is parsed (data.datasets.load_dataset)
    max_prompt_tokens: int = 1024  # any one text: a prompt, a target, an answer after its prompt, a dataset cell
    # working memory one request may need, by model/budget.py's formula (tokens × rows × the model's shape)
    max_request_bytes: int = 512 << 20
    # the same, summed over the requests running at once; a request waits for room, then hears "busy"
    max_inflight_bytes: int = 512 << 20
    inflight_wait_seconds: float = 30.0
    # of that budget, what long jobs (a comparison of many prompts) may hold together: slider moves, next-token
    # calls and single generations always find the rest (steer_ui/admission.py)
    long_job_share: float = 0.5
    max_new_tokens: int = 256
    max_top_k: int = 100
    max_sweep_points: int = 101
    max_alpha: float = 1e6  # |α| in either unit; NaN and inf are refused anyway
    max_detect_answers: int = 512
    max_compare_prompts: int = 64  # prompts one "many prompts" comparison runs (issue #31)
    # of them in the shared decode batch at once; each place is refilled when its prompt ends, after any visitor
    # already waiting (steerability.generate_all), so a visitor waits at most one prompt's generation
    compare_in_flight: int = 8
    # one comparison's time limit: refused up front when its estimate at the engine's measured speed passes it,
    # stopped there (its finished prompts returned) when it runs past it anyway
    compare_seconds: float = 300.0
    # ---- sessions (one per browser tab or gradio_client.Client; see steer_ui/sessions.py)
    max_sessions: int = 256
    sessions_per_address: int = 64  # kept sessions admitted from one client address
    new_sessions_burst: int = 64  # new sessions one address may open at once ...
    new_sessions_per_minute: int = 60  # ... and then this many a minute
    session_grace_seconds: float = 60.0  # an empty session used this recently is not evicted for a newcomer
    max_vectors_per_session: int = 32
    max_steering_terms: int = 8  # vectors one request steers with at once (steering_spec.MAX_TERMS)
    max_session_bytes: int = 256 << 20  # tensors of the session's vectors plus its dataset
    max_total_session_bytes: int = 1 << 30  # the same, summed over every session: what all visitors may hold
    session_idle_seconds: float = 4 * 3600.0
    # ---- the library (steer_ui/store): what owners keep across reloads and restarts
    owner_max_vectors: int = 64
    owner_max_datasets: int = 8
    owner_max_results: int = 500
    owner_max_bytes: int = 256 << 20  # an owner's vectors, datasets and results together
    owner_settings_chars: int = 4096
    max_result_chars: int = 2 << 20  # one saved result as JSON (both generations with their per-token numbers)
    store_max_bytes: int = 4 << 30  # the whole store; the longest-absent owners' unshared work goes first
    owner_idle_days: float = 90.0  # unshared vectors and datasets of owners not seen for this long are removed
    id_misses_per_minute: int = 30  # share and result ids that resolve to nothing, per client, before a pause
    # ---- long jobs (training, probing every layer, detection)
    job_seconds: float = 900.0
    # rows a training job may read: TSV keeps every row's cached prefix in memory (~0.1 MB a row on Gemma 3
    # 270M), so this bounds memory as well as time; TruthfulQA's full expansion (~6,000 answers) fits
    max_train_rows: int = 8000
    max_train_tokens: int = 400_000  # all text cells of a training or detection file together
    # ---- the queue and the decode batch (many sessions' generations decode together, model/engine.py)
    queue_max_size: int = 64
    queued_per_session: int = 4  # requests one session may have waiting (a newer slider move replaces an older)
    # ... and waiting or running: the Explore slots run many requests at once, so without this one page could
    # hold most of them with requests that never wait (an honest page has at most ~5 in progress)
    requests_per_session: int = 8
    queued_per_address: int = 32  # requests one client address may have waiting, over all its sessions
    max_body_bytes: int = 4 << 20  # one request's JSON body (files go through the upload route, --max-file-size)
    batch_requests: int = 8  # generations decoded together (3 rows each); more wait for a free place
    waiting_generations: int = 8  # beyond this a generation is refused with "busy, try again"
    generations_per_session: int = 2  # one visitor's generations at once (the page's newest cancels its older)
    # how long the page's generation (Explore's, a chat turn) waits for one of those places: the ones it
    # cancelled, or an API caller's, give theirs back within a step or two of the engine
    page_wait_s: float = 5.0
    # Save result calls waiting for their page's generation at once, over all sessions (one per session): each
    # holds one of the server's threads (the call is answered outside the queue)
    generation_waiters: int = 4
    generation_seconds: float = 300.0  # one generation's time limit, waiting included
    # ---- disk
    export_max_bytes: int = 512 << 20  # all exported files kept for download, oldest removed first
    export_keep_seconds: float = 3600.0
    activation_cache_max_bytes: int = 2 << 30


    @classmethod
    def local(cls) -> "Policy":
        """One person at their own machine (the CLI): the same checks, with room for long texts, long jobs and
        large files; what keeps a shared app safe for strangers (sessions, queues, quotas) stays as it is."""
        day = 24 * 3600.0
        return cls(max_prompt_tokens=32_768, max_request_bytes=16 << 30, max_inflight_bytes=16 << 30,
                   max_new_tokens=8192, max_top_k=1 << 20, compare_seconds=day, job_seconds=day,
                   max_train_rows=10_000_000, max_train_tokens=1 << 32, max_prompt_chars=1 << 20,
                   generation_seconds=day, max_detect_answers=1 << 20, max_compare_prompts=1 << 16)


def device_allowed(device: str | None) -> bool:
    return bool(DEVICE_PATTERN.match(str(device or "auto").strip()))


def valid_session_id(session: str | None) -> bool:
    return bool(session) and bool(SESSION_PATTERN.match(str(session)))
