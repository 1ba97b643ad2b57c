"""The chat room: a conversation with the unsteered and the steered assistant side by side (issue #48).

Each side keeps its own history: the steered assistant's next turn reads the steered assistant's earlier replies,
the unsteered one's its own, so the two conversations drift apart as they would with two separate models.  The
conversation lives on the server, in the session (``Session.chat``), bounded in turns and characters here and in
tokens by the models room (:meth:`Models.chat_prompt`, which says how many turns to drop).  A turn that does not
finish (a refusal, a closed stream) leaves the conversation as it was.

Steering acts on the generated tokens by default: the terms' positions become ``last``, the last prompt token
(the end of the template's generation prompt, from which the assistant's first token is predicted) and every
generated one, so the first token is steered as well.  ``steer_prompt`` makes it ``all``: the conversation's text
tokens too.  Special tokens (the template's turn markers, BOS) are never steered unless a term asks
(:mod:`steer_ui.model.hooks`).
"""
from __future__ import annotations

import dataclasses
import time
from typing import Iterator

import torch

from .. import chat, guards
from ..messages import UserError
from ..model.hooks import special_positions
from .common import Shared

MAX_TURNS = 8  # user turns a conversation keeps; the token bound usually comes first
MAX_CHARS = 24_000  # the whole conversation, both sides' replies included
MAX_SYSTEM_CHARS = 4_000


def empty() -> dict:
    return {"system": "", "turns": []}


class Chat:
    def __init__(self, shared: Shared, models, library, explore):
        self.shared, self.models, self.library, self.explore = shared, models, library, explore

    def template(self) -> dict:
        """Where the chat template comes from ("file", "tokenizer", "gemma-turns" or "none") and whether the model
        is a base model answering loosely (Gemma's turn format on a model without a template of its own)."""
        _, source = chat.template_of(self.models.handle, self.models.chat_template)
        return {"source": source, "base_model": source == "gemma-turns", "model": str(self.models.handle.model_id)}

    def view(self, session: str | None) -> dict:
        """The session's conversation: ``{"system", "turns": [{"user", "unsteered", "steered", "steering"}]}``."""
        s = self.shared.find(session)
        conv = s.chat or empty()
        return {"system": conv["system"], "turns": [dict(t) for t in conv["turns"]]}

    def save(self, session: str | None) -> str:
        """Freeze the session's conversation (both sides, every turn's steering) as a saved result; its id opens it
        read-only for anyone, without running the model."""
        s = self.shared.find(session)
        if not s.chat or not s.chat["turns"]:
            raise UserError("no_chat")
        first = s.chat["turns"][-1]["steering"]["vectors"][0]  # the vector kept with the result, to run it live
        vector = None if first["source"] == "random" else first["source"]
        # and every other vector a turn was steered with (the added rows, an earlier turn's), each kept the same way
        others = [t["source"] for turn in s.chat["turns"] for t in turn["steering"]["vectors"]
                  if t["source"] != "random"]
        return self.library.freeze(s, {"kind": "chat", "chat": self.view(session), "template": self.template()},
                                   vector, others)

    def rerun(self, session: str | None, result_id, client: str | None = None, sampling=None) -> Iterator[dict]:
        """A saved conversation run live (its page's *Run live*): the session's conversation starts afresh with the
        saved system message, and each saved user message is asked again under its turn's saved steering (the
        vector the result kept, opened into the session read-only as a shared one is), so both assistants answer
        anew, each from its own new history, and the session goes on chatting from there.  Streamed as
        :meth:`turn`'s frames, each with ``turn`` (0-based)."""
        saved = self.library.result(result_id, client)
        if saved.get("kind") != "chat":
            raise UserError("no_saved_chat")
        conv = saved["chat"]
        vector = self.library.open_result_vector(session, result_id, client) if saved.get("has_vector") else None
        kept = self.library.open_result_terms(session, result_id, client)  # the other terms' vectors, kept with it
        self.reset(session)
        last = conv["turns"][-1]["steering"]["vectors"][0]["source"] if conv["turns"] else None
        for n, t in enumerate(conv["turns"]):
            steering = {"vectors": [dict(term) for term in t["steering"]["vectors"]]}
            for term in steering["vectors"]:  # the owner's vectors, as kept with it
                if vector and term["source"] == last:
                    term["source"] = vector
                elif term["source"] in kept:
                    term["source"] = kept[term["source"]]
            for frame in self.turn(session, t["user"], steering, conv["system"], t.get("steer_prompt", False),
                                   sampling):
                yield {**frame, "turn": n}

    def reset(self, session: str | None) -> dict:
        self.shared.find(session).chat = None
        return empty()

    @staticmethod
    def messages(conv: dict, side: str, user: str) -> list[dict]:
        """The messages one side's next turn reads: the system message, every earlier turn with this side's own
        reply, then ``user``."""
        out = [{"role": "system", "content": conv["system"]}] if conv["system"] else []
        for t in conv["turns"]:
            out += [{"role": "user", "content": t["user"]}, {"role": "assistant", "content": t[side]}]
        return out + [{"role": "user", "content": user}]

    def prompts(self, session: str | None, message, system=None) -> dict:
        """The rendered prompts of the next turn for each side (what the model reads), without running it."""
        conv, user = self._next(self.shared.find(session), message, system)
        return {side: self.models.chat_prompt(self.messages(conv, side, user)) for side in ("unsteered", "steered")}

    def turn(self, session: str | None, message, steering, system=None, steer_prompt=False,
             sampling=None) -> Iterator[dict]:
        """One user turn answered by both sides, streamed: each yield is ``{"user", "unsteered", "steered",
        "done", "prompts"}``; the last (``done``) is kept in the conversation."""
        s = self.shared.find(session)
        before = s.chat
        conv, user = self._next(s, message, system)
        spec = self._spec(steering, steer_prompt)
        prompts = {side: self.models.chat_prompt(self.messages(conv, side, user)) for side in ("unsteered", "steered")}
        started = time.monotonic()
        last = {"user": user, "unsteered": "", "steered": "", "done": False, "prompts": prompts}
        for texts in self._both(session, prompts, spec, self._sampling(sampling, prompts["steered"])):
            last = {**last, **texts}
            yield last
        reply = {"user": user, "unsteered": last["unsteered"], "steered": last["steered"],
                 "steering": spec.as_dict(), "steer_prompt": spec.terms[0].positions == "all",
                 "seconds": round(time.monotonic() - started, 2)}
        if s.chat is not before:
            raise UserError("chat_changed")  # a reset or another turn while this one ran: keep theirs
        turns = conv["turns"] + [reply]
        if _chars(conv["system"], turns) > MAX_CHARS:
            raise UserError("chat_full", limit=MAX_CHARS)
        s.chat = {"system": conv["system"], "turns": turns}
        yield {**last, "done": True}

    def answer(self, session: str | None, messages, steering, steer_prompt=False, sampling=None) -> Iterator[dict]:
        """Both sides' answers to a conversation given whole (OpenAI's messages, earlier assistant replies as
        given, the same for both), streamed as ``{"unsteered", "steered", "done", "prompt"}``; nothing is kept (the
        CLI's ``--messages``)."""
        spec = self._spec(steering, steer_prompt)
        prompt = self.models.chat_prompt(messages)
        last = {"unsteered": "", "steered": "", "done": False, "prompt": prompt}
        for texts in self._both(session, {"unsteered": prompt, "steered": prompt}, spec,
                                self._sampling(sampling, prompt)):
            last = {**last, **texts}
            yield last
        yield {**last, "done": True}

    def _spec(self, steering, steer_prompt):
        """The spec with every term's positions made the chat's: ``last`` (the generation prompt's last token and
        the generated ones), or ``all`` when the prompt is steered too."""
        from ..steering_spec import parse

        positions = "all" if guards.flag(steer_prompt, "steer_prompt") else "last"
        spec = parse(steering, self.shared.policy.max_steering_terms, self.models.handle.arch.num_layers)
        return dataclasses.replace(spec, terms=tuple(dataclasses.replace(t, positions=positions) for t in spec.terms))

    def _sampling(self, sampling, prompt: str):
        sampling = self.explore.sampling() if sampling is None else sampling
        return dataclasses.replace(sampling, stop_ids=self._markers(prompt))

    def _markers(self, prompt: str) -> tuple[int, ...]:
        """The special tokens the rendered conversation holds (its turn markers, BOS): any of them ends an
        assistant's turn (a base model given Gemma's turns does not know <end_of_turn> as its EOS)."""
        handle = self.models.handle
        ids = torch.tensor(handle.tokenizer(prompt).input_ids)
        return tuple(sorted(set(ids[special_positions(handle, ids)].tolist())))

    def _next(self, s, message, system) -> tuple[dict, str]:
        """(the conversation the next turn continues, the checked user message), bounded."""
        conv = s.chat or empty()
        user = guards.text(message, "message", chat.MAX_MESSAGE_CHARS).strip()  # refuses an empty one
        if system is not None:
            system = guards.text(system, "system", MAX_SYSTEM_CHARS, allow_empty=True).strip()
            if conv["turns"] and system != conv["system"]:
                raise UserError("chat_system_fixed")  # the earlier turns were answered under the old one
            conv = {"system": system, "turns": conv["turns"]}
        if len(conv["turns"]) >= MAX_TURNS:
            raise UserError("chat_turns", limit=MAX_TURNS)
        if _chars(conv["system"], conv["turns"]) + len(user) > MAX_CHARS:
            raise UserError("chat_full", limit=MAX_CHARS)
        return conv, user

    def _both(self, session, prompts: dict, spec, sampling) -> Iterator[dict]:
        """Both sides' texts as they decode.  While the histories agree (the first turn) one request gives both
        sides; after that each side is its own request on its own prompt (the unsteered row of the unsteered
        side's, the steered row of the steered side's), decoding together in the engine's batch."""
        def stream(*args):  # a turn's generations take the page's Explore ones' places, never give theirs up
            return self.explore.stream_generate_for(*args, turn=True)

        if prompts["unsteered"] == prompts["steered"]:
            for frame in stream(session, prompts["steered"], spec, sampling):
                yield {"unsteered": frame.unsteered_text, "steered": frame.steered_text}
            return
        streams = {"unsteered": stream(session, prompts["unsteered"], spec, sampling),
                   "steered": stream(session, prompts["steered"], spec, sampling)}
        texts = {"unsteered": "", "steered": ""}
        try:
            while streams:
                for side in list(streams):
                    frame = next(streams[side], None)
                    if frame is None:
                        del streams[side]
                        continue
                    texts[side] = frame.unsteered_text if side == "unsteered" else frame.steered_text
                yield dict(texts)
        finally:
            for gen in streams.values():
                gen.close()


def _chars(system: str, turns: list[dict]) -> int:
    return len(system) + sum(len(t["user"]) + len(t["unsteered"]) + len(t["steered"]) for t in turns)
