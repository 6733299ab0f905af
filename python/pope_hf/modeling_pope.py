# coding=utf-8
"""pope's decoder-only GPT in PyTorch: the model of a folder written by `pope-export --format hf`.

One file that imports only torch (and, when they are installed, safetensors and transformers), so that
a pope model loads wherever PyTorch runs, without pope. It is the one PyTorch definition of pope's model:
pope's own oracle (scripts/reference/torch_gpt.py) checks pope's loss and every gradient against it.

The network (pope's include/pope/model.hpp): token embedding -> n_layer pre-norm blocks
[x += proj(attention(encode(q, k), v)); x += proj(GELU_tanh(fc(RMSNorm(x))))] -> RMSNorm -> the tied
head over the embedding's rows; the embedding has padded_vocab_size rows, and the logits of the padded
rows are left out (logits are [.., vocab_size]), as pope leaves them out of its loss. No biases.
q, k and v are the column blocks [0, C), [C, 2C), [2C, 3C) of one fused projection.

The positional encodings, every value of model.position.kind (aliases: none = nope, pjrope = full),
follow pope's docs/encodings.md; where the text leaves a detail open this file does what pope's CPU
reference does (T5 buckets of an odd bucket count, the tables formed in float64):
  nope; rope and its scalings (rope_pi, rope_ntk, rope_yarn, model.position.rope.scaling.kind pi, ntk,
  dynamic_ntk, yarn; rope.fraction); pope (magnitude, learn_delta, delta_bound, scale); alibi
  (head_fraction); xpos; t5_bias; pj_rotary; the PJ-bias methods affine, fj_affine, fj_lc, lc_affine,
  full, rope_affine, rope_ntk_affine, rope_yarn_affine (pj.order, pj.rho).
Positions are computed, never learned, so every encoding evaluates at any length, as pope's does:
dynamic NTK takes s = max(1, T / L_train) for a forward of T tokens; xPos refuses positions whose
decay leaves the floating-point range, naming model.position.xpos.scale_base, as pope does.

Precision: the position tables (angles, decays, biases) are formed in float64; the q/k transforms run
in float32 for float32 and half-precision models (float64 for a float64 model), RMSNorm and the softmax
in at least float32, and the logits are at least float32.

Plain PyTorch (python 3.8+, torch 1.13 or 2.x):
>>> import sys; sys.path.insert(0, "EXPORT_DIR")
>>> import modeling_pope
>>> model = modeling_pope.PopeGPT.from_pretrained("EXPORT_DIR")   # float32 on the CPU
>>> logits = model(torch.tensor([[464, 2068, 7586]]))              # [1, 3, vocab_size]
>>> nll = model.token_nll(tokens, targets)                         # per-token NLL, targets < 0 masked

With transformers installed, the folder's config.json names this file in auto_map:
>>> model = transformers.AutoModelForCausalLM.from_pretrained("EXPORT_DIR", trust_remote_code=True)
>>> model(input_ids, labels=input_ids).loss                        # labels shifted inside, -100 ignored

Limits: no KV cache (every forward recomputes the whole sequence, so generate() is not offered), no
padding (an attention_mask must be all ones), no dropout. Weights a folder does not hold are not
initialised as pope initialises them: train with pope.
"""
import importlib
import json
import math
import os
import struct

import torch
import torch.nn as nn
import torch.nn.functional as F


def _optional(module, *names):
    """The attributes `names` of `module`, or None when it does not import (any failure: missing, or
    unusable with this torch). importlib rather than import statements: transformers' remote-code
    loader requires every package a file imports with a statement, whatever try block holds it."""
    try:
        loaded = importlib.import_module(module)
        return tuple(getattr(loaded, name) for name in names)
    except Exception:  # noqa: BLE001
        return None


_safetensors_load_file = (_optional("safetensors.torch", "load_file") or (None,))[0]
_transformers = _optional("transformers", "PretrainedConfig", "PreTrainedModel")
_outputs = _optional("transformers.modeling_outputs", "CausalLMOutput") if _transformers else None
if _transformers and _outputs:
    (_PretrainedConfig, _PreTrainedModel), (_CausalLMOutput,) = _transformers, _outputs
else:
    _PretrainedConfig = _PreTrainedModel = _CausalLMOutput = None

HAVE_TRANSFORMERS = _PretrainedConfig is not None
FORMAT_VERSION = 1

__all__ = ["PopeGPT", "PopeConfigError", "UnsupportedEncoding", "METHODS", "ALIASES", "position_kinds",
           "read_safetensors", "load_pope_folder", "HAVE_TRANSFORMERS"]


class PopeConfigError(ValueError):
    """A model config this file cannot build; the message names the config key."""


class UnsupportedEncoding(PopeConfigError):
    """model.position.kind is not one this file implements (a pope newer than this file)."""


# ---- the methods of model.position.kind --------------------------------------------------------
# kind -> (q/k transform, score bias). Transforms: None, "rope" (scaling as configured), "rope_pi",
# "rope_ntk", "rope_yarn" (that scaling fixed), "pope", "xpos", "pj_rotary". Biases: None, "alibi",
# "t5_bias", or the enabled PJ-bias sectors (Fourier-jet, affine, light-cone).
_AFFINE = (False, True, False)
METHODS = {
    "nope": (None, None),
    "rope": ("rope", None),
    "pope": ("pope", None),
    "alibi": (None, "alibi"),
    "rope_pi": ("rope_pi", None),
    "rope_ntk": ("rope_ntk", None),
    "rope_yarn": ("rope_yarn", None),
    "rope_ntk_affine": ("rope_ntk", _AFFINE),
    "rope_yarn_affine": ("rope_yarn", _AFFINE),
    "pj_rotary": ("pj_rotary", None),
    "affine": (None, _AFFINE),
    "fj_affine": (None, (True, True, False)),
    "fj_lc": (None, (True, False, True)),
    "rope_affine": ("rope", _AFFINE),
    "full": (None, (True, True, True)),
    "lc_affine": (None, (False, True, True)),
    "xpos": ("xpos", None),
    "t5_bias": (None, "t5_bias"),
}
ALIASES = {"none": "nope", "pjrope": "full"}

# The PJ-bias parameters of a layer, in pope's order: name -> shape as a function of (H, K + 1).
_PJ_PARAMETERS = (
    ("omega", lambda H, R: (H,)),
    ("gate_logits", lambda H, R: (H, 3)),
    ("fj_order_logits", lambda H, R: (H, R)),
    ("fj_re", lambda H, R: (H, R)),
    ("fj_im", lambda H, R: (H, R)),
    ("fj_damping", lambda H, R: (H,)),
    ("affine_slope", lambda H, R: (H,)),
    ("lc_order_logits", lambda H, R: (H, R)),
    ("lc_re", lambda H, R: (H, R)),
    ("lc_im", lambda H, R: (H, R)),
)
_TWO_PI = 2.0 * math.pi
_XPOS_MAX_EXPONENT = 80.0   # e^80 ~ 5.5e34, inside the float32 and bfloat16 range
_SOFTPLUS_LINEAR_FROM = 20.0

# Query rows per attention block are chosen so that one block's scores hold at most this many
# elements (B x H x rows x keys): long sequences run in O(T) rows of memory at a time.
ATTENTION_BLOCK_ELEMENTS = 1 << 25


def position_kinds():
    """Every model.position.kind this file implements, aliases included."""
    return sorted(set(METHODS) | set(ALIASES))


def _require(mapping, key, path):
    if not isinstance(mapping, dict) or key not in mapping:
        raise PopeConfigError(f"{path}.{key}: missing from the model config")
    return mapping[key]


def _softplus(x):
    return F.softplus(x, beta=1.0, threshold=_SOFTPLUS_LINEAR_FROM)


def _work_dtype(dtype):
    """The precision of the q/k transforms: float64 stays, everything else runs in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


# ---- RoPE and its scalings (docs/encodings.md, section 2) ---------------------------------------

def rope_rotary_dim(fraction, head_dim):
    exact = fraction * head_dim
    rotary = int(round(exact))
    if abs(exact - rotary) > 1e-9 or rotary <= 0 or rotary % 2 != 0 or rotary > head_dim:
        raise PopeConfigError(f"model.position.rope.fraction: fraction {fraction} of head dim {head_dim} must give "
                              "a positive even number of rotating channels")
    return rotary


def rope_scale_factor(scaling, train_length, total_length):
    kind = scaling["kind"]
    if kind == "none":
        return 1.0
    if kind == "dynamic_ntk":
        return max(1.0, total_length / train_length)
    return float(scaling["factor"])


def rope_frequencies(rope, rotary_dim, train_length, total_length):
    """theta'_m, m = 0..rotary_dim/2 - 1, for a forward whose last position is total_length - 1."""
    scaling = rope["scaling"]
    kind = scaling["kind"]
    if kind not in ("none", "pi", "ntk", "dynamic_ntk", "yarn"):
        raise PopeConfigError(f"model.position.rope.scaling.kind: unknown scaling '{kind}'")
    s = rope_scale_factor(scaling, train_length, total_length)
    pairs, step = rotary_dim // 2, 2.0 / rotary_dim
    base = float(rope["base"])
    if kind in ("ntk", "dynamic_ntk"):
        if rotary_dim <= 2:
            raise PopeConfigError("model.position.rope.fraction: NTK scaling needs more than 2 rotating channels")
        base = base * s ** (rotary_dim / (rotary_dim - 2.0))
    theta = [base ** (-m * step) for m in range(pairs)]
    if kind == "pi":
        theta = [t / s for t in theta]
    elif kind == "yarn":
        alpha, beta = float(scaling["yarn_alpha"]), float(scaling["yarn_beta"])
        scaled = []
        for t in theta:
            rotations = train_length * t / (2.0 * math.pi)
            gamma = min(max((rotations - alpha) / (beta - alpha), 0.0), 1.0)
            scaled.append((1.0 - gamma) * t / s + gamma * t)
        theta = scaled
    return theta


def rope_qk_multiplier(scaling):
    if scaling["kind"] != "yarn":
        return 1.0
    if scaling["yarn_temperature"] > 0.0:
        return float(scaling["yarn_temperature"])
    return 0.1 * math.log(scaling["factor"]) + 1.0


def _rotate_half_split(x, cos, sin, half, rotary):
    """NeoX pairs (x_m, x_{m+half}) over the first `rotary` channels rotated by the [T, half] angles."""
    x1, x2, rest = x[..., :half], x[..., half:rotary], x[..., rotary:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos, rest], dim=-1)


# ---- PoPE (section 3) ------------------------------------------------------------------------

def pope_frequencies(base, head_dim):
    return [base ** (-c * (1.0 / head_dim)) for c in range(head_dim)]


def _magnitude(kind, x):
    if kind == "softplus":
        return _softplus(x)
    if kind == "identity":
        return x
    if kind == "relu":
        return F.relu(x)
    raise PopeConfigError(f"model.position.pope.magnitude: unknown magnitude '{kind}'")


# ---- ALiBi (section 4) -----------------------------------------------------------------------

def alibi_slopes(n_head):
    def geometric(n):
        return [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]
    n = 1 << (n_head.bit_length() - 1)
    return geometric(n) + geometric(2 * n)[0::2][:n_head - n]


def alibi_head_slopes(head_fraction, n_head):
    biased = int(math.floor(head_fraction * n_head + 0.5))
    return (alibi_slopes(biased) if biased else []) + [0.0] * (n_head - biased)


# ---- T5 relative bias (section 7) ------------------------------------------------------------

def t5_bucket(lag, buckets, max_distance):
    exact = buckets // 2
    if lag < exact:
        return lag
    spread = math.log(lag / exact) / math.log(max_distance / exact)
    return min(buckets - 1, exact + int(spread * (buckets - exact)))


# ---- PJ-bias (section 5.1) -------------------------------------------------------------------

def pj_bias_table(params, lags, train_length, order, rho, sectors):
    """b_h(lag) [H, len(lags)] in float64 from one layer's raw PJ parameters (name -> tensor)."""
    p = {name: params[name].double() for name, _ in _PJ_PARAMETERS}
    L = float(train_length)
    lag = lags.double()
    x = lag / L
    heads = p["omega"].shape[0]
    enabled = torch.tensor(sectors, dtype=torch.bool, device=lag.device)
    logits = torch.where(enabled[None, :], p["gate_logits"], torch.full_like(p["gate_logits"], -math.inf))
    gate = torch.softmax(logits, dim=-1)                                   # [H, 3], disabled exactly 0
    omega = p["omega"][:, None]                                            # [H, 1]
    orders = torch.arange(order + 1, dtype=torch.float64, device=lag.device)
    total = torch.zeros(heads, lag.shape[0], dtype=torch.float64, device=lag.device)
    if sectors[0]:                                                         # Fourier-jet
        alpha = torch.softmax(p["fj_order_logits"], dim=-1)                # [H, K+1]
        damping = _softplus(p["fj_damping"])[:, None]                      # [H, 1]
        inverse_factorial = torch.tensor([1.0 / math.factorial(r) for r in range(order + 1)], dtype=torch.float64,
                                         device=lag.device)
        powers = x[None, :] ** orders[:, None] * inverse_factorial[:, None]   # [K+1, T]: x^r / r! (0^0 = 1)
        basis = powers[None] * torch.exp(-damping * x[None, :])[:, None, :]   # [H, K+1, T]
        angle = omega * lag[None, :]                                       # [H, T]
        real = (p["fj_re"][:, :, None] * torch.cos(angle)[:, None, :] -
                p["fj_im"][:, :, None] * torch.sin(angle)[:, None, :])            # [H, K+1, T]
        total = total + gate[:, 0:1] * (alpha[:, :, None] * basis * real).sum(dim=1)
    if sectors[1]:                                                         # affine
        if rho not in ("linear", "lightcone"):
            raise PopeConfigError(f"model.position.pj.rho: unknown rho '{rho}'")
        rho_of = x if rho == "linear" else torch.asinh(x)
        total = total + gate[:, 1:2] * (-_softplus(p["affine_slope"])[:, None] * rho_of[None, :])
    if sectors[2]:                                                         # light-cone
        alpha = torch.softmax(p["lc_order_logits"], dim=-1)
        phi = L * torch.asinh(x)
        beta = lag / torch.sqrt(lag * lag + L * L)
        basis = beta[None, :] ** orders[:, None]                           # [K+1, T]: beta^r (0^0 = 1)
        angle = omega * phi[None, :]
        real = (p["lc_re"][:, :, None] * torch.cos(angle)[:, None, :] -
                p["lc_im"][:, :, None] * torch.sin(angle)[:, None, :])            # [H, K+1, T]
        total = total + gate[:, 2:3] * (alpha[:, :, None] * basis[None] * real).sum(dim=1)
    return total


# ---- PJ-rotary (section 5.2) -----------------------------------------------------------------

def pj_rotary_transform(x, omega, shear_rate, positions, order, is_key):
    """x [..., T, M*2(K+1)]: per block m the jet shear exp(c_p N) (queries) or exp(-c_p N^T) (keys),
    c_p = shear_rate * p, then every complex channel rotated by omega_m * p. omega: M floats."""
    channels = order + 1
    blocks = len(omega)
    work = _work_dtype(x.dtype)
    pos = positions.double()
    c = shear_rate * pos                                                   # [T]
    if is_key:
        c = -c
    # powers[p, n] = c_p^n / n!
    powers = [torch.ones_like(c)]
    for n in range(1, channels):
        powers.append(powers[-1] * c / n)
    powers = torch.stack(powers, dim=-1)                                   # [T, K+1]
    r = torch.arange(channels, device=x.device)
    if is_key:
        distance = r[:, None] - r[None, :]                                 # y_r = sum_{t <= r} (-c)^{r-t}/(r-t)! z_t
    else:
        distance = r[None, :] - r[:, None]                                 # y_r = sum_{t >= r} c^{t-r}/(t-r)! z_t
    shear = powers[:, distance.clamp(min=0)] * (distance >= 0).to(torch.float64)   # [T, K+1 (out), K+1 (in)]
    angle = pos[:, None] * torch.tensor(omega, dtype=torch.float64, device=x.device)[None, :]   # [T, M]
    cos, sin = torch.cos(angle).to(work), torch.sin(angle).to(work)
    z = x.to(work).reshape(*x.shape[:-1], blocks, channels, 2)
    y = torch.einsum("prt,...pmtj->...pmrj", shear.to(work), z)
    re, im = y[..., 0], y[..., 1]                                          # [..., T, M, K+1]
    cos, sin = cos[:, :, None], sin[:, :, None]
    out = torch.stack([re * cos - im * sin, re * sin + im * cos], dim=-1)
    return out.reshape(x.shape).to(x.dtype)


# ---- the encoding of one layer ---------------------------------------------------------------

class PositionEncoding(nn.Module):
    """The positional encoding of one attention layer: its parameters (pope's names, so that the state
    dict keys are layers.<i>.position.<name>) and encode(q, k) -> (q~, k~, scale, bias per lag)."""

    def __init__(self, model):
        super().__init__()
        position = _require(model, "position", "model")
        self.kind = _require(position, "kind", "model.position")
        method = ALIASES.get(self.kind, self.kind)
        if method not in METHODS:
            raise UnsupportedEncoding(f"model.position.kind '{self.kind}': this modeling file implements "
                                      f"{', '.join(position_kinds())}")
        self.transform, self.bias_kind = METHODS[method]
        self.n_head = int(model["n_head"])
        self.head_dim = int(model["n_embd"]) // self.n_head
        self.train_length = int(model["context_length"])
        H, d = self.n_head, self.head_dim

        if self.transform is not None and self.transform.startswith("rope"):
            rope = json.loads(json.dumps(_require(position, "rope", "model.position")))   # a private copy
            fixed = {"rope_pi": "pi", "rope_ntk": "ntk", "rope_yarn": "yarn"}.get(self.transform)
            if fixed is not None:
                if rope["scaling"]["kind"] not in ("none", fixed):
                    raise PopeConfigError(f"model.position.rope.scaling.kind: kind '{self.kind}' uses the scaling "
                                          f"'{fixed}', found '{rope['scaling']['kind']}'")
                rope["scaling"]["kind"] = fixed
            self.rope = rope
            self.rotary_dim = rope_rotary_dim(rope["fraction"], d)
            rope_frequencies(rope, self.rotary_dim, self.train_length, self.train_length)   # checks the options
        elif self.transform == "pope":
            self.pope = _require(position, "pope", "model.position")
            _magnitude(self.pope["magnitude"], torch.zeros(1))
            bound = self.pope.get("delta_bound", "clamp")   # exports older than the key clamped δ
            # project clamps δ after each training update only: its forward takes δ as stored, as none's does.
            if bound not in ("clamp", "none", "project"):
                raise PopeConfigError(f"model.position.pope.delta_bound: unknown bound '{bound}'")
            self.clamp_delta = bound == "clamp"
            if self.pope["learn_delta"]:
                self.delta = nn.Parameter(torch.zeros(H, d))
        elif self.transform == "xpos":
            self.xpos = _require(position, "xpos", "model.position")
            if d % 2:
                raise PopeConfigError(f"model.n_embd: xpos rotates pairs: expected an even head dim, found {d}")
        elif self.transform == "pj_rotary":
            self.pj = _require(position, "pj", "model.position")
            width = 2 * (int(self.pj["rotary_order"]) + 1)
            if d % width:
                raise PopeConfigError(f"model.position.pj.rotary_order: blocks of {width} dims must divide the "
                                      f"head dim {d}")

        if self.bias_kind == "alibi":
            self.slopes = alibi_head_slopes(float(_require(position, "alibi", "model.position")["head_fraction"]), H)
        elif self.bias_kind == "t5_bias":
            self.t5 = _require(position, "t5_bias", "model.position")
            self.bias = nn.Parameter(torch.zeros(H, int(self.t5["buckets"])))
            self._buckets = {}
        elif self.bias_kind is not None:                                     # PJ-bias sectors
            self.pj = _require(position, "pj", "model.position")
            orders = int(self.pj["order"]) + 1
            for name, shape in _PJ_PARAMETERS:
                self.register_parameter(name, nn.Parameter(torch.zeros(*shape(H, orders))))

    # -- pieces --------------------------------------------------------------------------------

    def softmax_scale(self):
        d = self.head_dim
        if self.transform is not None and self.transform.startswith("rope"):
            t = rope_qk_multiplier(self.rope["scaling"])
            return t * t / math.sqrt(d)
        if self.transform == "pope" and self.pope["scale"] == "inv_sqrt_2d":
            return 1.0 / math.sqrt(2 * d)
        return 1.0 / math.sqrt(d)

    def _rope(self, x, positions, total_length):
        theta = rope_frequencies(self.rope, self.rotary_dim, self.train_length, total_length)
        angle = positions.double()[:, None] * torch.tensor(theta, dtype=torch.float64, device=x.device)[None, :]
        work = _work_dtype(x.dtype)
        out = _rotate_half_split(x.to(work), torch.cos(angle).to(work), torch.sin(angle).to(work),
                                 self.rotary_dim // 2, self.rotary_dim)
        return out.to(x.dtype)

    def _pope(self, x, positions, is_key):
        d = self.head_dim
        omega = torch.tensor(pope_frequencies(float(self.pope["base"]), d), dtype=torch.float64, device=x.device)
        phase = positions.double()[:, None] * omega[None, :]               # [T, d]
        if is_key and self.pope["learn_delta"]:
            delta = torch.clamp(self.delta.double(), -_TWO_PI, 0.0) if self.clamp_delta else self.delta.double()
            phase = phase[None] + delta[:, None, :]                        # [H, T, d]
        work = _work_dtype(x.dtype)
        mu = _magnitude(self.pope["magnitude"], x.to(work))
        return torch.cat([mu * torch.cos(phase).to(work), mu * torch.sin(phase).to(work)], dim=-1).to(x.dtype)

    def _xpos(self, x, positions, is_key):
        d, half = self.head_dim, self.head_dim // 2
        base, gamma = float(self.xpos["base"]), float(self.xpos["scale_base"])
        centre = math.floor(self.train_length / 2.0)
        rates = [math.log((2.0 * m / d + 0.4) / 1.4) / gamma for m in range(half)]
        first, last = float(positions[0]), float(positions[-1])
        farthest = max(abs(first - centre), abs(last - centre))
        if half and abs(rates[0]) * farthest > _XPOS_MAX_EXPONENT:
            raise ValueError(f"xpos: positions up to {int(last)} lie {farthest:g} from the centre L_train/2 = "
                             f"{centre:g}, where xpos's scale leaves the floating-point range (at most "
                             f"{_XPOS_MAX_EXPONENT / abs(rates[0]):.0f} positions from it with "
                             f"model.position.xpos.scale_base {gamma:g})")
        pos = positions.double()
        theta = torch.tensor([base ** (-m * (2.0 / d)) for m in range(half)], dtype=torch.float64, device=x.device)
        exponent = (pos[:, None] - centre) * torch.tensor(rates, dtype=torch.float64, device=x.device)[None, :]
        scale = torch.exp(-exponent if is_key else exponent)
        angle = pos[:, None] * theta[None, :]
        work = _work_dtype(x.dtype)
        scale = scale.to(work)
        cos, sin = torch.cos(angle).to(work), torch.sin(angle).to(work)
        xw = x.to(work)
        x1, x2 = xw[..., :half] * scale, xw[..., half:] * scale
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).to(x.dtype)

    def _pj_rotary(self, x, positions, is_key):
        order = int(self.pj["rotary_order"])
        blocks = self.head_dim // (2 * (order + 1))
        omega = [float(self.pj["rotary_base"]) ** (-m * (1.0 / blocks)) for m in range(blocks)]
        rate = float(self.pj["rotary_eta"]) / self.train_length
        return pj_rotary_transform(x, omega, rate, positions, order, is_key)

    def transform_qk(self, x, positions, is_key, total_length):
        """x [B, H, T, d] -> the encoded rows [B, H, T, qk_width]."""
        if self.transform is None:
            return x
        if self.transform.startswith("rope"):
            return self._rope(x, positions, total_length)
        if self.transform == "pope":
            return self._pope(x, positions, is_key)
        if self.transform == "xpos":
            return self._xpos(x, positions, is_key)
        return self._pj_rotary(x, positions, is_key)

    def bias_table(self, length, device):
        """b_h(lag) [H, length] for lags 0..length-1 (float64), or None without a score bias."""
        if self.bias_kind is None:
            return None
        lags = torch.arange(length, dtype=torch.float64, device=device)
        if self.bias_kind == "alibi":
            return -torch.tensor(self.slopes, dtype=torch.float64, device=device)[:, None] * lags[None, :]
        if self.bias_kind == "t5_bias":
            index = self._buckets.get(length)
            if index is None:
                buckets, distance = int(self.t5["buckets"]), int(self.t5["max_distance"])
                index = torch.tensor([t5_bucket(lag, buckets, distance) for lag in range(length)], dtype=torch.long)
                self._buckets = {length: index}
            return self.bias.double()[:, index.to(device)]
        params = {name: getattr(self, name) for name, _ in _PJ_PARAMETERS}
        return pj_bias_table(params, lags, self.train_length, int(self.pj["order"]), self.pj["rho"], self.bias_kind)

    def encode(self, q, k):
        """q, k [B, H, T, d] -> (q~, k~, softmax scale, bias per lag [H, T] or None)."""
        T = q.shape[2]
        positions = torch.arange(T, dtype=torch.float64, device=q.device)
        return (self.transform_qk(q, positions, False, T), self.transform_qk(k, positions, True, T),
                self.softmax_scale(), self.bias_table(T, q.device))


# ---- the network -----------------------------------------------------------------------------

class RMSNorm(nn.Module):
    def __init__(self, width, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x):
        xf = x.to(_work_dtype(x.dtype))
        normed = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return normed.to(x.dtype) * self.weight


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


def causal_attention(q, k, v, scale, bias):
    """softmax(q k^T * scale + bias[h, t - s], causal) v, over blocks of query rows.
    q, k [B, H, T, W]; v [B, H, T, d]; bias [H, T] per lag (float64) or None."""
    B, H, T, _ = q.shape
    rows = max(1, ATTENTION_BLOCK_ELEMENTS // max(1, B * H * T))
    softmax_dtype = _work_dtype(q.dtype)
    table = bias.to(softmax_dtype) if bias is not None else None
    outputs = []
    for first in range(0, T, rows):
        last = min(T, first + rows)
        scores = (q[:, :, first:last] @ k[:, :, :last].transpose(-1, -2)).to(softmax_dtype) * scale
        query = torch.arange(first, last, device=q.device)[:, None]
        key = torch.arange(last, device=q.device)[None, :]
        if table is not None:
            scores = scores + table[:, (query - key).clamp(min=0)][None]
        scores = scores.masked_fill(key > query, float("-inf"))
        outputs.append(torch.softmax(scores, dim=-1).to(v.dtype) @ v[:, :, :last])
    return torch.cat(outputs, dim=2)


class Attention(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.proj = nn.Linear(width, width, bias=False)


class MLP(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc = nn.Linear(width, 4 * width, bias=False)
        self.proj = nn.Linear(4 * width, width, bias=False)

    def forward(self, x):
        return self.proj(gelu_tanh(self.fc(x)))


class Block(nn.Module):
    def __init__(self, model):
        super().__init__()
        C, eps = int(model["n_embd"]), float(model["norm_eps"])
        self.n_head = int(model["n_head"])
        self.attn_norm = RMSNorm(C, eps)
        self.attn = Attention(C)
        self.position = PositionEncoding(model)
        self.mlp_norm = RMSNorm(C, eps)
        self.mlp = MLP(C)

    def forward(self, x):
        B, T, C = x.shape
        H = self.n_head
        qkv = self.attn.qkv(self.attn_norm(x))                            # [B, T, 3C]: q, k, v column blocks
        q, k, v = (qkv[..., j * C:(j + 1) * C].reshape(B, T, H, C // H).transpose(1, 2) for j in range(3))
        q, k, scale, bias = self.position.encode(q, k)
        y = causal_attention(q, k, v, scale, bias).transpose(1, 2).reshape(B, T, C)
        x = x + self.attn.proj(y)
        return x + self.mlp(self.mlp_norm(x))


def check_model_config(model):
    for key in ("vocab_size", "padded_vocab_size", "n_layer", "n_head", "n_embd", "context_length", "norm_eps",
                "position"):
        _require(model, key, "model")
    if model["n_embd"] % model["n_head"]:
        raise PopeConfigError(f"model.n_embd: {model['n_embd']} is not a multiple of model.n_head {model['n_head']}")
    if model["padded_vocab_size"] < model["vocab_size"]:
        raise PopeConfigError("model.padded_vocab_size: smaller than model.vocab_size")


class _PopeNetwork:
    """The modules and forward shared by PopeGPT (plain PyTorch) and PopeForCausalLM (transformers).
    Attribute names are pope's parameter names (wte.weight, layers.<i>.…, final_norm.weight)."""

    def _build_network(self, model):
        check_model_config(model)
        self.pope_model_config = model
        self.vocab_size = int(model["vocab_size"])
        self.wte = nn.Embedding(int(model["padded_vocab_size"]), int(model["n_embd"]))
        self.layers = nn.ModuleList([Block(model) for _ in range(int(model["n_layer"]))])
        self.final_norm = RMSNorm(int(model["n_embd"]), float(model["norm_eps"]))

    def pope_logits(self, tokens):
        """tokens [B, T] (ids below vocab_size) -> logits [B, T, vocab_size], at least float32."""
        if tokens.dim() != 2:
            raise ValueError(f"expected token ids of shape [B, T], got {list(tokens.shape)}")
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= self.vocab_size):
            raise ValueError(f"token ids must lie in [0, {self.vocab_size}), got [{int(tokens.min())}, "
                             f"{int(tokens.max())}]")
        x = self.wte(tokens.long())
        for block in self.layers:
            x = block(x)
        logits = F.linear(self.final_norm(x), self.wte.weight[:self.vocab_size])   # padded rows left out
        return logits if logits.dtype == torch.float64 else logits.float()

    def token_nll(self, tokens, targets):
        """Per-token negative log-likelihood [B, T] of targets (aligned with tokens: targets[t] is the
        token after tokens[t]); 0 where the target is negative (masked), as pope's loss."""
        logits = self.pope_logits(tokens)
        targets = targets.to(logits.device).long()
        keep = targets >= 0
        nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.clamp(min=0).reshape(-1),
                              reduction="none").reshape(targets.shape)
        return torch.where(keep, nll, torch.zeros_like(nll))

    def pope_loss(self, tokens, targets):
        """pope's loss: the mean NLL over the unmasked targets."""
        keep = (targets >= 0).to(self.wte.weight.device)
        return self.token_nll(tokens, targets).sum() / keep.sum().clamp(min=1)


class PopeGPT(_PopeNetwork, nn.Module):
    """pope's GPT as a plain torch.nn.Module. `model` is the "model" section of pope's resolved config
    (config.json's pope_config.model in an exported folder)."""

    def __init__(self, model):
        nn.Module.__init__(self)
        self._build_network(model)

    def forward(self, tokens):
        return self.pope_logits(tokens)

    @classmethod
    def from_pretrained(cls, path, dtype=torch.float32, device="cpu"):
        """The model of an exported folder, its weights in `dtype` on `device`; with a half-precision
        dtype the positional parameters (layers.*.position.*) stay float32, as pope's CUDA backend
        keeps them."""
        config, weights = load_pope_folder(path)
        model = cls(config["pope_config"]["model"]).to(device=device, dtype=dtype)
        if dtype in (torch.float16, torch.bfloat16):
            for block in model.layers:
                block.position.float()
        model.load_state_dict(weights, strict=True)   # each tensor converted to its parameter's dtype
        return model.eval()


# ---- reading a folder ------------------------------------------------------------------------

_SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                       "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
                       "U8": torch.uint8, "BOOL": torch.bool}


def read_safetensors(path, with_metadata=False):
    """{name: tensor} of a safetensors file (the safetensors package when installed, else a reader of
    the format: u64 little-endian header length, JSON header, raw little-endian data)."""
    if _safetensors_load_file is not None and not with_metadata:
        return _safetensors_load_file(str(path))
    with open(path, "rb") as f:
        blob = bytearray(f.read())
    if len(blob) < 8:
        raise ValueError(f"{path}: {len(blob)} bytes, too short for a safetensors header")
    (length,) = struct.unpack_from("<Q", blob, 0)
    if 8 + length > len(blob):
        raise ValueError(f"{path}: header length {length} exceeds the file ({len(blob)} bytes)")
    try:
        header = json.loads(blob[8:8 + length].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        raise ValueError(f"{path}: the header is not JSON: {error}")
    metadata = header.pop("__metadata__", {}) or {}
    start, tensors = 8 + length, {}
    for name, entry in header.items():
        dtype = _SAFETENSORS_DTYPES.get(entry.get("dtype"))
        if dtype is None:
            raise ValueError(f"{path}: tensor '{name}' has dtype {entry.get('dtype')}, which this reader does not know")
        begin, end = entry["data_offsets"]
        count = math.prod(entry["shape"]) if entry["shape"] else 1
        item = torch.empty(0, dtype=dtype).element_size()
        if end - begin != count * item or start + end > len(blob):
            raise ValueError(f"{path}: tensor '{name}' has offsets [{begin}, {end}) that do not hold {count} "
                             f"elements of {entry['dtype']} inside the file")
        flat = torch.frombuffer(blob, dtype=dtype, count=count, offset=start + begin) if count else \
            torch.empty(0, dtype=dtype)
        tensors[name] = flat.reshape(entry["shape"]).clone()
    return (tensors, metadata) if with_metadata else tensors


def load_pope_folder(path):
    """(config.json as a dict, {name: weight}) of a folder written by pope-export."""
    with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    if config.get("model_type") != "pope" or "pope_config" not in config:
        raise PopeConfigError(f"{path}/config.json: not a pope export (model_type {config.get('model_type')!r}, "
                              "expected 'pope' with a pope_config)")
    version = config.get("pope_export", {}).get("format_version", FORMAT_VERSION)
    if version > FORMAT_VERSION:
        raise PopeConfigError(f"{path}/config.json: export format {version}, this file reads up to {FORMAT_VERSION}")
    return config, read_safetensors(os.path.join(path, "model.safetensors"))


# ---- transformers wrappers -------------------------------------------------------------------

if HAVE_TRANSFORMERS:
    class PopeConfig(_PretrainedConfig):
        """config.json of an exported folder; pope_config is pope's whole resolved run config."""
        model_type = "pope"

        def __init__(self, pope_config=None, **kwargs):
            self.pope_config = pope_config if pope_config is not None else {}
            super().__init__(**kwargs)

    class PopeForCausalLM(_PopeNetwork, _PreTrainedModel):
        """pope's GPT for AutoModelForCausalLM (trust_remote_code=True): forward(input_ids, labels=None)
        returns logits [B, T, vocab_size] and, with labels, the mean next-token loss (labels shifted
        inside, -100 ignored)."""
        config_class = PopeConfig
        base_model_prefix = "pope_network"   # no parameter name starts with it: the names are pope's
        main_input_name = "input_ids"
        _no_split_modules = ["Block"]
        _keep_in_fp32_modules = ["position"]   # layers.*.position.*: float32 under torch_dtype=bfloat16

        def __init__(self, config):
            _PreTrainedModel.__init__(self, config)
            model = (config.pope_config or {}).get("model")
            if not model:
                raise PopeConfigError("config.json has no pope_config.model: not a pope export")
            self._build_network(model)
            self.post_init()

        def _init_weights(self, module):
            pass   # an exported folder holds every weight; pope initialises, not this file

        def get_input_embeddings(self):
            return self.wte

        def set_input_embeddings(self, value):
            self.wte = value

        def get_output_embeddings(self):
            return None   # the head is the embedding itself (tied), read in pope_logits

        def forward(self, input_ids=None, attention_mask=None, labels=None, return_dict=None, **kwargs):
            if input_ids is None:
                raise ValueError("PopeForCausalLM takes input_ids (no inputs_embeds)")
            if attention_mask is not None and not bool(attention_mask.bool().all()):
                raise ValueError("PopeForCausalLM does not support padding: attention_mask must be all ones")
            logits = self.pope_logits(input_ids)
            loss = None
            if labels is not None:
                shifted = labels[:, 1:].to(logits.device).long()
                loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), shifted.reshape(-1),
                                       ignore_index=-100)
            if return_dict is False:
                return (loss, logits) if loss is not None else (logits,)
            return _CausalLMOutput(loss=loss, logits=logits)

    __all__ += ["PopeConfig", "PopeForCausalLM"]
