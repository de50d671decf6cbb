#pragma once
// Internal: opening input files that must be regular files. A FIFO, a socket or a device in place of
// a data file or a checkpoint would block a reader forever or feed it endless bytes.
#include <cstdint>
#include <cstdio>
#include <string>

namespace tandem::io {

/// Opens path for reading in binary mode and returns the stream and the file's size. Throws
/// tandem::Error (Input) naming the file, described as `what` ("data file", "checkpoint"), when it is
/// missing, a directory, not a regular file or unreadable. Opening never blocks.
std::FILE* open_regular_file(const std::string& path, const char* what, uint64_t& size);

}  // namespace tandem::io
