"""Server-side messages in plain English, by key: the core raises errors that carry a key and parameters.

The core (service, CLI) never imports the UI; the UI's translations
(:mod:`steer_ui.ui.i18n`) take these English texts as their base and add
other languages under the same keys and ``{placeholders}``.
"""
from __future__ import annotations

from typing import Any

ENGLISH: dict[str, str] = {
    "error_title": "Error",
    "cancelled_title": "Cancelled",
    "notice_title": "Note",
    "yes": "yes",
    "no": "no",
    "too_many_prompts": "{count} prompts given; one comparison runs at most {limit} (one per line).",
    "too_few_values": "{count} distinct values given for {what}; at least {least}.",
    "too_many_values": "{count} values given for {what}; at most {limit}.",
    "compare_pairs_summary": "Steers {intended} of {n} held-out prompts the intended way ({share:.0%}); {anti} against "
                             "it; {flips} flip the sign of their margin within ±{top:.4g}; mean margin {margin:+.2f} "
                             "nats at α = {alpha:.4g}; fluency {drop:+.2f} nats/token.",
    "compare_summary": "{n} prompts at α = {alpha:.4g}: first-token KL {kl:.3f} nats on average; fluency {drop:+.2f} "
                       "nats/token; distinct tokens {distinct:.0%}; concept score {concept} ({units}).",
    "concept_units_sd": "standard deviations along the vector, steered text minus unsteered, read by the unsteered "
                        "model",
    "concept_units_delta_p_truthful": "the detector's p(truthful) of the steered text minus the unsteered text's",
    "concept_units_none": "this vector has no single direction or detector to read",
    "compare_needs_pairs_chart": "Margins and steerability need pairs: tick \"Use the loaded dataset's held-out pairs\".",
    "no_prompts": "Give some prompts (one per line), or compare on the loaded dataset's held-out pairs.",
    "compare_needs_pairs": "Comparing on the dataset needs contrastive pairs (prompt, positive, negative): {detail}",
    "unexpected": "Something went wrong on the server (it is logged there). Your data and vectors are kept; try "
                  "again or change the input.",
    "no_model": "No model is loaded yet: load one in the Model tab.",
    "model_load_failed": "The model could not be loaded: {detail}",
    "model_loading": "Loading the model… {detail}",
    "model_facts": "**{model_id}** ({model_type}) · {num_layers} layers · hidden size {hidden_size} · "
                   "vocabulary {vocab_size} · tied lm_head: {tied_lm_head} · {parameters} parameters · "
                   "{device} {dtype} · {weights} · loaded in {load_seconds} s",
    "weights_float32": "float32 weights",
    "weights_bfloat16": "bfloat16 weights and arithmetic",
    "weights_int8_exact": "int8 weights (the GGUF's own codes), float32 arithmetic",
    "weights_int8_rounded": "int8 weights (rounded per output row), float32 arithmetic",
    "weights_cost": "{kind}: against float32, max |Δp| {dp}, top-1 {top1}, max |ΔΔlogit| {ddlogit} (measured "
                    "on {prompts} fixed prompts)",
    "weights_int8_declined": "{kind} (int8 was measured at max |Δp| {dp}, top-1 {top1}: over the default's bound, "
                             "so float32)",
    "unknown_vector": "There is no vector named '{name}' in this session (you have: {known}). Train or import "
                      "one first.",
    "bad_layer": "Layer {layer} does not exist: this model has layers 0 to {last}.",
    "steering_failed": "This vector cannot steer the loaded model: {detail}",
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
    "cell_too_long": "{name} could not be used: row {row}, column '{column}' has {size} characters; this server "
                     "reads at most {limit} characters per cell. The previously loaded data is unchanged.",
    "column_name_too_long": "{name} could not be used: the name of column '{column}…' has {size} characters; at "
                            "most {limit}. The previously loaded data is unchanged.",
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
    "link_fallback": "Showing '{shown}' instead, at its own layer, α and range (the link's were for its vector).",
    "no_steering": "No steering at α = 0: move the slider to see which tokens it promotes and suppresses.",
    "model_switch_off": "Changing the model is switched off on this server: the administrator chose it at launch "
                        "(python app.py --model ... --allow-model-switch to allow visitors to switch).",
    "model_not_allowed": "That model is not on this server's list; choose one of: {known}.",
    "bad_device": "Device '{device}' is not allowed: use auto, cpu, cuda, cuda:N, mps or multi.",
    "bad_dtype": "Data type '{dtype}' is not allowed: use one of {known}.",
    "bad_weights": "Weights '{weights}' are not known: use one of {known}.",
    "session_expired": "This page's session was idle for over {hours} h, so the server forgot it; its data and "
                       "vectors are gone. Load them again to go on.",
    "too_many_new_sessions": "Too many new sessions from your address (at most {limit} a minute); try again in "
                             "{wait} s. Sessions already open are not affected.",
    "sessions_full": "The server is busy: it keeps {limit} sessions and every one holds a visitor's work. Try "
                     "again later.",
    "address_sessions_full": "The server is busy: your address already has {limit} sessions holding work. Use "
                             "one of them, or try again later.",
    "session_busy": "The server is busy: this session already has {count} generations running. Wait for one to "
                    "finish.",
    "queue_session_full": "The server is busy: this page already has {count} requests waiting or running. Wait "
                          "for them to finish.",
    "queue_address_full": "The server is busy: your address already has {count} requests waiting. Try again in a "
                          "moment.",
    "superseded": "Replaced by a newer request of the same kind from this page.",
    "waiting_for_memory": "Waiting for working memory: {used} of {total} MB is in use ({long} MB of it by long jobs "
                          "such as comparisons).",
    "compare_too_large": "One prompt of this comparison ({tokens} tokens and {new_tokens} new ones, 3 rows) needs "
                         "{need} MB of working memory; comparisons may use {limit} of this server's {total} MB. "
                         "Shorten the prompts or ask for fewer new tokens.",
    "compare_too_slow": "This comparison would take about {estimate} s at this server's measured speed ({prompts} "
                        "prompts, {tokens} prompt tokens, {new_tokens} new tokens each); its time limit is {limit} s. "
                        "Use at most {fit} prompts, fewer new tokens or shorter prompts.",
    "compare_timeout": "The comparison reached its time limit ({limit} s) before any prompt finished. Use fewer "
                       "prompts, fewer new tokens or shorter prompts.",
    "compare_stopped": "Stopped at the time limit ({limit} s): {done} of {total} prompts finished; the table and "
                       "charts show those.",
    "memory_busy": "The server is busy: the requests running now use its working memory ({limit} MB in all). "
                   "Try again in a moment.",
    "job_running": "A job is already running in this session: wait for it or cancel it first.",
    "number_not_a_number": "{what} must be a number, got {value}.",
    "number_not_finite": "{what} must be a finite number, got {value}.",
    "number_not_whole": "{what} must be a whole number, got {value}.",
    "number_too_small": "{what} must be at least {low}, got {value}.",
    "number_too_large": "{what} must be at most {high}, got {value}.",
    "number_not_positive": "{what} must be above 0, got {value}.",
    "not_a_flag": "{what} must be true or false.",
    "not_a_choice": "{what}: '{value}' is not one of the choices.",
    "bad_input": "{what} could not be read: {detail}.",
    "wrong_inputs": "This endpoint takes {needed} values; the request sent {got}.",
    "body_too_large": "The request is {size} MB; this server takes at most {limit} MB per request.",
    "text_not_text": "{what} must be text.",
    "text_empty": "{what} is empty.",
    "text_too_long": "{what} has {size} characters; the limit is {limit}.",
    "text_not_unicode": "{what} holds a character that is not valid text (at position {position}).",
    "too_many_tokens": "{what} is {tokens} tokens long; this server takes at most {limit} tokens.",
    "request_too_large": "This request ({tokens} tokens × {rows} rows) needs about {need} MB of working memory; "
                         "this server allows {limit} MB per request. Use a shorter text or fewer rows.",
    "row_too_long": "Row {row}'s {column} is {tokens} tokens long; this server takes at most {limit} tokens per "
                    "text.",
    "row_too_many_chars": "Row {row}'s {column} has {size} characters; this server takes at most {limit} "
                          "characters per text.",
    "data_too_large": "The dataset's texts are at least {tokens} tokens together; a job on this server reads at most "
                      "{limit}. Upload a subset.",
    "data_too_many_chars": "The dataset's texts are {chars} characters together, so over {limit} tokens (no token of "
                           "this model spans more than {longest} characters); a job on this server reads at most "
                           "{limit} tokens. Upload a subset.",
    "push_overflows": "α × this vector would push the residual stream to a length of {size}, which overflows "
                      "the model's {dtype} arithmetic: use a smaller α.",
    "owner_quota": "You keep the most {kind}s allowed here ({limit}); remove one to keep another.",
    "owner_bytes": "You keep the most this server allows ({limit} MB); remove something to keep more.",
    "store_full": "The server's library is full ({limit} MB); try again later, or ask its administrator.",
    "library_full": "The server's library is full (its disk has no room), so this could not be kept; what you "
                    "kept before is safe. Try again later, or ask the server's administrator.",
    "library_unwritable": "The server's library cannot be written just now, so this could not be kept; what you "
                          "kept before is safe. Try again later, or ask the server's administrator.",
    "unknown_id": "There is no shared vector or saved result with that id (or its owner stopped sharing it).",
    "too_many_misses": "Too many ids that do not exist from your address ({limit} a minute); wait a minute.",
    "not_own_vector": "'{name}' is not one of your kept vectors: only your own vectors can be shared.",
    "not_kept": "This session keeps nothing (this server has no library, or the page has no owner): export "
                "files to keep your work.",
    "shared": "Shared: anyone with the link can open this vector, read-only, until you stop sharing it.",
    "unshared": "Stopped sharing '{name}': its link no longer opens it.",
    "saved_result": "Saved: the link shows this view without running the model.",
    "result_view": "A saved result (made on {when}). Run it live to check it reproduces.",
    "comparison_view": "A saved comparison (made on {when}) is on the Many prompts tab; Compare runs it live.",
    "stale_bars": "Made for the previous settings: move α, or press Shift+Enter in the prompt, to update.",
    "stale_generations": "Made for the previous settings: Generate to update.",
    "stale_dose": "Made for the previous settings: Dose-response sweep to update.",
    "stale_train": "Made for the previous settings: Train to update.",
    "stale_probe": "Made for the previous settings: Probe every layer to update.",
    "stale_detect": "Made for the previous vector or answers: Score to update.",
    "stale_compare": "Made for the previous settings: Compare to update.",
    "no_comparison": "Nothing has been compared on the Many prompts tab yet.",
    "saved_comparison": "Saved: the link opens this comparison without running the model.",
    "result_other_model": "This result was made on another model ({model}); running it live here will differ.",
    "reproduced": "Run live: reproduced exactly (same tokens{numbers}).",
    "not_reproduced": "Run live: it differs from the saved result ({detail}).",
    "work_not_kept": "Your work is not kept on this server: it lives only in this page's session. Export files "
                     "to keep it.",
    "concepts_failed": "Could not compute this panel: {detail}",
    "concepts_no_demo": "Run the explosion first (the button above), then the fix.",
    "settings_json_not_text": "The settings must be JSON text: an object such as {{\"epochs\": 10}}.",
    "settings_json_too_long": "The settings have {size} characters; at most {limit}.",
    "settings_json_long_number": "A number in the settings is {size} characters long; at most {digits} digits.",
    "settings_json_not_finite": "The settings hold {name}, which is not a finite number; give a number such as 0.5.",
    "settings_json_nested": "The settings are nested too deeply; give a flat object such as {{\"epochs\": 10}}.",
    "settings_json_unreadable": "The settings are not valid JSON (line {line}, column {column}). Write an object such "
                                "as {{\"epochs\": 10, \"lr\": 0.01}}: names in double quotes, a colon after each "
                                "name, commas between entries.",
    "settings_json_not_object": "The settings must be a JSON object of names and values, such as "
                                "{{\"epochs\": 10}}.",
    "name_hidden_character": "The name '{name}' holds {code}, a character that is invisible or reorders the text "
                             "around it, so the name would not show as it is; choose a name without it.",
    "too_many_vectors": "This session already holds {limit} vectors, the most allowed; start a new session "
                        "(reload the page) to train or import more.",
    "session_full": "This session would hold more than {limit} MB of data and vectors, the most allowed; reload "
                    "the page to start a fresh session.",
    "server_full": "This server holds as much visitors' data and vectors as it allows ({limit} MB in all); "
                   "try again later, or ask its administrator.",
    "prompt_too_long": "The prompt has {size} characters; the limit is {limit}.",
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
               "**max |Δlogit|** = {maxd:.3f} on {token} (centred, among the {likely} tokens with p ≥ 0.1 % before "
               "or after){warn} · whole vocabulary: {rawd:.3f} on {rawtoken}",
    "readout_warn": " ⚠ **logits exploding** (above {threshold:g})",
    "no_tokens": "No tokens were generated.",
    "token_detail": "Token {token}: log-probability {logprob:.3f}, Δlogit {delta:+.3f} (direct estimate "
                    "{direct:+.3f}). Alternatives: {alts}",
    "drag_alpha": "Drag α to see the distribution change.",
    "dataset_summary": "**{name}**: {kind}, {rows} rows; columns: {columns}",
    "dataset_warning": "⚠ {detail}",
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


class UserError(Exception):
    """A failure to show the user as is: ``key`` names the message (the UI translates it), ``params`` fill it."""

    def __init__(self, key: str, **params: Any):
        self.key, self.params = key, params
        super().__init__(english(key, **params))


# What a message's {what} names: the fields of requests, as a visitor sees them (the UI translates them too).
FIELDS: dict[str, str] = {
    "alpha": "α", "alpha_max": "α max", "layer": "The layer", "seed": "The seed", "top_k": "Top-k",
    "top_p": "Top-p", "temperature": "The temperature", "repetition_penalty": "The repetition penalty",
    "max_new_tokens": "The number of new tokens", "max_delta_logit": "The Δlogit limit", "points": "The number of "
    "sweep points", "prompt": "The prompt", "target": "The target token", "answer": "An answer",
    "relative": "Relative units", "greedy": "Greedy", "bins": "The number of bins", "draws": "The number of draws",
    "seq_len": "The sequence length", "batch": "The batch size", "tokens": "The number of tokens",
    "bound": "The bound", "steps": "The number of steps", "token": "The token", "settings": "The settings",
    "vector": "The vector", "method": "The method", "format": "The format", "schema": "The schema",
    "dataset": "The dataset", "position": "The position", "language": "The language", "dtype": "The data type",
    "input": "An input", "auto_layer": "Auto layer",
}


MAX_FIELD_CHARS = 200  # a field named by its label is named whole (the page's longest label is far shorter)


def field_name(what: str, names: dict[str, str] | None = None) -> str:
    """The name of field ``what`` as a visitor sees it (``names`` in another language, English by default)."""
    return (names or {}).get(what) or FIELDS.get(what) or str(what)[:MAX_FIELD_CHARS]


def normalise_lang(lang: str | None) -> str:
    """Any Chinese locale (zh, zh-CN, zh-Hans-CN, ...) -> 'zh-CN'; everything else -> 'en'."""
    return "zh-CN" if str(lang or "").lower().startswith("zh") else "en"


def english(key: str, **params: Any) -> str:
    """The English text of message ``key`` with ``params`` filled in (missing ones shown as '?')."""
    template = ENGLISH.get(key)
    if template is None:
        return key if not params else f"{key}: {params}"
    if "what" in params:
        params = {**params, "what": field_name(params["what"])}
    try:
        return template.format(**params)
    except (KeyError, IndexError, ValueError):
        return key
