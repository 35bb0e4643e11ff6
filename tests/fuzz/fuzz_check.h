// FUZZ_CHECK(condition, what): the fuzzers' way of reporting a broken property (a round trip that
// changes the value, an error code the contract does not allow). It prints `what` and aborts, which
// libFuzzer records as a crash with the input that caused it. The code under test itself must
// never abort; these checks are the only aborts a fuzz target may contain.
#ifndef ATTNSERVE_TESTS_FUZZ_FUZZ_CHECK_H_
#define ATTNSERVE_TESTS_FUZZ_FUZZ_CHECK_H_

#include <cstdio>
#include <cstdlib>
#include <string>

#define FUZZ_CHECK(condition, what)                                                              \
  do {                                                                                           \
    if (!(condition)) {                                                                          \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK(%s) failed: %s\n", __FILE__, __LINE__, #condition, \
                   std::string(what).c_str());                                                   \
      std::abort();                                                                              \
    }                                                                                            \
  } while (false)

#endif  // ATTNSERVE_TESTS_FUZZ_FUZZ_CHECK_H_
