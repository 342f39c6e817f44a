#pragma once
// A varying inner size L (a batch's sequence length) in the op table's keys: sizes, strides and offsets of tensors
// on a storage marked with L (core/storage.h StorageHandle::sym) are keyed as forms a * L^p + b (p 1 or 2, b in
// -1..1) or as static values. torchtpu/shapes/eager_symbolic.py decodes the same codes (decode/encode): keep both in
// step.
#include <c10/util/ArrayRef.h>
#include <c10/util/SmallVector.h>

#include <cstdint>

namespace torchtpu {

// A form's key value: negative (no size, stride or offset is; rows codes have bit 62 clear, these set).
int64_t sym_code(int64_t a, int64_t b, int64_t p);
// A code's value at L (a static value: itself).
int64_t sym_value(int64_t code, int64_t L);
// The contiguous strides of a storage's shape codes, as codes (a stride that is no form a * L^p: false in `ok`).
c10::SmallVector<int64_t, 6> sym_strides(c10::ArrayRef<int64_t> shape, c10::SmallVector<bool, 6>* ok);
// Which form of L a value is taken for when nothing else tells (0: a static value).
int64_t sym_classify(int64_t v, int64_t L);
// The form of a factory's int argument (an arange's end, an empty's size) while L varies: a * L for a in 1..16
// (arange(4 * L) for 4L routed pairs), else 0 (a static value). Not L +- 1: at L = 33 a hidden size 32 was taken for
// L - 1 (new_zeros(4L, 32) in index's backward).
int64_t int_form(int64_t v, int64_t L);
// What a view (sizes, strides, offset) of a storage whose compact tensor has the shape codes `shape` at L tells of
// each of its values (sizes, then strides, then the offset): a negative form code, 1 (a static value) or 0 (it
// does not tell: the caller guesses). Each view dim is matched to the storage dim it walks by its stride: a size equal
// to that dim's (or to the product of it and the dims outside it, a merge) takes its code, a part of a static dim is
// static; the offset's coordinates in the storage give its code.
c10::SmallVector<int64_t, 13> view_forms(c10::ArrayRef<int64_t> shape, int64_t L, c10::IntArrayRef sizes,
                                         c10::IntArrayRef strides, int64_t offset);

}  // namespace torchtpu
