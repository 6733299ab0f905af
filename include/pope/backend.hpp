// The op set both backends implement. The model (model.cpp) is written once as calls into
// these ops; the CPU backend is the readable reference (float, or double for gradient
// checks), the CUDA backend the fast path.
//
// Layout conventions (row-major, N = B·T rows, C = n_embd, H heads of width d = C/H):
//   activations  [N, C]; qkv [N, 3C] with q, k, v in column blocks of C and head h at h·d;
//   weights      [out_features, in_features] (a linear layer computes x·Wᵀ);
//   statistics   rstd [N], lse [B, H, T], losses [N] in the statistic dtype.
// Gradients marked "accumulate" are added to what the output tensor holds.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pope/config.hpp"  // AttentionImpl
#include "pope/position.hpp"
#include "pope/tensor.hpp"

namespace pope {

struct BackendDTypes {
  DType activation;  // activations and compute copies of weights (CPU: Real, CUDA: bf16)
  DType parameter;   // master weights, gradients, optimizer state (CPU: Real, CUDA: f32)
  DType statistic;   // rstd, lse, losses (CPU: Real, CUDA: f32)
};

// One attention call over a micro-batch. `position_params`/`position_grads` point at this
// layer's encoding parameters (one tensor per PositionEncoding::layer_parameters entry).
struct AttentionShape {
  int batch = 0;
  int seq_len = 0;
  int n_head = 0;
  int head_dim = 0;
};


struct AttentionForward {
  AttentionShape shape;
  const PositionEncoding* encoding = nullptr;
  PositionContext position;
  Tensor qkv;                     // [N, 3C]
  Tensor out;                     // [N, C]
  Tensor lse;                     // [B, H, T]; saved for the backward
  std::span<const Tensor> position_params;
  // Optional: Backend::attention_encoded_numel elements of the activation dtype where the
  // backend keeps what it derives from qkv and the position parameters (the encoded q̃, k̃; a
  // PJ-bias's table) for the backward, which then need not derive it again. Empty: nothing kept.
  Tensor encoded;
  AttentionImpl impl = AttentionImpl::fused;
};

struct AttentionBackward {
  AttentionShape shape;
  const PositionEncoding* encoding = nullptr;
  PositionContext position;
  Tensor qkv, out, lse, dout;     // as saved by / given to the forward
  Tensor dqkv;                    // [N, 3C], overwritten
  std::span<const Tensor> position_params;
  std::span<const Tensor> position_grads;  // accumulate
  // false lets a backend trade bitwise repeatability for speed (the CUDA fused kernels add dq
  // with atomic adds); the CPU backend is deterministic either way.
  bool deterministic = true;
  // The forward's `encoded`, untouched since that forward with the same qkv and position
  // parameters; empty: derived again.
  Tensor encoded;
  // Usually the forward's; both impls store lse as the natural log of the softmax sum, so
  // either backward can start from either forward's out and lse.
  AttentionImpl impl = AttentionImpl::fused;
};

// One layer's key/value cache for incremental decoding, rows [0, capacity) per (sequence, head):
// keys as the scores see them (the encoding's q/k transform applied at their positions), values
// as they are. An encoding whose transform changes with the total length (dynamic NTK) also
// keeps the keys before the transform, and every call encodes all of them again.
struct KvCacheLayer {
  Tensor keys;      // [B, H, capacity, qk_width], activation dtype
  Tensor values;    // [B, H, capacity, head_dim]
  Tensor raw_keys;  // [B, H, capacity, head_dim] where PositionEncoding::transform_varies_with_length; else empty
};

// Attention of n new rows per sequence at positions p0 … p0 + n − 1 (p0 = position.position_offset,
// the rows already cached, the same for every sequence) over the cached rows and themselves: the
// call writes the new rows' keys and values into cache rows [p0, p0 + n), then
//   out_t = Σ_{s ≤ t} softmax_s(<q̃_t, k̃_s> · scale + b_h(t − s)) v_s
// with the scale and bias of a call covering positions [0, p0 + n): the last rows of a full
// forward over the same tokens. `past` holds p0 when the call runs: a backend that records a
// decode step (a CUDA graph) reads the position there, so that one recording replays at every
// new position, and tabulates the bias b_h(Δ) for the cache's whole capacity (the same values:
// a bias depends on the lag alone). Steps of a cache with raw keys are never recorded (their
// transform changes with the length), so a backend may size their work from `position`, the
// context of the call being queued.
struct AttentionDecode {
  AttentionShape shape;  // seq_len: n, the new rows per sequence
  const PositionEncoding* encoding = nullptr;
  PositionContext position;  // seq_len n, position_offset p0
  Tensor past;               // i32 [1] in backend memory: p0
  Tensor qkv;                // [B·n, 3C], the new rows
  Tensor out;                // [B·n, C]
  std::span<const Tensor> position_params;
  KvCacheLayer cache;
};

// One contiguous run of the parameter arena with its weight-decay flag and its ParamSpec's bounds
// (AdamW, include/pope/optim.hpp, projects into them; the backends' update ignores them).
struct ParamSegment {
  std::int64_t offset = 0;
  std::int64_t numel = 0;
  bool weight_decay = false;
  std::optional<ParamBounds> bounds = std::nullopt;
};

struct AdamWStep {
  double lr = 0.0;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double weight_decay = 0.0;
  long step = 1;              // 1-based, for bias correction
  double grad_scale = 1.0;    // multiplies the gradient first (clipping)
};

// AdamW settings that stay fixed over a run (the per-step values live in device memory, see
// Backend::adamw_guarded).
struct AdamWHyper {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double weight_decay = 0.0;
  double grad_clip = 0.0;     // > 0: scale gradients down to this global norm; 0: no clipping
};

// Per-step optimizer inputs, an f64 tensor of kStepScheduleSize elements the host writes
// before each step, so that recorded work (a CUDA graph) reads the new values on replay.
// Bias corrections are computed on the host (1 − β^step in double) so that every backend
// rounds the same values.
enum StepScheduleSlot : int {
  kScheduleLr = 0,
  kScheduleCorrection1 = 1,
  kScheduleCorrection2 = 2,
  kStepScheduleSize = 3
};

// Per-step results kept in device memory, an f64 tensor of kStepStatsSize elements: the
// sum of token losses (accumulate_sum adds to it), the squared global gradient norm
// (sum_of_squares_into) and whether adamw_guarded applied the update (1) or skipped it (0).
enum StepStatsSlot : int { kStatsLossSum = 0, kStatsGradSquares = 1, kStatsApplied = 2, kStepStatsSize = 3 };

// The clipping factor for a finite global gradient norm: min(1, grad_clip / norm) when
// clipping is on. Backends evaluate it in double, in this form, so that all agree.
inline double clip_scale(double grad_clip, double norm) {
  return grad_clip > 0.0 && norm > grad_clip ? grad_clip / norm : 1.0;
}

// A point in a backend's queue of work. record() marks everything queued so far; wait()
// blocks until that work has finished. Errors that kernels record on the device are not
// checked here; the next synchronize() reports them.
class Fence {
 public:
  virtual ~Fence() = default;
  virtual void record() = 0;
  virtual void wait() = 0;
  // Whether that work has finished, without blocking: a rank that waits on work which
  // depends on other ranks polls this, so that it can give up when they fail.
  virtual bool ready() = 0;
};

// A fence that also notes when its work finished, so that phases of queued work can be timed
// without synchronising in between: seconds_since(earlier) is the device time from `earlier`'s
// point in the queue to this one. Both must have been recorded and reached (wait() or
// ready()); std::logic_error otherwise.
class TimedFence : public Fence {
 public:
  virtual double seconds_since(const TimedFence& earlier) const = 0;
};

// Records the work a backend queues between begin() and end() instead of running it;
// replay() runs the recording again, reading and writing the same memory (a CUDA graph).
// Recording must not allocate, copy from pageable host memory or synchronise.
class GraphCapture {
 public:
  virtual ~GraphCapture() = default;  // ends a recording left open by an exception
  virtual void begin() = 0;
  virtual void end() = 0;             // throws when something queued in between could not be recorded
  virtual void replay() = 0;
};

// Floats per row of fp8_update_scales' scale_inv: 16 bytes, so each row's factor is 16-byte aligned.
inline constexpr std::int64_t kFp8FactorRow = 4;

class Backend {
 public:
  virtual ~Backend() = default;

  virtual DeviceKind device() const = 0;
  virtual BackendDTypes dtypes() const = 0;
  virtual std::string description() const = 0;

  // Memory. allocate() returns zero-filled memory of at least `bytes`.
  virtual Buffer allocate(std::size_t bytes) = 0;
  virtual void fill(Tensor t, double value) = 0;
  virtual void copy(Tensor dst, Tensor src) = 0;     // same dtype and numel
  virtual void convert(Tensor dst, Tensor src) = 0;  // any float dtypes, same numel
  virtual void copy_from_host(Tensor dst, const void* src) = 0;
  virtual void copy_to_host(void* dst, Tensor src) = 0;
  virtual void synchronize() = 0;

  // Host memory for the asynchronous copies below (page-locked on CUDA), zero-filled.
  virtual Buffer allocate_host(std::size_t bytes) = 0;
  // Queue a copy without waiting for it. The host memory must come from allocate_host and
  // stay untouched (from_host) or unread (to_host) until a Fence recorded after the copy has
  // been waited for. The CPU backend copies at once.
  virtual void copy_from_host_async(Tensor dst, const void* src) = 0;
  virtual void copy_to_host_async(void* dst, Tensor src) = 0;
  virtual std::unique_ptr<Fence> make_fence() = 0;
  virtual std::unique_ptr<TimedFence> make_timed_fence() = 0;

  // Recording work for replay; make_graph_capture throws std::logic_error unless
  // supports_graphs().
  virtual bool supports_graphs() const { return false; }
  virtual std::unique_ptr<GraphCapture> make_graph_capture();
  // Changes whenever the backend's own temporary memory moves or one of its uploaded tables
  // changes, so that a recording that holds their addresses or values knows it must be made again
  // (also changed by other backends of the process: a needless new recording, never a stale one).
  virtual std::uint64_t scratch_generation() const { return 0; }

  // out[N,C] = wte[tokens[n], :];  dwte[tokens[n], :] += dout[n, :] (accumulate, deterministic).
  virtual void embedding_forward(Tensor out, Tensor tokens, Tensor wte) = 0;
  virtual void embedding_backward(Tensor dwte, Tensor dout, Tensor tokens) = 0;

  // out = x / rms(x) · gain, rstd = 1/sqrt(mean(x²) + eps);  dx, dgain accumulate.
  virtual void rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor gain, double eps) = 0;
  virtual void rmsnorm_backward(Tensor dx, Tensor dgain, Tensor dout, Tensor x, Tensor gain, Tensor rstd) = 0;

  // out = alpha · op(a) · op(b) + beta · out, 2-D tensors, op = transpose when the flag is set.
  virtual void matmul(Tensor out, Tensor a, Tensor b, bool transpose_a, bool transpose_b,
                      double alpha = 1.0, double beta = 0.0) = 0;

  // A matmul whose product P = op(a) · op(b) passes through an epilogue before it is stored
  // (bf16 out; fused into the GEMM on the GPU, composed from the ops here by default):
  //   add:           out = P + aux          (aux [M, N], must not alias out: the residual add)
  //   gelu:          aux = P, out = gelu(P) (aux keeps the pre-activation for the backward)
  //   gelu_backward: out = P · gelu'(aux)   (aux is the forward's pre-activation)
  enum class MatmulEpilogue { add, gelu, gelu_backward };
  virtual void matmul_epilogue(Tensor out, Tensor a, Tensor b, bool transpose_a, bool transpose_b,
                               MatmulEpilogue epilogue, Tensor aux);

  // out = norm · wᵀ (w [N, K]) with norm = rmsnorm(x) · gain, as rmsnorm_forward writes norm and
  // rstd; with an epilogue, out and aux as matmul_epilogue's. Composed from those ops here; the
  // GPU fuses the norm into the product when there are only a few rows (decoding).
  virtual void rmsnorm_matmul(Tensor out, Tensor norm, Tensor rstd, Tensor x, Tensor gain, double eps, Tensor w,
                              std::optional<MatmulEpilogue> epilogue = std::nullopt, Tensor aux = {});

  // FP8 (train.precision = "fp8"): per-tensor scaled e4m3 / e5m2 operands of the linear layers'
  // products, a tensor x standing as its bytes' values times 1 / scale. The CUDA backend runs them
  // on FP8 tensor cores (has_fp8_tensor_cores); the CPU backend computes them exactly, as the
  // reference the GPU's are tested against, and does not train with them.
  //
  // fp8_cast: out (e4m3 | e5m2 [R, C]) = fp8(v · scale) and out_t ([C, R], same dtype) its
  // transpose, either empty, rounded as float_to_fp8 (model/fp8.hpp); amax (f32 [1]) becomes
  // max(amax, max |v|), NaN or +inf when v holds one. x: the activation dtype [R, C]; scale f32 [1].
  // v is what the prologue makes of x, rounded to the activation dtype as the unfused op would
  // store it: x itself (none), gelu(x), or x · gelu'(pre) (gelu_backward: x the gradient of GELU's
  // output, pre [R, C] its input). The prologues fuse GELU and its backward into the cast.
  enum class Fp8Prologue { none, gelu, gelu_backward };
  virtual void fp8_cast(Tensor out, Tensor out_t, Tensor x, Tensor scale, Tensor amax,
                        Fp8Prologue prologue = Fp8Prologue::none, Tensor pre = {}) = 0;
  // Delayed scaling of k tensors of `format` (amax, scale f32 [k]; history f32 [k, L], newest
  // first; scale_inv f32 [k, kFp8FactorRow], the factor in column 0): a finite amax[i] is pushed
  // into history row i, and where that row's max m > 0, scale[i] = fp8 max / m / 2^margin and
  // scale_inv[i, 0] = 1 / scale[i]; a non-finite amax changes nothing. Every amax is then reset
  // to 0. The factors' rows are 16 bytes since cuBLASLt reads each factor from a 16-byte boundary.
  virtual void fp8_update_scales(Tensor amax, Tensor history, Tensor scale, Tensor scale_inv, DType format,
                                 int margin) = 0;
  // out [M, N] = (a / a_scale) · (b / b_scale)ᵀ + beta · c, given the inverse scales: a [M, K] and
  // b [N, K] FP8, not both e5m2; a_scale_inv, b_scale_inv f32 [1] or [1, kFp8FactorRow] (a row of
  // fp8_update_scales' scale_inv), the factor first, 16-byte aligned on the GPU; out the activation
  // dtype or f32. c is addend when given (out's shape and dtype: the residual add fused into the
  // product), else out. fast_accumulation lets the GPU accumulate less exactly (forward products).
  virtual void fp8_matmul(Tensor out, Tensor a, Tensor a_scale_inv, Tensor b, Tensor b_scale_inv, double beta,
                          bool fast_accumulation, Tensor addend = {}) = 0;
  virtual bool has_fp8_tensor_cores() const { return false; }

  // GELU, tanh approximation. backward writes dx = dout · gelu'(x) (dx may alias dout).
  virtual void gelu_forward(Tensor out, Tensor x) = 0;
  virtual void gelu_backward(Tensor dx, Tensor dout, Tensor x) = 0;

  // out = a + b (out may alias a or b).
  virtual void add(Tensor out, Tensor a, Tensor b) = 0;

  // x = min(max(x, lowest), highest) in place, the bounds rounded to x's dtype (the parameter
  // dtype: f32 on the GPU, Real on the CPU); NaN stays NaN. Projects bounded master weights.
  virtual void clamp(Tensor x, double lowest, double highest) = 0;

  // Causal attention with the encoding's transform, bias and scale.
  virtual void attention_forward(const AttentionForward& args) = 0;
  virtual void attention_backward(const AttentionBackward& args) = 0;
  // Incremental decoding's attention (AttentionDecode). The default refuses: a backend without it
  // cannot generate.
  virtual void attention_decode(const AttentionDecode& args);
  // Elements (activation dtype) of AttentionForward::encoded that this backend can keep for the
  // backward of one such call; 0: it keeps nothing (the CPU backend).
  virtual std::int64_t attention_encoded_numel(const AttentionShape& shape, const PositionEncoding& encoding) const {
    static_cast<void>(shape);
    static_cast<void>(encoding);
    return 0;
  }

  // Softmax cross-entropy over the first `vocab_size` columns of logits [N, Vp] (padded
  // columns excluded). losses[n] = −log p(targets[n]); targets < 0 are masked (loss 0, no
  // gradient). With compute_grad, logits are overwritten by dL/dlogits · grad_scale
  // (padded columns 0). Logits are in the activation dtype or f32 (the model evaluates with
  // f32 logits on a bf16 backend); the arithmetic is at least fp32 either way.
  virtual void cross_entropy(Tensor losses, Tensor logits, Tensor targets, int vocab_size,
                             bool compute_grad, double grad_scale) = 0;

  // Greedy decoding's choice, left in backend memory: for each row r of logits [rows, Vp] (the
  // forward-only logits dtype, at least fp32), ids[r] (i32) = the first of the largest of its
  // first vocab_size columns, log_probs[r] (statistic dtype) = that column's log-softmax over
  // those columns. A row holding a non-finite logit gets id 0 and log-probability NaN. With
  // `past` (i32 [1]) set, also past[0] += advance: the cached length the next decode call starts
  // from, so that a step can be queued before the host has read this one.
  virtual void greedy_tokens(Tensor ids, Tensor log_probs, Tensor logits, int vocab_size, Tensor past,
                             int advance) = 0;

  // Σ x² over a tensor (host value), for the global gradient norm.
  virtual double sum_of_squares(Tensor x) = 0;
  // The same sum left in device memory: result (one f64 element) = Σ x².
  virtual void sum_of_squares_into(Tensor result, Tensor x) = 0;
  // total (one f64 element) += Σ values (statistic dtype), the sum taken first, in a fixed
  // order: the running loss of a step without reading losses back.
  virtual void accumulate_sum(Tensor total, Tensor values) = 0;

  // AdamW over the whole arena: grads are multiplied by step.grad_scale, decoupled weight
  // decay on segments that ask for it; m, v same layout as params. If `compute_copy` is not
  // empty it receives the updated weights converted to the activation dtype.
  virtual void adamw(Tensor params, Tensor grads, Tensor m, Tensor v, std::span<const ParamSegment> segments,
                     const AdamWStep& step, Tensor compute_copy) = 0;

  // AdamW whose per-step values come from device memory: lr and bias corrections from
  // `schedule` (StepScheduleSlot), the loss sum and squared gradient norm from `stats`
  // (StepStatsSlot). When both are finite it applies adamw() with grad_scale =
  // clip_scale(hyper.grad_clip, √squares) and sets stats[kStatsApplied] = 1; otherwise it
  // leaves params, m, v and compute_copy untouched and sets it to 0.
  virtual void adamw_guarded(Tensor params, Tensor grads, Tensor m, Tensor v, std::span<const ParamSegment> segments,
                             const AdamWHyper& hyper, Tensor schedule, Tensor stats, Tensor compute_copy) = 0;
};

// Convenience: a tensor together with the buffer that owns it.
struct OwnedTensor {
  Buffer buffer;
  Tensor tensor;
};
OwnedTensor allocate_tensor(Backend& backend, Shape shape, DType dtype);

// Host copies of an f32, f64 or bf16 tensor (checkpoints store fp32; losses are read in double;
// bf16 logits are read for argmax scoring). Throws
// std::invalid_argument when the host span's size differs from the tensor's.
std::vector<float> tensor_to_host_f32(Backend& backend, const Tensor& tensor);
std::vector<double> tensor_to_host_f64(Backend& backend, const Tensor& tensor);
void tensor_from_host_f32(Backend& backend, const Tensor& tensor, std::span<const float> values);

// Backend factory: cpu, cuda or automatic (CUDA when a GPU is present, else CPU).
// precision "float" | "double" selects the CPU backend's Real; cuda_device the GPU (a
// data-parallel rank's local rank, taken modulo the visible devices so that a rank that sees
// only its own GPU uses it). Throws std::runtime_error when CUDA is asked for but unavailable.
std::unique_ptr<Backend> make_backend(DeviceChoice device, const std::string& cpu_precision = "float",
                                      int threads = 0, int cuda_device = 0);
bool cuda_available();

}  // namespace pope
