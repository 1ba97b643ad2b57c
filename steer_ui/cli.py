"""``python -m steer_ui``: the headless CLI, on the same core as the app.

Every command takes ``--model`` (default: the embedded Gemma 3 270M) and
``--json``, which prints exactly one JSON object on stdout (``{"error": ...}``
on failure, with a non-zero exit and no traceback).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

from .policy import DECODE_SETTINGS, DTYPES, WEIGHTS
from .vector import POSITIONS

COMMANDS: dict[str, Callable[[argparse.Namespace], dict]] = {}


class CliError(Exception):
    """An expected failure: printed as one line, exit code 2."""


def command(name: str):
    def register(fn):
        COMMANDS[name] = fn
        return fn
    return register


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="embedded (default), a hub id, a local directory, a .gguf file, tiny:FAMILY, "
                   "or random:SHAPE (a real shape with random weights: llama-8b, llama-1b, llama-mini)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N, mps, or multi (accelerate device_map='auto')")
    p.add_argument("--dtype", default="auto", choices=DTYPES,
                   help="auto: bfloat16 on CUDA (float16 where bfloat16 is unsupported), float32 on CPU and MPS")
    p.add_argument("--weights", default="auto", choices=("auto",) + WEIGHTS,
                   help="auto: int8 on a CPU where the model has its own int8 codes (a GGUF) within the measured "
                        "bound, else float32 (CPU) or the dtype's; int8: weight-only, float32 arithmetic (CPU)")
    p.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")


def _steering_args(p: argparse.ArgumentParser, spec: bool = True) -> None:
    if spec:
        p.add_argument("--steering", metavar="SPEC", help='several vectors at once: JSON such as {"vectors": '
                       '[{"source": "v.safetensors", "scale": 0.3, "layers": [6], "normalize": true}, ...]} or a '
                       'file of it (docs/cli.md); instead of --vector/--random-vector/--layer/--alpha/--relative')
    p.add_argument("--vector", help="a steering-vector file (any supported format)")
    p.add_argument("--random-vector", type=int, metavar="SEED", help="a seeded unit random direction")
    p.add_argument("--layer", type=int, help="decoder block whose output is steered (default: the vector's, or the middle)")
    p.add_argument("--alpha", type=float, default=0.0)
    p.add_argument("--relative", action="store_true", help="alpha as a fraction of the layer's mean residual norm")
    p.add_argument("--positions", choices=POSITIONS, default=None,
                   help="where to steer (default: the vector's own); last = the last prompt token and generated ones")


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, so ``--json`` still prints one JSON object for a bad flag."""

    def error(self, message: str):
        raise CliError(message)


def _method_flags(p: argparse.ArgumentParser) -> None:
    """``--method`` plus one flag per setting name of every registered method (generated from the settings).

    Two methods may share a setting name with different types, choices or bounds (ITI's and L2S's
    ``steer_positions``), so argparse only collects the text typed: the chosen method's own settings parser
    converts and checks it, and refuses a flag that method does not have.  Flags default to None ("not given"),
    so a method sees only what the user typed.  A name that is a switch (true/false) in every method that has
    it is a switch here too, with a ``--no-`` form.
    """
    from .methods.base import aliases, all_methods, specs

    methods = all_methods()
    p.add_argument("--method", required=True, choices=[m.name for m in methods])
    per_name: dict[str, list[tuple[str, Any]]] = {}
    for m in methods:
        for spec in specs(m.Settings):
            per_name.setdefault(spec.name, []).append((m.name, spec))
        for alias, targets in aliases(m.Settings).items():
            target = next(s for s in specs(m.Settings) if s.name == targets[0])
            per_name.setdefault(alias, []).append((m.name, dataclasses.replace(
                target, name=alias, flag=None, help=f"sets {', '.join(targets)}")))
    for name, owned in per_name.items():
        flag = owned[0][1].cli_flag
        helps = dict.fromkeys(f"{spec.help}{_choices_text(spec)}" for _, spec in owned)
        text = "; ".join(f"[{', '.join(m for m, s in owned if f'{s.help}{_choices_text(s)}' == h)}] {h}"
                         for h in helps)
        if all(spec.kind == "bool" for _, spec in owned):
            p.add_argument(flag, dest=name, action="store_const", const=True, default=None, help=text)
            p.add_argument("--no-" + flag[2:], dest=name, action="store_const", const=False, default=None,
                           help=argparse.SUPPRESS)
        else:
            p.add_argument(flag, dest=name, default=None, metavar="VALUE", help=text)
    p.set_defaults(_settings=list(per_name))


def _choices_text(spec) -> str:
    return f" (one of: {', '.join(map(str, spec.choices))})" if spec.choices else ""


def _flag_names(message: str) -> str:
    """A settings error in the CLI's words: the setting names it mentions as their flags.  Names with an
    underscore are identifiers wherever they appear; one-word names (layer, seed) only where the message uses
    them as a setting ("seed must be …", "layer=…", a list of names), not in its prose."""
    import re

    from .methods.base import all_methods, specs

    names = {s.name: s.cli_flag for m in all_methods() for s in specs(m.Settings)}
    for name in sorted(names, key=len, reverse=True):
        as_setting = "" if "_" in name else r"(?=\s+must\b|=|,|;|$)"
        message = re.sub(rf"(?<![\w-]){re.escape(name)}(?![\w-]){as_setting}", names[name], message)
    return message


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m steer_ui", description="Activation steering, headless.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("generate", help="unsteered and steered continuations side by side")
    _common(p)
    _steering_args(p)
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--prompt", help="a text to continue")
    what.add_argument("--chat", action="append", metavar="MESSAGE",
                      help="a user turn of a conversation through the model's chat template (repeatable: each turn "
                           "is answered by both sides, each from its own history)")
    what.add_argument("--messages", metavar="FILE", help="a JSON list of chat messages ({role, content}: system, "
                                                         "user, assistant; the last a user's) that both sides answer")
    p.add_argument("--system", default=None, help="with --chat: a system message")
    p.add_argument("--steer-prompt", action="store_true",
                   help="with --chat/--messages: steer the conversation's text too, not only the reply")
    p.add_argument("--chat-template", metavar="FILE", help="a Jinja chat template over the model's own")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--repetition-penalty", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--max-delta-logit", type=float, default=None,
                   help="hold every steered step's centred logit change against the unsteered model on the same "
                        "text within this (0 = off): where a step goes over, its change is scaled down to the limit; "
                        "default: the vector's own bound where it states one (a constrained TSV vector does), else off")

    p = sub.add_parser("next-token", help="next-token distribution unsteered vs steered")
    _common(p)
    _steering_args(p)
    p.add_argument("--prompt", required=True)
    p.add_argument("--top-k", type=int, default=10)

    p = sub.add_parser("sweep", help="dose-response table over alphas from one batched pass")
    _common(p)
    _steering_args(p, spec=False)
    p.add_argument("--prompt", required=True)
    p.add_argument("--alphas", default="-1,-0.5,-0.25,0,0.25,0.5,1", help="comma-separated alphas")
    p.add_argument("--target", help="report this token's probability")

    p = sub.add_parser("compare", help="one vector over many prompts: both generations of each, and with a pairs "
                                       "dataset each held-out prompt's margin over alpha and its steerability")
    _common(p)
    _steering_args(p, spec=False)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompts", metavar="FILE", help="a text file, one prompt per line")
    source.add_argument("--data", metavar="FILE", help="a pairs dataset (prompt, positive, negative): its held-out "
                                                       "prompts, with margins and steerability")
    p.add_argument("--alpha-max", type=float, default=None,
                   help="the margin grid spans ±this (default: 2 × |alpha|, or 1 when alpha is 0)")
    p.add_argument("--alphas", help="comma-separated alphas for the margins instead of the grid")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--seed", type=int, default=0, help="the random vector's seed when --random-vector is not given")
    p.add_argument("--csv", action="store_true", help="print the rows as CSV instead")

    p = sub.add_parser("probe-layers", help="per-layer logistic probes on a labelled dataset")
    _common(p)
    p.add_argument("--data", required=True)
    p.add_argument("--position", choices=("last", "mean"), default="last")
    p.add_argument("--schema", default=None)
    p.add_argument("--seed", type=int, default=0)

    p = sub.add_parser("train", help="train a steering vector and save it (flags come from each method's settings)")
    _common(p)
    p.add_argument("--data", required=True)
    p.add_argument("--schema", default=None)
    p.add_argument("--out", required=True)
    _method_flags(p)

    p = sub.add_parser("detect", help="score answers with a TSV vector")
    _common(p)
    p.add_argument("--vector", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--schema", default=None)

    p = sub.add_parser("export", help="write a vector in another tool's format")
    _common(p)
    p.add_argument("--vector", required=True)
    p.add_argument("--format", required=True, choices=("native", "gguf", "steering-vectors", "neuronpedia", "caa"))
    p.add_argument("--out", required=True)

    p = sub.add_parser("import", help="read a vector from any supported format into the native one")
    _common(p)
    p.add_argument("--in", dest="inp", required=True)
    p.add_argument("--out", required=True)

    p = sub.add_parser("library", help="the library of kept vectors: list, add (listed for every visitor), remove, "
                                       "share, unshare")
    _common(p)
    p.add_argument("action", choices=("list", "add", "remove", "share", "unshare"))
    p.add_argument("target", nargs="?", help="add: a vector file; remove, share, unshare: a vector's name")
    p.add_argument("--name", help="add: the name visitors see (default: the vector's own)")
    p.add_argument("--owner", help="an owner's token (from /whoami): act on that owner's vectors, not the listed ones")
    p.add_argument("--store", default=None, help="the library (default ~/.cache/steer_ui/library.db, or a "
                                                  "postgresql:// URL), as app.py --store")

    p = sub.add_parser("bench", help="the benchmark (ratios measured in one run)")
    _common(p)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", help="also write the JSON here (after every section, so a run cut short leaves what "
                                  "it measured, marked incomplete)")
    p.add_argument("--skip", default="", help="comma-separated sections to leave out: "
                   "training, extract, bf16_lm_head, bf16_model, cold_load, alpha_grid, vs_float32, many_prompts")
    p.add_argument("--decode", choices=DECODE_SETTINGS, default=None,
                   help="the decode path of the side-by-side and many-users sections (default: "
                        "$STEER_UI_DECODE or auto: a captured static step on CUDA, the fused one on a CPU where "
                        "the model allows it, the dynamic one elsewhere)")
    return parser


# ------------------------------------------------------------------ helpers
def load_handle(args: argparse.Namespace):
    from .model.loading import load_model

    return load_model(args.model, device=args.device, dtype=args.dtype, progress=_stderr_progress,
                      weights=args.weights)


CLI_SESSION = "cli-local-session"  # the command's one session at the door


def open_door(args: argparse.Namespace, handle=None):
    """(the door over the loaded model, the CLI's session): a command asks what the app's fronts ask, checked by
    the same rules (with a local user's room: :meth:`Policy.local`), so `generate` here and Generate on the page
    are one request.  The door's scratch folder goes when the command ends."""
    import atexit
    import shutil
    import tempfile

    from .policy import Policy
    from .service import Service

    workdir = tempfile.mkdtemp(prefix="steer_ui-cli-")
    atexit.register(shutil.rmtree, workdir, True)
    template = None
    if getattr(args, "chat_template", None):
        try:
            template = Path(args.chat_template).expanduser().read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CliError(f"--chat-template: {exc}") from None
    door = Service(handle or load_handle(args), max_file_bytes=1 << 40, workdir=workdir, policy=Policy.local(),
                   chat_template=template)
    return door, CLI_SESSION


def steering_from_args(args: argparse.Namespace, service, session: str):
    """(the command's steering spec, warnings): ``--steering`` (JSON text, or a file of it) or today's one-vector
    flags.  A vector file it names is imported through the door first, which takes names and never paths."""
    from . import steering_spec

    text = getattr(args, "steering", None)
    if text:
        if not text.lstrip().startswith("{"):
            try:
                text = Path(text).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise CliError(f"--steering: {exc}") from None
        spec = steering_spec.parse(text, service.policy.max_steering_terms, layers=service.handle.arch.num_layers)
        terms, warnings = [], []
        for term in spec.terms:
            if not term.random and Path(term.source).is_file():
                name, more = service.import_vector(session, term.source)
                term, warnings = dataclasses.replace(term, source=name), warnings + list(more)
            terms.append(term)
        return steering_spec.Spec(tuple(terms)), warnings
    warnings: list = []
    if getattr(args, "vector", None):
        source, warnings = service.import_vector(session, args.vector)
        seed = 0
    elif getattr(args, "random_vector", None) is not None:
        source, seed = steering_spec.RANDOM_SOURCE, args.random_vector
    else:  # no vector: both sides the same model (α = 0 adds exactly nothing)
        source, seed = steering_spec.RANDOM_SOURCE, 0
        return steering_spec.one(source, 0.0, args.layer, args.relative, seed), warnings
    return steering_spec.one(source, args.alpha, args.layer, args.relative, seed, args.positions), list(warnings)


def _steering_report(args, service, session, spec, warnings) -> dict:
    """What every steering command reports beside its numbers: the model, where and how strongly it steered."""
    steers = service.steers_for(session, spec)
    layers = sorted({s.layer for s in steers if hasattr(s, "layer")})
    return {"model": service.handle.model_id, "layer": layers[0] if len(layers) == 1 else layers or None,
            "alpha": args.alpha, "relative": args.relative, "steering": spec.as_dict(),
            "raw_alpha": [float(s.alpha.reshape(-1)[0]) for s in steers], "warnings": warnings}


# ----------------------------------------------------------------- commands
@command("generate")
def cmd_generate(args) -> dict:
    from .service import last_frame

    service, session = open_door(args)
    spec, warnings = steering_from_args(args, service, session)
    limit = service.delta_limit(session, spec, args.max_delta_logit)
    sampling = service.sampling(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                                top_p=args.top_p, repetition_penalty=args.repetition_penalty, seed=args.seed,
                                max_delta_logit=limit, stop=args.stop)
    if args.chat or args.messages:
        result = _chat(args, service, session, spec, sampling)
    else:
        result = last_frame(service.stream_generate_for(session, args.prompt, spec, sampling)).as_dict()
    result.update(_steering_report(args, service, session, spec, warnings), max_delta_logit=sampling.max_delta_logit)
    return result


def _chat(args, service, session, spec, sampling) -> dict:
    """``--chat`` turns through the chat room (each side keeps its own history), or ``--messages``' conversation
    answered by both sides: ``{"system", "turns": [{"user", "unsteered", "steered", ...}]}``."""
    from .service import last_frame

    if args.messages:
        try:
            messages = json.loads(Path(args.messages).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CliError(f"--messages: {exc}") from None
        last = last_frame(service.chat_answer(session, messages, spec, args.steer_prompt, sampling))
        return {"messages": messages, "prompt": last["prompt"], "unsteered": {"text": last["unsteered"]},
                "steered": {"text": last["steered"]}}
    for message in args.chat:
        last_frame(service.chat_turn(session, message, spec, args.system or "", args.steer_prompt, sampling))
    view = service.chat_view(session)
    last = view["turns"][-1]
    return {**view, "unsteered": {"text": last["unsteered"]}, "steered": {"text": last["steered"]}}


@command("next-token")
def cmd_next_token(args) -> dict:
    service, session = open_door(args)
    spec, warnings = steering_from_args(args, service, session)
    out = service.next_token_for(session, args.prompt, spec, top_k=args.top_k).as_dict()
    out.update(_steering_report(args, service, session, spec, warnings))
    return out


@command("sweep")
def cmd_sweep(args) -> dict:
    service, session = open_door(args)
    if not (args.vector or args.random_vector is not None):
        raise CliError("sweep needs --vector FILE or --random-vector SEED")
    spec, warnings = steering_from_args(args, service, session)
    try:
        alphas = [float(a) for a in args.alphas.split(",") if a.strip()]
    except ValueError:
        raise CliError(f"--alphas must be comma-separated numbers, got '{args.alphas}'") from None
    term = spec.terms[0]
    frame = service.sweep(session, args.prompt, term.source if not term.random else None, args.layer,
                          relative=args.relative, seed=term.seed, target=args.target, alphas=alphas)
    frame = frame.rename(columns={"alpha": "alpha_requested", "raw_alpha": "alpha"})
    layer = service.steers_for(session, spec)[0].layer
    return {"model": service.handle.model_id, "layer": layer, "relative": args.relative,
            "rows": frame.to_dict("records"), "warnings": warnings}


@command("compare")
def cmd_compare(args) -> dict:
    from .service import RANDOM, Service

    handle = load_handle(args)
    service = Service(handle)
    session = "cli-compare-session"
    if args.vector:
        name, warnings = service.import_vector(session, args.vector)
    elif args.random_vector is not None:
        name, warnings = RANDOM, []
    else:
        raise CliError("compare needs --vector FILE or --random-vector SEED")
    prompts = ""
    if args.prompts:
        try:
            prompts = open(args.prompts, encoding="utf-8").read()
        except (OSError, UnicodeDecodeError) as exc:
            raise CliError(f"--prompts: {exc}") from None
    else:
        service.upload_dataset(session, args.data)
    alphas = None
    if args.alphas:
        try:
            alphas = [float(a) for a in args.alphas.split(",") if a.strip()]
        except ValueError:
            raise CliError(f"--alphas must be comma-separated numbers, got '{args.alphas}'") from None
    alpha_max = args.alpha_max if args.alpha_max is not None else (2 * abs(args.alpha) or 1.0)
    seed = args.random_vector if args.random_vector is not None else args.seed
    out = service.compare(session, prompts, use_dataset=bool(args.data), vector_name=name, layer=args.layer,
                          alpha=args.alpha, relative=args.relative, seed=seed, alpha_max=alpha_max,
                          sampling=service.sampling(max_new_tokens=args.max_new_tokens), alphas=alphas,
                          positions=args.positions)
    out["summary"].update(model=handle.model_id, vector=name, layer=args.layer, warnings=list(warnings))
    return out


@command("probe-layers")
def cmd_probe_layers(args) -> dict:
    service, session = open_door(args)
    service.upload_dataset(session, args.data, schema=args.schema)
    return service.probe_layers(session, position=args.position, seed=args.seed, progress=_stderr_progress)


@command("train")
def cmd_train(args) -> dict:
    from .methods import get, parse_settings

    method = get(args.method)
    values = {name: getattr(args, name) for name in args._settings if getattr(args, name) is not None}
    try:  # the typed text with this method's types and bounds, before the model loads; refuses unknown flags
        parse_settings(method.Settings, values)
    except ValueError as exc:
        raise CliError(_flag_names(str(exc).splitlines()[0] if str(exc) else "bad settings")) from None
    from .messages import UserError

    service, session = open_door(args)
    service.upload_dataset(session, args.data, schema=args.schema)
    try:
        name, report = service.train(session, args.method, progress=_stderr_progress, settings=values)
    except UserError as exc:  # a setting named in the refusal is named as its flag here
        raise CliError(_flag_names(str(exc).splitlines()[0])) from None
    vector = service.get_vector(session, name)
    vector.save(args.out)
    return {"out": args.out, **vector.metadata(), **({"report": report} if report else {})}


@command("detect")
def cmd_detect(args) -> dict:
    service, session = open_door(args)
    name, warnings = service.import_vector(session, args.vector)
    out = service.detect(session, name, path=args.data, schema=args.schema)
    out["warnings"] = warnings
    return out


@command("export")
def cmd_export(args) -> dict:
    from .formats import export_notes, read_vector, write_vector

    vector, warnings = read_vector(args.vector)
    written = write_vector(vector, args.format, args.out)
    return {"format": args.format, "out": [str(p) for p in written],
            "warnings": warnings + export_notes(vector, args.format)}


@command("import")
def cmd_import(args) -> dict:
    from .formats import read_vector

    handle = load_handle(args) if args.model else None
    vector, warnings = read_vector(args.inp, handle)
    vector.save(args.out)
    return {"out": args.out, **vector.metadata(), "warnings": warnings}


@command("bench")
def cmd_bench(args) -> dict:
    from .model import static_decode
    from .tools.bench import SKIPPABLE, run_bench

    if args.decode:  # every batch the run makes reads the setting
        os.environ[static_decode.ENV] = args.decode
    def write(result: dict) -> None:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)

    skip = tuple(name.strip() for name in args.skip.split(",") if name.strip())
    unknown = sorted(set(skip) - set(SKIPPABLE))
    if unknown:
        raise CliError(f"--skip: no section {', '.join(unknown)} (choose from {', '.join(SKIPPABLE)})")
    result = run_bench(model=args.model, device=args.device, dtype=args.dtype, quick=args.quick, weights=args.weights,
                       log=lambda m: print(m, file=sys.stderr, flush=True), skip=skip,
                       partial=write if args.out else None)
    if args.out:
        write(result)
    return result


@command("library")
def cmd_library(args) -> dict:
    """Manage the library from the shell; ``add`` checks the file against the model (--model) like an import."""
    from .messages import UserError
    from .policy import Policy
    from .store import open_library
    from .store.library import KINDS

    library = open_library(args.store, Policy())
    if library is None:
        raise CliError("--store off: there is no library to manage")
    owner = None
    if args.owner is not None:
        owner = library.owner_of(args.owner)
        if owner is None:
            raise CliError("--owner: this library issued no such owner token")
    if args.action != "list" and not args.target:
        raise CliError(f"library {args.action} needs a {'file' if args.action == 'add' else 'vector name'}")
    try:
        if args.action == "list":
            rows = [{"kind": kind, "name": i["name"], "share_id": i["share_id"], "listed": bool(i["listed"]),
                     "model": i["model"], "bytes": i["size"]} for kind in KINDS for i in library.items(owner, kind)]
            return {"owner": bool(owner), "items": rows}
        if args.action == "add":
            from . import names
            from .formats import read_vector
            from .keeping import native_bytes
            from .model.identity import model_fingerprint

            handle = load_handle(args)
            path = Path(args.target)
            vector, warnings = read_vector(path, handle)  # checked like an import, against this model
            name = names.checked((args.name or vector.name or path.stem).strip()[:200])  # listed as it is
            native = library.save(owner, "vector", name, native_bytes(vector), {"method": vector.method},
                                  model_fingerprint(handle), listed=owner is None)
            return {"added": name, "listed": bool(native["listed"]), "warnings": warnings}
        if args.action == "remove":
            return {"removed": library.remove(owner, "vector", args.target)}
        if owner is None:
            raise CliError(f"library {args.action} acts on an owner's vector: give --owner TOKEN "
                           "(listed vectors are open to everyone already)")
        if args.action == "share":
            share_id = library.share(owner, args.target)
            return {"name": args.target, "share_id": share_id, "link": f"/?vector={share_id}"}
        return {"name": args.target, "unshared": library.unshare(owner, args.target)}
    except UserError as exc:
        raise CliError(str(exc)) from None
    finally:
        library.db.close()


def _expected_errors() -> tuple[type, ...]:
    """Input errors, printed as one line: every core error type is a ValueError except the loader's and the
    service's refusals (a command that goes through the service, such as compare's import)."""
    from .messages import UserError
    from .model.loading import ModelLoadError
    from .store import StoreError

    return (CliError, ValueError, ModelLoadError, FileNotFoundError, StoreError, UserError)


def _stderr_progress(fraction: float, message: str) -> None:
    print(f"[{fraction:4.0%}] {message}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    wants_json = "--json" in argv
    try:
        args = build_parser().parse_args(argv)
        result: Any = COMMANDS[args.command](args)
    except _expected_errors() as exc:
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if wants_json:
            print(json.dumps({"error": message}))
        print(f"error: {message}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result, default=str))
    elif getattr(args, "csv", False):
        import pandas as pd

        print(pd.DataFrame(result["rows"]).to_csv(index=False), end="")
    else:
        _print_human(args.command, result)
    return 0


def _print_human(command_name: str, result: dict) -> None:
    if command_name == "generate":
        for turn in result.get("turns", [])[:-1]:  # a chat's earlier turns, each side's own reply
            print(f"user:      {turn['user']}\nunsteered: {turn['unsteered']}\nsteered:   {turn['steered']}\n")
        if result.get("turns"):
            print(f"user:      {result['turns'][-1]['user']}")
        print(f"unsteered: {result['unsteered']['text']}")
        print(f"steered:   {result['steered']['text']}")
    elif command_name == "next-token":
        print(f"{'unsteered':<28}{'steered':<28}")
        for u, s in zip(result["unsteered"], result["steered"]):
            print(f"{u['token']!r:<18}{u['prob']:<10.4f}{s['token']!r:<18}{s['prob']:.4f}")
        print(f"KL={result['kl']:.4f}  max centred |Δlogit| among likely tokens (p >= 0.1%)="
              f"{result['likely_max_abs_delta_logit']:.3f} ({result['likely_max_delta_token']!r})"
              f"{'  logits exploding' if result['exploding'] else ''}  whole vocabulary max |Δlogit|="
              f"{result['max_abs_delta_logit']:.3f} ({result['max_delta_token']!r})")
    else:
        print(json.dumps(result, indent=2, default=str))
