// The enums of the config keys that take one of a few names (pope/config.hpp spells them, with
// EnumNames). Plain C++17 and no includes, so that kernels can take them as they are.
#pragma once

namespace pope {
enum class RopeScalingKind { none, pi, ntk, dynamic_ntk, yarn };

// How PoPE turns a real channel into a magnitude μ ≥ 0 (Table 5 ablations).
enum class MagnitudeKind { softplus, identity, relu };
enum class DeltaInit { zero, uniform };  // δ's init; uniform: U(−2π, 0)
// How δ keeps to [−2π, 0]: clamp acts clamped (no gradient outside); none leaves it unbounded;
// project acts as stored, like none, and the optimizer clamps it back after every update.
enum class DeltaBound { clamp, none, project };
enum class PopeScale { inv_sqrt_d, inv_sqrt_2d };
enum class PjRho { linear, lightcone };  // the affine PJ-bias sector's ρ(Δ)
enum class PjGateInit { affine, uniform, alibi, zero };
enum class DataKind { tokens, indirect_indexing };
enum class LrSchedule { cosine, linear, constant };  // after warmup
enum class DeviceChoice { automatic, cpu, cuda };

// Who computes the causal attention of the encoded q̃, k̃: ours (the fused kernels, or the simple
// ones for other widths), or cuDNN's fused SDPA as a comparator (CUDA backend, encodings without a
// score bias). The encodings' transforms are ours either way; the CPU backend refuses cudnn.
enum class AttentionImpl { fused, cudnn };

// What the blocks' linear layers compute in: bf16 operands, or per-tensor scaled FP8 (e4m3
// forward, e5m2 gradients) on GPUs with FP8 tensor cores. Everything else is the same in both.
enum class Precision { bf16, fp8 };

}  // namespace pope
