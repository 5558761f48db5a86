// Raw binary files in and out of the CPU shims that run kernels' CUDA text under g++ (tests/test_*_host.py,
// tests/test_rmsnorm_bwd_cols.py): a tensor written by numpy's tofile, read back whole, written back.
#pragma once
#include <fstream>
#include <string>
#include <vector>

template <class T> std::vector<T> read(const std::string& path) {
    std::ifstream in(path, std::ios::binary | std::ios::ate);
    std::vector<T> out(size_t(in.tellg()) / sizeof(T));
    in.seekg(0);
    in.read(reinterpret_cast<char*>(out.data()), out.size() * sizeof(T));
    return out;
}

template <class T> void write(const std::string& path, const std::vector<T>& v) {
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}
