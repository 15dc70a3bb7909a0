"""Result records as numpy arrays: load_results, load_hidden and the flat table."""

import json
import os

import numpy as np

__all__ = ["record_to_numpy", "load_results", "load_hidden", "attach_hidden"]


def _matrix(rows, dtype, k):
    if len(rows) == 0:
        return np.zeros((0, k), dtype=dtype)
    return np.asarray(rows, dtype=dtype)


def record_to_numpy(rec):
    """One parsed JSONL result record -> dict with numpy arrays (error records are returned as is).

    logprob, entropy: float64 [n-1]; rank: int64 [n-1]; topk_ids: int64 [n-1, k]; topk_logprobs:
    float64 [n-1, k]; final: {"entropy": float, "topk_ids": int64 [k], "topk_logprobs": float64 [k]};
    tokens (when the record has them): int64 [n]; hidden: {} (filled by attach_hidden);
    hidden_refs: the record's "hidden" entries ({"layer", "file", "rows"}). Other fields are kept.
    """
    if "error" in rec:
        return rec
    out = dict(rec)
    final = rec.get("final") or {}
    k = len(final.get("topk_ids", [])) or max((len(r) for r in rec.get("topk_ids", [])), default=0)
    for key, dtype in (("logprob", np.float64), ("entropy", np.float64), ("rank", np.int64)):
        if key in rec:
            out[key] = np.asarray(rec[key], dtype=dtype)
    if "topk_ids" in rec:
        out["topk_ids"] = _matrix(rec["topk_ids"], np.int64, k)
    if "topk_logprobs" in rec:
        out["topk_logprobs"] = _matrix(rec["topk_logprobs"], np.float64, k)
    if final:
        out["final"] = {
            "entropy": float(final.get("entropy", float("nan"))),
            "topk_ids": np.asarray(final.get("topk_ids", []), dtype=np.int64),
            "topk_logprobs": np.asarray(final.get("topk_logprobs", []), dtype=np.float64),
        }
    for key in ("tokens", "input_ids"):
        if key in rec and isinstance(rec[key], list):
            out[key] = np.asarray(rec[key], dtype=np.int64)
    if "sum_logprob" in rec:
        out["sum_logprob"] = float(rec["sum_logprob"])
    out["hidden_refs"] = list(rec.get("hidden") or [])
    out["hidden"] = {}
    return out


class _HiddenFiles:
    """np.load(mmap_mode='r') of each hidden_L<L>.npy once, shared by all records."""

    def __init__(self, hidden_dir):
        self.dir = os.fspath(hidden_dir)
        self.maps = {}

    def rows(self, ref):
        path = os.path.join(self.dir, ref["file"])
        if path not in self.maps:
            self.maps[path] = np.load(path, mmap_mode="r")
        start, end = ref["rows"]
        arr = self.maps[path]
        if end > arr.shape[0]:
            raise ValueError("%s has %d rows, the record points at rows [%d, %d)" % (path, arr.shape[0], start, end))
        return arr[start:end]


def attach_hidden(records, hidden_dir):
    """Sets rec["hidden"][layer] = memory-mapped rows of each record's hidden states in hidden_dir."""
    files = _HiddenFiles(hidden_dir)
    for rec in records:
        if "error" in rec:
            continue
        rec["hidden_dir"] = files.dir
        for ref in rec.get("hidden_refs", []):
            rec["hidden"][int(ref["layer"])] = files.rows(ref)
    return records


def _iter_lines(path):
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                yield n, json.loads(raw)
            except ValueError as e:
                raise ValueError("%s:%d: not valid JSON (%s)" % (path, n, e)) from None


def _flat(path):
    cols = {k: [] for k in ("id", "position", "token", "logprob", "rank", "entropy", "top1_id", "top1_logprob")}
    for _, rec in _iter_lines(path):
        if "error" in rec or "logprob" not in rec:
            continue
        lp = rec["logprob"]
        m = len(lp)
        toks = rec.get("tokens") or rec.get("input_ids")
        cols["id"].extend([rec.get("id")] * m)
        cols["position"].extend(range(m))
        cols["token"].extend(toks[1 : m + 1] if toks and len(toks) == m + 1 else [-1] * m)
        cols["logprob"].extend(lp)
        cols["rank"].extend(rec.get("rank") or [-1] * m)
        cols["entropy"].extend(rec.get("entropy") or [float("nan")] * m)
        topk_ids = rec.get("topk_ids") or [[]] * m
        topk_lp = rec.get("topk_logprobs") or [[]] * m
        cols["top1_id"].extend(r[0] if r else -1 for r in topk_ids)
        cols["top1_logprob"].extend(r[0] if r else float("nan") for r in topk_lp)
    dtypes = {"position": np.int64, "token": np.int64, "logprob": np.float64, "rank": np.int64,
              "entropy": np.float64, "top1_id": np.int64, "top1_logprob": np.float64}
    out = {k: (np.asarray(v, dtype=dtypes[k]) if k in dtypes else np.asarray(v, dtype=object)) for k, v in cols.items()}
    try:
        import pandas as pd
    except ImportError:
        return out
    return pd.DataFrame(out)


def load_results(path, flat=False, hidden_dir=None):
    """Reads a results JSONL file written by ``ds4replay score``.

    Returns a list of records (dicts with numpy arrays, see record_to_numpy); with ``hidden_dir``
    (the ``--hidden-dir`` of the run) each record's ``hidden[layer]`` is a memory-mapped view of its
    rows. ``flat=True`` returns one row per scored position instead: a pandas DataFrame when pandas
    is installed, else a dict of numpy columns: id, position (t: scores token t+1), token (the
    scored token id, -1 when the record has no tokens), logprob, rank, entropy, top1_id,
    top1_logprob. Error records (score --skip-bad) are kept in the list form, skipped in the flat one.
    """
    path = os.fspath(path)
    if flat:
        return _flat(path)
    records = [record_to_numpy(rec) for _, rec in _iter_lines(path)]
    if hidden_dir is not None:
        attach_hidden(records, hidden_dir)
    return records


def load_hidden(dir_or_record, layer, hidden_dir=None):
    """Hidden states of one captured layer, memory-mapped (nothing is read until used).

    ``dir_or_record`` is a ``--hidden-dir`` directory (returns the whole hidden_L<layer>.npy:
    [all tokens, 5120] for mean mode), a .npy file, or a record from replay() / load_results()
    (returns that record's rows; a record from load_results without hidden_dir needs ``hidden_dir``).
    """
    if isinstance(dir_or_record, dict):
        rec = dir_or_record
        if layer in rec.get("hidden", {}):
            return rec["hidden"][layer]
        refs = [r for r in rec.get("hidden_refs", rec.get("hidden", [])) if int(r["layer"]) == int(layer)]
        if not refs:
            have = sorted(int(r["layer"]) for r in rec.get("hidden_refs", []))
            raise KeyError("record %r has no hidden states of layer %s (captured: %s)" % (rec.get("id"), layer, have))
        d = hidden_dir or rec.get("hidden_dir")
        if d is None:
            raise ValueError("give hidden_dir= (the --hidden-dir of the run) to load this record's hidden states")
        return _HiddenFiles(d).rows(refs[0])
    path = os.fspath(dir_or_record)
    if os.path.isdir(path):
        path = os.path.join(path, "hidden_L%d.npy" % int(layer))
    return np.load(path, mmap_mode="r")
