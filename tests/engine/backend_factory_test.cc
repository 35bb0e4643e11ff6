// CreateBackend(auto | cpu | cuda): names, the auto fallback and its reason, and the cuda error
// when the binary has no CUDA backend or no usable device. Runs everywhere: with a device, "cuda"
// and "auto" must pick the CUDA backend instead.
#include "kernels/backend_factory.h"

#include "gtest/gtest.h"

namespace attnserve {
namespace {

TEST(BackendFactoryTest, CpuByName) {
  BackendOptions options;
  options.name = "cpu";
  absl::StatusOr<BackendChoice> choice = CreateBackend(options);
  ASSERT_TRUE(choice.ok()) << choice.status();
  EXPECT_EQ(choice->backend->name(), "cpu");
  EXPECT_EQ(choice->reason, "cpu: requested");
}

TEST(BackendFactoryTest, UnknownNameIsInvalidArgument) {
  BackendOptions options;
  options.name = "tpu";
  absl::StatusOr<BackendChoice> choice = CreateBackend(options);
  EXPECT_EQ(choice.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(choice.status().message().find("must be auto, cpu or cuda"), absl::string_view::npos);
}

TEST(BackendFactoryTest, CudaAndAutoAgree) {
  BackendOptions cuda;
  cuda.name = "cuda";
  cuda.cuda.kv_pool_bytes = int64_t{64} << 20;
  absl::StatusOr<BackendChoice> forced = CreateBackend(cuda);
  BackendOptions automatic = cuda;
  automatic.name = "auto";
  absl::StatusOr<BackendChoice> chosen = CreateBackend(automatic);
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  if (forced.ok()) {
    EXPECT_EQ(forced->backend->name(), "cuda");
    EXPECT_EQ(chosen->backend->name(), "cuda");
    EXPECT_NE(chosen->reason.find("is usable"), std::string::npos) << chosen->reason;
    return;
  }
  // No CUDA here: "cuda" fails with the reason, "auto" falls back to the CPU and says why.
  EXPECT_EQ(forced.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(forced.status().message().rfind("backend = cuda: ", 0), 0u) << forced.status();
  if (CudaBackendBuilt()) {
    EXPECT_NE(forced.status().message().find("no CUDA device"), absl::string_view::npos)
        << forced.status();
  }
  EXPECT_EQ(chosen->backend->name(), "cpu");
  EXPECT_EQ(chosen->reason.rfind("auto: CPU, because the CUDA backend is unavailable (", 0), 0u)
      << chosen->reason;
}

}  // namespace
}  // namespace attnserve
