"""load_results (records and the flat table), load_hidden on files, compare()."""

import builtins
import json
import os
import subprocess

import numpy as np
import pytest

from ds4replay import compare, load_hidden, load_results, replay
from test_replay import run_score


@pytest.fixture(scope="module")
def scored(binary, model, token_seqs, tmp_path_factory):
    d = str(tmp_path_factory.mktemp("scored"))
    out = run_score(binary, model, token_seqs, d, "--capture-layers", "1", "--hidden-dir", os.path.join(d, "h"))
    return out, os.path.join(d, "h")


def test_load_results_records(scored, token_seqs):
    path, hdir = scored
    recs = load_results(path)
    assert [r["n_tokens"] for r in recs] == [len(s) for s in token_seqs]
    assert recs[0]["logprob"].shape == (0,) and recs[0]["topk_ids"].shape == (0, 5)
    assert recs[0]["hidden"] == {} and recs[0]["hidden_refs"][0]["layer"] == 1
    with_h = load_results(path, hidden_dir=hdir)
    for plain, r, s in zip(recs, with_h, token_seqs):
        assert r["hidden"][1].shape == (len(s), 256)
        np.testing.assert_array_equal(load_hidden(plain, 1, hidden_dir=hdir), r["hidden"][1])
    with pytest.raises(ValueError):
        load_hidden(recs[1], 1)  # no hidden_dir known
    with pytest.raises(KeyError):
        load_hidden(with_h[1], 7)


def test_load_results_flat(scored, token_seqs):
    path, _ = scored
    df = load_results(path, flat=True)  # a pandas DataFrame, or (without pandas) a dict of columns
    m = sum(len(s) - 1 for s in token_seqs)
    assert all(len(np.asarray(df[c])) == m for c in df.keys())
    recs = load_results(path)
    np.testing.assert_array_equal(np.asarray(df["logprob"]), np.concatenate([r["logprob"] for r in recs]))
    np.testing.assert_array_equal(np.asarray(df["rank"]), np.concatenate([r["rank"] for r in recs]))
    np.testing.assert_array_equal(np.asarray(df["top1_id"]), np.concatenate([r["topk_ids"][:, 0] for r in recs]))
    assert list(df["position"][:3]) == [0, 0, 1]  # seq00 has one token: nothing scored


def test_load_results_flat_without_pandas(scored, monkeypatch):
    path, _ = scored
    real_import = builtins.__import__

    def no_pandas(name, *a, **k):
        if name == "pandas":
            raise ImportError("no pandas here")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_pandas)
    cols = load_results(path, flat=True)
    assert isinstance(cols, dict)
    assert cols["logprob"].dtype == np.float64 and cols["rank"].dtype == np.int64
    assert len(cols["id"]) == len(cols["logprob"])


def test_load_results_error_records_and_bad_lines(tmp_path):
    p = tmp_path / "r.jsonl"
    p.write_text('{"id": "a", "error": "bad token", "line": 1}\n\n{"id": "b", "n_tokens": 2, "logprob": [-1.5]}\n')
    recs = load_results(str(p))
    assert recs[0]["error"] == "bad token"
    assert recs[1]["logprob"].tolist() == [-1.5]
    p.write_text('{"id": "a", "n_tokens": 2, "logprob": [-1.5]}\n{"id": \n')
    with pytest.raises(ValueError, match="r.jsonl:2"):
        load_results(str(p))


def test_compare_files_and_records(scored, model, token_seqs):
    path, _ = scored
    same = compare(path, path)
    assert same["positions"] == sum(len(s) - 1 for s in token_seqs)
    assert same["max_abs_dlogprob"] == 0 and same["top1_agreement"] == 1
    res = replay(token_seqs, model=model, backend="cpu", top_k=5)
    against = compare(res, path)
    assert against["max_abs_dlogprob"] == 0
    shifted = [dict(r, logprob=r["logprob"] - 0.5) for r in res]
    assert compare(shifted, path)["median_abs_dlogprob"] == pytest.approx(0.5)
