// IDX (MNIST-format) and CIFAR-10 binary readers, and loading data sets by name.
#include "tandem/data/dataset.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "data/readers.h"

namespace tandem::data {

namespace fs = std::filesystem;

namespace {

constexpr int kIdxMaxDims = 8;
constexpr uint8_t kIdxUnsignedByte = 0x08;
constexpr int64_t kCifarSide = 32;
constexpr int64_t kCifarPixels = 3 * kCifarSide * kCifarSide;
constexpr int64_t kCifarRecord = 1 + kCifarPixels;

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

uint32_t load_be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

std::string names_list() {
  std::string out;
  for (const std::string& n : dataset_names()) out += (out.empty() ? "" : ", ") + n;
  return out;
}

void check_name(const std::string& name) {
  for (const std::string& n : dataset_names())
    if (n == name) return;
  TANDEM_CHECK(false, "unknown data set '", name, "'; valid names: ", names_list());
}

// What a user does to get the files in place.
std::string fix_hint(const std::string& name) {
  if (name == "fashion-mnist")
    return "install the Debian package (`apt-get install dataset-fashion-mnist`) or pass --data-dir with a "
           "directory holding the four IDX files";
  if (name == "mnist")
    return "put the four MNIST IDX files (optionally .gz) there or pass --data-dir with a directory holding them";
  return "unpack the CIFAR-10 binary version (cifar-10-binary.tar.gz) there or pass --data-dir with a directory "
         "holding its .bin files";
}

void check_dir(const std::string& name, const std::string& dir) {
  std::error_code ec;
  TANDEM_CHECK(fs::is_directory(dir, ec), "data directory ", dir, " for ", name, " does not exist; ", fix_hint(name));
}

// The file itself when present, else its .gz twin; uncompressed wins because it reads faster.
std::string find_file(const std::string& name, const std::string& dir, const std::string& base) {
  std::error_code ec;
  fs::path raw = fs::path(dir) / base;
  if (fs::exists(raw, ec)) return raw.string();
  fs::path gz = fs::path(dir) / (base + ".gz");
  if (fs::exists(gz, ec)) return gz.string();
  TANDEM_CHECK(false, name, ": expected file ", raw.string(), " (or ", gz.filename().string(), ") is missing; ",
               fix_hint(name));
  return {};
}

void check_labels(const std::string& path, const int32_t* labels, int64_t n, int64_t num_classes) {
  for (int64_t i = 0; i < n; ++i)
    TANDEM_CHECK(labels[i] >= 0 && labels[i] < num_classes, path, ": label ", labels[i], " of sample ", i,
                 " is outside [0, ", num_classes, ")");
}

Dataset load_idx_set(const std::string& name, const std::string& dir, bool train) {
  check_dir(name, dir);
  const std::string prefix = train ? "train" : "t10k";
  const std::string images_path = find_file(name, dir, prefix + "-images-idx3-ubyte");
  const std::string labels_path = find_file(name, dir, prefix + "-labels-idx1-ubyte");

  // Both headers are read and compared before any data is inflated.
  IdxFile images_file(images_path), labels_file(labels_path);
  const Shape& is = images_file.shape();
  TANDEM_CHECK(is.size() == 3, images_path, ": expected an IDX images file (magic 0x00000803, dims [N, 28, 28])",
               " but it has ", is.size(), " dims ", shape_str(is));
  TANDEM_CHECK(is[1] == 28 && is[2] == 28, images_path, ": unexpected dims ", shape_str(is), "; ", name,
               " images are [N, 28, 28]");
  const Shape& ls = labels_file.shape();
  TANDEM_CHECK(ls.size() == 1, labels_path, ": expected an IDX labels file (magic 0x00000801, dims [N])",
               " but it has ", ls.size(), " dims ", shape_str(ls));
  const int64_t n = is[0];
  TANDEM_CHECK(ls[0] == n, images_path, " holds ", n, " images but ", labels_path, " holds ", ls[0], " labels");
  Tensor raw_labels = labels_file.read_data();
  Tensor images = images_file.read_data();

  Dataset ds;
  ds.name = name;
  ds.num_classes = 10;
  ds.images = images.view({n, 1, 28, 28});
  ds.labels = Tensor::empty({n}, DType::i32);
  const uint8_t* src = raw_labels.data<uint8_t>();
  int32_t* dst = ds.labels.data<int32_t>();
  for (int64_t i = 0; i < n; ++i) dst[i] = src[i];
  check_labels(labels_path, dst, n, ds.num_classes);
  return ds;
}

Dataset load_cifar10(const std::string& dir, bool train) {
  const std::string name = "cifar10";
  check_dir(name, dir);
  std::error_code ec;
  std::string root = dir;
  fs::path nested = fs::path(dir) / "cifar-10-batches-bin";
  if (fs::is_directory(nested, ec)) root = nested.string();

  std::vector<std::string> files;
  if (train) {
    for (int i = 1; i <= 5; ++i) files.push_back(find_file(name, root, "data_batch_" + std::to_string(i) + ".bin"));
  } else {
    files.push_back(find_file(name, root, "test_batch.bin"));
  }
  std::vector<uint8_t> pixels;
  std::vector<int32_t> labels;
  for (const std::string& f : files) read_cifar_file(f, pixels, labels);

  const int64_t n = static_cast<int64_t>(labels.size());
  Dataset ds;
  ds.name = name;
  ds.num_classes = 10;
  ds.images = Tensor::from_data(pixels.data(), {n, 3, kCifarSide, kCifarSide}, DType::u8);
  ds.labels = Tensor::from_data(labels.data(), {n}, DType::i32);
  return ds;
}

}  // namespace

int64_t Dataset::size() const { return images.defined() ? images.size(0) : 0; }

IdxFile::IdxFile(const std::string& path) : reader_(path) {
  uint8_t magic[4];
  size_t got = reader_.read(magic, 4);
  TANDEM_CHECK(got == 4, path, " is truncated: expected at least 4 bytes of IDX header, found ", got);
  const uint32_t m = load_be32(magic);
  TANDEM_CHECK(magic[0] == 0 && magic[1] == 0 && magic[3] >= 1, path, ": wrong magic number ", hex32(m),
               "; not an IDX file (labels start with 0x00000801, images with 0x00000803)");
  TANDEM_CHECK(magic[2] == kIdxUnsignedByte, path, ": magic number ", hex32(m), " announces IDX element type 0x",
               hex32(magic[2]).substr(8), "; only unsigned bytes (0x08) are supported");
  const int ndim = magic[3];
  TANDEM_CHECK(ndim <= kIdxMaxDims, path, ": magic number ", hex32(m), " announces ", ndim,
               " dimensions; at most ", kIdxMaxDims, " are supported");

  uint8_t dims_raw[4 * kIdxMaxDims];
  const size_t dims_bytes = 4 * static_cast<size_t>(ndim);
  got = reader_.read(dims_raw, dims_bytes);
  TANDEM_CHECK(got == dims_bytes, path, " is truncated: expected ", 4 + dims_bytes, " bytes of IDX header, found ",
               4 + got);
  shape_.resize(static_cast<size_t>(ndim));
  bytes_ = 1;
  bool too_big = false;
  uint64_t nonzero = 1;  // a zero dim makes no bytes, but the other dims' strides must still fit
  for (int d = 0; d < ndim; ++d) {
    uint32_t extent = load_be32(dims_raw + 4 * d);
    shape_[static_cast<size_t>(d)] = extent;
    too_big = too_big || __builtin_mul_overflow(bytes_, uint64_t{extent}, &bytes_) ||
              __builtin_mul_overflow(nonzero, uint64_t{std::max(extent, 1u)}, &nonzero) || nonzero > (uint64_t{1} << 62);
  }
  const uint64_t header = 4 + dims_bytes;
  // Checked before allocating, so a damaged header cannot ask for terabytes.
  if (!reader_.compressed()) {
    TANDEM_CHECK(!too_big && header + bytes_ <= reader_.file_size(), path, " is truncated: dims ", shape_str(shape_),
                 " need ", header, " + ", bytes_, " bytes, found ", reader_.file_size());
  } else {
    TANDEM_CHECK(!too_big && bytes_ <= reader_.max_data_bytes(), path, ": dims ", shape_str(shape_), " need ", bytes_,
                 " bytes of data, more than this ", reader_.file_size(),
                 "-byte gzip file can hold (damaged header or truncated file)");
  }
}

Tensor IdxFile::read_data() {
  const std::string& path = reader_.path();
  Tensor t = Tensor::empty(shape_, DType::u8);
  // Inflation stops at the size the header announced; what follows is only probed, never all inflated.
  size_t got = reader_.read(t.data_ptr(), bytes_);
  TANDEM_CHECK(got == bytes_, path, " is truncated: dims ", shape_str(shape_), " need ", bytes_,
               " bytes of data, found ", got, reader_.cut_short() ? " (the gzip stream is cut short)" : "");
  constexpr uint64_t kProbe = uint64_t{1} << 20;
  uint64_t extra = reader_.count_remaining(kProbe);
  TANDEM_CHECK(!reader_.cut_short(), path,
               " is truncated: its gzip stream is cut short after the data (checksum missing)");
  TANDEM_CHECK(extra == 0, path, ": ", extra > kProbe ? "more than " + std::to_string(kProbe) : std::to_string(extra),
               " unexpected bytes after the ", bytes_, " bytes of data that dims ", shape_str(shape_), " announce");
  return t;
}

void read_cifar_file(const std::string& path, std::vector<uint8_t>& pixels, std::vector<int32_t>& labels) {
  std::vector<uint8_t> bytes = read_all(path);
  const int64_t size = static_cast<int64_t>(bytes.size());
  TANDEM_CHECK(size > 0, path, " is empty; a CIFAR-10 batch file holds 3073-byte records");
  TANDEM_CHECK(size % kCifarRecord == 0, path, " is truncated: expected a whole number of ", kCifarRecord,
               "-byte records (", (size / kCifarRecord + 1) * kCifarRecord, " bytes for ", size / kCifarRecord + 1,
               "), found ", size, " bytes");
  const int64_t n = size / kCifarRecord;
  const size_t old = labels.size();
  labels.resize(old + static_cast<size_t>(n));
  pixels.resize(pixels.size() + static_cast<size_t>(n * kCifarPixels));
  uint8_t* px = pixels.data() + old * kCifarPixels;
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* rec = bytes.data() + i * kCifarRecord;
    TANDEM_CHECK(rec[0] < 10, path, ": label ", int{rec[0]}, " of record ", i, " is outside [0, 10)");
    labels[old + static_cast<size_t>(i)] = rec[0];
    std::memcpy(px + i * kCifarPixels, rec + 1, kCifarPixels);
  }
}

Tensor read_idx(const std::string& path) { return IdxFile(path).read_data(); }

Dataset load_dataset(const std::string& name, const std::string& dir, bool train) {
  check_name(name);
  const std::string where = dir.empty() ? default_data_dir(name) : dir;
  if (name == "cifar10") return load_cifar10(where, train);
  return load_idx_set(name, where, train);
}

std::string default_data_dir(const std::string& name) {
  check_name(name);
  const char* root = std::getenv("TANDEM_DATA_DIR");
  return std::string(root && *root ? root : "/usr/share/datasets") + "/" + name;
}

std::vector<std::string> dataset_names() { return {"mnist", "fashion-mnist", "cifar10"}; }

}  // namespace tandem::data
