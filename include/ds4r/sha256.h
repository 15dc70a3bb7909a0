// SHA-256 (FIPS 180-4), streaming. Used to fingerprint a run's input and model (the run sidecar,
// include/ds4r/run_manifest.h); not for anything secret.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace ds4r {

class Sha256 {
public:
    Sha256();
    void update(const void* data, size_t n);
    void update(const std::string& s) { update(s.data(), s.size()); }
    // Lower-case hex of the 32-byte digest. Ends the hash: call once.
    std::string hex_digest();

private:
    void block(const uint8_t* p);  // one 64-byte block
    std::array<uint32_t, 8> h_;
    std::array<uint8_t, 64> buf_{};
    size_t buf_len_ = 0;
    uint64_t total_ = 0;  // bytes hashed
};

// Hex SHA-256 of a file's bytes, read in large blocks; throws RuntimeError naming the file.
std::string sha256_file(const std::string& path);

}  // namespace ds4r
