// Shared helpers for the test executables.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <string>

namespace ds4r::test {

// Directory with the copied golden data (tests/data).
std::string data_dir();
// A fresh temporary directory, removed at process exit.
std::string temp_dir(const std::string& tag);
// The golden tiny-a checkpoint (tests/data/tiny-a/model; never modified).
std::string golden_model_dir();
// A private copy of the golden checkpoint in a fresh temporary directory (for tests that corrupt it).
std::string copy_golden_model(const std::string& tag);
// Path of the built ds4replay binary.
std::string binary_path();
// Runs a shell command; returns the exit status and captures stdout+stderr into *output.
int run_command(const std::string& cmd, std::string* output);

// Runs f on a thread; a hang fails the test (and stops the binary: a stuck thread cannot be joined).
template <class F>
void within_seconds(double s, F f) {
    auto fut = std::async(std::launch::async, f);
    if (fut.wait_for(std::chrono::duration<double>(s)) != std::future_status::ready) {
        ADD_FAILURE() << "no result after " << s << " s: a hang";
        std::fflush(stdout);
        std::_Exit(1);
    }
    fut.get();
}

}  // namespace ds4r::test
