// Creating output files: atomic replacement through a fresh file, appending and creating without
// following a link, and what is refused with which message.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "core/safe_file.h"
#include "tandem/error.h"

namespace fs = std::filesystem;
using namespace tandem;

namespace {

fs::path fresh_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("tandem_safe_file_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string contents(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

size_t entries(const fs::path& dir) {
  return static_cast<size_t>(std::distance(fs::directory_iterator(dir), fs::directory_iterator()));
}

// The message of the tandem::Error that f throws, checked to be an input error.
template <typename F>
std::string input_error(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), Error::Kind::Input) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected an error";
  return "";
}

}  // namespace

TEST(SafeFile, AtomicWriteReplacesTheFileAndLeavesNothingBeside) {
  fs::path dir = fresh_dir("replace");
  const fs::path p = dir / "out.bin";
  std::ofstream(p) << "old";
  io::write_file_atomically(p.string(), "test file", std::string_view("new content"));
  EXPECT_EQ(contents(p), "new content");
  EXPECT_EQ(entries(dir), 1u);
  // A name near the longest a file system takes still gets its temporary file.
  const fs::path long_name = dir / std::string(250, 'n');
  io::write_file_atomically(long_name.string(), "test file", std::string_view("x"));
  EXPECT_EQ(contents(long_name), "x");
  EXPECT_EQ(entries(dir), 2u);
  fs::remove_all(dir);
}

TEST(SafeFile, AFailingWriterLeavesTheOldFileAndNoTemporary) {
  fs::path dir = fresh_dir("failing");
  const fs::path p = dir / "out.bin";
  std::ofstream(p) << "old";
  EXPECT_THROW(io::write_file_atomically(p.string(), "test file",
                                         [&](int fd) {
                                           io::write_all(fd, "half", 4, p.string(), "test file");
                                           throw std::runtime_error("stopped");
                                         }),
               std::runtime_error);
  EXPECT_EQ(contents(p), "old");
  EXPECT_EQ(entries(dir), 1u);
  fs::remove_all(dir);
}

TEST(SafeFile, AtomicWriteReplacesALinkAndLeavesItsTarget) {
  fs::path dir = fresh_dir("link");
  std::ofstream(dir / "victim") << "not yours";
  fs::create_symlink(dir / "victim", dir / "out");
  io::write_file_atomically((dir / "out").string(), "test file", std::string_view("mine"));
  EXPECT_EQ(contents(dir / "victim"), "not yours");
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(dir / "out")));
  EXPECT_EQ(contents(dir / "out"), "mine");
  fs::remove_all(dir);
}

TEST(SafeFile, BadPlacesAreNamedInTheError) {
  fs::path dir = fresh_dir("bad");
  std::string e = input_error([&] { io::write_file_atomically((dir / "no" / "f").string(), "test file", "x"); });
  EXPECT_NE(e.find("does not exist"), std::string::npos) << e;
  fs::create_directories(dir / "d" / "inside");
  e = input_error([&] { io::write_file_atomically((dir / "d").string(), "test file", "x"); });
  EXPECT_NE(e.find("is a directory"), std::string::npos) << e;
  e = input_error([&] { io::write_file_atomically(dir.string() + "/", "test file", "x"); });
  EXPECT_NE(e.find("names a directory"), std::string::npos) << e;
  e = input_error([&] { io::check_can_write((dir / "no" / "f").string(), "test file"); });
  EXPECT_NE(e.find("does not exist"), std::string::npos) << e;
  EXPECT_EQ(entries(dir), 1u);  // only d: nothing left behind by the failures
  fs::remove_all(dir);
}

TEST(SafeFile, WriteCheckUsesAFreshFileAndRemovesIt) {
  fs::path dir = fresh_dir("check");
  std::ofstream(dir / "victim") << "not yours";
  fs::create_symlink(dir / "victim", dir / "out.partial");
  EXPECT_NO_THROW(io::check_can_write((dir / "out").string(), "test file"));
  EXPECT_EQ(contents(dir / "victim"), "not yours");
  EXPECT_EQ(entries(dir), 2u);
  fs::remove_all(dir);
}

TEST(SafeFile, AppendCreatesThenAppends) {
  fs::path dir = fresh_dir("append");
  const fs::path p = dir / "log";
  for (const char* line : {"a\n", "b\n"}) {
    io::UniqueFd fd = io::open_for_append(p.string(), "test file");
    io::write_all(fd.get(), line, 2, p.string(), "test file");
  }
  EXPECT_EQ(contents(p), "a\nb\n");
  fs::remove_all(dir);
}

TEST(SafeFile, AppendRefusesLinksFifosDirectoriesAndHardLinks) {
  fs::path dir = fresh_dir("append_refused");
  std::ofstream(dir / "victim") << "not yours";
  fs::create_symlink(dir / "victim", dir / "soft");
  fs::create_symlink(dir / "nowhere", dir / "dangling");
  fs::create_hard_link(dir / "victim", dir / "hard");
  ASSERT_EQ(mkfifo((dir / "fifo").c_str(), 0600), 0);
  const std::pair<const char*, const char*> cases[] = {{"soft", "symbolic link"},
                                                       {"dangling", "symbolic link"},
                                                       {"hard", "hard links"},
                                                       {"fifo", "not a regular file"},
                                                       {".", "directory"}};
  for (auto [name, says] : cases) {
    const std::string p = (dir / name).string();
    std::string e = input_error([&] { io::open_for_append(p, "test file"); });
    EXPECT_NE(e.find(says), std::string::npos) << name << ": " << e;
    EXPECT_NE(e.find(p), std::string::npos) << e;
  }
  EXPECT_EQ(contents(dir / "victim"), "not yours");
  EXPECT_FALSE(fs::exists(dir / "nowhere"));
  fs::remove_all(dir);
}

TEST(SafeFile, CreateNewRefusesAnythingAlreadyThere) {
  fs::path dir = fresh_dir("create_new");
  fs::create_symlink(dir / "nowhere", dir / "dangling");
  std::string e = input_error([&] { io::create_new_file((dir / "dangling").string(), "test file"); });
  EXPECT_NE(e.find("already there"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(dir / "nowhere"));
  io::UniqueFd fd = io::create_new_file((dir / "new").string(), "test file");
  EXPECT_TRUE(fd);
  EXPECT_THROW(io::create_new_file((dir / "new").string(), "test file"), Error);
  fs::remove_all(dir);
}
