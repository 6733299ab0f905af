#!/usr/bin/env python3
"""Helpers of tests/cli/test_pope_export.sh.

  export_check.py jitter MODEL.safetensors SEED
      Perturbs a checkpoint's F32 weights in place (python's standard library only), so that the
      positions shape the output: the fused q/k/v projections get N(0, 0.25) noise (larger q and k
      make the attention depend on the positions, instead of nearly uniform at the init's 0.02), the
      attention output projections N(0, 0.2) and the embedding N(0, 0.3) (so that attention reaches
      the logits), norm gains and positional parameters N(0, 0.3) (away from their exact 1 and 0
      inits). Without it a wrong RoPE base moved the NLL by about 1e-4 relative; with it by 1e-2.

  export_check.py compare CASES.json
      For each case {name, dir, eval_json, book, tolerance, expect_mismatch, variant}: loads the
      exported folder with modeling_pope.PopeGPT.from_pretrained (plain PyTorch, float32, CPU),
      recomputes pope-eval's windows (window w of a length L reads tokens [wL, wL + L] of the book)
      and compares the mean NLL and the tail NLL of every length with pope-eval's --json, relative
      error against the tolerance. Where transformers imports, it also loads the folder with
      AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True) and compares its logits and
      loss with the plain model's. Checks config.json's keys, the weights' dtypes and, when present,
      the tokenizer files. Prints one row per case and length; exit 0 when every case matches (and
      every expect_mismatch case does not), 1 otherwise, 77 without torch.
"""
import json
import math
import os
import random
import struct
import sys


def read_header(blob):
    (length,) = struct.unpack_from("<Q", blob, 0)
    return length, json.loads(blob[8:8 + length].decode("utf-8"))


def jitter(path, seed):
    blob = bytearray(open(path, "rb").read())
    length, header = read_header(blob)
    start = 8 + length
    rng = random.Random(seed)
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        assert entry["dtype"] == "F32", (name, entry["dtype"])
        if name.endswith("attn.qkv.weight"):
            std = 0.25
        elif name.endswith("attn.proj.weight") or name == "wte.weight":
            std = 0.2 if name.endswith("proj.weight") else 0.3
        elif len(entry["shape"]) == 1 or ".position." in name:
            std = 0.3
        else:
            continue
        begin, end = entry["data_offsets"]
        count = (end - begin) // 4
        values = struct.unpack_from(f"<{count}f", blob, start + begin)
        struct.pack_into(f"<{count}f", blob, start + begin, *(v + rng.gauss(0.0, std) for v in values))
    with open(path, "wb") as f:
        f.write(blob)


def read_book(path):
    import array
    data = open(path, "rb").read()
    if len(data) >= 1024 and struct.unpack_from("<i", data, 0)[0] == 20240520:   # llm.c shard
        count = struct.unpack_from("<i", data, 8)[0]
        tokens = array.array("H")
        tokens.frombytes(data[1024:1024 + 2 * count])
        return list(tokens)
    tokens = array.array("H")
    tokens.frombytes(data)
    return list(tokens)


def relative(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


def check_folder(case, modeling_pope, problems):
    """config.json, dtypes and tokenizer files of an exported folder."""
    folder = case["dir"]
    config = json.load(open(os.path.join(folder, "config.json")))
    model = config["pope_config"]["model"]
    expected = {"model_type": "pope", "architectures": ["PopeForCausalLM"],
                "auto_map": {"AutoConfig": "modeling_pope.PopeConfig",
                             "AutoModelForCausalLM": "modeling_pope.PopeForCausalLM"},
                "vocab_size": model["vocab_size"], "padded_vocab_size": model["padded_vocab_size"],
                "hidden_size": model["n_embd"], "num_hidden_layers": model["n_layer"],
                "num_attention_heads": model["n_head"], "rms_norm_eps": model["norm_eps"],
                "max_position_embeddings": config["pope_config"]["train"]["seq_len"],
                "position_encoding": model["position"]["kind"], "tie_word_embeddings": True}
    for key, value in expected.items():
        if config.get(key) != value:
            problems.append(f"{case['name']}: config.json {key} = {config.get(key)!r}, expected {value!r}")
    tensors, metadata = modeling_pope.read_safetensors(os.path.join(folder, "model.safetensors"), with_metadata=True)
    if metadata.get("format") != "pt":
        problems.append(f"{case['name']}: model.safetensors metadata format {metadata.get('format')!r}, expected 'pt'")
    bf16 = config["pope_export"]["dtype"] == "bf16"
    for name, tensor in tensors.items():
        want = "torch.float32" if (not bf16 or ".position." in name) else "torch.bfloat16"
        if str(tensor.dtype) != want:
            problems.append(f"{case['name']}: {name} is {tensor.dtype}, expected {want}")
    if os.path.exists(os.path.join(folder, "vocab.json")):
        vocab = json.load(open(os.path.join(folder, "vocab.json"), encoding="utf-8"))
        merges = open(os.path.join(folder, "merges.txt"), encoding="utf-8").read().split("\n")
        tokenizer = json.load(open(os.path.join(folder, "tokenizer_config.json")))
        special = json.load(open(os.path.join(folder, "special_tokens_map.json")))
        if len(vocab) != 50257 or vocab.get("<|endoftext|>") != 50256 or vocab.get("Ġthe") != 262:
            problems.append(f"{case['name']}: vocab.json is not GPT-2's ({len(vocab)} entries)")
        if not merges[0].startswith("#version") or len([m for m in merges[1:] if m]) != 50000:
            problems.append(f"{case['name']}: merges.txt is not GPT-2's")
        for what, table in (("tokenizer_config.json", tokenizer), ("special_tokens_map.json", special)):
            if table.get("eos_token") != "<|endoftext|>" or table.get("bos_token") != "<|endoftext|>":
                problems.append(f"{case['name']}: {what} does not name <|endoftext|>")
        if config.get("eos_token_id") != 50256 or config.get("bos_token_id") != 50256:
            problems.append(f"{case['name']}: config.json lacks bos/eos_token_id 50256")
    return config


def remote_code_imports(path):
    """The packages transformers' remote-code loader requires for a modeling file: import statements
    outside try blocks, found as its releases find them (a regex that skips `try: … except:` blocks on
    one line, one that skips any try block, and an AST walk)."""
    import ast
    import re
    content = open(path, encoding="utf-8").read()
    found = set()
    for text in (re.sub(r"\s*try\s*:\s*.*?\s*except\s*:", "", content, flags=re.MULTILINE),
                 re.sub(r"\s*try\s*:.*?except.*?:", "", content, flags=re.DOTALL)):
        names = re.findall(r"^\s*import\s+(\S+)\s*$", text, flags=re.MULTILINE)
        names += re.findall(r"^\s*from\s+(\S+)\s+import", text, flags=re.MULTILINE)
        found |= {name.split(".")[0] for name in names if not name.startswith(".")}
    for node in ast.walk(ast.parse(content)):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def compare(cases_path):
    try:
        import torch
    except ImportError:
        print("SKIP: no torch for this python")
        return 77
    here = os.path.dirname(os.path.abspath(__file__))
    cases = json.load(open(cases_path))
    sys.path.insert(0, cases[0]["dir"])   # the modeling file as exported (they are all the same file)
    import modeling_pope
    transformers = None
    if modeling_pope.HAVE_TRANSFORMERS:
        import transformers
    torch.set_num_threads(1)
    problems, rows, worst = [], [], {}
    stdlib = set(getattr(sys, "stdlib_module_names", ()))   # python 3.10+
    extra = remote_code_imports(os.path.join(cases[0]["dir"], "modeling_pope.py")) - stdlib - {"torch"}
    if stdlib and extra:
        problems.append(f"modeling_pope.py imports {sorted(extra)} with statements outside try blocks: "
                        "transformers' remote-code loader would require them")
    print(f"torch {torch.__version__}, transformers {transformers.__version__ if transformers else 'not installed'}; "
          f"modeling file {modeling_pope.__file__}")
    print("| case | length | windows | pope NLL | torch NLL | rel error | tail rel error | tolerance | |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for case in cases:
        check_folder(case, modeling_pope, problems)
        model = modeling_pope.PopeGPT.from_pretrained(case["dir"], dtype=torch.float32)
        hf_model = None
        if transformers is not None:
            hf_model = transformers.AutoModelForCausalLM.from_pretrained(case["dir"], trust_remote_code=True,
                                                                         torch_dtype=torch.float32).eval()
        report = json.load(open(case["eval_json"]))
        tail = report["tail"]
        book = torch.tensor(read_book(case["book"]), dtype=torch.long)
        case_error = 0.0
        for result in report["curves"][0]["results"]:
            L = result["length"]
            windows = (len(book) - 1) // L
            if windows != result["windows"]:
                problems.append(f"{case['name']}: length {L}: {windows} windows here, pope-eval had "
                                f"{result['windows']}")
                continue
            inputs = torch.stack([book[w * L:w * L + L] for w in range(windows)])
            targets = torch.stack([book[w * L + 1:w * L + L + 1] for w in range(windows)])
            with torch.no_grad():
                nll = model.token_nll(inputs, targets).double()
                if hf_model is not None:
                    logits = model(inputs)
                    hf = hf_model(input_ids=inputs, labels=inputs)
                    error = (hf.logits - logits).abs().max().item() / logits.abs().max().item()
                    shifted = nll[:, :-1].mean().item()
                    if error > 1e-6 or relative(hf.loss.item(), shifted) > 1e-5:
                        problems.append(f"{case['name']}: transformers' logits differ from the plain model's by "
                                        f"{error:.2e} (loss {hf.loss.item()} vs {shifted})")
            mean = nll.sum().item() / nll.numel()
            tail_start = max(0, L - tail)
            tail_mean = nll[:, tail_start:].mean().item()
            error = relative(mean, result["nll"])
            tail_error = relative(tail_mean, result["tail_nll"])
            case_error = max(case_error, error, tail_error)
            flag = "" if max(error, tail_error) <= case["tolerance"] else "over"
            rows.append(flag)
            print(f"| {case['name']} | {L} | {windows} | {result['nll']:.6f} | {mean:.6f} | {error:.2e} | "
                  f"{tail_error:.2e} | {case['tolerance']:g} | {flag} |")
        worst[case["name"]] = case_error
        matched = case_error <= case["tolerance"]
        if case.get("expect_mismatch"):
            if matched:
                problems.append(f"{case['name']}: a tampered export matched pope (error {case_error:.2e}): the check "
                                "cannot see this change")
        elif not matched:
            problems.append(f"{case['name']}: max relative error {case_error:.2e} over the tolerance "
                            f"{case['tolerance']:g}")
    plain = {k: v for k, v in worst.items() if not any(c["name"] == k and c.get("expect_mismatch") for c in cases)}
    for dtype in ("f32", "bf16"):
        errors = [worst[c["name"]] for c in cases if c["name"] in plain and c.get("dtype", "f32") == dtype]
        if errors:
            print(f"{dtype}: {len(errors)} exports, max relative error {max(errors):.2e}")
    if problems:
        print("\n".join(["MISMATCH:"] + problems))
        return 1
    print(f"OK: {len(cases)} exports checked"
          + (" (plain PyTorch and transformers)" if transformers else " (plain PyTorch; transformers not installed)"))
    return 0


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "jitter":
        jitter(sys.argv[2], int(sys.argv[3]))
        return 0
    if len(sys.argv) == 3 and sys.argv[1] == "compare":
        return compare(sys.argv[2])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
