// The host side of score --devices' one weight reader (src/io/fanout_weight_source.h): a CPU backend
// whose host allocations come from another backend. With a GPU backend as `memory`, the layers the
// reader holds are pinned memory, so that every GPU's copy of a layer reads pinned memory (a copy from
// pageable memory runs at a fraction of the bus speed). `memory` must outlive the returned backend and
// every allocation made through it.
#pragma once

#include <memory>

#include "ds4r/backend.h"

namespace ds4r {

std::unique_ptr<Backend> make_cpu_backend_with_host_memory_of(Backend& memory);

}  // namespace ds4r
