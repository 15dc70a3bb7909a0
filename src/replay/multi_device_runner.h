// score --devices: one pass on several backends at once (docs/ARCHITECTURE.md "Many devices").
//
// N workers, each with its own backend (worker i on device devices[i]; an index may repeat: `0,0` is
// two workers on one card) and its own PassRunner, each pass on its own thread. A pass's sequences
// are split into N contiguous groups balanced by token count (balanced_boundaries, the split of
// --shard); worker i scores group i. All workers take their layers from ONE FanoutWeightSource (one
// reader, each layer read once per pass) and so advance in lock step. The scores come back in input
// order and the hidden rows reach the sink in the order of a one-device run (per layer: worker 0's
// sequences, then worker 1's, ...; a worker ahead of the ones before it has its rows held back until
// they wrote theirs, at most about one layer of its rows). Results depend only on each sequence
// (batch invariance), so the output is byte-identical to a one-device run.
//
// Failures: the first worker that throws stops the others (the fan-out's waits and the chunk /
// layer callbacks throw FanoutStopped), every thread is joined, and its error is rethrown with the
// device named (same kind: exit codes as today). Interrupted (Ctrl-C, thrown by on_layer) stops the
// pass the same way and is rethrown as is. OutOfMemoryError of a worker: that worker's chunks are
// halved and the whole pass runs again on every worker (the sink is told: restart_pass), as the
// one-device runner does; at the smallest chunk size it stops the run like any error.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "ds4r/replay.h"
#include "io/fanout_weight_source.h"

namespace ds4r {

class MultiDeviceRunner {
public:
    // backends[i] and devices[i]: worker i (the backends outlive the runner); weights.target(i) is its
    // source; opts[i] its options (chunk rows sized for its backend; retry_out_of_memory is turned off,
    // this runner retries).
    MultiDeviceRunner(std::vector<Backend*> backends, std::vector<int> devices, const Checkpoint& ckpt,
                      FanoutWeightSource& weights, const EngramResources* engram,
                      std::vector<ReplayOptions> opts);
    ~MultiDeviceRunner();

    // One pass (see PassRunner::run). on_layer is called once per layer, when every worker has finished
    // it (rows: the pass's; wait_s / compute_s: the slowest worker's), from a worker thread, never two at
    // once; it may throw (Interrupted) to stop the pass.
    std::vector<SequenceScores> run(const std::vector<std::vector<int32_t>>& seqs, HiddenSink* sink,
                                    const std::function<void(const LayerTiming&)>& on_layer = {});
    // Progress within a layer, over all workers: rows of the slowest worker's layer done so far by every
    // worker (calls serialized, from worker threads).
    void set_on_chunk(PassRunner::ChunkCallback f) { on_chunk_ = std::move(f); }
    int64_t chunk_rows() const;  // the smallest of the workers'
    size_t workers() const { return workers_.size(); }
    int out_of_memory_retries() const { return oom_retries_; }
    // The last pass's split: worker i scored sequences [b[i], b[i+1]).
    const std::vector<int64_t>& last_split() const { return split_; }
    // Tests: called on worker w's thread after each of its layers, before anything else sees the layer
    // (a throw there is a failing device).
    void set_worker_hook_for_tests(std::function<void(int worker, const LayerTiming&)> f) {
        hook_ = std::move(f);
    }

private:
    struct Worker;
    std::vector<std::unique_ptr<Worker>> workers_;
    FanoutWeightSource& weights_;
    int n_layers_ = 0;
    PassRunner::ChunkCallback on_chunk_;
    std::function<void(int, const LayerTiming&)> hook_;
    std::vector<int64_t> split_;
    int oom_retries_ = 0;
};

}  // namespace ds4r
