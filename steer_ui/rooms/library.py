"""The vectors a session can use and what it keeps in the library: its own vectors, the shared and listed ones,
share ids, and saved results (an Explore view or a Many prompts comparison), over :mod:`steer_ui.keeping`."""
from __future__ import annotations

import datetime
import json
import re
from dataclasses import dataclass

from .. import guards, names
from ..messages import UserError
from ..sessions import vector_bytes
from ..steering import steering_kind
from ..steering_spec import RANDOM_SOURCE, parse
from ..store.library import PUBLIC_ID
from .common import RANDOM, Shared, expected_errors, refusal
from .models import Models

LAST_COMPARISON = "last_comparison"  # Session.cache key: the last Many prompts comparison, for Save result


@dataclass
class Library:
    shared: Shared
    models: Models

    # ------------------------------------------------------------ shares
    def share_vector(self, session: str | None, name: str) -> str:
        """Share the session's own kept vector ``name``: its unguessable share id (the same one each time)."""
        return self.shared.keeper.share(self.shared.find(session), guards.text(name, "vector", 200))

    def unshare_vector(self, session: str | None, name: str) -> bool:
        return self.shared.keeper.unshare(self.shared.find(session), guards.text(name, "vector", 200))

    def open_shared(self, session: str | None, share_id, client: str | None = None) -> str:
        """Add the vector shared under ``share_id`` to the session, read-only; its name in the session's list."""
        return self.shared.keeper.open_shared(self.shared.find(session), share_id, client, self.models.handle)

    def share_id_of(self, session: str | None, name: str | None) -> str:
        return self.shared.keeper.share_id_of(self.shared.find(session), name) if name else ""

    # ----------------------------------------------------------- vectors
    def vectors(self, session: str | None) -> list[dict]:
        """What this session can use, each with where it comes from (own / shared / listed / bundled / random)."""
        s = self.shared.find(session)
        own = list(dict.fromkeys([n for n in s.vectors if n not in s.shared] + list(s.stored)))
        rows = [{"name": RANDOM, "kind": "random"}]
        rows += [{"name": n, "kind": "listed" if n in self.models.published else "bundled"}
                 for n in self.models.bundled_vectors]
        rows += [{"name": n, "kind": "own", "share_id": self.shared.keeper.share_id_of(s, n) or None} for n in own]
        rows += [{"name": n, "kind": "shared", "share_id": i} for n, i in s.shared.items()]
        return rows

    def vector_names(self, session: str | None) -> list[str]:
        """Every vector this session can use: the random direction, the server's bundled and listed ones, its own
        (kept in the library too), and those opened by a share link."""
        return [row["name"] for row in self.vectors(session)]

    def add_vector(self, session: str | None, vector, name: str | None = None, report: dict | None = None) -> str:
        s = self.shared.find(session)
        policy, bundled = self.shared.policy, self.models.bundled_vectors
        if len(s.vectors) >= policy.max_vectors_per_session:
            raise UserError("too_many_vectors", limit=policy.max_vectors_per_session)
        self.shared.sessions.check_bytes(s, vector_bytes(vector))
        base = name or vector.name or vector.method
        base = names.checked(re.sub(r"\s+", " ", str(base)).strip() or "vector")  # listed as it is, one line
        if base in (RANDOM, RANDOM_SOURCE) or base in bundled:  # "random" in a steering spec is the random direction
            base = f"{base} (saved)"
        unique, n = base, 2
        while unique in s.vectors or unique in s.stored or unique in bundled:
            unique, n = f"{base} ({n})", n + 1
        if not vector.name:
            vector.name = unique
        self.shared.keeper.keep_vector(s, unique, vector, self.models.current)  # first: a refused save changes nothing
        s.vectors[unique] = vector
        if report is not None:
            s.reports[unique] = report
        return unique

    def get_vector(self, session: str | None, name: str | None, layer: int | None = None, seed: int = 0):
        """The session's vector ``name``, or a seeded random direction at ``layer`` for :data:`RANDOM`."""
        from ..vector import random_vector

        guard, keeper = self.shared.guard, self.shared.keeper
        if not name or name == RANDOM:
            handle = self.models.handle
            layer = guard.layer(handle, layer if layer is not None else handle.arch.num_layers // 2)
            return random_vector(handle.arch.hidden_size, layer, seed=guard.seed(seed), model_id=handle.model_id,
                                 model_type=handle.model_type)
        s = self.shared.find(session)
        if name in s.vectors:
            return s.vectors[name]
        if name in self.models.bundled_vectors:  # shared and read-only: nothing a session does changes them
            return self.models.bundled_vectors[name]
        kept = keeper.stored_vector(s, name, self.models.handle) if isinstance(name, str) else None
        if kept is not None:
            return kept
        if keeper.on and isinstance(name, str) and PUBLIC_ID.match(name):  # every endpoint takes a share id
            return self.get_vector(session, self.open_shared(session, name, s.client))  # its name in the session
        raise UserError("unknown_vector", name=str(name)[:80], known=", ".join(self.vector_names(session)[1:]) or
                        "none")

    def vector_info(self, session: str | None, name: str | None) -> dict:
        """Metadata of a vector (layers, method, recommended α range, metrics) for the pickers."""
        if not name or name == RANDOM:
            handle = self.models.handle
            return {"name": RANDOM, "method": "random", "layers": [handle.arch.num_layers // 2],
                    "alpha_range": None, "input_dependent": False}
        vector = self.get_vector(session, name)
        meta = vector.metadata()
        meta["input_dependent"] = steering_kind(vector) == "input"
        meta["steering"] = steering_kind(vector)
        return meta

    @staticmethod
    def _vector_layer(vector, layer) -> int | None:
        """Single-layer vectors move to the chosen layer; multi-layer and input-dependent ones keep theirs."""
        if layer is None or steering_kind(vector) != "static" or len(vector.layers) > 1:
            return None
        return int(layer)

    def steers(self, session: str | None, vector_name: str | None, layer: int | None, alpha: float,
               relative: bool = True, seed: int = 0, positions: str | None = None,
               special_tokens: bool = False) -> list:
        """Hook specs for the chosen vector, layer and α (raw or relative units)."""
        from ..steering import build_steers

        guard, handle = self.shared.guard, self.models.handle
        if layer is not None:
            layer = guard.layer(handle, layer)
        vector = self.get_vector(session, vector_name, layer, seed)
        alpha = guard.alpha(alpha)
        try:
            steers = build_steers(handle, vector, alpha, layer=self._vector_layer(vector, layer),
                                  relative=guards.flag(relative, "relative"), positions=positions,
                                  special_tokens=guards.flag(special_tokens, "special_tokens"))
        except UserError:
            raise
        except expected_errors() as exc:  # check_compatible's refusals are keyed; others keep their English detail
            raise refusal(exc, "steering_failed") from None
        guard.pushes(handle, steers)
        return steers

    def steers_for(self, session: str | None, steering) -> list:
        """Hook specs for a steering spec of several terms (:mod:`steer_ui.steering_spec`): each term's vector by
        its own method, at each of its layers (a movable one-layer direction may act at several; other vectors
        keep their own sites); terms at one layer add, since their hooks add in turn."""
        from .. import steering_spec

        handle = self.models.handle
        spec = steering_spec.parse(steering, self.shared.policy.max_steering_terms, layers=handle.arch.num_layers)
        steers: list = []
        for term in spec.terms:
            source = RANDOM if term.random else term.source
            vector = self.get_vector(session, source, term.layers[0] if term.layers else None, term.seed)
            movable = term.random or self._vector_layer(vector, 0) is not None
            for layer in (term.layers if movable and term.layers else (term.layers[:1] or (None,))):
                steers += self.steers(session, source, layer, term.scale, term.normalize, term.seed, term.positions,
                                      term.special_tokens)
        self.shared.guard.pushes(handle, steers)  # terms at one layer add: their sum must stay finite too
        return steers

    def applied(self, session: str | None, steering) -> dict:
        """What a spec steers with, term by term, as an answer echoes it: the source as asked and the name it
        resolved to, and each hook's layer with α in both units (raw; relative to the layer's typical residual
        norm, where the hook is one direction)."""
        from .. import steering_spec
        from ..model.hooks import Steer
        from ..model.units import relative_scale

        handle = self.models.handle
        spec = steering_spec.parse(steering, self.shared.policy.max_steering_terms, layers=handle.arch.num_layers)
        terms = []
        for term in spec.terms:
            one = steering_spec.Spec((term,))
            hooks = []
            for s in self.steers_for(session, one):
                raw = float(s.alpha.reshape(-1)[0])
                if isinstance(s, Steer) and s.fn is None and s.vector.ndim == 1:  # one direction at one block
                    relative = raw * float(s.vector.norm()) / max(relative_scale(handle, s.layer), 1e-12)
                    hooks.append({"layer": s.layer, "raw_alpha": raw, "relative_alpha": relative})
                else:  # per input (L2S) or per head (ITI): no one length to measure against the layer's norm
                    layers = [s.layer] if isinstance(s, Steer) else sorted(s.shifts)
                    hooks += [{"layer": int(layer), "raw_alpha": raw, "relative_alpha": None} for layer in layers]
            terms.append({**term.as_dict(), "resolved": RANDOM if term.random else term.source, "hooks": hooks})
        return {"vectors": terms}

    # ---------------------------------------------------- saved results
    def freeze(self, s, payload: dict, vector_name, term_names=()) -> str:
        """Keep ``payload`` (stamped with the model and the time) as a saved result; its id.  ``term_names``: the
        other vectors it was steered with, kept with it as ``vector_name`` is (:meth:`open_result_terms`)."""
        payload = {**payload, "model_id": self.models.handle.model_id,
                   "when": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
        text = json.dumps(payload)
        limit = self.shared.policy.max_result_chars
        if len(text) > limit:
            raise UserError("text_too_long", what="result", size=len(text), limit=limit)
        return self.shared.keeper.save_result(s, payload, vector_name, self.models.handle, term_names)

    def save_result(self, session: str | None, view: dict, generation: bool = True) -> str:
        """Freeze the session's last Explore view (``view``: its settings and next-token numbers) with its last
        generation; its id opens it for anyone, without running the model.  ``generation=False``: ``view`` alone
        (kind "link": a prompt too long for a link, whose id the link carries instead)."""
        s = self.shared.find(session)
        if not generation:  # only the prompt, bounded as every prompt is
            prompt = guards.text(view.get("prompt"), "prompt", self.shared.policy.max_prompt_chars)
            return self.freeze(s, {"kind": "link", "view": {"prompt": prompt}}, None)
        generation = self._generation_for(s, view)
        return self.freeze(s, {"view": view, "generation": generation}, view.get("vector"),
                           added_sources(view.get("extra")))

    def _generation_for(self, s, view: dict) -> dict:
        """The session's last generation, once it is the one made for ``view``'s settings: Save pressed while the
        page's newest generation still decodes waits for it (``policy.page_wait_s``), or the saved result would
        pair the view with the previous settings' text; still decoding after that, refused.  With nothing
        decoding the last one is kept as it is (the page shows it, marked stale where it differs)."""
        if not self.shared.sessions.wait_for_generation(s, lambda: _made_for(s.last_generation, view),
                                                        self.shared.policy.page_wait_s):
            raise UserError("generation_running")  # not waited for: another save of this page already waits
        if not s.last_generation:
            raise UserError("no_generation")
        if not _made_for(s.last_generation, view) and s.generating:
            raise UserError("generation_running")
        return s.last_generation

    def save_comparison(self, session: str | None) -> str:
        """Freeze the session's last *Many prompts* comparison (its settings, every row and the summary); its id
        opens the whole table for anyone, without running the model.  The added rows' own vectors (``held``) are
        kept with it as the main one is (:meth:`open_result_terms`)."""
        s = self.shared.find(session)
        last = s.cache.get(LAST_COMPARISON)
        if not last:
            raise UserError("no_comparison")
        return self.freeze(s, {"kind": "comparison", "comparison": last["comparison"], "settings": last["settings"]},
                           last["settings"].get("vector"), added_sources(last["settings"].get("held")))

    def open_result_vector(self, session: str | None, result_id, client: str | None = None) -> str | None:
        """Put the vector a saved result was made with into the session (read-only, as a shared one is), so the
        result can run live; its name there, or None when the result used a bundled or random vector."""
        vector = self.shared.keeper.result_vector(result_id, client, self.models.handle)
        if vector is None:
            return None
        s = self.shared.find(session)
        name = f"{vector.name} (saved result)"
        s.vectors.setdefault(name, vector)
        return name

    def open_result_terms(self, session: str | None, result_id, client: str | None = None) -> dict:
        """Put the other vectors a saved result was steered with (an Explore view's added rows, a conversation's
        terms) into the session, read-only, as :meth:`open_result_vector` does the main one: ``{name as saved:
        name here}``, empty when every one was bundled or random."""
        s = self.shared.find(session)
        out = {}
        for saved, vector in self.shared.keeper.result_term_vectors(result_id, client, self.models.handle).items():
            out[saved] = name = f"{saved} (saved result)"
            s.vectors.setdefault(name, vector)
        return out

    def result(self, result_id, client: str | None = None) -> dict:
        """A saved result as it was saved, read without running the model."""
        return self.shared.keeper.result(result_id, client)


def added_sources(extra) -> list[str]:
    """The vectors an Explore view's added rows name (``extra``, a spec's text, or a comparison's ``held``, its
    dict); bundled or random ones are kept by name and left out by the keeper.  A spec that does not parse adds
    none (the view ran with it)."""
    if not isinstance(extra, (str, dict)) or not extra or (isinstance(extra, str) and not extra.strip()):
        return []
    try:
        return [t.source for t in parse(extra).terms if not t.random]
    except UserError:
        return []


_SETTINGS = ("vector", "layer", "alpha", "relative", "seed")


def _made_for(generation: dict | None, view: dict) -> bool:
    """Whether ``generation`` was made for the settings ``view`` names (those it names: an API caller's view
    may name none)."""
    if not generation:
        return False
    made = {"prompt": generation.get("prompt"), **generation.get("settings", {})}
    for key in ("prompt",) + _SETTINGS:
        if key in view and key in made and not _same(view[key], made[key]):
            return False
    if "extra" in view and "settings" in generation:  # "" and None are both no added row
        return (view["extra"] or "") == (made.get("extra") or "")
    return True


def _same(a, b) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return abs(float(a) - float(b)) <= 1e-9 * max(1.0, abs(float(a)))
    return a == b
