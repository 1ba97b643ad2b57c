"""Model: pick a model (embedded, hub id, local directory, GGUF), load it, see its architecture facts."""
from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from .. import plots
from ..model.precision import path_in_use
from ..service import Service
from . import i18n, relabel
from .common import T, handler, progress_adapter, sid


@dataclass
class ModelTab:
    source: gr.Dropdown
    device: gr.Dropdown
    dtype: gr.Dropdown
    load: gr.Button
    status: gr.Markdown
    facts: gr.JSON
    norms: gr.Plot

    @property
    def relabelled(self) -> list:
        """The outputs a language switch redraws (ui/relabel.py)."""
        return [self.status, self.norms]


def facts_markdown(lang: str, facts: dict) -> str:
    shown = {k: facts.get(k) for k in ("model_id", "model_type", "num_layers", "hidden_size", "vocab_size",
                                       "tied_lm_head", "parameters", "device", "dtype", "load_seconds")}
    if isinstance(shown["tied_lm_head"], bool):  # a yes or no in the page's language, not Python's True/False
        shown["tied_lm_head"] = i18n.message(lang, "yes" if shown["tied_lm_head"] else "no")
    return i18n.markdown(lang, "model_facts", weights=weights_text(lang, facts), **shown)


def weights_text(lang: str, facts: dict) -> str:
    """The weights' precision and, where measured, its cost against float32 (issue #37: accuracy on the page)."""
    weights = facts.get("weights") or "float32"
    key = "weights_int8_" + ("exact" if facts.get("int8_exact") else "rounded") if weights == "int8" else \
        f"weights_{weights}"
    kind = i18n.message(lang, key) if key in i18n.MESSAGES["en"] else weights
    cost = facts.get("precision_cost")
    if not cost:
        return kind
    # in words a person reads (issue #52): the same top token on so many test prompts, the largest probability
    # change as the bound; the full measurement stays in the model's facts (JSON) and docs/models.md
    # with integer products on rounded activations (issue #50; the paths the loader switches on) the line names
    # that path and shows its cost, measured with it on for every product
    on = path_in_use(cost)
    if weights == "int8" and on is not None:
        cost = cost[on]
        kind = i18n.message(lang, "weights_integer_unembedding", kind=kind) if on == "w8a16_unembedding" else \
            i18n.message(lang, "weights_integer_products", kind=kind, bits=16 if on == "w8a16" else 8)
    numbers = {"dp": f"{cost['max_abs_dp']:.2g}", "agree": cost["top1_agree"], "prompts": cost["prompts"]}
    if weights != "int8":  # auto measured int8 and kept float32
        return i18n.message(lang, "weights_int8_declined", kind=kind, **numbers)
    return i18n.message(lang, "weights_cost", kind=kind, **numbers)


def banner_markdown(lang: str, facts: dict) -> str:
    """The page's model line: which model, how deep, what precision, in one short line (the Model tab has the
    rest); a long line of facts took a phone's first screen (issue #52)."""
    return i18n.markdown(lang, "model_banner", model_id=facts.get("model_id"), num_layers=facts.get("num_layers"),
                         weights=weights_text(lang, facts))


def status_markdown(backend: Service, lang: str, short: bool = False) -> str:
    """The model's state: its facts when loaded (``short``: the banner's one line), else loading or failed."""
    status = backend.model_status()
    if status["ready"]:
        facts = backend.model_facts()
        return banner_markdown(lang, facts) if short else facts_markdown(lang, facts)
    if status["error"]:
        return i18n.markdown(lang, "model_load_failed", detail=status["error"])
    if status["loading"]:
        said = i18n.say(lang, status["message"])  # the loader's progress, by key: in the page's language
        return i18n.markdown(lang, "model_loading", detail=f"{said} — {status['fraction']:.0%}")
    return i18n.message(lang, "no_model")


def build_model_tab(backend: Service) -> ModelTab:
    with gr.Row():
        sources = list(backend.policy.model_sources)
        # custom values reach the service, which refuses anything off the list in the same words whatever it
        # names (gradio's own check would echo the value back)
        source = gr.Dropdown(choices=sources, value=sources[0] if sources else None, allow_custom_value=True,
                             label=T("model.source"), info=T("model.source_info"), scale=3)
        device = gr.Dropdown(choices=["auto", "cpu", "cuda", "mps"], value="auto", allow_custom_value=True,
                             label=T("model.device"), scale=1)
        dtype = gr.Dropdown(choices=["auto", "float32", "bfloat16", "float16"], value="auto",
                            label=T("model.dtype"), scale=1)
    # Switching is the administrator's call (python app.py --allow-model-switch); the service refuses it otherwise.
    allowed = backend.policy.allow_model_switch
    load = gr.Button(T("model.load"), variant="primary", interactive=allowed)
    status = gr.Markdown(elem_id="model-status")
    with gr.Row():
        norms = gr.Plot(label=T("model.norms"))
        facts = gr.JSON(label=T("model.facts"))
    tab = ModelTab(source=source, device=device, dtype=dtype, load=load, status=status, facts=facts, norms=norms)

    @handler(backend, status=status)
    def load_model(source, device, dtype, request: gr.Request, progress=gr.Progress()):
        facts = backend.switch_model(source, device, dtype, progress=progress_adapter(progress))
        return relabel.keep(backend, sid(request), [tab.status, tab.facts, tab.norms], model_panels, facts,
                            backend.layer_norm_frame())

    tab.load_event = load.click(load_model, [source, device, dtype], [status, facts, norms], api_name="load_model",
                                concurrency_id="model", concurrency_limit=1)
    return tab


def model_panels(lang: str, facts: dict, norms) -> tuple:
    """Status, facts and norm chart of a loaded model in ``lang``, from its facts and norms (no model work)."""
    return facts_markdown(lang, facts), facts, plots.layer_norms(norms, labels=i18n.plot_labels(lang, "norms"))


def model_view(backend: Service, session_id: str | None, tab: ModelTab):
    """Status, facts and norm chart for whatever is loaded (page load), kept for a language switch."""
    if not backend.model_ready:
        lang = backend.language(session_id)
        return status_markdown(backend, lang), None, plots.empty_figure(status_markdown(backend, lang))
    return relabel.keep(backend, session_id, [tab.status, tab.facts, tab.norms], model_panels, backend.model_facts(),
                        backend.layer_norm_frame())
