// Detection of make-tiny --headers-only checkpoints (include/ds4r/zero_weights.h).
#include "ds4r/zero_weights.h"

#include "ds4r/checkpoint.h"
#include "ds4r/safetensors.h"

namespace ds4r {

bool checkpoint_has_zero_weights(const Checkpoint& ckpt) {
    for (const ShardInfo& s : ckpt.shards())
        for (const auto& kv : read_safetensors_header(s.path).metadata)
            if (kv.first == kZeroWeightsMetadataKey) return true;
    return false;
}

}  // namespace ds4r
