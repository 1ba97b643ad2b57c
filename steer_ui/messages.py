"""Server-side messages in plain English, by key: the core raises errors that carry a key and parameters.

The core (service, CLI) never imports the UI; the UI's translations
(:mod:`steer_ui.ui.i18n`) take these English texts as their base and add
other languages under the same keys and ``{placeholders}``.
"""
from __future__ import annotations

from typing import Any

ENGLISH: dict[str, str] = {
    "error_title": "Error",
    "unexpected": "Something went wrong: {detail}. Your data and vectors are kept; try again or change the input.",
    "no_model": "No model is loaded yet: load one in the Model tab.",
    "model_load_failed": "The model could not be loaded: {detail}",
    "model_loading": "Loading the model… {detail}",
    "model_facts": "**{model_id}** ({model_type}) · {num_layers} layers · hidden size {hidden_size} · "
                   "vocabulary {vocab_size} · tied lm_head: {tied_lm_head} · {parameters} parameters · "
                   "{device} {dtype} · loaded in {load_seconds} s",
    "unknown_vector": "There is no vector named '{name}' in this session (you have: {known}). Train or import "
                      "one first.",
    "bad_layer": "Layer {layer} does not exist: this model has layers 0 to {last}.",
    "steering_failed": "This vector cannot steer the loaded model: {detail}",
    "bad_alpha": "α must be a finite number, got {alpha}.",
    "explore_failed": "Could not compute the steered distribution: {detail}",
    "input_dependent_projection": "This vector is input-dependent (L2S): it has no single direction to project "
                                  "through lm_head.",
    "empty_prompt": "The prompt is empty: type some text to continue.",
    "bad_sampling": "Bad sampling setting: {detail}",
    "generation_failed": "Generation failed: {detail}",
    "sweep_unsupported": "The dose-response sweep needs a single fixed direction; this vector is input-dependent "
                         "or acts on several sites.",
    "unknown_bundled": "There is no bundled dataset '{name}' (available: {known}).",
    "no_file": "No file was given.",
    "file_missing": "The file {name} could not be found (the upload may have expired); upload it again.",
    "file_too_large": "{name} is {size} MB, over the {limit} MB limit.",
    "dataset_invalid": "{name} could not be used: {detail}. The previously loaded data is unchanged.",
    "no_dataset": "No dataset is loaded in this session: use the Data tab first.",
    "training_failed": "Training failed: {detail}",
    "unknown_method": "Unknown method '{method}' (choose one of: {known}).",
    "bad_settings": "Settings refused: {detail}",
    "too_many_answers": "{count} answers to score; this server scores at most {limit} per request.",
    "too_many_rows": "The dataset has {rows} rows; training on this server reads at most {limit}. Upload a "
                     "subset (whole questions or groups) to train on it.",
    "cancel_asked": "Stopping the running job…",
    "nothing_to_cancel": "Nothing is running in this session.",
    "link_notice": "From the link: {detail}.",
    "no_steering": "No steering at α = 0: move the slider to see which tokens it promotes and suppresses.",
    "model_switch_off": "Changing the model is switched off on this server: the administrator chose it at launch "
                        "(python app.py --model ... --allow-model-switch to allow visitors to switch).",
    "model_not_allowed": "That model is not on this server's list; choose one of: {known}.",
    "bad_device": "Device '{device}' is not allowed: use auto, cpu, cuda, cuda:N, mps or multi.",
    "bad_dtype": "Data type '{dtype}' is not allowed: use one of {known}.",
    "session_expired": "This page's session was closed to make room (the server keeps at most {limit} sessions, "
                       "and forgets idle ones); its data and vectors are gone. Load them again to go on.",
    "too_many_vectors": "This session already holds {limit} vectors, the most allowed; start a new session "
                        "(reload the page) to train or import more.",
    "session_full": "This session would hold more than {limit} MB of data and vectors, the most allowed; reload "
                    "the page to start a fresh session.",
    "server_full": "This server holds as much visitors' data and vectors as it allows ({limit} MB in all); "
                   "try again later, or ask its administrator.",
    "prompt_too_long": "The prompt has {size} characters; the limit is {limit}.",
    "bad_number": "{what} must be a whole number from {low} to {high}, got {value}.",
    "busy": "The server is busy ({detail}). Try again in a moment.",
    "generation_timeout": "Generation stopped: {detail}.",
    "job_queued": "Waiting for another visitor's job to finish…",
    "job_cancelled": "Cancelled: nothing was kept, and your session is as it was.",
    "job_too_long": "Stopped after {limit} s, this server's limit for one job: nothing was kept. Try fewer rows "
                    "or epochs.",
    "not_tsv": "Vector '{name}' was made by method '{method}'; detection needs a TSV vector.",
    "no_answers": "There are no answers to score: type at least one answer.",
    "detect_failed": "Detection failed: {detail}",
    "unknown_format": "Unknown format '{fmt}' (choose one of: {known}).",
    "export_failed": "Could not export to {fmt}: {detail}",
    "import_failed": "{name} could not be imported: {detail}",
    "readout": "**KL**(unsteered‖steered) = {kl:.4f} nats · **entropy** {hu:.3f} → {hs:.3f} nats · "
               "**max |Δlogit|** = {maxd:.3f} on {token}{warn}",
    "no_tokens": "No tokens were generated.",
    "token_detail": "Token {token}: log-probability {logprob:.3f}, Δlogit {delta:+.3f} (direct estimate "
                    "{direct:+.3f}). Alternatives: {alts}",
    "drag_alpha": "Drag α to see the distribution change.",
    "dataset_summary": "**{name}**: {kind}, {rows} rows; columns: {columns}",
    "dataset_warning": "⚠ {detail}",
    "bad_json": "The extra hyperparameters are not valid JSON: {detail}",
    "no_curves": "This method reports no per-epoch curves.",
    "trained": "Trained **{name}**; it is now in the vector lists of Explore, Detect and Export.",
    "answers_table": "The answers table needs two columns: prompt and answer.",
    "pick_tsv": "Pick a TSV vector first.",
    "detect_summary": "Scored {n} answers · AUROC: {auroc}",
    "no_generation": "Nothing has been generated in Explore yet.",
    "exported": "Wrote {n} file(s) in {fmt} format: {names}",
    "imported": "Imported **{name}**; it is now in the vector lists.",
    "import_warning": "⚠ {detail}",
    "share_failed": "Could not create a public share link ({detail}); the app is still available locally.",
}


def normalise_lang(lang: str | None) -> str:
    """Any Chinese locale (zh, zh-CN, zh-Hans-CN, ...) -> 'zh-CN'; everything else -> 'en'."""
    return "zh-CN" if str(lang or "").lower().startswith("zh") else "en"


def english(key: str, **params: Any) -> str:
    """The English text of message ``key`` with ``params`` filled in (missing ones shown as '?')."""
    template = ENGLISH.get(key)
    if template is None:
        return key if not params else f"{key}: {params}"
    try:
        return template.format(**params)
    except (KeyError, IndexError, ValueError):
        return key
