"""The README's Python example, run verbatim: the first ```python block of its "## Python" section."""

import os
import re

import numpy as np

from conftest import REPO


def readme_example():
    text = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    section = text.split("\n## Python", 1)[1].split("\n## ", 1)[0]
    m = re.search(r"```python\n(.*?)```", section, re.S)
    assert m, "README.md's Python section has no ```python block"
    return m.group(1)


def test_readme_python_example(binary, monkeypatch):
    monkeypatch.chdir(REPO)  # the example's paths are relative to the repository
    ns = {}
    exec(compile(readme_example(), "README.md (Python example)", "exec"), ns)
    res = ns["res"]
    assert len(res) == 2
    n1 = len(ns["ids1"])
    assert res[0]["logprob"].shape == (n1 - 1,)
    assert np.all(res[0]["logprob"] < 0)
    for layer in ns["res"][0]["hidden"]:
        assert res[0]["hidden"][layer].shape == (n1, 256)
    assert sorted(res[1]["hidden"]) == [2, 4, 6]
