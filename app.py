"""Launch the steer_ui app:  python app.py [--model embedded|HUB_ID|DIR|FILE.gguf|tiny:FAMILY] [--port 7860] ...

The page comes up at once; the model loads in the background (the embedded
Gemma 3 270M takes a few seconds from its safetensors cache, about a minute the
very first time while its GGUF is dequantised) and every model action waits for
it, with the status shown at the top of the page.
"""
from __future__ import annotations

import argparse
import os
import re
import socket
import sys
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

SHARE_PROBE = ("api.gradio.app", 443)


def parse_size(text: str) -> int:
    """'50MB', '512k', '1GB' or a number of bytes -> bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmg]?)i?b?\s*", str(text), flags=re.IGNORECASE)
    if not match:
        raise argparse.ArgumentTypeError(f"--max-file-size must look like 50MB, 512KB or 1000000, got '{text}'")
    number, unit = float(match.group(1)), match.group(2).lower()
    size = int(number * {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[unit])
    if size <= 0:
        raise argparse.ArgumentTypeError("--max-file-size must be positive")
    return size


def parse_auth(value: str | None) -> list[tuple[str, str]] | None:
    """'user:password', or a file with one 'user:password' per line (blank lines and # comments skipped)."""
    if not value:
        return None
    path = Path(value).expanduser()
    if path.is_file():
        lines = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines()]
        entries = [ln for ln in lines if ln and not ln.startswith("#")]
        source = str(path)
    else:
        entries, source = [value], "--auth"
    pairs = []
    for number, entry in enumerate(entries, 1):
        user, sep, password = entry.partition(":")
        if not sep or not user or not password:
            where = f"{source} line {number}" if source != "--auth" else "--auth"
            raise SystemExit(f"error: {where}: expected user:password (or a file of such lines), got '{entry[:40]}'")
        pairs.append((user, password))
    if not pairs:
        raise SystemExit(f"error: {source} contains no user:password lines")
    return pairs


def parse_forwarded(text: str) -> tuple[str, ...]:
    """'127.0.0.1,10.0.0.0/8' -> the proxies whose X-Forwarded-For names the client ('' names none).

    Each entry is an IP address or a network, as uvicorn reads them (a network's host bits zero); uvicorn would
    take anything else as a literal that never matches, so a typo would silently trust nobody."""
    import ipaddress

    entries = [entry.strip() for entry in str(text).split(",") if entry.strip()]
    for entry in entries:
        try:
            ipaddress.ip_network(entry) if "/" in entry else ipaddress.ip_address(entry)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"--forwarded-allow-ips takes IP addresses and networks, comma-separated (127.0.0.1, "
                f"10.0.0.0/8), got '{entry[:60]}'") from None
    return tuple(entries)


def internet_reachable(timeout: float = 3.0) -> bool:
    try:
        with socket.create_connection(SHARE_PROBE, timeout=timeout):
            return True
    except OSError:
        return False


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python app.py", description="steer_ui: explore activation steering in a browser.")
    p.add_argument("--model", default="embedded",
                   help="embedded (default: Gemma 3 270M), a hub id, a local directory, a .gguf file, or tiny:FAMILY")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N, mps, or multi (spread over all GPUs with accelerate)")
    p.add_argument("--dtype", default="auto", help="auto, float32, bfloat16 or float16")
    p.add_argument("--weights", default="auto", choices=("auto", "float32", "bfloat16", "int8"),
                   help="auto (default): int8 on a CPU for a GGUF's own codes when their measured cost against "
                        "float32 is within the bound (docs/models.md: Weight precision), else float32")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 for the local network)")
    p.add_argument("--port", type=int, default=7860)
    p.add_argument("--share", action="store_true", help="also create a public gradio.live link (needs internet)")
    p.add_argument("--auth", help="user:password, or a file with one user:password per line")
    p.add_argument("--max-file-size", type=parse_size, default="50MB", help="upload limit, e.g. 50MB (default)")
    p.add_argument("--wait", action="store_true", help="load the model before serving instead of in the background")
    # --- sharing safely (see docs/sharing.md, "Sharing safely"); defaults live in steer_ui/policy.py
    p.add_argument("--allow-model-switch", action="store_true",
                   help="let visitors switch the shared model (only to --model-choices); off by default")
    p.add_argument("--model-choices", default=None,
                   help="comma-separated models visitors may switch to (default: the --model given)")
    p.add_argument("--public", action="store_true",
                   help="serve beyond this machine (--share or a non-loopback --host) without --auth, knowingly")
    p.add_argument("--max-sessions", type=int, default=None, help="sessions kept at once (default 256)")
    p.add_argument("--job-seconds", type=float, default=None, help="time limit of one training job (default 900)")
    p.add_argument("--queue-size", type=int, default=None, help="requests waiting at most (default 64)")
    p.add_argument("--batch-requests", type=int, default=None,
                   help="generations decoded together in one batch (default 8)")
    p.add_argument("--waiting-generations", type=int, default=None,
                   help="generations waiting for a place in the batch before 'busy, try again' (default 8)")
    p.add_argument("--store", default=None,
                   help="the library of what visitors keep: a SQLite file (default ~/.cache/steer_ui/library.db), "
                        "a postgresql:// URL (several app processes share one library), or 'off' (keep nothing)")
    p.add_argument("--vectors", default=None, metavar="DIR",
                   help="publish every vector file in DIR as a listed, read-only vector for every visitor")
    p.add_argument("--max-prompt-tokens", type=int, default=None,
                   help="tokens in any one text a visitor sends: prompt, target, answer, dataset cell (default 1024)")
    p.add_argument("--sessions-per-address", type=int, default=None,
                   help="sessions kept for one client address (default 64; raise it behind a proxy or tunnel, "
                        "where every visitor has the proxy's address)")
    p.add_argument("--new-sessions-per-minute", type=int, default=None,
                   help="new sessions one client address may open a minute, after a burst of 64 (default 60)")
    p.add_argument("--api-key", action="append", default=[], metavar="KEY",
                   help="a key for the OpenAI-compatible API at /v1 (repeatable): clients send Authorization: "
                        "Bearer KEY; with --api-key or --auth set, /v1 needs one (docs/api.md)")
    p.add_argument("--chat-template", default=None, metavar="FILE",
                   help="a Jinja chat template for chat requests, over the model's own (docs/api.md)")
    p.add_argument("--forwarded-allow-ips", type=parse_forwarded, default=(), metavar="ADDRESSES",
                   help="proxies whose X-Forwarded-For header names the client, comma-separated addresses or "
                        "networks (e.g. 127.0.0.1 behind a proxy or tunnel on this machine); default none: every "
                        "client is the address that connects (docs/sharing.md: Sharing safely)")
    return p


LOOPBACK = ("127.0.0.1", "localhost", "::1")


def exposure_problem(args) -> str | None:
    """Why serving as asked would expose the app without a password, or None."""
    exposed = args.share or args.host not in LOOPBACK
    if not exposed or args.auth:
        return None
    where = "a public gradio.live link" if args.share else f"every machine that can reach {args.host}"
    return (f"this would serve the app to {where} with no password. Add --auth user:password (or a file of them), "
            "or pass --public to do it knowingly. Visitors can never switch the model, read host files or change "
            "what other visitors see (docs/sharing.md: Sharing safely).")


def policy_from_args(args):
    from steer_ui.policy import Policy

    policy = Policy(allow_model_switch=bool(args.allow_model_switch), model_sources=tuple(policy_sources(args)),
                    device=args.device, dtype=args.dtype, weights=args.weights)
    for flag, attr in (("max_sessions", "max_sessions"), ("job_seconds", "job_seconds"),
                       ("queue_size", "queue_max_size"), ("batch_requests", "batch_requests"),
                       ("waiting_generations", "waiting_generations"), ("max_prompt_tokens", "max_prompt_tokens"),
                       ("sessions_per_address", "sessions_per_address"),
                       ("new_sessions_per_minute", "new_sessions_per_minute")):
        value = getattr(args, flag)
        if value is not None:
            if value <= 0:
                raise SystemExit(f"error: --{flag.replace('_', '-')} must be positive, got {value}")
            setattr(policy, attr, type(getattr(policy, attr))(value))
    return policy


def startup_message(args, local_url: str, share_url: str | None, has_auth: bool) -> str:
    """What the app prints once it listens: where, and how to share it safely."""
    lines = [f"steer_ui is running on {local_url}"]
    if share_url:
        lines.append(f"public link: {share_url}" + ("" if has_auth else "  (no password: --public was given)"))
    elif args.host in LOOPBACK:
        lines.append("only this machine can open it; to share with colleagues: --host 0.0.0.0 --auth user:pass "
                     "(local network) or --share --auth user:pass (public link)")
    if getattr(args, "forwarded_allow_ips", ()):
        lines.append("client addresses: from X-Forwarded-For where the connection comes from "
                     f"{', '.join(args.forwarded_allow_ips)}")
    lines.append("visitors cannot switch the model" if not args.allow_model_switch else
                 f"visitors may switch the model to: {', '.join(policy_sources(args))}")
    return "\n".join(lines)


def policy_sources(args) -> list[str]:
    return list(dict.fromkeys([args.model] + [c.strip() for c in (args.model_choices or "").split(",")
                                              if c.strip()]))


def main(argv: list[str] | None = None) -> int:
    from steer_ui.heap import bound_arenas

    bound_arenas()  # before any thread starts (steer_ui/heap.py says why)
    args = build_parser().parse_args(argv)
    if isinstance(args.max_file_size, str):
        args.max_file_size = parse_size(args.max_file_size)
    auth = parse_auth(args.auth)
    problem = exposure_problem(args)
    if problem and not args.public:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if problem:
        print(f"warning: {problem}", file=sys.stderr)

    policy = policy_from_args(args)
    chat_template = None
    if args.chat_template:
        try:
            chat_template = Path(args.chat_template).expanduser().read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            print(f"error: --chat-template: {exc}", file=sys.stderr)
            return 2
    from steer_ui.store import StoreError, default_spec, open_for_serving, where

    # before the heavy imports: a store that is missing, read-only, full or locked is said in one line at once
    try:
        library = open_for_serving(args.store, policy)
    except StoreError as exc:
        line = getattr(exc, "line", None) or str(exc)
        if (args.store or "").strip():  # the store the operator named: serving without it is not what was asked
            print(f"error: --store {where(args.store.strip())}: {line}", file=sys.stderr)
            return 2
        # the default place (a newcomer's first run, a read-only home): the app still comes up, keeping nothing
        print(f"warning: the library at {default_spec()} {line}; serving with keeping off (visitors' work is not "
              "kept, and the page says so): --store PATH names another place, --store off says it knowingly",
              file=sys.stderr)
        library = None

    from steer_ui.model import static_decode
    from steer_ui.service import Service, UserError
    from steer_ui.ui.app import build_demo, launch_kwargs

    try:  # an operator's typo in STEER_UI_DECODE stops the launch here, not every generation later
        static_decode.setting(None)
    except static_decode.StaticDecodeError as exc:
        print(f"error: {static_decode.ENV}: {exc}", file=sys.stderr)
        return 2

    if library is not None and library.db.moved_aside is not None:
        print(f"warning: the library at {library.db.spec} could not be read; it was moved aside to "
              f"{library.db.moved_aside} (never deleted) and a new, empty one started", file=sys.stderr)
    if library is not None:
        library.keep_tidy()  # lifetimes and the disk budget (docs/sharing.md: What is kept)
    backend = Service(max_file_bytes=args.max_file_size, policy=policy, default_view=True, library=library,
                      vectors_dir=Path(args.vectors).expanduser() if args.vectors else None,
                      chat_template=chat_template)
    if args.wait or args.model.startswith("tiny:"):
        try:
            backend.load_model(args.model, args.device, args.dtype, weights=args.weights,
                               progress=lambda f, m: print(f"[{f:4.0%}] {m}", file=sys.stderr, flush=True))
        except UserError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    else:
        print(f"loading {args.model} in the background; the page works meanwhile", file=sys.stderr)
        backend.load_in_background(args.model, args.device, args.dtype, weights=args.weights)

    share = args.share
    if share and not internet_reachable():
        print("warning: --share needs internet access to gradio's tunnel server "
              f"({SHARE_PROBE[0]}), which cannot be reached from here; serving locally only.", file=sys.stderr)
        share = False

    demo = build_demo(backend)
    # api_open=False: direct POSTs to /gradio_api/run/... would skip the queue and its concurrency slot
    demo.queue(default_concurrency_limit=4, max_size=policy.queue_max_size, api_open=False)
    # quiet: gradio's own banner suggests share=True in launch(); ours names this app's flags instead
    demo.launch(**launch_kwargs(policy, server_name=args.host, server_port=args.port, share=share,
                                auth=auth, max_file_size=args.max_file_size, prevent_thread_lock=True, quiet=True,
                                forwarded_allow_ips=args.forwarded_allow_ips))
    from steer_ui.openai_api.server import install
    from steer_ui.ui.request_guard import forwarded_trusted

    install(demo.app, backend, args.api_key, auth or ())  # /v1, OpenAI's shape, on the same server

    if forwarded_trusted(demo) != ",".join(args.forwarded_allow_ips):  # a gradio that passes uvicorn its own list
        print(f"error: the server trusts X-Forwarded-For from '{forwarded_trusted(demo)}', not from what "
              "--forwarded-allow-ips names; stopping rather than let clients choose their address", file=sys.stderr)
        demo.close()
        return 2
    print(startup_message(args, demo.local_url, demo.share_url if share else None, auth is not None), flush=True)
    if share and not demo.share_url:
        print("warning: the public share link could not be created; the app is still served locally.",
              file=sys.stderr)
    try:
        demo.block_thread()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
