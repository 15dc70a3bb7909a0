"""encode() and text / chat inputs of replay(), through `ds4replay encode` (skipped where the binary
has no encode command)."""

import numpy as np
import pytest

from ds4replay import Ds4ReplayError, encode, replay


@pytest.fixture(autouse=True)
def need_encode(has_encode):
    if not has_encode:
        pytest.skip("this ds4replay has no `encode` command yet")


CHAT = [{"role": "user", "content": "Hello there"}, {"role": "assistant", "content": "Hi."}]


def test_encode_texts(model):
    ids = encode(["Hello world", "a b c"], model=model)
    assert len(ids) == 2 and all(isinstance(t, int) for t in ids[0])
    assert all(0 <= t < 512 for seq in ids for t in seq)
    again = encode("Hello world", tokenizer=model + "/tokenizer.json")
    assert again == ids[:1]


def test_encode_chat_uses_the_chat_format(model):
    (chat_ids,) = encode([CHAT], model=model)
    (plain,) = encode(["Hello there"], model=model)
    assert 508 in chat_ids and 509 in chat_ids  # <｜User｜>, <｜Assistant｜> of the tiny tokenizer
    assert len(chat_ids) > len(plain)
    recs = encode([{"id": "c", "messages": CHAT, "extra": 1}], model=model, return_records=True)
    assert recs[0]["id"] == "c" and recs[0]["extra"] == 1 and recs[0]["tokens"] == chat_ids


def test_replay_accepts_texts_chats_and_ids(model):
    (ids,) = encode(["Hello world"], model=model)
    res = replay(["Hello world", CHAT, ids], model=model, backend="cpu")
    assert [r["id"] for r in res] == [0, 1, 2]
    assert res[0]["n_tokens"] == len(ids)
    np.testing.assert_array_equal(res[0]["logprob"], res[2]["logprob"])
    assert res[1]["n_tokens"] > 3


def test_encode_errors_surface(model, tmp_path):
    with pytest.raises(Ds4ReplayError) as e:
        encode(["x"], tokenizer=str(tmp_path / "missing.json"))
    assert e.value.returncode in (2, 3)
    assert "missing.json" in e.value.message
