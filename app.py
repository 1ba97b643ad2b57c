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
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 for the local network)")
    p.add_argument("--port", type=int, default=7860)
    p.add_argument("--share", action="store_true", help="also create a public gradio.live link (needs internet)")
    p.add_argument("--auth", help="user:password, or a file with one user:password per line")
    p.add_argument("--max-file-size", type=parse_size, default="50MB", help="upload limit, e.g. 50MB (default)")
    p.add_argument("--wait", action="store_true", help="load the model before serving instead of in the background")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if isinstance(args.max_file_size, str):
        args.max_file_size = parse_size(args.max_file_size)
    auth = parse_auth(args.auth)

    from steer_ui.service import Service, UserError
    from steer_ui.ui.app import build_demo, launch_kwargs

    backend = Service(max_file_bytes=args.max_file_size)
    if args.wait or args.model.startswith("tiny:"):
        try:
            backend.load_model(args.model, args.device, args.dtype,
                               progress=lambda f, m: print(f"[{f:4.0%}] {m}", file=sys.stderr, flush=True))
        except UserError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    else:
        print(f"loading {args.model} in the background; the page works meanwhile", file=sys.stderr)
        backend.load_in_background(args.model, args.device, args.dtype)

    share = args.share
    if share and not internet_reachable():
        print("warning: --share needs internet access to gradio's tunnel server "
              f"({SHARE_PROBE[0]}), which cannot be reached from here; serving locally only.", file=sys.stderr)
        share = False

    demo = build_demo(backend)
    demo.queue(default_concurrency_limit=4)
    demo.launch(**launch_kwargs(server_name=args.host, server_port=args.port, share=share, auth=auth,
                                max_file_size=args.max_file_size, prevent_thread_lock=True, quiet=False))
    if share and not demo.share_url:
        print("warning: the public share link could not be created (see gradio's message above); "
              "the app is still served locally.", file=sys.stderr)
    try:
        demo.block_thread()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
