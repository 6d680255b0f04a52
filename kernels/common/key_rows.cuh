// key_rows.cuh - where key (and value) token t of one batch item lives in a paged KV cache
// (fc_params.block_table, flashcore.h): row t % page_size of page
// block_table[b * block_table_stride + t / page_size].
//
// Used by the decode kernels' K/V loads (kPaged in decode_sm80.cuh). The page division is a
// FastDiv (common/fast_div.cuh: a multiply-high, an add and a shift; set up once per CTA), and the
// page index read from the table is clamped into [0, num_pages): the host never sees the table's
// contents (it lives on the device), so a bad entry must not send a load outside the pools. A bad
// entry gives some page's rows (wrong results), never an out-of-bounds read.
//
// K and V share the table, so one lookup (at) serves both: the caller adds
// page * page_stride + row * row_stride to its own pool's (head) base.
#pragma once

#include "common/fast_div.cuh"

#include <stdint.h>

namespace flashcore {

struct KeyRows {
    const int32_t *table;  // this batch item's row of the block table
    FastDiv page_size;
    int last_page;         // num_pages - 1 (validation keeps num_pages in [1, 2^31 - 1])

    struct Slot {
        int page;  // clamped into [0, num_pages)
        int row;   // row within the page
    };

    KeyRows() = default;
#ifdef __CUDACC__
    // The table row of batch item `batch`; page_size and num_pages as validated (page_size > 0).
    __device__ __forceinline__ KeyRows(const int32_t *block_table, int64_t table_stride, int batch, int page_size_,
                                       int64_t num_pages)
        : table(block_table + batch * table_stride), page_size(page_size_),
          last_page(static_cast<int>(num_pages - 1)) {}

    // Key `key` (0 <= key < pages_per_seq * page_size, so the table entry read is this item's).
    __device__ __forceinline__ Slot at(int key) const {
        const int entry = page_size.div(key);
        const int page = min(max(__ldg(table + entry), 0), last_page);
        return Slot{page, key - entry * static_cast<int>(page_size.d)};
    }
#endif
};

}  // namespace flashcore
