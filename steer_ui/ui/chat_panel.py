"""Explore's Chat: a conversation answered by the unsteered and the steered assistant side by side (issue #48).

*Prompt kind* picks Completion (the tab as it always was) or Chat.  In Chat the steering is Explore's own controls, the
whole spec they show (the main vector and every added row, each with its own layer, α, units and seed: the same
terms a completion is steered by), and its sampling; each Send is one user turn, which both assistants answer, each
from its own history, streamed side by side; the bars show the next-token distribution of the steered assistant's
first token.  The conversation is the server's (the chat room, through the door); this page only draws it.
*Save result* freezes the whole conversation; its ``?result=`` link shows it read-only (:func:`ChatPanel.show_saved`
on the page load), with *Run live*: every saved user message asked again under its saved steering, both assistants
answering afresh from their own new histories (the saved replies are not replayed: the visitor sees this model
answer now), after which the visitor goes on chatting.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace

import gradio as gr

from .. import plots, steering_spec
from ..service import RANDOM, Service
from . import extra_terms, i18n, relabel
from ..messages import UserError
from .common import EXPLORE, T, handler, page_url, sid
from .request_guard import client_address

SHOW_CHAT = "show_chat"  # a saved conversation the page load is about to draw (set by library_ui.page_links)
CHAT_RESULT = "chat_result"  # the saved conversation this page shows, for its Run live
FRAME_INTERVAL_S = 0.25  # as Explore's generations: four frames a second read as live text


@dataclass
class ChatPanel:
    mode: gr.Radio
    group: gr.Group
    note: gr.Markdown
    unsteered: gr.Chatbot
    steered: gr.Chatbot
    bars: gr.Plot
    status: gr.Markdown
    link: gr.Textbox
    system: gr.Textbox
    run_live: gr.Button
    show_saved: object = None  # the page-load step that draws a saved conversation (?result=)

    @property
    def relabelled(self) -> list:
        """What a language switch redraws (ui/relabel.py): the lines and the chart with words in them."""
        return [self.note, self.bars, self.status]

    @property
    def saved_outputs(self) -> list:
        return [self.mode, self.group, self.note, self.unsteered, self.steered, self.system, self.run_live]


def bubbles(view: dict, side: str, pending: dict | None = None) -> list[dict]:
    """One side's conversation as a Chatbot's messages (its own replies only)."""
    out = []
    for t in view["turns"] + ([pending] if pending else []):
        out += [{"role": "user", "content": t["user"]}, {"role": "assistant", "content": t[side] or "…"}]
    return out


def note_line(lang: str, template: dict, saved: bool = False) -> str:
    """The line above the conversation: a saved one is read-only; a base model answers loosely; a model with no
    template cannot chat (the line names --chat-template)."""
    if saved:
        return i18n.label(lang, "chat.saved")
    model = i18n.plain(template.get("model", ""))
    if template["source"] == "none":
        return i18n.label(lang, "chat.no_template").format(model=model)
    if template.get("base_model"):
        return i18n.label(lang, "chat.base_model").format(model=model)
    return ""


def turn_spec(vector, layer, alpha, relative, vector_seed, extra, steer_prompt) -> dict:
    """The steering a chat turn asks for: the whole spec the page shows (the main row and every added row, each
    with its own layer, α, units and seed), every term acting where the chat steers: ``last`` (the generation
    prompt's last token and the generated ones), or ``all`` (``apply.phases`` prompt and generation) when the
    prompt is steered too.  The chat room sets the same positions; the first-token bars read them here."""
    spec = extra_terms.full_spec(vector, layer, alpha, relative, vector_seed, extra) or steering_spec.one(
        steering_spec.RANDOM_SOURCE if vector in (None, "", RANDOM) else vector, alpha, layer, relative, vector_seed)
    positions = "all" if steer_prompt in (True, 1) else "last"
    return steering_spec.Spec(tuple(replace(t, positions=positions) for t in spec.terms)).as_dict()


def _first_token_bars(lang: str, view) -> object:
    return plots.next_token_bars(view.unsteered, view.steered, labels=i18n.plot_labels(lang, "bars"))


def build_chat_panel(backend: Service, tab) -> ChatPanel:
    """The Chat controls under Explore's own, driven by ``tab``'s steering controls and sampling inputs."""
    mode = gr.Radio([(T("chat.completion"), "completion"), (T("chat.chat"), "chat")], value="completion",
                    label=T("chat.mode"), elem_id="explore-prompt-kind")
    with gr.Group(visible=False, elem_id="explore-chat") as group:
        note = gr.Markdown(elem_id="chat-note")
        system = gr.Textbox(label=T("chat.system"), lines=1, max_lines=4, elem_id="chat-system")
        with gr.Row(equal_height=True, elem_id="chat-sides"):
            unsteered = gr.Chatbot(label=T("chat.unsteered"), height=360, elem_id="chat-unsteered")
            steered = gr.Chatbot(label=T("chat.steered"), height=360, elem_id="chat-steered")
        message = gr.Textbox(label=T("chat.message"), lines=2, elem_id="chat-message")
        steer_prompt = gr.Checkbox(value=False, label=T("chat.steer_prompt"), info=T("chat.steer_prompt_info"),
                                   elem_id="chat-steer-prompt")
        with gr.Row():
            send = gr.Button(T("chat.send"), variant="primary", elem_id="chat-send")
            reset = gr.Button(T("chat.reset"), elem_id="chat-reset")
            save = gr.Button(T("explore.save_result"), elem_id="chat-save")
            run_live = gr.Button(T("explore.run_live"), variant="primary", elem_id="chat-run-live", visible=False)
        status = gr.Markdown(elem_id="chat-status")
        link = gr.Textbox(label=T("explore.link"), interactive=False, max_lines=1, visible=False, elem_id="chat-link")
        bars = gr.Plot(label=T("chat.first_token"), elem_id="chat-first-token")
    panel = ChatPanel(mode=mode, group=group, note=note, unsteered=unsteered, steered=steered, bars=bars,
                      status=status, link=link, system=system, run_live=run_live)

    def _note(lang: str, saved: bool) -> str:
        return note_line(lang, backend.chat_template(), saved)

    @handler(backend)  # its outputs hold no status line: a refusal (a model still loading) is a toast
    def pick_mode(kind, request: gr.Request):
        chat = kind == "chat"
        return gr.update(visible=chat), relabel.keep(backend, sid(request), [note], _note, False) if chat else ""

    @handler(backend, status=status)
    def chat_send(text, system_, steer_prompt_, vector, layer, alpha, relative, vector_seed, greedy, temperature,
                  top_k, top_p, repetition, max_tokens, seed, delta_limit=None, extra="", request: gr.Request = None):
        session = sid(request)
        spec = turn_spec(vector, layer, alpha, relative, vector_seed, extra, steer_prompt_)
        sampling = backend.sampling(max_new_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                                    repetition_penalty=repetition, seed=seed, greedy=greedy,
                                    max_delta_logit=backend.delta_limit(session, vector, delta_limit))
        view = backend.chat_view(session)
        shown, figure = 0.0, None
        for frame in backend.chat_turn(session, text, spec, system_, steer_prompt_, sampling):
            if figure is None:  # the steered assistant's first token, from the prompt it reads
                first = backend.next_token_for(session, frame["prompts"]["steered"], spec)
                figure = relabel.keep(backend, session, [bars], _first_token_bars, first)
            if not frame["done"] and time.monotonic() - shown < FRAME_INTERVAL_S:
                continue
            shown = time.monotonic()
            yield (bubbles(view, "unsteered", frame), bubbles(view, "steered", frame), figure, "",
                   "" if frame["done"] else gr.skip())

    @handler(backend, status=status)
    def chat_reset(request: gr.Request):
        backend.chat_reset(sid(request))
        return [], [], None, "", gr.update(value="", visible=False)

    @handler(backend, status=status)
    def chat_save(request: gr.Request):
        result_id = backend.chat_save(sid(request))
        link_ = f"{page_url(request)}?result={result_id}"
        return relabel.keep(backend, sid(request), [status], *relabel.text("saved_result")), \
            gr.update(value=link_, visible=True)

    @handler(backend)
    def show_saved(request: gr.Request):
        """On a saved conversation's page: Chat picked, both sides as saved, read-only; else nothing."""
        session = backend.peek_session(sid(request))
        saved = session.cache.pop(SHOW_CHAT, None) if session is not None else None
        if saved is None:
            return (gr.skip(),) * 7
        session.cache[CHAT_RESULT] = saved["id"]
        view = saved["chat"]
        return ("chat", gr.update(visible=True), relabel.keep(backend, sid(request), [note], _note, True),
                bubbles(view, "unsteered"), bubbles(view, "steered"), view["system"], gr.update(visible=True))

    @handler(backend, status=status)
    def chat_run_live(vector, greedy, temperature, top_k, top_p, repetition, max_tokens, seed, delta_limit=None,
                      request: gr.Request = None):
        """The saved conversation of this page asked again, live (rooms/chat.py ``rerun``), with the page's
        sampling; the conversation is then this visitor's own, to go on with."""
        session = sid(request)
        result_id = backend.session(session).cache.get(CHAT_RESULT)
        if not result_id:
            raise UserError("no_saved_chat")
        sampling = backend.sampling(max_new_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                                    repetition_penalty=repetition, seed=seed, greedy=greedy,
                                    max_delta_logit=backend.delta_limit(session, vector, delta_limit))
        view, turn, shown, turns = None, -1, 0.0, 0
        for frame in backend.chat_rerun(session, result_id, client_address(request), sampling):
            if frame["turn"] != turn:  # the turns before this one, as this run answered them
                turn, view = frame["turn"], backend.chat_view(session)
            turns = frame["turn"] + 1
            if not frame["done"] and time.monotonic() - shown < FRAME_INTERVAL_S:
                continue
            shown = time.monotonic()
            yield (bubbles(view, "unsteered", frame), bubbles(view, "steered", frame)) + (gr.skip(),) * 3
        view = backend.chat_view(session)
        done = relabel.keep(backend, session, [status], *relabel.text("chat_live", turns=turns))
        yield (bubbles(view, "unsteered"), bubbles(view, "steered"), done,
               relabel.keep(backend, session, [note], _note, False), gr.update(visible=False))

    steering = [tab.vector, tab.layer, tab.alpha, tab.relative, tab.vector_seed]
    mode.input(pick_mode, [mode], [group, note], api_name="chat_mode", api_visibility="undocumented")
    turn_inputs = [message, system, steer_prompt] + steering + list(tab.sampling_inputs) + [tab.rows.extra]
    turn_outputs = [unsteered, steered, bars, status, message]
    send.click(chat_send, turn_inputs, turn_outputs, api_name="chat_turn", **EXPLORE)
    message.submit(chat_send, turn_inputs, turn_outputs, api_name="chat_turn_on_submit",
                   api_visibility="undocumented", **EXPLORE)
    reset.click(chat_reset, None, [unsteered, steered, bars, status, link], api_name="chat_reset")
    run_live.click(chat_run_live, [tab.vector] + list(tab.sampling_inputs), [unsteered, steered, status, note, run_live],
                   api_name="chat_run_live", api_visibility="undocumented", **EXPLORE)
    save.click(chat_save, None, [status, link], api_name="chat_save")
    panel.show_saved = show_saved
    return panel
