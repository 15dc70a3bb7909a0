// Checkpoints whose weights are holes (make-tiny --headers-only): the shards hold valid headers but
// every tensor reads as zero bytes. make-tiny marks each shard header's "__metadata__" with
// kZeroWeightsMetadataKey; inspect reports it and score refuses such a checkpoint unless asked.
#pragma once

namespace ds4r {

class Checkpoint;

// "__metadata__" key written by make-tiny --headers-only into every shard header.
inline constexpr const char* kZeroWeightsMetadataKey = "ds4replay_zero_weights";

// True when some shard of the (validated) checkpoint carries the mark. Reads the shard headers again
// (a few ms per shard).
bool checkpoint_has_zero_weights(const Checkpoint& ckpt);

}  // namespace ds4r
