// The one reader of the peer cases (tests/peer/make_peer_cases.py, make_stack_peer_case.py): a
// case directory holds spec.json (our JSON form of the recorded module's spec), case.json (the
// recorded layer_index and prefill_split), io.safetensors (the layer's input, its positions and the
// outputs transformers / PyTorch computed) and, for the transformers models, the checkpoint as
// save_pretrained wrote it (config.json, model.safetensors). Used by tests/engine/peer_test.cc,
// hf_config_peer_test.cc, tests/server/checkpoint_spec_test.cc and stack_peer_test.cc.
#ifndef ATTNSERVE_TESTS_REFERENCE_PEER_CASE_H_
#define ATTNSERVE_TESTS_REFERENCE_PEER_CASE_H_

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/core/tensor.h"
#include "kernels/spec/layer_spec.h"

namespace attnserve::reference {

// The environment variable `env_var` when it is set and not empty, else `default_dir` (the
// directory the build's generating test writes, a compile definition of each test).
std::filesystem::path PeerCasesRoot(const char* env_var, const std::string& default_dir);

// The directories below `root` (one level) holding every file of `required`, sorted by name.
std::vector<std::filesystem::path> PeerCaseDirs(const std::filesystem::path& root,
                                                const std::vector<std::string>& required);

// A file's bytes; NOT_FOUND naming it when it cannot be opened.
absl::StatusOr<std::string> ReadText(const std::filesystem::path& path);

// case.json: INVALID_ARGUMENT unless it is an object with an integer layer_index (and, when
// present, an integer prefill_split; -1 when absent).
struct PeerCaseInfo {
  int layer_index = 0;
  int64_t prefill_split = -1;
};
absl::StatusOr<PeerCaseInfo> ReadCaseInfo(const std::filesystem::path& dir);

// spec.json, its errors prefixed "spec.json: ".
absl::StatusOr<LayerSpec> ReadRecordedSpec(const std::filesystem::path& dir);

// io.safetensors: the layer's input, its positions (stored as F32, checked to be exact small
// integers) and the recorded outputs. Shapes are the caller's to check.
struct PeerIo {
  Tensor hidden;                    // [seq_len, d_model]
  std::vector<int64_t> positions;   // [seq_len]
  Tensor expected;                  // One-shot prefill output.
  bool has_expected_split = false;  // The stack case records none.
  Tensor expected_split;            // Prefill-then-decode output.
};
absl::StatusOr<PeerIo> ReadPeerIo(const std::filesystem::path& dir);

}  // namespace attnserve::reference

#endif  // ATTNSERVE_TESTS_REFERENCE_PEER_CASE_H_
