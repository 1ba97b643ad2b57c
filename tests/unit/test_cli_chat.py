"""``generate --chat`` / ``--messages`` (issue #48): a conversation through the chat template from the command line,
through the same door and chat room as the page."""
from __future__ import annotations

import json

from steer_ui.cli import main

TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")
STEER = ("--model", "tiny:llama", "--random-vector", "3", "--alpha", "8", "--max-new-tokens", "4", "--json")


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out


def test_chat_turns_each_side_with_its_own_history(capsys, tmp_path):
    template = tmp_path / "template.jinja"
    template.write_text(TEMPLATE, encoding="utf-8")
    code, out = run(capsys, "generate", *STEER, "--chat-template", str(template), "--system", "Be brief.",
                    "--chat", "Hello", "--chat", "More")
    assert code == 0, out
    data = json.loads(out)
    assert data["system"] == "Be brief." and [t["user"] for t in data["turns"]] == ["Hello", "More"]
    assert data["steered"]["text"] == data["turns"][-1]["steered"]
    assert data["steering"]["vectors"][0]["seed"] == 3


def test_messages_file_and_refusals(capsys, tmp_path):
    template = tmp_path / "template.jinja"
    template.write_text(TEMPLATE, encoding="utf-8")
    messages = tmp_path / "messages.json"
    messages.write_text(json.dumps([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hey"},
                                    {"role": "user", "content": "Again"}]), encoding="utf-8")
    code, out = run(capsys, "generate", *STEER, "--chat-template", str(template), "--messages", str(messages))
    assert code == 0, out
    data = json.loads(out)
    assert data["prompt"] == "<|user|>Hi</s><|assistant|>Hey</s><|user|>Again</s><|assistant|>"
    assert isinstance(data["steered"]["text"], str)
    # no template (the tiny llama has none): one line naming --chat-template, exit 2
    code, out = run(capsys, "generate", *STEER, "--chat", "Hello")
    assert code == 2 and "--chat-template" in json.loads(out)["error"]
    messages.write_text("[{]", encoding="utf-8")
    code, out = run(capsys, "generate", *STEER, "--chat-template", str(template), "--messages", str(messages))
    assert code == 2 and json.loads(out)["error"].startswith("--messages")
