// A float buffer for intermediates a kernel overwrites whole: it grows without value-initialising
// (a fresh std::vector<float> zeroes every element first, and at 2048 prefill tokens those
// megabytes of zeros were a measurable share of the call) and keeps its allocation when reused.
#ifndef ATTNSERVE_KERNELS_CPU_SCRATCH_FLOATS_H_
#define ATTNSERVE_KERNELS_CPU_SCRATCH_FLOATS_H_

#include <cstdint>
#include <memory>

namespace attnserve {

// What one thread-local scratch buffer keeps between calls (16 MiB): the prefill buffers of a
// 2048-token chunk of the benchmark shapes (d_model 512: 4-12 MiB each, MLA's up-projected K/V 16
// MiB) fit, so their pages are faulted in once per thread instead of on every call; a larger call
// frees its buffer after use. Kept small because every executor and pool thread that ran a
// prefill holds its own buffers (GqaLayer's two, the prefill gather, MLA's six), and
// that memory is outside the KV budget.
inline constexpr int64_t kMaxRetainedScratchFloats = int64_t{4} << 20;

class ScratchFloats {
 public:
  // At least `n` floats, contents unspecified.
  float* Resize(int64_t n) {
    if (n > capacity_) {
      data_.reset(new float[n]);
      capacity_ = n;
    }
    return data_.get();
  }
  float* data() const { return data_.get(); }
  // Frees the allocation when it is larger than `max_floats`: a buffer kept across calls (per
  // thread, see kMaxRetainedScratchFloats) then holds at most that much between them.
  void Trim(int64_t max_floats) {
    if (capacity_ > max_floats) {
      data_.reset();
      capacity_ = 0;
    }
  }

 private:
  std::unique_ptr<float[]> data_;
  int64_t capacity_ = 0;
};

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_CPU_SCRATCH_FLOATS_H_
