"""Events over raw HTTP, as a hand-written client (or the page itself) sends them: join the queue, then read
the session's stream.  Shared by the hostile-client suites and the app tests."""
from __future__ import annotations

import json


def joined_calls(http, url: str, api: str, data: list, session: str | None, body_text: str | None,
                 count: int) -> list[tuple]:
    """``count`` joins of one event by one session, then each outcome from the session's stream, in order:
    ``("ok", output)``, ``("error", message)`` or ``("refused", status, detail)``."""
    import uuid

    config = http.get(url + "config", timeout=30).json()
    fn = next(d["id"] for d in config["dependencies"] if d.get("api_name") == api)
    session = session or uuid.uuid4().hex[:16]
    body = body_text or json.dumps({"data": data, "fn_index": fn, "session_hash": session, "event_data": None,
                                    "trigger_id": None})
    body = body.replace('"fn_index": null', f'"fn_index": {fn}').replace('"session_hash": null',
                                                                          f'"session_hash": "{session}"')
    outcomes: dict[str, tuple] = {}
    order = []
    for i in range(count):
        joined = http.post(url + "gradio_api/queue/join", content=body,
                           headers={"content-type": "application/json"}, timeout=60)
        key = joined.json()["event_id"] if joined.status_code == 200 else f"refused {i}"
        if joined.status_code != 200:
            outcomes[key] = ("refused", joined.status_code, joined.json().get("detail", joined.text))
        order.append(key)
    waiting = {e for e in order if e not in outcomes}
    if waiting:
        with http.stream("GET", url + f"gradio_api/queue/data?session_hash={session}",
                         timeout=300) as stream:
            for line in stream.iter_lines():
                if not line.startswith("data:"):
                    continue
                message = json.loads(line[5:])
                if message.get("msg") == "process_completed" and message.get("event_id") in waiting:
                    output = message.get("output") or {}
                    outcomes[message["event_id"]] = (("ok", output) if message.get("success")
                                                     else ("error", str(output.get("error"))))
                    waiting.discard(message["event_id"])
                    if not waiting:
                        break
    return [outcomes.get(e, ("error", "the stream ended without a result")) for e in order]
