// A backend tensor: a contiguous row-major block of one dtype, on the backend's memory (host memory
// for the CPU backend, device memory for CUDA). Tensors are cheap handles; `hold` keeps an owned
// allocation alive, views share it. Weights are views into a layer slot and own nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "ds4r/dtype.h"
#include "ds4r/error.h"

namespace ds4r {

struct Tensor {
    DType dtype = DType::F32;
    Shape shape;                 // row-major, contiguous
    void* data = nullptr;        // backend memory; nullptr for an empty tensor
    std::shared_ptr<void> hold;  // owner of the allocation (may be null for views of weights)

    int64_t numel() const { return shape_numel(shape); }
    size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
    int ndim() const { return static_cast<int>(shape.size()); }
    int64_t dim(int i) const { return shape.at(static_cast<size_t>(i < 0 ? i + ndim() : i)); }
    bool empty() const { return numel() == 0; }
    bool defined() const { return data != nullptr || numel() == 0; }

    template <class T>
    T* ptr() const {
        return static_cast<T*>(data);
    }
    // Elements per row along dim 0.
    int64_t row_numel() const { return shape.empty() ? 1 : numel() / (shape[0] ? shape[0] : 1); }
    // View of rows [begin, end) along dim 0.
    Tensor rows(int64_t begin, int64_t end) const {
        DS4R_CHECK(!shape.empty() && begin >= 0 && begin <= end && end <= shape[0],
                   "rows(%lld, %lld) out of range for %s", (long long)begin, (long long)end,
                   shape_str(shape).c_str());
        Tensor t = *this;
        t.shape[0] = end - begin;
        t.data =
            data ? static_cast<uint8_t*>(data) + static_cast<size_t>(begin * row_numel()) * dtype_size(dtype)
                 : nullptr;
        return t;
    }
    // Same bytes, another shape with the same element count.
    Tensor reshape(Shape s) const {
        DS4R_CHECK(shape_numel(s) == numel(), "reshape %s -> %s changes the element count",
                   shape_str(shape).c_str(), shape_str(s).c_str());
        Tensor t = *this;
        t.shape = std::move(s);
        return t;
    }
};

// A non-owning view of existing memory (weights inside a layer slot, host arrays in tests).
inline Tensor tensor_view(void* data, DType t, Shape shape) {
    Tensor x;
    x.dtype = t;
    x.shape = std::move(shape);
    x.data = data;
    return x;
}

}  // namespace ds4r
