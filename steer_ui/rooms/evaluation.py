"""One vector over many prompts: both generations of every prompt from the shared decode batch, planned before
any model work (:mod:`steer_ui.admission`), and the margins and steerability of :mod:`steer_ui.steerability`."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import admission, guards, steering_spec
from ..messages import Said, UserError
from .common import Shared, expected_errors, first_line, said_of
from .datasets import Datasets
from .explore import Explore
from .library import LAST_COMPARISON, Library
from .models import Models
from .training import Training


@dataclass
class Evaluation:
    shared: Shared
    models: Models
    library: Library
    datasets: Datasets
    explore: Explore
    training: Training  # its line of long jobs: a comparison takes its turn there and ends on Cancel

    def _prompts(self, session: str | None, prompts: Any, use_dataset: bool) -> tuple[list[str], list | None]:
        """The prompts to compare (pasted, one per line, or the dataset's held-out pairs) and their pairs."""
        p = self.shared.policy
        if use_dataset:
            pairs = self.datasets.held_out_pairs(session)
            return [pair.prompt for pair in pairs][: p.max_compare_prompts], pairs[: p.max_compare_prompts]
        raw = guards.text(prompts, "prompts", p.max_prompt_chars * p.max_compare_prompts, allow_empty=True)
        texts = [line.strip() for line in raw.splitlines() if line.strip()]
        if len(texts) > p.max_compare_prompts:
            raise UserError("too_many_prompts", count=len(texts), limit=p.max_compare_prompts)
        return texts, None

    def _alphas(self, alphas, top: float) -> list[float]:
        """The α a pair's steerability is read at: those given (2 or more distinct), else a grid over ±``top``."""
        from .. import steerability

        if alphas is None or not len(alphas):
            return steerability.alpha_grid(top)
        limit = self.shared.policy.max_sweep_points
        if len(alphas) > limit:
            raise UserError("too_many_values", what="alphas", count=len(alphas), limit=limit)
        alphas = sorted({self.shared.guard.alpha(a, "alphas") for a in alphas})
        if len(alphas) < 2:  # a slope needs two distinct α
            raise UserError("too_few_values", what="alphas", count=len(alphas), least=2)
        return alphas

    def compare(self, session: str | None, prompts: Any = "", use_dataset: bool = False,
                vector_name: str | None = None, layer: int | None = None, alpha: float = 0.0, relative: bool = True,
                seed: int = 0, alpha_max: float = 1.0, sampling=None, progress=None, alphas=None,
                positions: str | None = None, held=None) -> dict:
        """One vector over many prompts (pasted, one per line, or the loaded dataset's held-out pairs): both
        generations of every prompt from the shared decode batch, and per prompt and overall the numbers of
        :mod:`steer_ui.steerability` (margins and steerability when the prompts come with pairs, over ``alphas``
        or a grid over ±``alpha_max``).  ``held``: a steering spec of other vectors steering beside this one (the
        page's added vectors): in both generations, and unchanged along the margins' α."""
        from .. import steerability
        from ..model.budget import count_tokens
        from ..model.engine import EngineBusy
        from ..model.hooks import Steer

        p, guard, steers_of = self.shared.policy, self.shared.guard, self.library.steers
        flag = guards.flag(use_dataset, "use_dataset")
        texts, pairs = self._prompts(session, prompts, flag)
        if not texts:
            raise UserError("no_prompts")
        sampling = sampling or self.explore.sampling()
        guard.texts(self.models.handle, texts, "prompt", rows=3, new_tokens=sampling.max_new_tokens)
        alpha = guard.alpha(alpha)
        top = abs(guard.alpha(alpha_max, "alpha_max"))
        if top == 0:
            raise UserError("number_not_positive", what="alpha_max", value="0")
        layer = None if layer is None else guard.layer(self.models.handle, layer)  # once: the read-out and the save
        others = self.library.steers_for(session, held) if held is not None else []
        steers = steers_of(session, vector_name, layer, alpha, relative, seed, positions) + others
        unit = steers_of(session, vector_name, layer, 1.0, relative, seed, positions)
        unit_steer = unit[0] if len(unit) == 1 and isinstance(unit[0], Steer) else None
        scale = float(unit_steer.alpha.reshape(-1)[0]) if unit_steer is not None else 1.0
        alphas = self._alphas(alphas, top)
        alphas = alphas if pairs else None
        if pairs and unit_steer is None:
            raise UserError("sweep_unsupported")
        engine = self.models.engine()
        handle = self.models.handle
        # the teacher-forced passes: a prompt with a generation (3 rows' worth covers both texts), and a pair's
        # completions with one row per α of the grid
        reading_rows = len(alphas or [0]) + 2
        reading = guard.texts(handle, texts, "prompt", rows=reading_rows, new_tokens=sampling.max_new_tokens)
        # its share of the working memory and its time at the engine's measured speed, before any model work
        plan = admission.plan_comparison(handle, engine.measured(), p, [count_tokens(handle, t) for t in texts],
                                         sampling.max_new_tokens, reading_rows)
        try:
            requests = steerability.requests_for(engine.handle, texts, steers, sampling)
        except expected_errors() as exc:
            raise UserError("generation_failed", detail=said_of(exc)) from None
        s = self.shared.find(session)
        # a long job like any other: its turn in the line (the decode batch, not the model's lock), Cancel
        with self.training.job(s, handle, progress, kind="compare", model_lock=False) as report:
            # each line keyed (messages.Said), so the page says it in the visitor's language
            waiting = lambda wait: report(0.0, Said(wait.key, **wait.params))  # noqa: E731
            with guard.reserve(plan.reserve_bytes, long=True, waiting=waiting):
                try:
                    report(0.0, Said("progress_generating_prompts", n=len(texts)))
                    generated = steerability.generate_all(
                        engine, requests, plan.in_flight, texts, seconds=p.compare_seconds,
                        progress=lambda done, total: report(0.5 * done / total,
                                                            Said("progress_prompts_done", done=done, total=total)))
                except EngineBusy as exc:
                    raise UserError("busy", detail=first_line(exc)) from None
            finished = [i for i, g in enumerate(generated) if g is not None]
            if not finished:
                raise UserError("compare_timeout", limit=int(p.compare_seconds))
            asked = len(texts)
            stopped = len(finished) < asked
            if stopped:  # the time limit came first: the prompts that finished, and a line saying so
                generated, texts = [generated[i] for i in finished], [texts[i] for i in finished]
                pairs = [pairs[i] for i in finished] if pairs else pairs
            try:
                with guard.reserve(reading, long=True):
                    out = steerability.compare(self.models.handle, generated, steers, unit_steer, scale, pairs,
                                               alphas, alpha, progress=lambda f, m="": report(0.5 + f / 2, m),
                                               vector=self.library.get_vector(session, vector_name, layer, seed),
                                               held=others)
            except expected_errors() as exc:
                raise UserError("explore_failed", detail=said_of(exc)) from None
        out["summary"]["units"] = "relative" if relative else "raw"
        if stopped:
            out["summary"]["stopped"] = {"done": len(finished), "total": asked, "limit": int(p.compare_seconds)}
        # what *Save result* on the Many prompts tab keeps: the table and the settings it was made from
        s.cache[LAST_COMPARISON] = {"comparison": out, "settings": {
            "prompts": texts, "use_dataset": flag, "vector": vector_name, "layer": layer, "alpha": alpha,
            "relative": bool(relative), "seed": int(seed or 0), "alpha_max": top,
            "max_new_tokens": sampling.max_new_tokens,
            "held": None if held is None else steering_spec.parse(held).as_dict()}}
        return out
