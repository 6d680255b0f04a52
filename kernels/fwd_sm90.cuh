// fwd_sm90.cuh - the Hopper (sm_90a) fused attention forward: TMA + wgmma + warp specialization.
// What it computes and how: sm90/fwd_kernel.cuh. Its parts, under kernels/sm90/:
//   fwd_traits.cuh    tile configurations (FwdConfig: kLong / kShort / kTiny / kPair), FwdTraits,
//                     SplitSlots, Barriers, FwdMaps, Tile / decode_tile / snake_tile, and the
//                     code-path switches (kLazyRescale, kQInRegs, kGridSplit, kEarlyPvWait, ...)
//   fwd_split.cuh     split-KV across a cluster: SplitPartials, cluster_* / st_async,
//                     partial_weight, finish_split_rows
//   fwd_epilogue.cuh  epilogue store helpers: quad_transpose, stmatrix_x4
//   fwd_schedule.cuh  the tile schedule: a block's key tiles, the KV split's count and share
//   fwd_producer.cuh  the load pipeline: barrier set-up, the producer's loop (Q, K, V, mask tiles)
//   fwd_steps.cuh     a consumer's work on one key tile: GEMM issues, online softmax, pair merge
//   fwd_loop.cuh      the key loop: consume_tile and its sections (first, middle, last, skipped)
//   fwd_store.cuh     the epilogue's steps: finish_rows (split merges, sinks), store_rows (LSE, O)
//   fwd_kernel.cuh    fwd_kernel, which calls them (and the FLASHCORE_SM90_TRACE buffer, g_trace)
//   fwd_launch.cuh    host side: paired_grid, launch_config, launch_fwd_config, launch_fwd, the
//                     static_asserts against c_src/launch_rules.h, FLASHCORE_DEFINE_SM90_FWD
// (with sm90/ptx.cuh and sm90/tensor_map.h, shared with the backward). Instantiated per (head
// dim, dtype) in fwd_sm90_hdim*_*.cu. Run it through the C API; tests force it with
// FLASHCORE_FAMILY=sm90.
#pragma once

#include "sm90/fwd_launch.cuh"
