"""replay(): token ids through `ds4replay score` on the tiny golden checkpoint, CPU backend."""

import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import ds4replay
from ds4replay import Ds4ReplayError, load_hidden, load_results, replay


def run_score(binary, model, seqs, out_dir, *extra):
    """The same scoring done by the binary directly: the reference for replay()."""
    inp = os.path.join(out_dir, "in.jsonl")
    with open(inp, "w") as f:
        for i, s in enumerate(seqs):
            f.write(json.dumps({"id": i, "tokens": s}) + "\n")
    out = os.path.join(out_dir, "out.jsonl")
    subprocess.run([binary, "score", inp, "--output", out, "--model", model, "--backend", "cpu",
                    "--progress", "none", "--top-k", "5", *extra], check=True)
    return out


def test_replay_matches_the_binary(binary, model, token_seqs, tmp_path):
    res = replay(token_seqs, model=model, backend="cpu", top_k=5)
    ref = load_results(run_score(binary, model, token_seqs, str(tmp_path)))
    assert len(res) == len(token_seqs)
    for i, (r, q, s) in enumerate(zip(res, ref, token_seqs)):
        n = len(s)
        assert r["id"] == i
        assert r["n_tokens"] == n
        assert r["logprob"].dtype == np.float64 and r["logprob"].shape == (n - 1,)
        assert r["entropy"].shape == (n - 1,)
        assert r["rank"].dtype == np.int64 and r["rank"].shape == (n - 1,)
        assert r["topk_ids"].shape == (n - 1, 5) and r["topk_logprobs"].shape == (n - 1, 5)
        assert r["final"]["topk_ids"].shape == (5,)
        assert isinstance(r["final"]["entropy"], float)
        for key in ("logprob", "entropy", "rank", "topk_ids", "topk_logprobs"):
            np.testing.assert_array_equal(r[key], q[key])  # bit for bit: same binary, deterministic
        assert r["sum_logprob"] == q["sum_logprob"]
        assert np.isclose(r["sum_logprob"], r["logprob"].sum())
        # The actual token's logprob is at most the top-1's; rank 1 means it is the top-1 id.
        assert np.all(r["logprob"] <= r["topk_logprobs"][:, 0] + 1e-12)
        assert np.all((r["rank"] == 1) == (r["topk_ids"][:, 0] == np.asarray(s[1:])))
        assert r["hidden"] == {}


def test_flags_pass_through_and_batch_invariance(model, token_seqs):
    a = replay(token_seqs, model=model, backend="cpu")
    b = replay(token_seqs[::-1], model=model, backend="cpu", max_batch_tokens=16, pass_tokens=40)
    for r, q in zip(a, b[::-1]):
        np.testing.assert_array_equal(r["logprob"], q["logprob"])


def test_hidden_states_are_memory_mapped(model, token_seqs, tmp_path):
    seqs = token_seqs[2:5]
    res = replay(seqs, capture_layers=(2, 6), model=model, backend="cpu", workdir=tmp_path)
    total = sum(len(s) for s in seqs)
    for r, s in zip(res, seqs):
        assert sorted(r["hidden"]) == [2, 6]
        h = r["hidden"][2]
        assert isinstance(h, np.memmap)
        assert h.shape == (len(s), 256) and h.dtype == np.float16
        assert np.all(np.isfinite(h))
        assert r["hidden_dir"] is not None and os.path.isdir(r["hidden_dir"])
        np.testing.assert_array_equal(load_hidden(r, 6), r["hidden"][6])
    whole = load_hidden(res[0]["hidden_dir"], 2)
    assert whole.shape == (total, 256)
    np.testing.assert_array_equal(whole[: len(seqs[0])], res[0]["hidden"][2])
    # Different layers hold different states.
    assert not np.array_equal(res[0]["hidden"][2], res[0]["hidden"][6])


def test_hidden_without_workdir_survives_the_temporary_directory(model, token_seqs):
    res = replay(token_seqs[3:4], capture_layers=(3,), model=model, backend="cpu", hidden_mode="copies")
    h = res[0]["hidden"][3]
    assert res[0]["hidden_dir"] is None
    assert h.shape == (len(token_seqs[3]), 4, 256) and h.dtype == np.dtype("<u2")  # bf16 bit patterns
    assert int(np.count_nonzero(h)) > 0


def test_dict_records_keep_their_ids_and_fields(model, token_seqs):
    res = replay([{"id": "a", "tokens": token_seqs[2], "note": "x"}, np.asarray(token_seqs[3])],
                 model=model, backend="cpu")
    assert res[0]["id"] == "a" and res[0]["note"] == "x"
    assert res[1]["id"] == 1


def test_bad_token_raises_with_the_binarys_message(model):
    with pytest.raises(Ds4ReplayError) as e:
        replay([[1, 2, 3], [5, 100000]], model=model, backend="cpu")
    assert e.value.returncode == 2
    assert "line 2" in e.value.message or ":2:" in e.value.message, e.value.message
    assert "100000" in str(e.value)


def test_bad_model_raises_checkpoint_error(tmp_path):
    with pytest.raises(Ds4ReplayError) as e:
        replay([[1, 2, 3]], model=str(tmp_path / "nowhere"), backend="cpu")
    assert e.value.returncode == 3
    assert "nowhere" in e.value.message


def test_bad_inputs_are_rejected_before_running(model):
    with pytest.raises(TypeError):
        replay([[1.5, 2]], model=model)
    with pytest.raises(ValueError):
        replay([{"id": 1}], model=model)


def test_progress_passes_through_to_stderr(model, token_seqs, monkeypatch):
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    replay(token_seqs[:2], model=model, backend="cpu", progress=True)
    quiet = io.StringIO()
    monkeypatch.setattr(sys, "stderr", quiet)
    replay(token_seqs[:2], model=model, backend="cpu", progress=False)
    assert err.getvalue().strip() != ""
    assert quiet.getvalue() == ""


def test_binary_lookup(monkeypatch, binary, tmp_path):
    assert ds4replay.find_binary() == binary  # $DS4REPLAY_BIN
    assert ds4replay.find_binary(binary) == binary
    monkeypatch.setenv("DS4REPLAY_BIN", str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError) as e:
        ds4replay.find_binary()
    assert "DS4REPLAY_BIN" in str(e.value)
    monkeypatch.delenv("DS4REPLAY_BIN")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    # Falls back to the source tree's build/ (this checkout's, when built there).
    try:
        found = ds4replay.find_binary()
        assert found.endswith(os.path.join("build", "ds4replay"))
    except FileNotFoundError as e:
        assert "./build" in str(e)
