#include "kernels/cpu/rope_table.h"

#include <algorithm>

namespace attnserve {

RopeTable::RopeTable(const RotaryPositions& rope, std::vector<double> inv_freq)
    : inv_freq_(std::move(inv_freq)), rope_(rope) {
  rope_.inv_freq = inv_freq_.data();
}

bool RopeTable::SameParameters(const RotaryPositions& rope) const {
  // Interleaving does not change the tables, only how they are applied; kept equal anyway so a
  // table's parameters are exactly its holders'.
  return rope.rotary_dim == rope_.rotary_dim && rope.interleaved == rope_.interleaved &&
         rope.attention_factor == rope_.attention_factor &&
         std::equal(inv_freq_.begin(), inv_freq_.end(), rope.inv_freq);
}

std::shared_ptr<RopeTable> RopeTable::For(const RotaryPositions& rope) {
  static absl::Mutex registry_mu(absl::kConstInit);
  static auto* registry = new std::vector<std::weak_ptr<RopeTable>>();
  absl::MutexLock lock(&registry_mu);
  std::shared_ptr<RopeTable> found;
  // Drops the tables no layer holds any more while looking.
  std::erase_if(*registry, [&](const std::weak_ptr<RopeTable>& entry) {
    std::shared_ptr<RopeTable> table = entry.lock();
    if (table == nullptr) return true;
    if (found == nullptr && table->SameParameters(rope)) found = std::move(table);
    return false;
  });
  if (found != nullptr) return found;
  found = std::make_shared<RopeTable>(
      rope, std::vector<double>(rope.inv_freq, rope.inv_freq + rope.pairs()));
  registry->push_back(found);
  return found;
}

void RopeTable::Lookup(int64_t position, float* table) {
  const int pairs = rope_.pairs();
  if (position < 0 || position >= kMaxKeptPosition) {
    rope_.FillTable(position, table, table + pairs);
    return;
  }
  const size_t block = static_cast<size_t>(position / kBlock);
  absl::MutexLock lock(&mu_);
  if (block >= blocks_.size()) blocks_.resize(block + 1);
  std::unique_ptr<float[]>& rows = blocks_[block];
  if (rows == nullptr) {
    rows = std::make_unique<float[]>(static_cast<size_t>(kBlock) * rope_.rotary_dim);
    for (int64_t i = 0; i < kBlock; ++i) {
      float* row = rows.get() + i * rope_.rotary_dim;
      rope_.FillTable(static_cast<int64_t>(block) * kBlock + i, row, row + pairs);
    }
  }
  const float* row = rows.get() + (position % kBlock) * rope_.rotary_dim;
  std::copy(row, row + rope_.rotary_dim, table);
}

}  // namespace attnserve
