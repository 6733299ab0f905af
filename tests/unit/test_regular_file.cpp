// Paths where a regular file is expected: each kind of non-file is refused with what it is,
// and none of them blocks (a FIFO with no writer would block a plain open()).
#include <gtest/gtest.h>

#include <sys/stat.h>

#include "data/regular_file.hpp"
#include "pope/data.hpp"
#include "scratch_dir.hpp"

using namespace pope;
using pope::testing::ScratchDir;
using pope::testing::thrown_message;

TEST(RegularFile, EachKindOfNonFileIsNamedForWhatItIs) {
  ScratchDir dir;
  ASSERT_EQ(::mkfifo((dir / "fifo").c_str(), 0600), 0);
  std::filesystem::create_symlink("loop_b", dir / "loop_a");
  std::filesystem::create_symlink("loop_a", dir / "loop_b");
  std::filesystem::create_symlink("gone", dir / "dangling");
  const std::vector<std::pair<std::filesystem::path, std::string>> cases = {
      {dir / "fifo", "is a FIFO (named pipe), not a regular file"},
      {"/dev/zero", "is a character device, not a regular file"},
      {dir.path(), "is a directory, not a regular file"},
      {dir / "loop_a", "is a symbolic link loop"},
      {dir / "dangling", "is a dangling symbolic link"},
      {dir / "missing.bin", "does not exist"},
  };
  for (const auto& [path, reason] : cases) {
    EXPECT_NE(why_not_regular_file(path).find(reason), std::string::npos) << path << ": " << why_not_regular_file(path);
    // Every token reader refuses it the same way, without blocking.
    const auto message = thrown_message<DataError>([&] { TokenFile::open(path, 50257); });
    EXPECT_NE(message.find(reason), std::string::npos) << message;
  }
  pope::testing::write_bytes(dir / "file.bin", {1, 0});
  EXPECT_EQ(why_not_regular_file(dir / "file.bin"), "");
}
