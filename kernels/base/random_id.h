// 128-bit random identifiers as 32 lowercase hex characters, from the kernel's CSPRNG
// (getrandom, or /dev/urandom where it is missing). The server's session ids and the ids a client
// draws for Configure behind a balancer (client/common/session_routing.h) are both these, so a
// client-chosen id is as hard to guess as a server-drawn one.
#ifndef ATTNSERVE_KERNELS_BASE_RANDOM_ID_H_
#define ATTNSERVE_KERNELS_BASE_RANDOM_ID_H_

#include <string>

namespace attnserve {

std::string RandomHexId128();

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_BASE_RANDOM_ID_H_
