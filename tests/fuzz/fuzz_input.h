// The readers under fuzz take a path, so each input is written to one scratch file per fuzzing
// process (in /dev/shm where it exists, so no disk is touched) and read back from there.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace tg::fuzz {

class InputFile {
 public:
  explicit InputFile(const std::string& name) {
    const char* dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : (std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp");
    path_ = std::string(dir) + "/tg-fuzz-" + name + "-" + std::to_string(getpid());
  }
  ~InputFile() { std::remove(path_.c_str()); }
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  // Replaces the file's content with the input; aborts when it cannot (that is no finding).
  const std::string& write(const uint8_t* data, size_t size) {
    FILE* f = std::fopen(path_.c_str(), "wb");
    if (!f || (size && std::fwrite(data, 1, size, f) != size) || std::fclose(f) != 0) {
      std::perror(path_.c_str());
      std::abort();
    }
    return path_;
  }

 private:
  std::string path_;
};

}  // namespace tg::fuzz
