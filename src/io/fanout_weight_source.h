// One weight reader for several backends (score --devices, docs/ARCHITECTURE.md "Many devices").
//
// A host source (the prefetching source in direct mode on a host-memory backend: it reads each layer
// once into host memory, layer L+1 while L computes) is shared by N targets, one per worker. Target i
// is a WeightSource of its own (target(i)), used by worker i's PassRunner on worker i's thread. Every
// layer position of a pass is read ONCE and handed to every active target:
//  - a host-memory target (the CPU backend) gets views into the host layer; the host layer is released
//    when every active target's handle of it has been destroyed;
//  - a device target copies the layer's tensors from the host layer into memory of its own backend
//    (one allocation per layer, every tensor at a 256-byte aligned offset), synchronizes, and gives its
//    share of the host layer back at once.
// Lock step: the host source holds two layers at most, so a worker runs at most one layer ahead of
// the slowest active worker (it waits in acquire()). Host memory does not grow with N or with tokens.
//
// Contract:
//  - begin_pass(active) before each pass (and again after a stopped pass): `active[i]` says whether
//    target i takes part (acquires every entry of the schedule once). It resets the positions; a pass
//    that did not finish (stop(), an error) makes the host source drop what it prefetched.
//  - stop(): every acquire() waiting or to come throws FanoutStopped until the next begin_pass. A
//    worker that fails calls it so that no other worker waits forever for it.
//  - An error of the host source (truncated shard, I/O error) is rethrown by every target that
//    acquires the failed position, with its kind (CheckpointError stays exit code 3).
//  - The targets' set_schedule() must all give the same one-pass order; acquire() must follow it.
//  - The host source is only called with this source's lock released, by one thread at a time
//    (the first worker to need a position reads it; the others wait for it).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "ds4r/backend.h"
#include "ds4r/weights.h"

namespace ds4r {

class Checkpoint;

// acquire() on a stopped fan-out (another worker failed or the run is being interrupted). Not a
// ds4r::Error: the multi-device runner reports the failure that caused the stop instead.
class FanoutStopped : public std::runtime_error {
public:
    FanoutStopped() : std::runtime_error("weights: the multi-device pass was stopped") {}
};

class FanoutWeightSource {
public:
    // `host`: a source whose layers are host memory (ResidentLayer tensors are host pointers).
    // `targets`: the workers' backends (the same backend object must not appear twice).
    FanoutWeightSource(std::unique_ptr<WeightSource> host, const Checkpoint& ckpt,
                       std::vector<Backend*> targets);
    ~FanoutWeightSource();
    FanoutWeightSource(const FanoutWeightSource&) = delete;
    FanoutWeightSource& operator=(const FanoutWeightSource&) = delete;

    size_t size() const { return targets_.size(); }
    WeightSource& target(size_t i);
    void begin_pass(const std::vector<bool>& active);
    void stop();
    // The host source's reads plus the targets' uploads and waits.
    WeightSourceStats stats() const;

private:
    class Target;
    // One schedule position of the current pass: the host layer and how many targets still need it.
    struct Entry {
        uint64_t pos = 0;
        int layer = 0;
        std::shared_ptr<ResidentLayer> host;  // null while loading or after an error
        bool loading = true;
        std::exception_ptr error;
        int users_left = 0;  // active targets that have not given their share back
    };
    std::shared_ptr<Entry> take(size_t target, int layer);  // blocks; throws FanoutStopped
    void give_back(const std::shared_ptr<Entry>& e);
    void set_order(const std::vector<int>& order);
    // The tensors of a layer (or the head): name, dtype, shape, bytes; fixed at construction.
    struct TensorInfo {
        std::string name;
        DType dtype = DType::U8;
        Shape shape;
        uint64_t nbytes = 0;
    };
    const std::vector<TensorInfo>& tensors_of(int layer) const;

    std::unique_ptr<WeightSource> host_;
    std::vector<std::unique_ptr<Target>> targets_;
    std::vector<std::vector<TensorInfo>> layer_tensors_;  // [n_layers + 1]: the head last
    mutable std::mutex mu_;
    std::condition_variable cv_;
    // Under mu_.
    std::vector<int> order_;                   // one pass: 0..n-1, kHeadLayer
    std::deque<std::shared_ptr<Entry>> live_;  // positions read and not yet given back by every target
    std::vector<uint64_t> next_pos_;           // per target: its next schedule position
    std::vector<bool> active_;
    int n_active_ = 0;
    uint64_t next_read_pos_ = 0;  // the next position to read from the host source
    bool stop_ = false;
    bool host_clean_ = true;  // the host source is at the start of its schedule (no pass half done)
    uint64_t bytes_uploaded_ = 0;
    double upload_seconds_ = 0, wait_seconds_ = 0;
};

}  // namespace ds4r
