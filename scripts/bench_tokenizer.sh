#!/usr/bin/env bash
# Tokenizer throughput: `pope-data tokenize` on 1, 2, … cores against js-tiktoken@1.0.21 (gpt2)
# on one core, over the same text. Prints a Markdown table for docs/benchmarks.md.
#
# Usage: scripts/bench_tokenizer.sh [TEXT_DIR]   (default: data/sources/books from fetch_data.sh)
# Env: POPE_DATA (the pope-data binary; default: the first build/*/src/pope-data), REPEATS (3).
# Each figure is the best of REPEATS runs; pope-data's figures are its own summary (text bytes over
# the wall time after the tokenizer is loaded, and over the CPU time of all its threads, which a
# busy machine does not distort); js-tiktoken's is timed around encode() alone.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
text_dir="${1:-$repo/data/sources/books}"
repeats="${REPEATS:-3}"
[[ -d "$text_dir" ]] || { echo "error: $text_dir missing: run scripts/fetch_data.sh" >&2; exit 2; }

pope_data="${POPE_DATA:-$(compgen -G "$repo/build/*/src/pope-data" | head -1 || true)}"
[[ -x "$pope_data" ]] || { echo "error: pope-data not built (or set POPE_DATA)" >&2; exit 2; }
oracle_dir="$repo/data/tokenizer/oracle"
if [[ ! -f "$oracle_dir/node_modules/js-tiktoken/package.json" ]]; then
  npm install --silent --no-save --prefix "$oracle_dir" js-tiktoken@1.0.21 >/dev/null
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
megabytes="$(find "$text_dir" -type f ! -name '.*' -printf '%s\n' | awk '{s += $1} END {printf "%.1f", s / 1e6}')"

js_rate() {
  NODE_PATH="$oracle_dir/node_modules" node -e '
    const fs = require("fs"), path = require("path");
    const enc = require("js-tiktoken").getEncoding("gpt2");
    const walk = (d) => fs.readdirSync(d).sort().flatMap((n) => {
      const p = path.join(d, n);
      if (n.startsWith(".")) return [];
      return fs.statSync(p).isDirectory() ? walk(p) : [p];
    });
    const texts = walk(process.argv[1]).map((f) => fs.readFileSync(f, "utf8"));
    const bytes = texts.reduce((s, t) => s + Buffer.byteLength(t), 0);
    const t0 = process.hrtime.bigint();
    for (const t of texts) enc.encode(t, [], []);
    console.log((bytes / 1e6 / (Number(process.hrtime.bigint() - t0) / 1e9)).toFixed(2));
  ' "$text_dir"
}

# pope_rates CORES: "WALL_MB_PER_S CPU_MB_PER_S" from pope-data's summary line.
pope_rates() {
  "$pope_data" tokenize -i "$text_dir" -o "$tmp/out" --shard-tokens 0 --val-fraction 0 --overwrite -j "$1" |
    sed -n 's/.* = \([0-9.]*\) MB\/s (\([0-9.]*\) MB per CPU-second).*/\1 \2/p'
}

js="$(for _ in $(seq "$repeats"); do js_rate; done | sort -g | tail -1)"
echo "Text: $text_dir ($megabytes MB); $(nproc) cores; best of $repeats runs"
echo
echo "| tokenizer | threads | MB/s (wall) | × js-tiktoken | MB per CPU-second |"
echo "|---|---:|---:|---:|---:|"
echo "| js-tiktoken@1.0.21 (node $(node --version)) | 1 | $js | 1.0 | $js |"
for threads in $(seq 1 "$(nproc)"); do
  rates="$(for _ in $(seq "$repeats"); do pope_rates "$threads"; done | sort -g | tail -1)"
  awk -v w="${rates% *}" -v c="${rates#* }" -v j="$js" -v t="$threads" \
    'BEGIN {printf "| pope-data tokenize | %d | %.2f | %.1f | %.2f |\n", t, w, w / j, c}'
done
