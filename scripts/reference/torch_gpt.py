#!/usr/bin/env python3
"""Independent PyTorch model of pope's GPT, checked against one pope forward/backward.

Written from the papers and pope's documents (docs/encodings.md sections 1-4, 6 and 7,
data/README.md, include/pope/model.hpp), not from pope's C++: token embedding -> n_layer pre-norm blocks
[x += proj(attention(encode(qkv(RMSNorm(x))))); x += proj(GELU_tanh(fc(RMSNorm(x))))] -> RMSNorm
-> tied LM head over the padded vocabulary, padded logits excluded, mean cross-entropy over the
unmasked targets (target < 0 is masked).

Input: a dump written by `pope-bench train --config CFG --dump-step DUMP.safetensors`: the
weights under their model names (F32), "tokens" and "targets" (I32 [B, T]), "loss" (F32 scalar),
"grad.<name>" (F32) and metadata "config" (the resolved config JSON) and "activation_dtype".
This script recomputes the loss and every gradient (float64 by default) and prints the relative
error of each: ||pope - torch|| / ||torch||.

Tolerances: a bf16 dump (GPU) passes with loss error <= 1e-2 and every gradient <= 5e-2; an
f32 or f64 dump (CPU) with 1e-5 and 1e-4.
Encodings: nope, rope (no scaling), pope, alibi, xpos, t5_bias; a dump of another
model.position.kind exits 3, so that a caller looping over every kind tells "not implemented
here" from a failure.
Exit codes: 0 match, 1 mismatch, 2 unreadable dump or unsupported option, 3 encoding not
implemented here, 77 PyTorch missing.
Runs with PyTorch 1.13 (Debian's python3-torch, CPU) and 2.x.
"""
import argparse
import json
import math
import struct
import sys

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("SKIP: PyTorch is not installed for this python (Debian: apt-get install python3-torch)")
    sys.exit(77)

EXIT_MISMATCH = 1
EXIT_BAD_INPUT = 2
EXIT_UNIMPLEMENTED = 3
IMPLEMENTED = ("nope", "rope", "pope", "alibi", "xpos", "t5_bias")
TOLERANCES = {"bf16": (1e-2, 5e-2)}  # activation dtype -> (loss, gradient); anything else:
FULL_PRECISION_TOLERANCES = (1e-5, 1e-4)
SAFETENSORS_DTYPES = {"F32": (torch.float32, 4), "F64": (torch.float64, 8), "I32": (torch.int32, 4)}


class DumpError(Exception):
    """The dump is unreadable, incomplete or describes a model this oracle does not implement."""


class Unimplemented(DumpError):
    """The dump's model.position.kind is not one this oracle implements."""


# ---- reading the dump ----------------------------------------------------------------------

def read_safetensors(path):
    """Returns ({name: tensor}, metadata) of a safetensors file: an 8-byte little-endian header
    length, a JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {...}}, then data."""
    try:
        with open(path, "rb") as f:
            blob = bytearray(f.read())
    except OSError as error:
        raise DumpError(f"{path}: cannot read: {error}")
    if len(blob) < 8:
        raise DumpError(f"{path}: {len(blob)} bytes, too short for a safetensors header length")
    (header_length,) = struct.unpack_from("<Q", blob, 0)
    data_start = 8 + header_length
    if data_start > len(blob):
        raise DumpError(f"{path}: header length {header_length} exceeds the file ({len(blob)} bytes)")
    try:
        header = json.loads(blob[8:data_start].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise DumpError(f"{path}: header is not JSON: {error}")
    metadata = header.pop("__metadata__", {})
    tensors = {}
    for name, entry in header.items():
        if entry.get("dtype") not in SAFETENSORS_DTYPES:
            raise DumpError(f"{path}: tensor '{name}' has dtype {entry.get('dtype')}, expected F32, F64 or I32")
        dtype, item_size = SAFETENSORS_DTYPES[entry["dtype"]]
        begin, end = entry["data_offsets"]
        count = math.prod(entry["shape"])
        if end - begin != count * item_size or data_start + end > len(blob):
            raise DumpError(f"{path}: tensor '{name}' has offsets [{begin}, {end}) that do not hold "
                            f"{count} elements of {entry['dtype']} inside the file")
        flat = torch.frombuffer(blob, dtype=dtype, count=count, offset=data_start + begin) if count else \
            torch.empty(0, dtype=dtype)
        tensors[name] = flat.reshape(entry["shape"]).clone()
    return tensors, metadata


def require(tensors, name, shape, path):
    if name not in tensors:
        raise DumpError(f"{path}: tensor '{name}' is missing")
    if list(tensors[name].shape) != list(shape):
        raise DumpError(f"{path}: tensor '{name}' has shape {list(tensors[name].shape)}, expected {list(shape)}")
    return tensors[name]


# ---- positional encodings (docs/encodings.md) ----------------------------------------------

def rope_features(x, rope, positions):
    """NeoX half split over the first r = fraction*d channels: pair (x_m, x_{m+r/2}) rotated by
    p*theta_m, theta_m = base^(-2m/r); the other channels pass through."""
    if rope["scaling"]["kind"] != "none":
        raise DumpError(f"model.position.rope.scaling.kind '{rope['scaling']['kind']}': this oracle implements "
                        "only 'none'")
    d = x.shape[-1]
    r = round(rope["fraction"] * d)
    half = r // 2
    theta = rope["base"] ** (-2.0 * torch.arange(half, dtype=x.dtype, device=x.device) / r)
    angle = positions[:, None] * theta[None, :]
    cos, sin = torch.cos(angle), torch.sin(angle)
    x1, x2, rest = x[..., :half], x[..., half:r], x[..., r:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos, rest], dim=-1)


def pope_features(x, pope, positions, delta):
    """[mu cos(p*omega + delta), mu sin(p*omega + delta)], omega_c = base^(-c/d), mu = magnitude(x)."""
    d = x.shape[-1]
    magnitude = {"softplus": lambda v: F.softplus(v, beta=1.0, threshold=20.0),
                 "identity": lambda v: v,
                 "relu": F.relu}[pope["magnitude"]]
    omega = pope["base"] ** (-torch.arange(d, dtype=x.dtype, device=x.device) / d)
    phase = positions[:, None] * omega[None, :]            # [T, d]
    if delta is not None:                                   # keys only: [H, d] -> [1, H, 1, d]
        phase = phase + torch.clamp(delta, -2.0 * math.pi, 0.0)[None, :, None, :]
    mu = magnitude(x)
    return torch.cat([mu * torch.cos(phase), mu * torch.sin(phase)], dim=-1)


def xpos_features(x, xpos, positions, train_length, is_key):
    """RoPE over every pair (x_m, x_{m+d/2}), theta_m = base^(-2m/d), each pair scaled by
    zeta_m^((p - c)/gamma) on queries and zeta_m^(-(p - c)/gamma) on keys, zeta_m = (2m/d + 0.4)/1.4,
    c = floor(L_train / 2) (Sun et al. 2022)."""
    d = x.shape[-1]
    half = d // 2
    m = torch.arange(half, dtype=x.dtype, device=x.device)
    theta = xpos["base"] ** (-2.0 * m / d)
    zeta = (2.0 * m / d + 0.4) / 1.4
    exponent = (positions[:, None] - math.floor(train_length / 2)) / xpos["scale_base"]
    scale = zeta[None, :] ** (-exponent if is_key else exponent)
    angle = positions[:, None] * theta[None, :]
    cos, sin = torch.cos(angle), torch.sin(angle)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([(x1 * cos - x2 * sin) * scale, (x1 * sin + x2 * cos) * scale], dim=-1)


def t5_buckets(lags, buckets, max_distance):
    """T5's causal relative-position buckets: lags below B/2 exact, then log-spaced up to
    max_distance, every lag beyond in the last bucket (Raffel et al. 2020)."""
    exact = buckets // 2
    spread = torch.log(lags.clamp(min=1).double() / exact) / math.log(max_distance / exact)
    large = (exact + (spread * (buckets - exact)).long()).clamp(max=buckets - 1)
    return torch.where(lags < exact, lags, large)


def alibi_slopes(n_head):
    def geometric(n):
        return [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]
    n = 2 ** int(math.floor(math.log2(n_head)))
    return geometric(n) + geometric(2 * n)[0::2][:n_head - n]


def encode(q, k, position, train_length, n_head, layer):
    """Returns (q_tilde, k_tilde, softmax scale, score bias [H, T, T] or None); q, k are [B, H, T, d];
    `layer` maps the layer's position parameter names ("delta", "bias") to tensors."""
    kind, d, T = position["kind"], q.shape[-1], q.shape[2]
    positions = torch.arange(T, dtype=q.dtype, device=q.device)
    lag = positions[:, None] - positions[None, :]           # t - s
    if kind == "nope":
        return q, k, 1.0 / math.sqrt(d), None
    if kind == "rope":
        return rope_features(q, position["rope"], positions), rope_features(k, position["rope"], positions), \
            1.0 / math.sqrt(d), None
    if kind == "pope":
        pope = position["pope"]
        width = 2 * d if pope["scale"] == "inv_sqrt_2d" else d
        return pope_features(q, pope, positions, None), pope_features(k, pope, positions, layer.get("delta")), \
            1.0 / math.sqrt(width), None
    if kind == "alibi":
        biased = round(position["alibi"]["head_fraction"] * n_head)
        slopes = (alibi_slopes(biased) if biased else []) + [0.0] * (n_head - biased)
        bias = -torch.tensor(slopes, dtype=q.dtype, device=q.device)[:, None, None] * lag[None]
        return q, k, 1.0 / math.sqrt(d), bias
    if kind == "xpos":
        xpos = position["xpos"]
        return xpos_features(q, xpos, positions, train_length, False), \
            xpos_features(k, xpos, positions, train_length, True), 1.0 / math.sqrt(d), None
    if kind == "t5_bias":
        t5 = position["t5_bias"]
        bucket = t5_buckets(lag.clamp(min=0).long(), t5["buckets"], t5["max_distance"])   # [T, T]
        return q, k, 1.0 / math.sqrt(d), layer["bias"][:, bucket]                          # [H, T, T]
    raise Unimplemented(f"model.position.kind '{kind}': this oracle implements {', '.join(IMPLEMENTED)}")


# ---- the network ---------------------------------------------------------------------------

def rms_norm(x, gain, eps):
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * gain


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


def causal_attention(q, k, v, scale, bias):
    T = q.shape[2]
    scores = q @ k.transpose(-1, -2) * scale
    if bias is not None:
        scores = scores + bias[None]
    future = torch.triu(torch.ones(T, T, dtype=torch.bool, device=q.device), diagonal=1)
    scores = scores.masked_fill(future, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def parameter_shapes(model):
    """Every parameter name and shape of pope's layout (data/README.md)."""
    C, V, H, d = model["n_embd"], model["padded_vocab_size"], model["n_head"], model["n_embd"] // model["n_head"]
    position = model["position"]
    if position["kind"] not in IMPLEMENTED:
        raise Unimplemented(f"model.position.kind '{position['kind']}': this oracle implements {', '.join(IMPLEMENTED)}")
    has_delta = position["kind"] == "pope" and position["pope"]["learn_delta"]
    shapes = {"wte.weight": [V, C]}
    for i in range(model["n_layer"]):
        shapes.update({f"layers.{i}.attn_norm.weight": [C], f"layers.{i}.attn.qkv.weight": [3 * C, C],
                       f"layers.{i}.attn.proj.weight": [C, C], f"layers.{i}.mlp_norm.weight": [C],
                       f"layers.{i}.mlp.fc.weight": [4 * C, C], f"layers.{i}.mlp.proj.weight": [C, 4 * C]})
        if has_delta:
            shapes[f"layers.{i}.position.delta"] = [H, d]
        if position["kind"] == "t5_bias":
            shapes[f"layers.{i}.position.bias"] = [H, position["t5_bias"]["buckets"]]
    shapes["final_norm.weight"] = [C]
    return shapes


def loss_of(w, tokens, targets, model):
    B, T = tokens.shape
    C, H, eps = model["n_embd"], model["n_head"], model["norm_eps"]
    d = C // H
    x = w["wte.weight"][tokens.long()]                     # [B, T, C]
    for i in range(model["n_layer"]):
        p = f"layers.{i}."
        h = rms_norm(x, w[p + "attn_norm.weight"], eps)
        qkv = h @ w[p + "attn.qkv.weight"].T                # [B, T, 3C]: q, k, v column blocks
        q, k, v = (qkv[..., j * C:(j + 1) * C].reshape(B, T, H, d).transpose(1, 2) for j in range(3))
        layer = {name: w[p + "position." + name] for name in ("delta", "bias") if p + "position." + name in w}
        q, k, scale, bias = encode(q, k, model["position"], model["context_length"], H, layer)
        y = causal_attention(q, k, v, scale, bias).transpose(1, 2).reshape(B, T, C)
        x = x + y @ w[p + "attn.proj.weight"].T
        h = rms_norm(x, w[p + "mlp_norm.weight"], eps)
        x = x + gelu_tanh(h @ w[p + "mlp.fc.weight"].T) @ w[p + "mlp.proj.weight"].T
    logits = rms_norm(x, w["final_norm.weight"], eps) @ w["wte.weight"].T
    logits = logits[..., :model["vocab_size"]].reshape(B * T, -1)   # padded columns excluded
    flat_targets = targets.reshape(-1).long()
    keep = flat_targets >= 0
    return F.cross_entropy(logits[keep], flat_targets[keep])


# ---- comparison ----------------------------------------------------------------------------

def relative_error(ours, reference):
    ours, reference = ours.double(), reference.double()
    if not torch.isfinite(ours).all():
        return math.inf
    norm = reference.norm().item()
    diff = (ours - reference).norm().item()
    return diff / norm if norm > 0 else diff


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dump", help="safetensors file from pope-bench train --dump-step")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--dtype", default="float64", choices=["float64", "float32"],
                        help="precision of this reference (default float64)")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but torch sees no CUDA device", file=sys.stderr)
        return EXIT_BAD_INPUT

    try:
        tensors, metadata = read_safetensors(args.dump)
        if metadata.get("format") != "pope-step-dump" or "config" not in metadata:
            raise DumpError(f"{args.dump}: metadata format is {metadata.get('format')!r}, expected 'pope-step-dump' "
                            "with the config (write it with pope-bench train --dump-step)")
        model = json.loads(metadata["config"])["model"]
        shapes = parameter_shapes(model)
        if "tokens" not in tensors or tensors["tokens"].dim() != 2:
            raise DumpError(f"{args.dump}: expected a tensor 'tokens' of shape [B, T]")
        require(tensors, "targets", tensors["tokens"].shape, args.dump)
        vocab = model["vocab_size"]
        if not (0 <= tensors["tokens"].min() and tensors["tokens"].max() < vocab and tensors["targets"].max() < vocab):
            raise DumpError(f"{args.dump}: token or target ids outside the vocabulary [0, {vocab})")
        require(tensors, "loss", [], args.dump)
        weights = {n: require(tensors, n, s, args.dump).to(args.device, dtype).requires_grad_() for n, s in shapes.items()}
        for name, shape in shapes.items():
            require(tensors, "grad." + name, shape, args.dump)
        unexpected = sorted(set(tensors) - set(shapes) - {"grad." + n for n in shapes} - {"tokens", "targets", "loss"})
        if unexpected:
            raise DumpError(f"{args.dump}: tensors this model does not have: {', '.join(unexpected)}")
        loss = loss_of(weights, tensors["tokens"].to(args.device), tensors["targets"].to(args.device), model)
    except Unimplemented as error:
        print(f"unimplemented: {error}", file=sys.stderr)
        return EXIT_UNIMPLEMENTED
    except DumpError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    loss.backward()

    activation = metadata.get("activation_dtype", "f32")
    loss_tolerance, grad_tolerance = TOLERANCES.get(activation, FULL_PRECISION_TOLERANCES)
    B, T = tensors["tokens"].shape
    print(f"{args.dump}: {model['position']['kind']}, {model['n_layer']} layers, n_embd {model['n_embd']}, "
          f"{B} x {T} tokens; pope {metadata.get('backend', '?')} ({activation}) vs torch {torch.__version__} "
          f"{args.dtype} on {args.device}")
    loss_error = relative_error(tensors["loss"], loss.detach().cpu())
    print(f"loss: pope {tensors['loss'].item():.6f} torch {loss.item():.6f} rel error {loss_error:.2e} "
          f"(tolerance {loss_tolerance:g})")
    failures = [] if loss_error <= loss_tolerance else ["loss"]
    print(f"\n| gradient | rel error (tolerance {grad_tolerance:g}) |\n|---|---:|")
    for name in shapes:
        error = relative_error(tensors["grad." + name], weights[name].grad.detach().cpu())
        flag = "" if error <= grad_tolerance else "  FAIL"
        print(f"| grad.{name} | {error:.2e}{flag} |")
        if flag:
            failures.append("grad." + name)
    if failures:
        print(f"\nMISMATCH: {', '.join(failures)}")
        return EXIT_MISMATCH
    print(f"\nOK: loss and {len(shapes)} gradients match")
    return 0


if __name__ == "__main__":
    sys.exit(main())
