#include "model/fp8_linears.hpp"

#include <stdexcept>

namespace pope {

namespace {

Tensor view(const OwnedTensor& storage, DType dtype, Shape shape) {
  return Tensor{storage.tensor.data, dtype, storage.tensor.device, std::move(shape)};
}

}  // namespace

Fp8Linears::Fp8Linears(Backend& backend, int n_layer, std::int64_t n_embd, int history)
    : backend_(backend), n_layer_(n_layer), n_embd_(n_embd) {
  if (history < 1) throw std::invalid_argument("Fp8Linears: the amax history needs at least one entry");
  auto group = [&](std::int64_t count) {
    Group g{allocate_tensor(backend_, {count}, DType::f32), allocate_tensor(backend_, {count, history}, DType::f32),
            allocate_tensor(backend_, {count}, DType::f32), allocate_tensor(backend_, {count, kFp8FactorRow}, DType::f32)};
    backend_.fill(g.amax.tensor, 0.0);
    backend_.fill(g.history.tensor, 0.0);
    backend_.fill(g.scale.tensor, 1.0);
    backend_.fill(g.scale_inv.tensor, 1.0);
    return g;
  };
  const std::int64_t count = std::int64_t(n_layer) * kLinears;
  e4m3_ = group(2 * count);
  e5m2_ = group(count);
  calibrated_.assign(std::size_t(3 * count), false);
  for (int l = 0; l < n_layer; ++l)
    for (int j = 0; j < kLinears; ++j) {
      const auto which = Linear(j);
      w_.push_back(allocate_tensor(backend_, {out_features(which), in_features(which)}, DType::e4m3));
      w_t_.push_back(allocate_tensor(backend_, {in_features(which), out_features(which)}, DType::e4m3));
    }
}

std::int64_t Fp8Linears::in_features(Linear which) const { return which == mlp_proj ? 4 * n_embd_ : n_embd_; }

std::int64_t Fp8Linears::out_features(Linear which) const {
  switch (which) {
    case qkv: return 3 * n_embd_;
    case mlp_fc: return 4 * n_embd_;
    default: return n_embd_;
  }
}

void Fp8Linears::reserve(std::int64_t rows) {
  if (rows == rows_) return;
  x_t_.clear();
  for (int l = 0; l < n_layer_; ++l)
    for (int j = 0; j < kLinears; ++j) x_t_.push_back(allocate_tensor(backend_, {in_features(Linear(j)), rows}, DType::e4m3));
  const std::int64_t widest = 4 * n_embd_;
  x8_ = allocate_tensor(backend_, {rows * widest}, DType::e4m3);
  dy8_ = allocate_tensor(backend_, {rows * widest}, DType::e5m2);
  dy8_t_ = allocate_tensor(backend_, {rows * widest}, DType::e5m2);
  rows_ = rows;
}

Fp8Linears::Slot Fp8Linears::slot(Group& group, std::int64_t i) {
  return {group.amax.tensor.rows(i, i + 1), group.history.tensor.rows(i, i + 1), group.scale.tensor.rows(i, i + 1),
          group.scale_inv.tensor.rows(i, i + 1)};
}

void Fp8Linears::cast(Slot s, Tensor out, Tensor out_t, Tensor x, std::int64_t id, DType format, Prologue prologue,
                      Tensor pre) {
  if (!calibrated_[std::size_t(id)]) {
    backend_.fp8_cast(out, out_t, x, s.scale, s.amax, prologue, pre);
    backend_.fp8_update_scales(s.amax, s.history, s.scale, s.scale_inv, format, 0);
    calibrated_[std::size_t(id)] = true;
  }
  backend_.fp8_cast(out, out_t, x, s.scale, s.amax, prologue, pre);
}

void Fp8Linears::forward(int layer, Linear which, Tensor out, Tensor x, Tensor w, Prologue prologue, Tensor addend) {
  const std::int64_t i = index(layer, which), count = std::int64_t(n_layer_) * kLinears;
  const std::int64_t rows = x.dim(0);
  if (rows != rows_) throw std::logic_error("Fp8Linears::forward: not the reserved rows");
  const Tensor x8 = view(x8_, DType::e4m3, {rows, in_features(which)});
  const Tensor x_t = x_t_[std::size_t(i)].tensor;  // kept for the weight gradient
  const Slot sw = slot(e4m3_, count + i), sx = slot(e4m3_, i);
  cast(sw, w_[std::size_t(i)].tensor, w_t_[std::size_t(i)].tensor, w, count + i, DType::e4m3, Prologue::none, {});
  cast(sx, x8, x_t, x, i, DType::e4m3, prologue, {});
  backend_.fp8_matmul(out, x8, sx.scale_inv, w_[std::size_t(i)].tensor, sw.scale_inv, addend.empty() ? 0.0 : 1.0, true,
                      addend);
}

void Fp8Linears::backward(int layer, Linear which, Tensor dx, Tensor dw, Tensor dy, Prologue prologue, Tensor pre) {
  const std::int64_t i = index(layer, which), count = std::int64_t(n_layer_) * kLinears;
  const std::int64_t rows = dy.dim(0), n = out_features(which);
  if (rows != rows_) throw std::logic_error("Fp8Linears::backward: not the reserved rows");
  const Tensor dy8 = view(dy8_, DType::e5m2, {rows, n}), dy8_t = view(dy8_t_, DType::e5m2, {n, rows});
  const Slot sdy = slot(e5m2_, i), sw = slot(e4m3_, count + i), sx = slot(e4m3_, i);
  cast(sdy, dx.empty() ? Tensor{} : dy8, dy8_t, dy, 2 * count + i, DType::e5m2, prologue, pre);
  if (!dx.empty()) backend_.fp8_matmul(dx, dy8, sdy.scale_inv, w_t_[std::size_t(i)].tensor, sw.scale_inv, 0.0, false);
  backend_.fp8_matmul(dw, dy8_t, sdy.scale_inv, x_t_[std::size_t(i)].tensor, sx.scale_inv, 1.0, false);
}

void Fp8Linears::update_scales() {
  backend_.fp8_update_scales(e4m3_.amax.tensor, e4m3_.history.tensor, e4m3_.scale.tensor, e4m3_.scale_inv.tensor,
                             DType::e4m3, 0);
  backend_.fp8_update_scales(e5m2_.amax.tensor, e5m2_.history.tensor, e5m2_.scale.tensor, e5m2_.scale_inv.tensor,
                             DType::e5m2, 0);
}

}  // namespace pope
