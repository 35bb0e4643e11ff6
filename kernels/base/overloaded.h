// Overloaded{f, g, ...}: one callable from several lambdas, for std::visit over a variant.
#ifndef ATTNSERVE_KERNELS_BASE_OVERLOADED_H_
#define ATTNSERVE_KERNELS_BASE_OVERLOADED_H_

namespace attnserve {

template <typename... Fs>
struct Overloaded : Fs... {
  using Fs::operator()...;
};
// Spelled out: clang before 17 does not deduce an aggregate's template arguments (P1816).
template <typename... Fs>
Overloaded(Fs...) -> Overloaded<Fs...>;

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_BASE_OVERLOADED_H_
