"""replay(), encode() and compare(): the ds4replay commands from Python."""

import numbers
import os
import shutil
import tempfile

import numpy as np

from ._process import dumps, find_binary, run_json, run_jsonl
from ._records import attach_hidden, record_to_numpy

__all__ = ["replay", "encode", "compare"]


def _is_chat(x):
    return isinstance(x, (list, tuple)) and len(x) > 0 and all(isinstance(m, dict) and "role" in m for m in x)


def _is_token_list(x):
    if isinstance(x, np.ndarray):
        return x.ndim == 1 and np.issubdtype(x.dtype, np.integer)
    return isinstance(x, (list, tuple)) and all(
        isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in x
    )


def _input_record(i, item):
    """One input of replay()/encode() -> a JSONL record with "tokens", "text" or "messages"."""
    if isinstance(item, dict):
        rec = dict(item)
        rec.setdefault("id", i)
        if not any(k in rec for k in ("tokens", "input_ids", "text", "messages")):
            raise ValueError("input %d: a dict needs \"tokens\", \"text\" or \"messages\" (got keys %s)" % (i, sorted(rec)))
        return rec
    if isinstance(item, str):
        return {"id": i, "text": item}
    if _is_chat(item):
        return {"id": i, "messages": list(item)}
    if _is_token_list(item):
        return {"id": i, "tokens": [int(t) for t in item]}
    raise TypeError(
        "input %d: expected a list of token ids, a string, a chat (list of {\"role\", \"content\"} dicts) "
        "or a dict record, got %r" % (i, type(item).__name__)
    )


def _needs_encoding(rec):
    return "tokens" not in rec and "input_ids" not in rec


def _encode_args(model, tokenizer, add_generation_prompt, with_text):
    args = ["encode", "--input", "-", "--output", "-"]
    if model is not None and tokenizer is not None:
        raise ValueError("give either model= or tokenizer=, not both")
    if tokenizer is not None:
        args += ["--tokenizer", os.fspath(tokenizer)]
    elif model is not None:
        args += ["--model", os.fspath(model)]
    if add_generation_prompt is True:
        args.append("--add-generation-prompt")
    elif add_generation_prompt is False:
        args.append("--no-add-generation-prompt")
    if with_text:
        args.append("--with-text")
    return args


def encode(texts_or_chats, model=None, tokenizer=None, add_generation_prompt=None, with_text=False,
           return_records=False, binary=None, progress=False):
    """Token ids of texts and chats through ``ds4replay encode``.

    Each item is a string (byte-level BPE of tokenizer.json), a chat (list of {"role", "content", ...}
    messages in DeepSeek V4.1's chat format), or a dict record ({"text"} or {"messages", "tools",
    "thinking_mode", ...}; its other fields are carried through). ``model`` is a model directory (its
    tokenizer.json), ``tokenizer`` a tokenizer.json file; neither: the binary's default model
    directory. ``add_generation_prompt``: None leaves the encoder's default. Returns a list of token
    id lists, or with ``return_records=True`` the output records ({"id", "tokens", ...}).
    """
    items = [texts_or_chats] if isinstance(texts_or_chats, str) else list(texts_or_chats)
    recs = [_input_record(i, x) for i, x in enumerate(items)]
    for r in recs:
        if not _needs_encoding(r):
            raise ValueError("encode: input %r already has token ids" % (r["id"],))
    args = _encode_args(model, tokenizer, add_generation_prompt, with_text)
    out = list(run_jsonl(find_binary(binary), args, recs, progress=progress))
    if len(out) != len(recs):
        raise RuntimeError("ds4replay encode returned %d records for %d inputs" % (len(out), len(recs)))
    if return_records:
        return out
    return [r["tokens"] for r in out]


def _flag_args(flags):
    args = []
    for key, value in flags.items():
        name = "--" + key.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            args.append(name)
        elif isinstance(value, (list, tuple)):
            args += [name, ",".join(str(v) for v in value)]
        else:
            args += [name, str(value)]
    return args


def replay(seqs, capture_layers=(), top_k=8, model=None, backend="auto", hidden_mode="mean", workdir=None,
           progress=False, binary=None, **flags):
    """Scores sequences with ``ds4replay score``; returns one dict of numpy arrays per sequence.

    ``seqs``: token-id lists (or 1-D integer arrays), strings, chats (lists of {"role", "content"}
    dicts) or dict records; strings and chats go through ``ds4replay encode`` with the model's
    tokenizer first. Each result has ``logprob`` / ``entropy`` (float64 [n-1], position t scores
    token t+1), ``rank`` (int64 [n-1]), ``topk_ids`` / ``topk_logprobs`` ([n-1, top_k]), ``final``
    (after the last token), ``sum_logprob``, ``n_tokens``, ``id`` (the index in ``seqs`` unless the
    record had one), ``tokens`` when encoded here, and ``hidden[L]`` for every L in
    ``capture_layers``: an np.memmap view of the sequence's rows of hidden_L<L>.npy ([n, 5120] fp16
    in "mean" mode). The .npy files are written under ``workdir`` (kept); without ``workdir`` they go
    to a temporary directory that is removed once mapped (the mapped arrays stay valid; the disk
    space is freed when they are garbage-collected). Other keyword arguments are passed as flags to
    ``score`` (``max_batch_tokens=64`` -> ``--max-batch-tokens 64``; True -> the bare flag).
    ``progress=True`` passes the binary's progress lines through to sys.stderr. A failure of the
    binary raises Ds4ReplayError with its exit code and message.
    """
    exe = find_binary(binary)
    recs = [_input_record(i, x) for i, x in enumerate(seqs)]
    to_encode = [r for r in recs if _needs_encoding(r)]
    if to_encode:
        encoded = encode(to_encode, model=model, return_records=True, binary=exe, progress=progress)
        by_pos = iter(encoded)
        recs = [dict(next(by_pos)) if _needs_encoding(r) else r for r in recs]

    args = ["score", "--input", "-", "--output", "-", "--top-k", str(top_k), "--backend", backend,
            "--progress", "plain" if progress else "none"]
    if model is not None:
        args += ["--model", os.fspath(model)]
    hidden_dir = None
    temporary = None
    if capture_layers:
        if workdir is None:
            temporary = tempfile.mkdtemp(prefix="ds4replay-")
            base = temporary
        else:
            base = os.fspath(workdir)
            os.makedirs(base, exist_ok=True)
        hidden_dir = tempfile.mkdtemp(prefix="hidden-", dir=base)
        args += ["--capture-layers", ",".join(str(int(l)) for l in capture_layers), "--hidden-dir", hidden_dir,
                 "--hidden-mode", hidden_mode]
    args += _flag_args(flags)
    try:
        results = [record_to_numpy(r) for r in run_jsonl(exe, args, recs, progress=progress)]
        if len(results) != len(recs):
            raise RuntimeError("ds4replay score returned %d records for %d inputs" % (len(results), len(recs)))
        if hidden_dir is not None:
            attach_hidden(results, hidden_dir)
            if temporary is not None:
                for r in results:
                    r["hidden_dir"] = None
    finally:
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)
    return results


def _as_path(x, tmpdir, name):
    if isinstance(x, (str, os.PathLike)):
        return os.fspath(x)
    path = os.path.join(tmpdir, name)
    with open(path, "w", encoding="utf-8") as f:
        for rec in x:
            rec = {k: v for k, v in rec.items() if k not in ("hidden", "hidden_refs", "hidden_dir")}
            f.write(dumps(rec) + "\n")
    return path


def compare(a, b, model=None, tokenizer=None, binary=None):
    """``ds4replay compare A B --json``: fidelity statistics as a dict.

    ``a`` / ``b`` are result files or lists of records (from replay() / load_results(), or served-API
    logprob records). Keys: sequences, positions, median/mean/p95/max_abs_dlogprob, top1_agreement,
    rank_agreement, kl_*, per_sequence, ... (see include/ds4r/compare.h).
    """
    args = ["compare"]
    if tokenizer is not None:
        args += ["--tokenizer", os.fspath(tokenizer)]
    elif model is not None:
        args += ["--model", os.fspath(model)]
    with tempfile.TemporaryDirectory(prefix="ds4replay-compare-") as tmp:
        args += [_as_path(a, tmp, "a.jsonl"), _as_path(b, tmp, "b.jsonl"), "--json"]
        return run_json(find_binary(binary), args)
