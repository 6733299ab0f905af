#!/usr/bin/env python3
"""PyTorch model of pope's GPT, checked against one pope forward/backward.

The model is python/pope_hf/modeling_pope.py, the file pope-export writes into every exported
folder, so the model people load without pope is the one this oracle holds pope to. It is written
from pope's documents (docs/encodings.md, data/README.md, include/pope/model.hpp), its PyTorch code
apart from pope's C++: token embedding -> n_layer pre-norm blocks [x += proj(attention(encode(qkv(
RMSNorm(x))))); x += proj(GELU_tanh(fc(RMSNorm(x))))] -> RMSNorm -> tied LM head over the padded
vocabulary, padded logits excluded, mean cross-entropy over the unmasked targets (target < 0 is
masked).

Input: a dump written by `pope-bench train --config CFG --dump-step DUMP.safetensors`: the
weights under their model names (F32), "tokens" and "targets" (I32 [B, T]), "loss" (F32 scalar),
"grad.<name>" (F32) and metadata "config" (the resolved config JSON) and "activation_dtype".
This script recomputes the loss and every gradient (float64 by default) and prints the relative
error of each: ||pope - torch|| / ||torch||.

Tolerances: a bf16 dump (GPU) passes with loss error <= 1e-2 and every gradient <= 5e-2; an
f32 or f64 dump (CPU) with 1e-5 and 1e-4.
Encodings: every model.position.kind of modeling_pope.py (all of pope's registry when written); a
dump of a kind it does not know exits 3, so that a caller looping over every kind tells "not
implemented here" from a failure.
With --pope-from-paper, every layer's attention of a PoPE dump is instead the paper's equations
written out here in complex arithmetic, sharing no code with modeling_pope.py's encoding:
q~_t = softplus(q_t) e^{i t theta}, k~_s = softplus(k_s) e^{i (s theta + delta)} with theta_c = base^{-c/d}
(c = 0..d-1) and delta in [-2 pi, 0] as model.position.pope.delta_bound says, scores
Re(q~_t . conj(k~_s)) times the softmax scale, causal softmax, times v.
Exit codes: 0 match, 1 mismatch, 2 unreadable dump or unsupported option, 3 encoding not
implemented here, 77 PyTorch missing.
Runs with PyTorch 1.13 (Debian's python3-torch, CPU) and 2.x.
"""
import argparse
import json
import math
import os
import sys

try:
    import torch
except ImportError:
    print("SKIP: PyTorch is not installed for this python (Debian: apt-get install python3-torch)")
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "python",
                                "pope_hf"))
import modeling_pope  # noqa: E402  (needs torch, checked above)

EXIT_MISMATCH = 1
EXIT_BAD_INPUT = 2
EXIT_UNIMPLEMENTED = 3
TOLERANCES = {"bf16": (1e-2, 5e-2)}  # activation dtype -> (loss, gradient); anything else:
FULL_PRECISION_TOLERANCES = (1e-5, 1e-4)


class DumpError(Exception):
    """The dump is unreadable, incomplete or describes a model this oracle does not implement."""


class Unimplemented(DumpError):
    """The dump's model.position.kind is not one this oracle implements."""


# ---- reading the dump ----------------------------------------------------------------------

def read_dump(path):
    """({name: tensor}, metadata) of a safetensors file."""
    try:
        return modeling_pope.read_safetensors(path, with_metadata=True)
    except OSError as error:
        raise DumpError(f"{path}: cannot read: {error}")
    except (ValueError, KeyError, TypeError) as error:
        raise DumpError(f"{path}: not a safetensors file: {error}")


def require(tensors, name, shape, path):
    if name not in tensors:
        raise DumpError(f"{path}: tensor '{name}' is missing")
    if list(tensors[name].shape) != list(shape):
        raise DumpError(f"{path}: tensor '{name}' has shape {list(tensors[name].shape)}, expected {list(shape)}")
    return tensors[name]


# ---- the model: python/pope_hf/modeling_pope.py, the file pope-export ships -------------------

def build_model(model, device, dtype):
    """pope's GPT for the dump's model config, in `dtype` on `device`."""
    try:
        return modeling_pope.PopeGPT(model).to(device=device, dtype=dtype)
    except modeling_pope.UnsupportedEncoding as error:
        raise Unimplemented(str(error))
    except modeling_pope.PopeConfigError as error:
        raise DumpError(f"the dump's config: {error}")


# ---- PoPE from the paper's equations (--pope-from-paper) ------------------------------------

def paper_pope_forward(block, position):
    """A replacement for Block.forward computing PoPE attention from the paper's equations."""
    pope = position["pope"]
    if pope["magnitude"] != "softplus" or not pope["learn_delta"]:
        raise Unimplemented("--pope-from-paper: the paper's PoPE has softplus magnitudes and a learned delta")
    bound = pope.get("delta_bound", "clamp")
    scale_2d = pope["scale"] == "inv_sqrt_2d"

    def forward(x):
        B, T, C = x.shape
        H = block.n_head
        d = C // H
        qkv = block.attn.qkv(block.attn_norm(x))
        q, k, v = (qkv[..., j * C:(j + 1) * C].reshape(B, T, H, d).transpose(1, 2) for j in range(3))
        theta = float(pope["base"]) ** (-torch.arange(d, dtype=torch.float64, device=x.device) / d)  # [d]
        angle = torch.arange(T, dtype=torch.float64, device=x.device)[:, None] * theta[None, :]     # [T, d]
        delta = block.position.delta.double()                                                  # [H, d]
        if bound == "clamp":
            delta = torch.clamp(delta, -2 * math.pi, 0.0)
        query = torch.nn.functional.softplus(q.double()) * torch.exp(1j * angle)               # [B, H, T, d]
        key = torch.nn.functional.softplus(k.double()) * torch.exp(1j * (angle[None] + delta[:, None, :]))
        scores = (query @ key.conj().transpose(-1, -2)).real / math.sqrt(2 * d if scale_2d else d)
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        weights = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
        y = (weights.to(v.dtype) @ v).transpose(1, 2).reshape(B, T, C)
        x = x + block.attn.proj(y)
        return x + block.mlp(block.mlp_norm(x))

    return forward


def use_paper_pope(net, model):
    if model["position"]["kind"] != "pope":
        raise Unimplemented(f"--pope-from-paper: the dump is {model['position']['kind']}, not pope")
    for block in net.layers:
        block.forward = paper_pope_forward(block, model["position"])


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
    parser.add_argument("--pope-from-paper", action="store_true",
                        help="PoPE attention from the paper's equations in complex arithmetic (a PoPE dump)")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but torch sees no CUDA device", file=sys.stderr)
        return EXIT_BAD_INPUT

    try:
        tensors, metadata = read_dump(args.dump)
        if metadata.get("format") != "pope-step-dump" or "config" not in metadata:
            raise DumpError(f"{args.dump}: metadata format is {metadata.get('format')!r}, expected 'pope-step-dump' "
                            "with the config (write it with pope-bench train --dump-step)")
        model_config = json.loads(metadata["config"])["model"]
        net = build_model(model_config, args.device, dtype)
        if args.pope_from_paper:
            use_paper_pope(net, model_config)
        parameters = dict(net.named_parameters())
        if "tokens" not in tensors or tensors["tokens"].dim() != 2:
            raise DumpError(f"{args.dump}: expected a tensor 'tokens' of shape [B, T]")
        require(tensors, "targets", tensors["tokens"].shape, args.dump)
        vocab = model_config["vocab_size"]
        if not (0 <= tensors["tokens"].min() and tensors["tokens"].max() < vocab and tensors["targets"].max() < vocab):
            raise DumpError(f"{args.dump}: token or target ids outside the vocabulary [0, {vocab})")
        require(tensors, "loss", [], args.dump)
        for name, parameter in parameters.items():
            require(tensors, name, parameter.shape, args.dump)
            require(tensors, "grad." + name, parameter.shape, args.dump)
        unexpected = sorted(set(tensors) - set(parameters) - {"grad." + n for n in parameters} -
                            {"tokens", "targets", "loss"})
        if unexpected:
            raise DumpError(f"{args.dump}: tensors this model does not have: {', '.join(unexpected)}")
        with torch.no_grad():
            for name, parameter in parameters.items():
                parameter.copy_(tensors[name].to(dtype))
        loss = net.pope_loss(tensors["tokens"].to(args.device), tensors["targets"].to(args.device))
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
    print(f"{args.dump}: {model_config['position']['kind']}, {model_config['n_layer']} layers, n_embd "
          f"{model_config['n_embd']}, {B} x {T} tokens; pope {metadata.get('backend', '?')} ({activation}) vs torch "
          f"{torch.__version__} {args.dtype} on {args.device}")
    loss_error = relative_error(tensors["loss"], loss.detach().cpu())
    print(f"loss: pope {tensors['loss'].item():.6f} torch {loss.item():.6f} rel error {loss_error:.2e} "
          f"(tolerance {loss_tolerance:g})")
    failures = [] if loss_error <= loss_tolerance else ["loss"]
    print(f"\n| gradient | rel error (tolerance {grad_tolerance:g}) |\n|---|---:|")
    for name, parameter in parameters.items():
        # A parameter the loss does not reach (a disabled PJ-bias sector's) has no gradient: pope's is 0.
        grad = parameter.grad if parameter.grad is not None else torch.zeros_like(parameter)
        error = relative_error(tensors["grad." + name], grad.detach().cpu())
        flag = "" if error <= grad_tolerance else "  FAIL"
        print(f"| grad.{name} | {error:.2e}{flag} |")
        if flag:
            failures.append("grad." + name)
    if failures:
        print(f"\nMISMATCH: {', '.join(failures)}")
        return EXIT_MISMATCH
    print(f"\nOK: loss and {len(parameters)} gradients match")
    return 0


if __name__ == "__main__":
    sys.exit(main())
