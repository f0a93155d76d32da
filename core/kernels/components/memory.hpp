// Memory: the 16-, 8- and 4-byte units the kernels load and store whole, and
// loads and stores with cache hints (CUDA's ld.global.L2::256B and
// L1::no_allocate, prefetch.L1, st.global.cs; HIP's non-temporal stores;
// plain accesses in the portable form).
#pragma once

#include <cstdint>

#include "compat.hpp"

namespace sparse_mla::kernels {

// 16 bytes, loaded and stored as one unit on GPUs (ld.global.v4).
struct SPARSE_MLA_MAY_ALIAS Int4 {
  alignas(16) std::int32_t x;
  std::int32_t y, z, w;
};
static_assert(sizeof(Int4) == 16 && alignof(Int4) == 16, "Int4 is one 16-byte unit");

// 8 bytes, loaded as one unit on GPUs (ld.global.v2).
struct SPARSE_MLA_MAY_ALIAS Int2 {
  alignas(8) std::int32_t x;
  std::int32_t y;
};

// A 4-byte word that may alias bytes.
struct SPARSE_MLA_MAY_ALIAS Word {
  std::uint32_t value;
};

namespace device {

// Brings the line of `p` into this SM's L1 (CUDA); a hint, nothing elsewhere.
KOKKOS_INLINE_FUNCTION void prefetch_l1(const void* p) {
#if SPARSE_MLA_FORM_CUDA
  asm volatile("prefetch.L1 [%0];" ::"l"(p));
#else
  (void)p;
#endif
}

// How a load fetches (CUDA; every other form loads plainly):
// - wide: the L2 brings the whole 256-byte block the load falls in from
//   DRAM (ld.global.L2::256B), for rows read whole, whose neighbouring bytes
//   other lanes of the team load next;
// - wide_streaming: as wide, and the line is not kept in the L1
//   (L1::no_allocate), for outputs stored streaming.
enum class Fetch { plain, wide, wide_streaming };

// 1, 2 or 4 little-endian words from p: one vector access when `Vector` (p
// aligned to the access), bytes otherwise.
template <bool Vector, int Words, Fetch How = Fetch::plain>
KOKKOS_INLINE_FUNCTION void load_words(const std::uint8_t* p, std::uint32_t* w) {
  static_assert(Words == 1 || Words == 2 || Words == 4, "1, 2 or 4 words");
#if SPARSE_MLA_FORM_CUDA
#define SPARSE_MLA_FETCH(hint)                                                                          \
  if constexpr (Words == 4) {                                                                           \
    asm volatile("ld.global" hint ".v4.u32 {%0, %1, %2, %3}, [%4];"                                     \
                 : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3])                                       \
                 : "l"(p));                                                                             \
  } else if constexpr (Words == 2) {                                                                    \
    asm volatile("ld.global" hint ".v2.u32 {%0, %1}, [%2];" : "=r"(w[0]), "=r"(w[1]) : "l"(p));         \
  } else {                                                                                              \
    asm volatile("ld.global" hint ".u32 %0, [%1];" : "=r"(w[0]) : "l"(p));                              \
  }
  if constexpr (Vector && How == Fetch::wide) {
    SPARSE_MLA_FETCH(".L2::256B")
    return;
  } else if constexpr (Vector && How == Fetch::wide_streaming) {
    SPARSE_MLA_FETCH(".L1::no_allocate.L2::256B")
    return;
  }
#undef SPARSE_MLA_FETCH
#endif
  if constexpr (Vector && Words == 4) {
    const Int4 v = *reinterpret_cast<const Int4*>(p);
    w[0] = static_cast<std::uint32_t>(v.x);
    w[1] = static_cast<std::uint32_t>(v.y);
    w[2] = static_cast<std::uint32_t>(v.z);
    w[3] = static_cast<std::uint32_t>(v.w);
  } else if constexpr (Vector && Words == 2) {
    const Int2 v = *reinterpret_cast<const Int2*>(p);
    w[0] = static_cast<std::uint32_t>(v.x);
    w[1] = static_cast<std::uint32_t>(v.y);
  } else if constexpr (Vector) {
    w[0] = reinterpret_cast<const Word*>(p)->value;
  } else {
    for (int i = 0; i < Words; ++i) {
      w[i] = std::uint32_t{p[4 * i]} | std::uint32_t{p[4 * i + 1]} << 8 | std::uint32_t{p[4 * i + 2]} << 16 |
             std::uint32_t{p[4 * i + 3]} << 24;
    }
  }
}

// 16 bytes to p (aligned when `Vector`). A streaming store marks its lines
// for early eviction (CUDA st.global.cs, HIP a non-temporal store): for
// outputs larger than the L2, which no later read of the kernel finds there
// anyway. The portable form stores plainly.
template <bool Vector, bool Streaming = false>
KOKKOS_INLINE_FUNCTION void store16(std::uint8_t* p, const std::uint32_t w[4]) {
  if constexpr (Vector && Streaming) {
#if SPARSE_MLA_FORM_CUDA
    __stcs(reinterpret_cast<int4*>(p), make_int4(static_cast<int>(w[0]), static_cast<int>(w[1]), static_cast<int>(w[2]),
                                                 static_cast<int>(w[3])));
    return;
#elif SPARSE_MLA_FORM_HIP
    using U4 = unsigned int __attribute__((ext_vector_type(4)));
    const U4 v = {w[0], w[1], w[2], w[3]};
    __builtin_nontemporal_store(v, reinterpret_cast<U4*>(p));
    return;
#endif
  }
  if constexpr (Vector) {
    *reinterpret_cast<Int4*>(p) = Int4{static_cast<std::int32_t>(w[0]), static_cast<std::int32_t>(w[1]),
                                       static_cast<std::int32_t>(w[2]), static_cast<std::int32_t>(w[3])};
  } else {
    for (int i = 0; i < 16; ++i) p[i] = static_cast<std::uint8_t>(w[i / 4] >> (8 * (i % 4)));
  }
}

}  // namespace device
}  // namespace sparse_mla::kernels
