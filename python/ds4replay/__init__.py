"""ds4replay from Python: teacher-forced DeepSeek V4.1-Flash replay with numpy results.

    from ds4replay import replay
    res = replay([ids1, ids2], capture_layers=(10, 20, 30))
    res[0]["logprob"]; res[0]["hidden"][20]

The work is done by the ds4replay binary (found through the binary= argument, $DS4REPLAY_BIN, PATH,
./build/ds4replay or the source tree's build/); data streams through its stdin / stdout.
"""

from ._process import Ds4ReplayError, find_binary
from ._records import load_hidden, load_results
from .api import compare, encode, replay

__version__ = "0.1.0"
__all__ = ["replay", "encode", "load_results", "load_hidden", "compare", "find_binary", "Ds4ReplayError"]
