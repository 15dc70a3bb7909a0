// Shared helpers for the test executables.
#pragma once

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

}  // namespace ds4r::test
