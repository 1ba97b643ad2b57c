"""llama.cpp on the same GGUF, in the same run: the bench's measures against it (issues #37 and #50).

llama.cpp (through llama-cpp-python) is what a person would run this model with on a laptop CPU, so the
bench times it beside our decode, in this process, on as many threads as torch uses, with our steering
vector set as llama.cpp's control vector at the same block (its layer ``il`` adds to block ``il``'s output,
as ours does).  Both sides are given the same prompt token ids (ours), so they decode the same input.

* :func:`bench_vs_llama_cpp`, one sequence: llama.cpp's steered token against our side-by-side step
  (unsteered, steered and counterfactual rows: the page) -> ``vs_llama_cpp``, and against our steered-only
  step (the one row an API client without ``compare`` or log-probabilities gets) ->
  ``one_sequence_vs_llama_cpp``; the three runs interleaved, per-step medians.
* :func:`bench_batch8_vs_llama_cpp`, a room of people: eight prompts, 32 new tokens each, eight different
  steering vectors in one of our :class:`~steer_ui.model.generation.DecodeBatch`\\ es (steered-only rows,
  admitted as the engine admits them), against llama.cpp decoding the same eight prompts in one
  ``llama_decode`` batch per step (eight sequence ids, greedy argmax here) with one control vector for all,
  since it has no per-sequence vectors -> ``batch8_vs_llama_cpp``, wall time over wall time.

Without ``llama_cpp`` installed, for a model not loaded from a GGUF, or off the CPU, each measure says
``skipped: ...`` and the bench goes on.  ``python -m steer_ui.tools.vs_llama_cpp`` runs these alone.
"""
from __future__ import annotations

import ctypes
import gc
import json
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from ..model.generation import DecodeBatch, Request, Sampling, encode_prompt, prefill_groups
from ..model.loading import EMBEDDED, embedded_gguf_path
from ..model.precision import PROBE_PROMPTS
from .many_users import PROMPTS as MANY_USERS_PROMPTS
from .measures import GENERATION_PROMPT, _ours, seeded_steer
from .timing import interleaved, loadavg, median, ms, ratio, sync

INSTALL = "pip install llama-cpp-python==0.3.36"
# eight prompts of different lengths (6 to 13 tokens on the embedded model), one per sequence of the batch
BATCH8_PROMPTS = (*PROBE_PROMPTS, *MANY_USERS_PROMPTS[1:3])
BATCH8_SEQUENCES = 8


def llama_cpp_gguf(handle):
    """(the ``llama_cpp`` module, the model's GGUF path), or the reason these measures are skipped (a str)."""
    try:
        import llama_cpp
    except ImportError:
        return f"skipped: llama_cpp is not installed ({INSTALL})"
    source = handle.source
    if source != EMBEDDED and not str(source).endswith(".gguf"):
        return "skipped: llama.cpp runs GGUF models; this model was not loaded from one"
    if handle.device.type != "cpu":  # the binding is built for the CPU here; a GPU run against it says nothing
        return f"skipped: llama.cpp is timed on the CPU, this run is on {handle.device.type}"
    return llama_cpp, embedded_gguf_path() if source == EMBEDDED else Path(source).expanduser()


@contextmanager
def loaded_llama(llama_cpp, gguf: Path, threads: int):
    """llama-cpp-python's ``Llama`` on ``gguf`` with its default settings but the threads, freed on exit."""
    llm = llama_cpp.Llama(model_path=str(gguf), n_threads=threads, n_threads_batch=threads, n_ctx=512,
                          verbose=False, seed=0)
    try:
        yield llm
    finally:
        llm.close()
        del llm
        gc.collect()


def set_control_vector(llama_cpp, ctx, steer, num_layers: int, hidden: int) -> int:
    """Set ``steer`` (α·v at block ``steer.layer``) as the control vector of the llama.cpp context ``ctx``; 0 if
    llama.cpp took it.  llama.cpp reads one row per layer from layer 1 on (row ``il - 1`` is layer ``il``'s)."""
    data = torch.zeros(num_layers, hidden, dtype=torch.float32)
    data[steer.layer - 1] = steer.vector.float().cpu() * float(steer.scalar_alpha)
    buffer = (ctypes.c_float * data.numel())(*data.reshape(-1).tolist())
    return llama_cpp.llama_set_adapter_cvec(ctx, buffer, data.numel(), hidden, steer.layer, steer.layer)


def prompt_ids(handle, prompt: str) -> list[int]:
    """The prompt's token ids as our decode gets them; llama.cpp is given the same ids (same GGUF vocabulary)."""
    return encode_prompt(handle, prompt)[0].tolist()


# ------------------------------------------------------------------ one sequence
def llama_cpp_steered_steps(llm, ids: list[int], n_tokens: int) -> list[float]:
    """Seconds of each of ``n_tokens`` greedy steps after the first token (the prompt's pass and the first token
    are left out, as our per-step times leave out the prefill): the time between one token and the next, as
    ours are timed, so both medians shrug off the same stalls."""
    llm.reset()
    stamps = []
    for _token in llm.generate(ids, temp=0.0, top_k=1, reset=True):
        stamps.append(time.perf_counter())
        if len(stamps) == n_tokens + 1:
            break
    return [b - a for a, b in zip(stamps, stamps[1:])]


def bench_vs_llama_cpp(handle, steer, n_tokens: int, reps: int, log) -> dict:
    """One steered sequence: llama.cpp's per-token time against our side-by-side step and our steered-only step,
    same GGUF, prompt, token count and threads; medians of every step of every counted run, the three runs
    interleaved (their order turned each rep) after one warm-up run of each.  Ours decode in one kept
    :class:`DecodeBatch` each, the default decode path."""
    found = llama_cpp_gguf(handle)
    if isinstance(found, str):
        return {"status": found}
    llama_cpp, gguf = found
    log(f"bench: llama.cpp on {gguf.name}, one sequence ({reps} x {n_tokens} steered tokens, interleaved with our "
        "side-by-side and steered-only decodes)")
    threads = torch.get_num_threads()
    ids = prompt_ids(handle, GENERATION_PROMPT)
    with loaded_llama(llama_cpp, gguf, threads) as llm:
        status = set_control_vector(llama_cpp, llm.ctx, steer, handle.arch.num_layers, handle.arch.hidden_size)
        if status != 0:
            return {"status": f"failed: llama.cpp refused the control vector ({status})"}
        batches = {"side_by_side": DecodeBatch(handle), "steered_only": DecodeBatch(handle)}
        runs = {
            "llama_cpp": lambda: llama_cpp_steered_steps(llm, ids, n_tokens),
            "side_by_side": lambda: _ours(handle, GENERATION_PROMPT, [steer], n_tokens, batches["side_by_side"])[1],
            "steered_only": lambda: _ours(handle, GENERATION_PROMPT, [steer], n_tokens, batches["steered_only"],
                                          steered_only=True)[1],
        }
        per_run = interleaved(runs, reps)
    steered, both, alone = (median([step for run in per_run[name] for step in run])
                            for name in ("llama_cpp", "side_by_side", "steered_only"))
    return {"status": "measured", "llama_cpp_version": getattr(llama_cpp, "__version__", "?"), "threads": threads,
            "new_tokens": n_tokens, "reps": reps, "prompt_tokens": len(ids),
            "decode_path": batches["steered_only"].decode_path,
            "llama_cpp_steered_ms_per_token": ms(steered),
            "ours_ms_per_step": ms(both), "ours_steered_only_ms_per_step": ms(alone),
            "vs_llama_cpp": ratio(both, steered), "one_sequence_vs_llama_cpp": ratio(alone, steered),
            "note": "ours_ms_per_step makes the unsteered and steered sides and the counterfactual row in one step; "
                    "ours_steered_only_ms_per_step and llama.cpp make the steered side only"}


# ------------------------------------------------------------------ eight sequences in one batch
def batch8_steers(handle, layer: int, count: int = BATCH8_SEQUENCES) -> list:
    """``count`` different steerings: seeded unit random directions (seeds 0..) at ``layer``, relative α 0.5."""
    return [seeded_steer(handle, layer, seed=seed)[0] for seed in range(count)]


def ours_batch_seconds(handle, prompts, steers, n_tokens: int, batch: DecodeBatch) -> tuple[float, list[list[int]]]:
    """(wall seconds, each sequence's token ids) of ``prompts`` decoded together, greedy, ``n_tokens`` each, prompt
    ``i`` steered by ``steers[i]`` alone, in the empty ``batch``: steered-only rows, prompts admitted in the
    engine's prefill groups, then one step for all rows until every sequence has its tokens.  The clock starts
    once the requests are made (tokenised, validated), as llama.cpp's starts at its token ids."""
    sampling = Sampling(max_new_tokens=n_tokens, temperature=0.0, stop_at_eos=False, unsteered=False,
                        counterfactual=False)
    requests = [Request.make(handle, prompt, [steer], sampling) for prompt, steer in zip(prompts, steers)]
    sync(handle.input_device)
    start = time.perf_counter()
    for group in prefill_groups(requests, handle.input_device):
        batch.admit(group)
    while True:
        batch.sample()
        if all(r.done for r in requests):
            break
        batch.advance()
    sync(handle.input_device)
    seconds = time.perf_counter() - start
    batch.advance()  # drops the finished requests, so the batch is empty for the next run
    return seconds, [[t.token_id for t in r.result.steered.tokens] for r in requests]


class LlamaCppBatch:
    """A llama.cpp context for ``sequences`` sequences decoded together, on the model ``llm`` has loaded.

    Its settings are ``llm``'s (llama-cpp-python's defaults) with room for every sequence: ``n_seq_max``
    sequences, each its own KV stream of ``n_ctx / n_seq_max`` cells (``kv_unified`` off: llama.h's advice
    for sequences that share no prefix), and a batch that takes every prompt token in one ``llama_decode``.
    """

    def __init__(self, llama_cpp, llm, sequences: int, longest: int, total_prompt: int, threads: int):
        self.lib = llama_cpp
        params = llama_cpp.llama_context_params.from_buffer_copy(llm.context_params)
        per_sequence = -(-longest // 256) * 256  # llama.cpp rounds each sequence's cells up to 256 anyway
        params.n_ctx = per_sequence * sequences
        params.n_batch = params.n_ubatch = max(total_prompt, sequences)
        params.n_seq_max = sequences
        params.kv_unified = False
        params.n_threads = params.n_threads_batch = threads
        self.ctx = llama_cpp.llama_init_from_model(llm.model, params)
        if not self.ctx:
            raise RuntimeError("llama.cpp could not make a context for the batch")
        self.batch = llama_cpp.llama_batch_init(params.n_batch, 0, 1)
        self.vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(llm.model))

    def close(self) -> None:
        self.lib.llama_batch_free(self.batch)
        self.lib.llama_free(self.ctx)

    def decode(self, entries: list[tuple[int, int, int, bool]]) -> list[int]:
        """Run one ``llama_decode`` of ``entries`` (token, position, sequence id, wants logits); the greedy next
        token of every entry that wanted logits, in order."""
        batch = self.batch
        batch.n_tokens = len(entries)
        for i, (token, position, sequence, wanted) in enumerate(entries):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, position, 1
            batch.seq_id[i][0], batch.logits[i] = sequence, int(wanted)
        code = self.lib.llama_decode(self.ctx, batch)
        if code != 0:
            raise RuntimeError(f"llama_decode returned {code}")
        return [int(np.ctypeslib.as_array(self.lib.llama_get_logits_ith(self.ctx, i), shape=(self.vocab,)).argmax())
                for i, entry in enumerate(entries) if entry[3]]

    def generate(self, prompts: list[list[int]], n_tokens: int) -> tuple[float, list[list[int]]]:
        """(wall seconds, each sequence's token ids): every prompt in one ``llama_decode``, then one per step with
        every sequence's last token, greedy, until each has ``n_tokens``; the KV cache is cleared first."""
        self.lib.llama_memory_clear(self.lib.llama_get_memory(self.ctx), True)
        start = time.perf_counter()
        first = self.decode([(token, position, sequence, position == len(ids) - 1)
                             for sequence, ids in enumerate(prompts) for position, token in enumerate(ids)])
        made = [[token] for token in first]
        while len(made[0]) < n_tokens:
            step = self.decode([(tokens[-1], len(ids) + len(tokens) - 1, sequence, True)
                                for sequence, (ids, tokens) in enumerate(zip(prompts, made))])
            for tokens, token in zip(made, step):
                tokens.append(token)
        return time.perf_counter() - start, made


def bench_batch8_vs_llama_cpp(handle, layer: int, n_tokens: int, reps: int, log) -> dict:
    """Eight prompts decoded together, ``n_tokens`` greedy tokens each: ours with eight different steerings in
    one :class:`DecodeBatch` (steered-only rows, as the API decodes) against llama.cpp with one control vector
    (our first steering) in one ``llama_decode`` batch per step; wall times, prompt passes included, runs
    interleaved after one warm-up run of each."""
    found = llama_cpp_gguf(handle)
    if isinstance(found, str):
        return {"status": found}
    llama_cpp, gguf = found
    prompts = list(BATCH8_PROMPTS[:BATCH8_SEQUENCES])
    steers = batch8_steers(handle, layer, len(prompts))
    ids = [prompt_ids(handle, prompt) for prompt in prompts]
    threads = torch.get_num_threads()
    log(f"bench: llama.cpp on {gguf.name}, {len(prompts)} sequences in one batch ({reps} x {n_tokens} tokens each, "
        "interleaved with ours, eight steerings)")
    batch = DecodeBatch(handle)
    with loaded_llama(llama_cpp, gguf, threads) as llm:
        theirs = LlamaCppBatch(llama_cpp, llm, len(prompts), max(map(len, ids)) + n_tokens, sum(map(len, ids)),
                               threads)
        try:
            status = set_control_vector(llama_cpp, theirs.ctx, steers[0], handle.arch.num_layers,
                                        handle.arch.hidden_size)
            if status != 0:
                return {"status": f"failed: llama.cpp refused the control vector ({status})"}
            runs = interleaved({"ours": lambda: ours_batch_seconds(handle, prompts, steers, n_tokens, batch),
                                "llama_cpp": lambda: theirs.generate(ids, n_tokens)}, reps)
        finally:
            theirs.close()
    walls = {name: [seconds for seconds, _ in results] for name, results in runs.items()}
    tokens = {name: results[-1][1] for name, results in runs.items()}
    ours, theirs_s = median(walls["ours"]), median(walls["llama_cpp"])
    same = tokens["ours"][0], tokens["llama_cpp"][0]
    agree = next((i for i, (a, b) in enumerate(zip(*same)) if a != b), min(map(len, same)))
    return {"status": "measured", "llama_cpp_version": getattr(llama_cpp, "__version__", "?"), "threads": threads,
            "sequences": len(prompts), "new_tokens": n_tokens, "reps": reps,
            "prompt_tokens": [len(x) for x in ids], "decode_path": batch.decode_path,
            "ours_ms": ms(ours), "llama_cpp_ms": ms(theirs_s),
            "ours_ms_all": [ms(x) for x in walls["ours"]], "llama_cpp_ms_all": [ms(x) for x in walls["llama_cpp"]],
            "tokens_each": {name: sorted({len(t) for t in made}) for name, made in tokens.items()},
            # both sides steer the first prompt with the same vector: how far their greedy tokens go together
            # (llama.cpp's arithmetic is not ours, so a late parting at a near tie is expected)
            "first_sequence_tokens_agree": agree,
            "batch8_vs_llama_cpp": ratio(ours, theirs_s),
            "note": "ours: eight different steering vectors, one row each; llama.cpp: one control vector for all "
                    "eight (it has no per-sequence vectors); wall time from the prompts' token ids to the last "
                    "token, prompt passes included"}


def main(argv=None) -> None:
    """``python -m steer_ui.tools.vs_llama_cpp [--model M] [--tokens 64] [--batch-tokens 32] [--reps 5]``: the
    llama.cpp measures alone, as the bench runs them (the bench's layer and steering), one JSON object."""
    import argparse

    from ..model.loading import load_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=EMBEDDED)
    parser.add_argument("--weights", default="auto")
    parser.add_argument("--tokens", type=int, default=64, help="new tokens of the one-sequence runs")
    parser.add_argument("--batch-tokens", type=int, default=32, help="new tokens of each of the eight sequences")
    parser.add_argument("--reps", type=int, default=5, help="one-sequence repetitions (the batch runs 3)")
    args = parser.parse_args(argv)
    load_start = loadavg()
    handle = load_model(args.model, device="cpu", weights=args.weights)
    layer = handle.arch.num_layers // 2
    handle.layer_norms()  # relative α needs them
    steer, _ = seeded_steer(handle, layer)
    started = time.perf_counter()
    one = bench_vs_llama_cpp(handle, steer, args.tokens, args.reps, lambda _m: None)
    eight = bench_batch8_vs_llama_cpp(handle, layer, args.batch_tokens, 3, lambda _m: None)
    ratios = {name: one.get(name) for name in ("vs_llama_cpp", "one_sequence_vs_llama_cpp")}
    ratios["batch8_vs_llama_cpp"] = eight.get("batch8_vs_llama_cpp")
    print(json.dumps({"model": args.model, "weights": handle.weights, "ratios": ratios, "llama_cpp": one,
                      "llama_cpp_batch8": eight, "loadavg_start": load_start, "loadavg_end": loadavg(),
                      "seconds": round(time.perf_counter() - started, 1)}), flush=True)


if __name__ == "__main__":
    main()
