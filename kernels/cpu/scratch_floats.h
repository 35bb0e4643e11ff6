// A float buffer for intermediates a kernel overwrites whole: it grows without value-initialising
// (a fresh std::vector<float> zeroes every element first, and at 2048 prefill tokens those
// megabytes of zeros were a measurable share of the call) and keeps its allocation when reused.
#ifndef ATTNSERVE_KERNELS_CPU_SCRATCH_FLOATS_H_
#define ATTNSERVE_KERNELS_CPU_SCRATCH_FLOATS_H_

#include <cstdint>
#include <memory>

namespace attnserve {

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

 private:
  std::unique_ptr<float[]> data_;
  int64_t capacity_ = 0;
};

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_CPU_SCRATCH_FLOATS_H_
