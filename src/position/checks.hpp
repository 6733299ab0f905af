// Argument checks shared by every encoding's hooks. The hooks are called by backends with
// raw pointers; a wrong head index, a missing parameter or a too-short row stride would
// otherwise read or write out of bounds silently, so each hook checks first and throws
// std::invalid_argument naming the encoding, the hook and what was expected.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>

#include "pope/position.hpp"

namespace pope {

inline void check_context(const std::string& where, const PositionContext& ctx) {
  if (ctx.head_dim <= 0 || ctx.n_head <= 0 || ctx.seq_len < 0 || ctx.position_offset < 0)
    throw std::invalid_argument(where + ": invalid context (head_dim " + std::to_string(ctx.head_dim) + ", n_head " +
                                std::to_string(ctx.n_head) + ", seq_len " + std::to_string(ctx.seq_len) +
                                ", position_offset " + std::to_string(ctx.position_offset) +
                                "); expected head_dim > 0, n_head > 0, seq_len >= 0, position_offset >= 0");
}

inline void check_head(const std::string& where, const PositionContext& ctx, int head) {
  if (head < 0 || head >= ctx.n_head)
    throw std::invalid_argument(where + ": head " + std::to_string(head) + " out of range [0, " +
                                std::to_string(ctx.n_head) + ")");
}

// The parameter pointers of one layer: exactly `expected` of them, none null.
template <class Pointer>
void check_params(const std::string& where, std::span<Pointer const> params, std::size_t expected) {
  if (params.size() != expected)
    throw std::invalid_argument(where + ": got " + std::to_string(params.size()) + " parameter pointers, expected " +
                                std::to_string(expected));
  for (std::size_t i = 0; i < params.size(); ++i)
    if (params[i] == nullptr)
      throw std::invalid_argument(where + ": parameter pointer " + std::to_string(i) + " is null");
}

inline void check_pointer(const std::string& where, const void* pointer, const char* name) {
  if (pointer == nullptr) throw std::invalid_argument(where + ": " + name + " is null");
}

inline void check_stride(const std::string& where, std::int64_t stride, int head_dim, const char* name) {
  if (stride < head_dim)
    throw std::invalid_argument(where + ": " + name + " " + std::to_string(stride) + " is shorter than head_dim " +
                                std::to_string(head_dim));
}

// Everything a q/k transform forward needs: context, head, x/y and the parameter count.
template <class Real>
void check_transform_args(const std::string& where, const QkTransformArgs<Real>& a, std::size_t param_count) {
  check_pointer(where, a.ctx, "ctx");
  check_context(where, *a.ctx);
  check_head(where, *a.ctx, a.head);
  check_params(where, a.params, param_count);
  if (a.ctx->seq_len == 0) return;
  check_pointer(where, a.x, "x");
  check_pointer(where, a.y, "y");
  check_stride(where, a.x_stride, a.ctx->head_dim, "x_stride");
}

template <class Real>
void check_transform_backward_args(const std::string& where, const QkTransformBackwardArgs<Real>& a,
                                   std::size_t param_count) {
  check_pointer(where, a.ctx, "ctx");
  check_context(where, *a.ctx);
  check_head(where, *a.ctx, a.head);
  check_params(where, a.params, param_count);
  check_params(where + " (gradients)", a.dparams, param_count);
  if (a.ctx->seq_len == 0) return;
  check_pointer(where, a.x, "x");
  check_pointer(where, a.dy, "dy");
  check_pointer(where, a.dx, "dx");
  check_stride(where, a.x_stride, a.ctx->head_dim, "x_stride");
  check_stride(where, a.dx_stride, a.ctx->head_dim, "dx_stride");
}

}  // namespace pope
