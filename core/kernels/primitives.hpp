// Device primitives: everything the kernels do differently on CUDA, on HIP
// and through portable Kokkos, behind one set of names (Ginkgo's
// common/cuda_hip/components, vLLM's csrc/cuda_compat.h). The kernels call
// these and contain no backend #ifdef.
//
// Each primitive has up to three forms, picked per compilation pass:
//   cuda      nvcc's device pass (__CUDA_ARCH__): warp intrinsics, PTX hints;
//   hip       hipcc's device pass (__HIP_DEVICE_COMPILE__): the same
//             intrinsics with HIP's names, 64-bit wavefront ballots;
//   portable  everything else (host spaces, and every pass of a build
//             configured with SPARSE_MLA_PORTABLE_PRIMITIVES=ON): Kokkos team
//             operations and atomics, plain loads and stores, integer
//             arithmetic for the conversions.
// The portable form computes the same results bit for bit; the native forms
// are shorter instruction sequences for the same thing.
//
// Lane groups. The native forms work on groups of 32 consecutive team ranks
// (a team of vector length 1 lays its ranks out along consecutive GPU
// threads): a CUDA warp, half of a 64-wide CDNA wavefront (gfx90a, gfx942),
// a whole 32-wide RDNA wavefront. HIP's shuffles take a width of 32 and its
// 64-bit ballots are cut to the group's half, so every kernel sees 32-lane
// groups on every GPU and needs teams of whole groups (multiples of 32
// threads; the launches guarantee it). The portable form has groups of one
// lane, where a ballot is the lane's own bit and a shuffle its own value.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#if defined(SPARSE_MLA_PORTABLE_PRIMITIVES)
#define SPARSE_MLA_FORM_CUDA 0
#define SPARSE_MLA_FORM_HIP 0
#elif defined(__CUDA_ARCH__)
#define SPARSE_MLA_FORM_CUDA 1
#define SPARSE_MLA_FORM_HIP 0
#elif defined(__HIP_DEVICE_COMPILE__)
#define SPARSE_MLA_FORM_CUDA 0
#define SPARSE_MLA_FORM_HIP 1
#else
#define SPARSE_MLA_FORM_CUDA 0
#define SPARSE_MLA_FORM_HIP 0
#endif

// A loop the device compilers must not unroll (#pragma unroll 1), for loops
// whose body's loads must follow the previous iteration's stores. Host
// compilers take no such pragma (g++ warns on it).
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
#define SPARSE_MLA_NO_UNROLL _Pragma("unroll 1")
#else
#define SPARSE_MLA_NO_UNROLL
#endif

// Types that may alias any other (g++ needs the attribute to read a buffer of
// int32 or bytes through Int4; the device compilers do not take it there).
#if defined(__GNUC__) && !defined(__CUDA_ARCH__) && !defined(__HIP_DEVICE_COMPILE__)
#define SPARSE_MLA_MAY_ALIAS __attribute__((__may_alias__))
#else
#define SPARSE_MLA_MAY_ALIAS
#endif

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

// Which form this pass compiles (see the top of the file). Device code may
// branch on it with `if constexpr`; host code must not (nvcc's host pass
// sees `portable`): it tests portable_build.
enum class Form { portable, cuda, hip };
#if SPARSE_MLA_FORM_CUDA
inline constexpr Form form = Form::cuda;
#elif SPARSE_MLA_FORM_HIP
inline constexpr Form form = Form::hip;
#else
inline constexpr Form form = Form::portable;
#endif

// The same in every pass: whether the build was configured to run the
// portable forms on GPUs too (SPARSE_MLA_PORTABLE_PRIMITIVES=ON).
#if defined(SPARSE_MLA_PORTABLE_PRIMITIVES)
inline constexpr bool portable_build = true;
#else
inline constexpr bool portable_build = false;
#endif

// Lanes of a lane group: 32 in the native forms, 1 in the portable one.
inline constexpr int group_lanes = form == Form::portable ? 1 : 32;
// A lane group's ballot: bit l for lane l.
using LaneMask = std::uint32_t;

// ---- Lane groups ----------------------------------------------------------

// Lane l's bit set when `predicate` holds there, for every lane of the group.
KOKKOS_INLINE_FUNCTION LaneMask ballot(bool predicate) {
#if SPARSE_MLA_FORM_CUDA
  return __ballot_sync(0xffffffffu, predicate);
#elif SPARSE_MLA_FORM_HIP
  // A 64-bit wavefront ballot; this group's 32 bits (lanes 32-63 are the
  // upper group of a CDNA wavefront).
  return static_cast<LaneMask>(__ballot(predicate) >> (__lane_id() & 32));
#else
  return predicate ? 1u : 0u;
#endif
}

// Set bits of a mask.
KOKKOS_INLINE_FUNCTION int popc(LaneMask mask) {
#if SPARSE_MLA_FORM_CUDA || SPARSE_MLA_FORM_HIP
  return __popc(mask);
#else
  int bits = 0;
  for (; mask != 0; mask &= mask - 1) ++bits;
  return bits;
#endif
}

// The lowest set bit's lane (mask != 0).
KOKKOS_INLINE_FUNCTION int first_lane(LaneMask mask) {
#if SPARSE_MLA_FORM_CUDA || SPARSE_MLA_FORM_HIP
  return __ffs(mask) - 1;
#else
  int lane = 0;
  while ((mask & 1u) == 0) {
    mask >>= 1;
    ++lane;
  }
  return lane;
#endif
}

// The lanes below `lane`, as a mask.
KOKKOS_INLINE_FUNCTION LaneMask lanes_below(int lane) { return (LaneMask{1} << lane) - 1u; }

// Lane `source`'s value, on every lane of the group.
template <class T>
KOKKOS_INLINE_FUNCTION T shuffle(T value, int source) {
#if SPARSE_MLA_FORM_CUDA
  return __shfl_sync(0xffffffffu, value, source);
#elif SPARSE_MLA_FORM_HIP
  return __shfl(value, source, 32);
#else
  (void)source;
  return value;
#endif
}

// Lane l - delta's value on lane l (lanes below delta keep their own).
template <class T>
KOKKOS_INLINE_FUNCTION T shuffle_up(T value, int delta) {
#if SPARSE_MLA_FORM_CUDA
  return __shfl_up_sync(0xffffffffu, value, delta);
#elif SPARSE_MLA_FORM_HIP
  return __shfl_up(value, delta, 32);
#else
  (void)delta;
  return value;
#endif
}

// The sum of `value` over the group, on every lane: int32, or uint32 where
// the sum must wrap (packed words).
template <class Int>
KOKKOS_INLINE_FUNCTION Int group_sum(Int value) {
  static_assert(std::is_same<Int, std::int32_t>::value || std::is_same<Int, std::uint32_t>::value,
                "group_sum takes 32-bit integers");
#if SPARSE_MLA_FORM_CUDA && __CUDA_ARCH__ >= 800
  return __reduce_add_sync(0xffffffffu, value);
#elif SPARSE_MLA_FORM_CUDA || SPARSE_MLA_FORM_HIP
  for (int mask = 16; mask > 0; mask >>= 1) {
#if SPARSE_MLA_FORM_CUDA
    value += __shfl_xor_sync(0xffffffffu, value, mask);
#else
    value += __shfl_xor(value, mask, 32);
#endif
  }
  return value;
#else
  return value;
#endif
}

// Orders the group's team-scratch stores before its lanes' loads that
// follow (a CUDA warp's __syncwarp; on HIP the group's wavefront runs in
// step, so a wavefront fence suffices). The portable form's groups are one
// lane.
KOKKOS_INLINE_FUNCTION void group_sync() {
#if SPARSE_MLA_FORM_CUDA
  __syncwarp();
#elif SPARSE_MLA_FORM_HIP
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "wavefront");
  __builtin_amdgcn_wave_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "wavefront");
#endif
}

// The inclusive prefix sum of `value` over the group's lanes up to `lane`.
KOKKOS_INLINE_FUNCTION std::uint32_t group_inclusive_sum(std::uint32_t value, int lane) {
  for (int d = 1; d < group_lanes; d <<= 1) {
    const std::uint32_t up = shuffle_up(value, d);
    if (lane >= d) value += up;
  }
  return value;
}

// ---- Team sums and scans --------------------------------------------------
// Teams of vector length 1 whose ranks are consecutive lanes, a whole number
// of lane groups (native forms); any team (portable form).

// Ints of team scratch team_sum() needs for a team of `threads`: one per
// lane group (at least one, the portable form's counter).
KOKKOS_INLINE_FUNCTION constexpr std::size_t team_sum_ints(int threads) {
  return threads >= 32 ? static_cast<std::size_t>(threads) / 32 : 1;
}

// The sum of `value` over the team's `threads` threads, returned to thread
// 0, in two calls: begin_team_sum() before the work (the portable form zeroes
// a shared counter behind a barrier, best placed while loads are in flight),
// team_sum() after it. `partial` is team scratch of team_sum_ints(threads).
template <class Member>
KOKKOS_INLINE_FUNCTION void begin_team_sum(const Member& team, std::int32_t threads, std::int32_t* partial) {
  if constexpr (form == Form::portable) {
    if (threads == 1) return;
    if (team.team_rank() == 0) *partial = 0;
    team.team_barrier();
  } else {
    (void)team;
    (void)threads;
    (void)partial;
  }
}
template <class Member>
KOKKOS_INLINE_FUNCTION std::int32_t team_sum(const Member& team, std::int32_t threads, std::int32_t value,
                                             std::int32_t* partial) {
  if (threads == 1) return value;
  if constexpr (form == Form::portable) {
    // Shared-memory atomics on the counter begin_team_sum() zeroed.
    Kokkos::atomic_add(partial, value);
    team.team_barrier();
    return *partial;
  } else {
    // A group sum, one value per group through scratch, and a group sum of
    // those by the first group.
    const std::int32_t rank = team.team_rank();
    const std::int32_t group_value = group_sum(value);
    if ((rank & 31) == 0) partial[rank >> 5] = group_value;
    team.team_barrier();
    if (rank >= 32) return 0;
    return group_sum(rank < (threads >> 5) ? partial[rank] : 0);
  }
}

// Words of team scratch team_exclusive_sum() needs per call: one per lane
// group of a team of up to 1024 threads.
inline constexpr std::int32_t team_exclusive_sum_words = 32;

// The exclusive prefix sum of `value` over the team's ranks, and in `total`
// the team's sum, on every thread. Every thread of the team calls it (it has
// a barrier). `totals` (team_exclusive_sum_words of team scratch) is written
// before the barrier and read after it: consecutive calls take alternate
// buffers, so that one barrier a call suffices. A team of one thread (host
// spaces) sums nothing.
template <class Member>
KOKKOS_INLINE_FUNCTION std::uint32_t team_exclusive_sum(const Member& team, std::uint32_t* totals, std::uint32_t value,
                                                        std::uint32_t& total) {
  if constexpr (form == Form::portable) {
    (void)totals;
    if (team.team_size() == 1) {
      total = value;
      return 0;
    }
    team.team_barrier();
    const std::uint32_t before = team.team_scan(value);
    std::uint32_t sum = value;
    team.team_reduce(Kokkos::Sum<std::uint32_t>(sum));
    total = sum;
    return before;
  } else {
    // A shuffle scan in each group, one word per group through scratch, one
    // barrier (Kokkos' team reductions and scans take several); then lane g
    // of every group reads group g's word, and two group sums give the team's
    // total and the groups ahead (not a loop over the groups on every thread).
    const int rank = team.team_rank();
    const int lane = rank & 31, group = rank >> 5;
    const std::uint32_t inclusive = group_inclusive_sum(value, lane);
    if (lane == 31) totals[group] = inclusive;
    team.team_barrier();
    const int groups = team.team_size() >> 5;
    const std::uint32_t word = lane < groups ? totals[lane] : 0u;
    total = group_sum(word);
    const std::uint32_t before = group_sum(lane < group ? word : 0u);
    return before + inclusive - value;
  }
}

// Ints of team scratch team_round_offsets() needs for N units a thread: two
// buffers (alternate calls take alternate ones, so that one barrier a call
// suffices between a call's reads and the next call's writes) of one int per
// lane group and unit.
KOKKOS_INLINE_FUNCTION constexpr std::size_t team_round_ints(int units) {
  return 2 * 32 * static_cast<std::size_t>(units);
}

// The end of team_round_offsets and team_entry_offsets: each group's
// count of each unit (partial[u * 32 + group]) is written; after the
// barrier, lane g of every group reads group g's and two group sums give the
// unit's total and the groups ahead, which `in_group` (the thread's count
// within its group: exclusive or inclusive, as the caller computed it) is
// moved by.
template <int N, class Member>
KOKKOS_INLINE_FUNCTION void group_offsets(const Member& team, std::int32_t threads, const std::int32_t* partial,
                                          const std::int32_t (&in_group)[N], std::int32_t (&offset)[N],
                                          std::int32_t& total) {
  const std::int32_t rank = team.team_rank();
  const std::int32_t lane = rank & 31, group = rank >> 5, groups = threads >> 5;
  team.team_barrier();
  total = 0;
  for (int u = 0; u < N; ++u) {
    const std::int32_t sum = lane < groups ? partial[u * 32 + lane] : 0;
    const std::int32_t unit_total = group_sum(sum);
    const std::int32_t earlier_groups = group_sum(lane < group ? sum : 0);
    offset[u] = total + earlier_groups + in_group[u];
    total += unit_total;
  }
}

// The set bits of a unit's four entries (bit e of `entries`) on the
// group's lanes up to and including this one (`upto`: those lanes' bits),
// in the order (lane, entry): a ballot per entry.
KOKKOS_INLINE_FUNCTION std::int32_t group_entries_through(std::uint32_t entries, LaneMask upto) {
  std::int32_t through = 0;
  for (int e = 0; e < 4; ++e) through += popc(ballot((entries >> e) & 1u) & upto);
  return through;
}

// Exclusive offsets of N small counts per thread, in the order (unit u,
// rank): all threads' unit 0, then all threads' unit 1, ... count[u] (0 to
// MaxCount) becomes before[u], the counts ahead of it, and `total` is the sum
// of all, on every thread. `threads` is the team's size; every thread calls
// it (it has a barrier); `parity` alternates the scratch buffer
// (team_round_ints(N) ints).
template <int N, int MaxCount, class Member>
KOKKOS_INLINE_FUNCTION void team_round_offsets(const Member& team, std::int32_t threads, const std::int32_t (&count)[N],
                                               std::int32_t (&before)[N], std::int32_t& total, std::int32_t* scratch,
                                               int& parity) {
  if (threads == 1) {
    total = 0;
    for (int u = 0; u < N; ++u) {
      before[u] = total;
      total += count[u];
    }
    return;
  }
  std::int32_t* partial = scratch + 32 * N * parity;
  parity ^= 1;
  const std::int32_t rank = team.team_rank();
  if constexpr (form == Form::portable) {
    // One Kokkos team scan per unit, and the last thread's inclusive sum
    // through scratch for each unit's total.
    total = 0;
    for (int u = 0; u < N; ++u) {
      const std::int32_t exclusive = team.team_scan(count[u]);
      if (rank == threads - 1) partial[u] = exclusive + count[u];
      team.team_barrier();
      before[u] = total + exclusive;
      total += partial[u];
      team.team_barrier();
    }
  } else {
    // In a group, each bit of a count is a ballot: the lanes below hold
    // popc(ballot & below) of each, and lane 31's count after those is the
    // group's sum. The groups' sums of each unit go through scratch, one
    // barrier, and then lane g of every group reads group g's sum: two group
    // sums give the unit's total and the groups ahead.
    const std::int32_t lane = rank & 31, group = rank >> 5;
    const LaneMask below = lanes_below(lane);
    std::int32_t in_group[N];
    for (int u = 0; u < N; ++u) {
      std::int32_t ahead = 0;
      for (int bit = 0; (MaxCount >> bit) != 0; ++bit) ahead += popc(ballot((count[u] >> bit) & 1) & below) << bit;
      in_group[u] = ahead;
      if (lane == 31) partial[u * 32 + group] = ahead + count[u];
    }
    group_offsets(team, threads, partial, in_group, before, total);
  }
}

// The same for N units of four entries a thread, from which of them are
// valid (bit e of valid[u]: entry e of unit u): through[u] becomes the valid
// entries up to and including unit u's, in the order of team_round_offsets
// (and `total` their sum). A ballot per entry, not per bit of a count: no
// count to form, and lane 31's inclusive count is its group's sum. Same
// scratch and parity as team_round_offsets.
template <int N, class Member>
KOKKOS_INLINE_FUNCTION void team_entry_offsets(const Member& team, std::int32_t threads, const std::uint32_t (&valid)[N],
                                               std::int32_t (&through)[N], std::int32_t& total, std::int32_t* scratch,
                                               int& parity) {
  if (form == Form::portable || threads == 1) {
    std::int32_t count[N], before[N];
    for (int u = 0; u < N; ++u) count[u] = popc(valid[u]);
    team_round_offsets<N, 4>(team, threads, count, before, total, scratch, parity);
    for (int u = 0; u < N; ++u) through[u] = before[u] + count[u];
    return;
  }
  std::int32_t* partial = scratch + 32 * N * parity;
  parity ^= 1;
  const std::int32_t rank = team.team_rank();
  const std::int32_t lane = rank & 31, group = rank >> 5;
  const LaneMask upto = 0xFFFFFFFFu >> (31 - lane);
  std::int32_t in_group[N];
  for (int u = 0; u < N; ++u) {
    in_group[u] = group_entries_through(valid[u], upto);
    if (lane == 31) partial[u * 32 + group] = in_group[u];
  }
  group_offsets(team, threads, partial, in_group, through, total);
}

// Exclusive offsets of N counts that are the same on every lane of a group
// (a group's count of each unit), in the order (unit u, group): count[u]
// becomes before[u], the counts of the groups ahead of this one and of all
// groups' units before u, and `total` is the sum of all, on every thread.
// Same barrier, scratch and parity as team_round_offsets; the portable form's
// groups are one lane, whose counts are at most 4.
template <int N, class Member>
KOKKOS_INLINE_FUNCTION void team_group_offsets(const Member& team, std::int32_t threads, const std::int32_t (&count)[N],
                                               std::int32_t (&before)[N], std::int32_t& total, std::int32_t* scratch,
                                               int& parity) {
  if (form == Form::portable || threads == 1) {
    team_round_offsets<N, 4>(team, threads, count, before, total, scratch, parity);
    return;
  }
  std::int32_t* partial = scratch + 32 * N * parity;
  parity ^= 1;
  const std::int32_t rank = team.team_rank();
  std::int32_t in_group[N];
  for (int u = 0; u < N; ++u) {
    in_group[u] = 0;
    if ((rank & 31) == 0) partial[u * 32 + (rank >> 5)] = count[u];
  }
  group_offsets(team, threads, partial, in_group, before, total);
}

// `Ints` int32 of team scratch at a fixed place. The native forms use a
// static shared-memory array (a constant address; Kokkos' team scratch
// pointer costs arithmetic on launch parameters before the first load); the
// portable form (host spaces, portable builds) takes them from level-0 team
// scratch, which the launch must then reserve (where `static_team_ints` is
// false, and on host spaces). A kernel calls it once.
inline constexpr bool static_team_ints = !portable_build;
template <int Ints, class Member>
KOKKOS_INLINE_FUNCTION std::int32_t* team_ints(const Member& team) {
#if SPARSE_MLA_FORM_CUDA || SPARSE_MLA_FORM_HIP
  (void)team;
  __shared__ std::int32_t ints[Ints];
  return ints;
#else
  return static_cast<std::int32_t*>(team.team_scratch(0).get_shmem(sizeof(std::int32_t) * Ints));
#endif
}

// ---- Atomics on team scratch (and global memory) ---------------------------
// Relaxed, as Kokkos' are. The native ones let the compiler use shared-memory
// atomics for level-0 scratch; Kokkos' are inline assembly on a generic
// address, which it cannot narrow.

KOKKOS_INLINE_FUNCTION std::uint32_t atomic_cas(std::uint32_t* p, std::uint32_t expected, std::uint32_t desired) {
#if SPARSE_MLA_FORM_CUDA || SPARSE_MLA_FORM_HIP
  return atomicCAS(p, expected, desired);
#else
  return Kokkos::atomic_compare_exchange(p, expected, desired);
#endif
}
KOKKOS_INLINE_FUNCTION void atomic_min(std::uint32_t* p, std::uint32_t value) {
#if SPARSE_MLA_FORM_CUDA || SPARSE_MLA_FORM_HIP
  atomicMin(p, value);
#else
  Kokkos::atomic_fetch_min(p, value);
#endif
}
KOKKOS_INLINE_FUNCTION std::uint32_t atomic_max(std::uint32_t* p, std::uint32_t value) {
#if SPARSE_MLA_FORM_CUDA || SPARSE_MLA_FORM_HIP
  return atomicMax(p, value);
#else
  return Kokkos::atomic_fetch_max(p, value);
#endif
}
KOKKOS_INLINE_FUNCTION std::uint32_t atomic_or(std::uint32_t* p, std::uint32_t bits) {
#if SPARSE_MLA_FORM_CUDA || SPARSE_MLA_FORM_HIP
  return atomicOr(p, bits);
#else
  return Kokkos::atomic_fetch_or(p, bits);
#endif
}
// 64 bits, on global memory too.
KOKKOS_INLINE_FUNCTION std::uint64_t atomic_cas(std::uint64_t* p, std::uint64_t expected, std::uint64_t desired) {
#if SPARSE_MLA_FORM_CUDA || SPARSE_MLA_FORM_HIP
  using Word = unsigned long long;
  static_assert(sizeof(Word) == sizeof(std::uint64_t), "64-bit words");
  return atomicCAS(reinterpret_cast<Word*>(p), static_cast<Word>(expected), static_cast<Word>(desired));
#else
  return Kokkos::atomic_compare_exchange(p, expected, desired);
#endif
}

// ---- Memory ---------------------------------------------------------------

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

// ---- Number conversions ----------------------------------------------------

union FloatBits {
  float f;
  std::uint32_t u;
};
KOKKOS_INLINE_FUNCTION float from_bits(std::uint32_t u) {
  FloatBits b;
  b.u = u;
  return b.f;
}
KOKKOS_INLINE_FUNCTION std::uint32_t to_bits(float f) {
  FloatBits b;
  b.f = f;
  return b.u;
}

// float32 to bfloat16, round to nearest even. Every NaN becomes 0x7FFF, the
// canonical NaN that CUDA's cvt.rn.bf16.f32 gives the reference engine.
KOKKOS_INLINE_FUNCTION std::uint32_t bf16_rne(float value) {
  const std::uint32_t u = to_bits(value);
  const std::uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return (u & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FFFu : rounded;
}

// Two floats to two bf16 (lo in bits 0-15), each as bf16_rne rounds it. On
// sm_80 and later one cvt.rn.bf16x2.f32 rounds both: the instruction the
// reference engine's kernel rounds with (NaN to 0x7FFF, subnormals kept).
// Elsewhere the integer rounding above.
KOKKOS_INLINE_FUNCTION std::uint32_t bf16x2_rne(float lo, float hi) {
#if SPARSE_MLA_FORM_CUDA && __CUDA_ARCH__ >= 800
  std::uint32_t packed;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(hi), "f"(lo));
  return packed;
#else
  return bf16_rne(lo) | bf16_rne(hi) << 16;
#endif
}

// The exact float value of one e4m3 byte (e4m3fn, or e4m3fnuz with `fnuz`).
// The byte's magnitude bits moved to a float's exponent and mantissa fields
// (mag << 20) read as a float that is the e4m3 value times 2^-(127 - bias):
// a normal one with its exponent re-biased, a subnormal one (exponent field
// 0) as a float subnormal. One multiply by 2^(127 - bias) makes both exact,
// provided subnormal floats are not flushed to zero (they are not: no
// fast-math flags; the golden files and the differential tests hold
// subnormal bytes).
KOKKOS_INLINE_FUNCTION float e4m3_value(std::uint32_t byte, bool fnuz) {
  const std::uint32_t magnitude = byte & 0x7Fu;
  const float value = from_bits(magnitude << 20) * (fnuz ? 0x1p119f : 0x1p120f);
  const bool nan = fnuz ? byte == 0x80u : magnitude == 0x7Fu;
  return nan ? from_bits(0x7FC00000u) : from_bits(to_bits(value) | ((byte & 0x80u) << 24));
}

// Whether e4m3fn_x4() is the hardware's conversion (sm_89 and later), and
// so cheaper than the integer decode of the kernels' fast path.
inline constexpr bool native_e4m3 =
#if SPARSE_MLA_FORM_CUDA && __CUDA_ARCH__ >= 890
    true;
#else
    false;
#endif

// Four e4m3fn bytes (a little-endian word) to their exact float values. On
// sm_89 and later: two bytes to two f16 (every e4m3 value is an f16 value,
// NaN to NaN), each f16 to a float, six instructions for four values.
// Elsewhere e4m3_value() a byte at a time.
KOKKOS_INLINE_FUNCTION void e4m3fn_x4(std::uint32_t w, float f[4]) {
#if SPARSE_MLA_FORM_CUDA && __CUDA_ARCH__ >= 890
  std::uint32_t h01, h23;
  asm("{\n\t.reg .b16 lo, hi;\n\tmov.b32 {lo, hi}, %2;\n\t"
      "cvt.rn.f16x2.e4m3x2 %0, lo;\n\tcvt.rn.f16x2.e4m3x2 %1, hi;\n\t}"
      : "=r"(h01), "=r"(h23)
      : "r"(w));
  asm("{\n\t.reg .b16 a, b, c, d;\n\tmov.b32 {a, b}, %4;\n\tmov.b32 {c, d}, %5;\n\t"
      "cvt.f32.f16 %0, a;\n\tcvt.f32.f16 %1, b;\n\tcvt.f32.f16 %2, c;\n\tcvt.f32.f16 %3, d;\n\t}"
      : "=f"(f[0]), "=f"(f[1]), "=f"(f[2]), "=f"(f[3])
      : "r"(h01), "r"(h23));
#else
  for (int i = 0; i < 4; ++i) f[i] = e4m3_value((w >> (8 * i)) & 0xFFu, false);
#endif
}

}  // namespace device
}  // namespace sparse_mla::kernels

#undef SPARSE_MLA_FORM_CUDA
#undef SPARSE_MLA_FORM_HIP
