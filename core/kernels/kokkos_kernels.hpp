// The Kernels interface implemented once over Kokkos, for any backend.
//
// `Exec` is the backend's small launch policy:
//   using execution_space = ...;                 // Kokkos::Serial, Kokkos::Cuda, ...
//   static void bind(Stream&);                   // give the stream its execution-space instance
//   template <class F> static void launch(Stream&, F f);   // run f(instance) in stream order
// Each backend compiles this header once (backends/<name>/*_kernels.cpp).
#pragma once

#include "fill.hpp"
#include "fp8_upconvert.hpp"
#include "hisparse_gather.hpp"
#include "hisparse_mirror.hpp"
#include "hisparse_plan.hpp"
#include "hisparse_resolve.hpp"
#include "hisparse_stage.hpp"
#include "hisparse_union.hpp"
#include "team_scratch.hpp"
#include "topk_convert.hpp"
#include "kernels.hpp"

namespace sparse_mla::kernels {

template <class Exec>
class KokkosKernels final : public Kernels {
 public:
  using space = typename Exec::execution_space;

  const char* execution_space() const override { return space::name(); }
  void bind(Stream& stream) const override {
    Exec::bind(stream);
    if constexpr (!is_host_space<space>) {
      Exec::launch(stream, [](const space& s) { kernels::claim_team_scratch_pool(s); });
    }
  }

  void fill_i32(Stream& stream, const FillI32Args& a) const override {
    Exec::launch(stream, [a](const space& s) { kernels::fill_i32(s, a); });
  }
  void reserve_team_scratch(Stream& stream, std::size_t bytes) const override {
    Exec::launch(stream, [bytes](const space& s) { kernels::reserve_team_scratch(s, bytes); });
  }
  std::size_t resolve_hisparse_scratch_bytes(std::int32_t top_k, std::int32_t hot_slots,
                                             std::int32_t hot_block_size) const override {
    return kernels::resolve_hisparse_scratch_bytes(top_k, hot_slots, hot_block_size);
  }
  void convert_topk(Stream& stream, const TopkConvertArgs& a) const override {
    Exec::launch(stream, [a](const space& s) { kernels::convert_topk(s, a); });
  }
  void gather_upconvert_fp8(Stream& stream, const Fp8UpconvertArgs& a) const override {
    Exec::launch(stream, [a](const space& s) { kernels::gather_upconvert_fp8(s, a); });
  }
  void resolve_hisparse(Stream& stream, const HiSparseResolveArgs& a) const override {
    Exec::launch(stream, [a](const space& s) { kernels::resolve_hisparse(s, a); });
  }
  void union_hisparse_requests(Stream& stream, const HiSparseUnionArgs& a) const override {
    Exec::launch(stream, [a](const space& s) { kernels::union_hisparse_requests(s, a); });
  }
  void scatter_hisparse_union(Stream& stream, const HiSparseUnionScatterArgs& a) const override {
    Exec::launch(stream, [a](const space& s) { kernels::scatter_hisparse_union(s, a); });
  }
  std::size_t union_hisparse_scratch_bytes(std::int32_t union_width) const override {
    return kernels::union_hisparse_scratch_bytes(union_width);
  }
  void gather_hisparse(Stream& stream, const HiSparseGatherArgs& a) const override {
    Exec::launch(stream, [a](const space& s) { kernels::gather_hisparse(s, a); });
  }
  void write_hisparse_rows(Stream& stream, const HiSparseWriteRowsArgs& a) const override {
    Exec::launch(stream, [a](const space& s) { kernels::write_hisparse_rows(s, a); });
  }
  void invalidate_hisparse_slots(Stream& stream, const HiSparseInvalidateArgs& a) const override {
    Exec::launch(stream, [a](const space& s) { kernels::invalidate_hisparse_slots(s, a); });
  }
  void stage_hisparse_rows(Stream& stream, const HiSparseStageArgs& a) const override {
    Exec::launch(stream, [a](const space& s) { kernels::stage_hisparse_rows(s, a); });
  }
  void plan_hisparse_prefill(Stream& stream, const HiSparsePlanArgs& a) const override {
    Exec::launch(stream, [a](const space& s) { kernels::plan_hisparse_prefill(s, a); });
  }
};

}  // namespace sparse_mla::kernels
