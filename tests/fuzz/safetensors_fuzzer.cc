// Fuzzes the safetensors reader (kernels/model/safetensors.h) and the checkpoint loader built on it
// (kernels/model/checkpoint_loader.h): the input is the whole content of a .safetensors file, as a
// Configure's checkpoint path may name a file anyone wrote.
//
// SafetensorsFile reads through a file descriptor (pread, one tensor at a time), so the bytes are
// written to a private temporary file first; that also keeps the fuzzed code exactly what the
// server runs.
//
// Properties: Open returns a file or INVALID_ARGUMENT / DATA_LOSS (never crashes, never allocates
// what the header claims before checking it against the file); every listed tensor reads back to
// exactly its declared byte range, or UNIMPLEMENTED (INVALID_ARGUMENT for a dtype name the format
// does not define) when the engine does not compute in its dtype;
// LoadLayerWeightsFromSafetensors for each spec of fuzz_specs.h returns weights of exactly the
// expected shapes or an error (INVALID_ARGUMENT, NOT_FOUND, UNIMPLEMENTED, DATA_LOSS).
#include <fcntl.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/model/checkpoint_loader.h"
#include "kernels/spec/layer_spec.h"
#include "kernels/model/layer_weights.h"
#include "kernels/model/safetensors.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/fuzz_specs.h"

namespace attnserve {
namespace {

// A temporary .safetensors file of this process, removed at exit.
class ScratchFile {
 public:
  ScratchFile() {
    // tmpfs when there is one: on a disk, rewriting the file costs ~8x the executions per second.
    const char* dir = std::getenv("TMPDIR");
    std::string base = dir != nullptr && *dir != '\0' ? dir : "/tmp";
    if (dir == nullptr && access("/dev/shm", W_OK) == 0) base = "/dev/shm";
    path_ = base + "/attnserve_fuzz_XXXXXX.safetensors";
    const int fd = mkstemps(path_.data(), /*suffixlen=*/12);
    FUZZ_CHECK(fd >= 0, "cannot create " + path_);
    close(fd);
  }
  ~ScratchFile() { unlink(path_.c_str()); }

  const std::string& Write(const uint8_t* data, size_t size) {
    const int fd = open(path_.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
    FUZZ_CHECK(fd >= 0, "cannot open " + path_);
    size_t written = 0;
    while (written < size) {
      const ssize_t n = write(fd, data + written, size - written);
      FUZZ_CHECK(n > 0, "cannot write " + path_);
      written += static_cast<size_t>(n);
    }
    close(fd);
    return path_;
  }

 private:
  std::string path_;
};

bool IsOneOf(absl::StatusCode code, std::initializer_list<absl::StatusCode> allowed) {
  for (absl::StatusCode a : allowed) {
    if (code == a) return true;
  }
  return false;
}

void CheckFile(const SafetensorsFile& file) {
  for (const std::string& name : file.names()) {
    absl::StatusOr<SafetensorsTensorInfo> info = file.info(name);
    FUZZ_CHECK(info.ok(), "listed tensor without info: " + name);
    FUZZ_CHECK(info->data_begin <= info->data_end, name);
    absl::StatusOr<Tensor> tensor = file.Read(name);
    if (!tensor.ok()) {
      // A dtype the format defines but the engine does not compute in is UNIMPLEMENTED; a name
      // the format does not define passes Open (its byte range is checked) and is
      // INVALID_ARGUMENT here.
      FUZZ_CHECK(!info->dtype.has_value() &&
                     IsOneOf(tensor.status().code(), {absl::StatusCode::kUnimplemented,
                                                      absl::StatusCode::kInvalidArgument}),
                 tensor.status().ToString());
      continue;
    }
    FUZZ_CHECK(tensor->num_bytes() == info->data_end - info->data_begin, name);
    FUZZ_CHECK(tensor->shape() == info->shape, name);
  }
}

void CheckLoad(const std::string& path, const LayerSpec& spec) {
  absl::StatusOr<LayerWeights> weights = LoadLayerWeightsFromSafetensors(path, spec, 0);
  if (!weights.ok()) {
    FUZZ_CHECK(IsOneOf(weights.status().code(),
                       {absl::StatusCode::kInvalidArgument, absl::StatusCode::kNotFound,
                        absl::StatusCode::kUnimplemented, absl::StatusCode::kDataLoss}),
               weights.status().ToString());
    return;
  }
  absl::Status valid = ValidateLayerWeights(spec, *weights);
  FUZZ_CHECK(valid.ok(), valid.ToString());
}

}  // namespace
}  // namespace attnserve

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace attnserve;
  static ScratchFile* const scratch = new ScratchFile();
  // Removed at exit; libFuzzer leaves through exit() after -max_total_time and -runs.
  static const int registered = std::atexit([] { delete scratch; });
  (void)registered;
  const std::string& path = scratch->Write(data, size);

  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
  if (!file.ok()) {
    FUZZ_CHECK(IsOneOf(file.status().code(),
                       {absl::StatusCode::kInvalidArgument, absl::StatusCode::kDataLoss}),
               file.status().ToString());
    return 0;
  }
  CheckFile(*file);
  for (const LayerSpec& spec : fuzz::FuzzSpecs()) CheckLoad(path, spec);
  return 0;
}
