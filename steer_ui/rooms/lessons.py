"""The Concepts tab's lessons: their inputs are bounded like every other request's
(texts in tokens, numbers as numbers), and each runs as a job (one at a time on the model, within the job
time limit, stopped by Cancel).

The maths lives in :mod:`steer_ui.concepts`; this module decides what a visitor may ask of it.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import concepts
from ..messages import KeyedError, UserError
from .common import Shared
from .models import Models
from .training import Training

MAX_BINS = 1000  # histogram bins of the lm_head row norms
MAX_DRAWS = 100_000  # next-token draws of the sampling lesson (one uniform each: cheap)
MAX_TIMED_TOKENS = 128  # tokens timed with and without the KV cache (the second run is quadratic)
MAX_KV_SEQ = 1 << 30  # the KV formula's sequence length and batch: arithmetic only, but shown as numbers
MAX_KV_BATCH = 1 << 20
MAX_TOKEN_CHARS = 100  # the explosion's token, typed as text
MAX_FIX_STEPS = 1000
MAX_BOUND = 1000.0
DEMO_KEY = "concepts_explosion"  # the session's last explosion, for the fix that follows it


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else "the input could not be used"


@dataclass
class Lessons:
    shared: Shared
    models: Models
    training: Training

    def _run(self, session: str | None, kind: str, work, progress=None):
        """``work(handle, report)`` as a job of ``session`` named ``kind`` in the line; a core refusal becomes one
        plain line."""
        s = self.shared.find(session)
        handle = self.models.handle
        with self.training.job(s, handle, progress, kind=kind) as report:
            try:
                return work(handle, report)
            except UserError:
                raise
            except ValueError as exc:  # ConceptsError, GenerationError, SteeringError are ValueErrors
                if isinstance(exc, KeyedError) and exc.key is not None:  # it names its message: said as such
                    raise UserError(exc.key, **exc.params) from None
                raise UserError("concepts_failed", detail=_first_line(exc)) from None

    def _sampling(self, temperature, top_k, top_p, repetition) -> dict:
        number = self.shared.guard.number
        return {"temperature": number(temperature, "temperature", low=0, high=100),
                "top_k": number(top_k or 0, "top_k", integer=True, low=0, high=1 << 20),
                "top_p": number(top_p, "top_p", low=0, high=1),
                "repetition_penalty": number(repetition, "repetition_penalty", low=0, high=100)}

    # ------------------------------------------------------------------ lessons
    def lm_head(self, session: str | None, bins=60):
        bins = self.shared.guard.number(bins if bins not in (None, "") else 60, "bins", integer=True, low=1,
                                         high=MAX_BINS)
        return self._run(session, "concepts_lm_head",
                         lambda h, _r: (concepts.lm_head_facts(h), concepts.row_norms(h, bins=bins)))

    def sampling(self, session: str | None, prompt, temperature=1.0, top_k=0, top_p=1.0, repetition=1.0):
        self.shared.guard.prompt(self.models.handle, prompt)
        settings = self._sampling(temperature, top_k, top_p, repetition)
        return self._run(session, "concepts_sampling", lambda h, _r: concepts.sampling_filters(h, prompt, **settings))

    def sample(self, session: str | None, prompt, temperature=1.0, top_k=0, top_p=1.0, repetition=1.0, n=100,
               seed=0):
        guard = self.shared.guard
        guard.prompt(self.models.handle, prompt)
        settings = self._sampling(temperature, top_k, top_p, repetition)
        n = guard.number(100 if n in (None, "") else n, "draws", integer=True, low=1, high=MAX_DRAWS)
        seed = guard.seed(seed)
        return self._run(session, "concepts_sample",
                         lambda h, _r: concepts.sample_many(h, prompt, n=n, seed=seed, **settings))

    def explode(self, session: str | None, prompt, layer=None, alpha=concepts.DEFAULT_EXPLOSION_ALPHA, token=None):
        """Steer along one token's unembedding row; the demo is kept in the session for :meth:`fix`."""
        from .. import guards

        guard, handle = self.shared.guard, self.models.handle
        guard.prompt(handle, prompt, rows=3, new_tokens=concepts.DEMO_TOKENS)
        layer = None if layer in (None, "") else guard.layer(handle, layer)
        alpha = guard.alpha(concepts.DEFAULT_EXPLOSION_ALPHA if alpha in (None, "") else alpha)
        if not alpha > 0:
            raise UserError("number_not_positive", what="alpha", value=str(alpha))
        token = guards.text(token, "token", MAX_TOKEN_CHARS, allow_empty=True) or None
        demo = self._run(session, "concepts_explode",
                         lambda h, _r: concepts.explode(h, prompt, layer, alpha, token, concepts.DEMO_TOKENS))
        self.shared.find(session).cache[DEMO_KEY] = demo
        return demo

    def fix(self, session: str | None, bound=concepts.DEFAULT_FIX_BOUND, steps=concepts.DEFAULT_FIX_STEPS,
            progress=None):
        """Constrain the session's last explosion so that no logit moves more than ``bound``."""
        guard = self.shared.guard
        bound = guard.number(concepts.DEFAULT_FIX_BOUND if bound in (None, "") else bound, "bound", low=0,
                             high=MAX_BOUND)
        if not bound > 0:
            raise UserError("number_not_positive", what="bound", value=str(bound))
        steps = guard.number(concepts.DEFAULT_FIX_STEPS if steps in (None, "") else steps, "steps", integer=True,
                             low=1, high=MAX_FIX_STEPS)
        demo = self.shared.find(session).cache.get(DEMO_KEY)
        if demo is None:
            raise UserError("concepts_no_demo")
        return self._run(session, "concepts_fix", lambda h, report: concepts.fix_explosion(
            h, demo, max_change=bound, steps=steps, max_new_tokens=concepts.DEMO_TOKENS, progress=report),
            progress)

    def kv(self, session: str | None, seq_len=4096, batch=1, dtype="bfloat16") -> dict:
        """The KV-cache formula for this model at ``seq_len`` × ``batch`` in ``dtype``, beside a measured cache."""
        guard = self.shared.guard
        seq_len = guard.number(seq_len, "seq_len", integer=True, low=1, high=MAX_KV_SEQ)
        batch = guard.number(batch, "batch", integer=True, low=1, high=MAX_KV_BATCH)
        if dtype not in concepts.DTYPE_BYTES:
            raise UserError("not_a_choice", what="dtype", value=str(dtype)[:20])

        def work(h, _report):
            layout = concepts.kv_layout(h.model.config)
            measured = concepts.measured_cache(h, concepts.DEFAULT_PROMPT)
            return {"layout": layout, "seq_len": seq_len, "batch": batch, "dtype": dtype, "measured": measured,
                    "table": concepts.kv_cache_table(layout, batch=batch, dtype=dtype)}

        return self._run(session, "concepts_kv", work)

    def time_cache(self, session: str | None, n_tokens=24):
        n_tokens = self.shared.guard.number(24 if n_tokens in (None, "") else n_tokens, "tokens", integer=True,
                                             low=1, high=MAX_TIMED_TOKENS)
        return self._run(session, "concepts_kv_time",
                         lambda h, report: concepts.time_cache(h, n_tokens, progress=report))
