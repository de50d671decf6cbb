#include "data/byte_reader.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include "data/regular_file.h"
#include "tandem/error.h"

namespace tandem::data {

namespace {
constexpr size_t kChunk = size_t{1} << 20;
// Deflate never expands data more than about 1032:1; the slack covers headers of tiny files.
constexpr uint64_t kMaxInflateRatio = 1032;
constexpr uint64_t kInflateSlack = 1 << 16;
}  // namespace

ByteReader::ByteReader(std::string path) : path_(std::move(path)) {
  file_ = io::open_regular_file(path_, "data file", file_size_);
  // A small file needs no megabyte of buffer (and a fuzzer opens thousands of them a second).
  in_.resize(static_cast<size_t>(std::clamp<uint64_t>(file_size_, 1, kChunk)));
  refill();
  gz_ = in_len_ >= 2 && in_[0] == 0x1f && in_[1] == 0x8b;
  if (gz_) {
    // 16 + MAX_WBITS: gzip wrapper only, so the trailer's CRC and length are verified too.
    int rc = inflateInit2(&zs_, 16 + MAX_WBITS);
    if (rc != Z_OK) {
      std::fclose(file_);
      file_ = nullptr;
      TANDEM_RUNTIME_CHECK(false, "inflateInit2 failed for ", path_, " (zlib error ", rc, ")");
    }
    zs_ready_ = true;
    zs_.next_in = in_.data();
    zs_.avail_in = static_cast<uInt>(in_len_);
  }
}

ByteReader::~ByteReader() {
  if (zs_ready_) inflateEnd(&zs_);
  if (file_) std::fclose(file_);
}

void ByteReader::refill() {
  size_t got = std::fread(in_.data(), 1, in_.size(), file_);
  TANDEM_RUNTIME_CHECK(!std::ferror(file_), "read error on data file ", path_, ": ", std::strerror(errno));
  if (got == 0) eof_ = true;
  in_pos_ = 0;
  in_len_ = got;
}

uint64_t ByteReader::max_data_bytes() const {
  return gz_ ? file_size_ * kMaxInflateRatio + kInflateSlack : file_size_;
}

size_t ByteReader::read(void* dst, size_t n) {
  auto* out = static_cast<unsigned char*>(dst);
  size_t got = gz_ ? read_gz(out, n) : read_raw(out, n);
  produced_ += got;
  return got;
}

size_t ByteReader::read_raw(unsigned char* dst, size_t n) {
  size_t done = 0;
  size_t buffered = std::min(n, in_len_ - in_pos_);
  if (buffered) {
    std::memcpy(dst, in_.data() + in_pos_, buffered);
    in_pos_ += buffered;
    done = buffered;
  }
  // Large requests bypass the buffer: straight from the file into the caller's memory.
  while (done < n && !eof_) {
    size_t got = std::fread(dst + done, 1, n - done, file_);
    TANDEM_RUNTIME_CHECK(!std::ferror(file_), "read error on data file ", path_, ": ", std::strerror(errno));
    if (got == 0) eof_ = true;
    done += got;
  }
  return done;
}

size_t ByteReader::read_gz(unsigned char* dst, size_t n) {
  size_t done = 0;
  while (done < n && !finished_) {
    if (zs_.avail_in == 0 && !eof_) {
      refill();
      zs_.next_in = in_.data();
      zs_.avail_in = static_cast<uInt>(in_len_);
    }
    if (member_done_) {
      if (zs_.avail_in == 0) {  // refill found nothing: a clean end after the last member
        finished_ = true;
        break;
      }
      // Concatenated gzip members form one stream (what `cat a.gz b.gz` makes).
      TANDEM_RUNTIME_CHECK(inflateReset(&zs_) == Z_OK, "inflateReset failed for ", path_);
      member_done_ = false;
    }
    if (zs_.avail_in == 0 && eof_) {  // the file ends inside a gzip member: callers report what is missing
      cut_short_ = true;
      finished_ = true;
      break;
    }
    size_t want = std::min<size_t>(n - done, std::numeric_limits<uInt>::max());
    zs_.next_out = dst + done;
    zs_.avail_out = static_cast<uInt>(want);
    int rc = inflate(&zs_, Z_NO_FLUSH);
    done += want - zs_.avail_out;
    switch (rc) {
      case Z_OK:
      case Z_BUF_ERROR:  // no progress possible with this input: the loop refills
        break;
      case Z_STREAM_END:
        member_done_ = true;
        break;
      case Z_MEM_ERROR:
        TANDEM_RUNTIME_CHECK(false, "inflate ran out of memory on ", path_);
        break;
      default:  // Z_DATA_ERROR, Z_NEED_DICT, Z_STREAM_ERROR
        TANDEM_CHECK(false, "data file ", path_, " is corrupt: invalid gzip data (",
                     zs_.msg ? zs_.msg : "zlib error", ") after ", produced_ + done, " decompressed bytes");
    }
  }
  return done;
}

uint64_t ByteReader::count_remaining(uint64_t limit) {
  std::vector<unsigned char> scratch(static_cast<size_t>(std::min<uint64_t>(1 << 16, limit + 1)));
  uint64_t total = 0;
  while (total <= limit) {
    size_t got = read(scratch.data(), static_cast<size_t>(std::min<uint64_t>(scratch.size(), limit + 1 - total)));
    if (got == 0) break;
    total += got;
  }
  return total;
}

std::vector<uint8_t> read_all(const std::string& path) {
  ByteReader r(path);
  std::vector<uint8_t> out;
  if (!r.compressed()) {
    out.resize(r.file_size());
    out.resize(r.read(out.data(), out.size()));
    return out;
  }
  size_t used = 0;
  out.resize(std::max<uint64_t>(r.file_size() * 4, 1 << 16));
  for (;;) {
    if (used == out.size()) out.resize(out.size() * 2);
    size_t got = r.read(out.data() + used, out.size() - used);
    if (got == 0) break;
    used += got;
  }
  out.resize(used);
  TANDEM_CHECK(!r.cut_short(), "data file ", path, " is truncated: its gzip stream is cut short after ", used,
               " decompressed bytes");
  return out;
}

}  // namespace tandem::data
