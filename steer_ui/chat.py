"""Conversations as prompts: a list of messages rendered through the model's chat template (issue #48, #49).

Where the template comes from, first found: the administrator's ``--chat-template FILE``; the tokenizer's own
(a hub model's, or a GGUF's ``tokenizer.chat_template`` as transformers reads it); for a Gemma model without one
(the embedded Gemma 3 270M is a base model whose GGUF carries none), Gemma's turn format, whose markers are
tokens of its vocabulary.  Otherwise there is no chat, and the refusal names ``--chat-template``.

Rendering is the tokenizer's own ``apply_chat_template`` (transformers' sandboxed Jinja) with
``add_generation_prompt``, so what the model reads is what its authors' code gives it; the rendered text's
leading BOS is dropped because tokenising a prompt adds it again.
"""
from __future__ import annotations

from typing import Any

from . import guards
from .messages import UserError

ROLES = ("system", "user", "assistant")
MAX_MESSAGES = 64
MAX_MESSAGE_CHARS = 32_768  # the token bound on the whole rendered conversation is the one that counts

# Gemma's turns (the format of Gemma's own instruction-tuned templates): a system message goes before the first
# user turn's text, as Gemma 3's template puts it.
GEMMA_TURNS = (
    "{{ bos_token }}{% set first = namespace(system='') %}"
    "{% if messages and messages[0]['role'] == 'system' %}{% set first.system = messages[0]['content'] + '\\n\\n' %}"
    "{% set messages = messages[1:] %}{% endif %}"
    "{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else 'user' }}\n"
    "{{ (first.system if loop.first else '') + m['content'] | trim }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def checked(messages: Any, max_messages: int = MAX_MESSAGES) -> list[dict[str, str]]:
    """``messages`` as a list of ``{"role", "content"}`` (OpenAI's shape; text content, or a list of text parts),
    bounded; one line naming the message (1-based) when one is not."""
    if not isinstance(messages, list) or not 1 <= len(messages) <= max_messages:
        raise UserError("chat_messages", limit=max_messages)
    out = []
    for n, message in enumerate(messages, 1):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise UserError("chat_message_role", n=n)
        content = message.get("content")
        if isinstance(content, list):  # OpenAI's content parts: this model reads text only
            if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
                raise UserError("chat_message_not_text", n=n)
            content = "".join(str(p.get("text", "")) for p in content)
        content = guards.text(content, "message", MAX_MESSAGE_CHARS, allow_empty=message["role"] == "assistant")
        out.append({"role": message["role"], "content": content})
    if out[-1]["role"] == "assistant":
        raise UserError("chat_ends_with_assistant")
    return out


def template_of(handle, override: str | None = None) -> tuple[str | None, str]:
    """(template, where it comes from: "file", "tokenizer", "gemma-turns" or "none")."""
    if override:
        return override, "file"
    own = getattr(handle.tokenizer, "chat_template", None)
    if isinstance(own, str) and own.strip():
        return own, "tokenizer"
    if str(handle.model_type or "").startswith("gemma"):
        return GEMMA_TURNS, "gemma-turns"
    return None, "none"


def render(handle, messages: list[dict[str, str]], override: str | None = None) -> str:
    """The conversation as the prompt text the model continues (its next assistant turn)."""
    template, _ = template_of(handle, override)
    if template is None:
        raise UserError("no_chat_template", model=str(handle.model_id)[:80])
    try:
        text = handle.tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False,
                                                    add_generation_prompt=True)
    except Exception as exc:  # noqa: BLE001 - a template's own error (it may raise on purpose), in one line
        raise UserError("chat_template_failed", detail=str(exc).splitlines()[0][:200] if str(exc) else
                        type(exc).__name__) from None
    bos = getattr(handle.tokenizer, "bos_token", None)
    adds_bos = bool(bos) and handle.tokenizer("x").input_ids[:1] == [handle.tokenizer.bos_token_id]
    if adds_bos and text.startswith(bos):  # tokenising the prompt puts it back
        text = text[len(bos):]
    return text
