#!/usr/bin/env bash
# Plots the training and validation loss of one or more pope-train runs from their metrics.jsonl
# (src/runtime/trainer.cpp writes it: "train" records' loss, "eval" records' val_loss) to a PNG,
# one colour per run labelled by its directory name: training loss as a line, validation loss
# as dashed line with markers.
#   scripts/plot_loss.sh RUN... -o PNG [--x step|tokens] [--log-y] [--title TEXT]
# RUN is a run directory or its metrics.jsonl. --x tokens counts train.batch_size × train.seq_len
# tokens per step, read from the run's config.json. A line that is not a JSON object is an error
# naming the file and line, except a torn last line (no newline: the run was killed mid-write),
# which is skipped with a warning. Needs python3 and gnuplot (scripts/setup.sh installs gnuplot-nox).
# Exit codes: 0 written, 1 unreadable or malformed input or a gnuplot failure, 2 usage error.
set -euo pipefail

me=plot_loss.sh
usage() { echo "usage: scripts/plot_loss.sh RUN... -o PNG [--x step|tokens] [--log-y] [--title TEXT]" >&2; exit 2; }

runs=() png="" x=step log_y=0 title=""
while [ $# -gt 0 ]; do
  case "$1" in
    -o|--output) [ $# -ge 2 ] || usage; png=$2; shift 2 ;;
    --x) [ $# -ge 2 ] || usage; x=$2; shift 2 ;;
    --log-y) log_y=1; shift ;;
    --title) [ $# -ge 2 ] || usage; title=$2; shift 2 ;;
    -h|--help) sed -n '2,11s/^# \{0,1\}//p' "$0"; exit 0 ;;
    -*) echo "$me: unknown option $1" >&2; usage ;;
    *) runs+=("$1"); shift ;;
  esac
done
[ ${#runs[@]} -gt 0 ] || { echo "$me: no run given" >&2; usage; }
[ -n "$png" ] || { echo "$me: -o PNG is required" >&2; usage; }
case "$x" in step|tokens) ;; *) echo "$me: --x $x: expected step or tokens" >&2; usage ;; esac
[ -d "$(dirname "$png")" ] || { echo "$me: -o $png: the directory $(dirname "$png") does not exist" >&2; exit 2; }
command -v python3 >/dev/null 2>&1 || { echo "$me: python3 is not installed (scripts/setup.sh installs it)" >&2; exit 1; }

# The gnuplot program, data included, or an error naming the file and line (python exits 1).
tmp="$png.tmp.png"
program="$(python3 - "$tmp" "$x" "$log_y" "$title" "${runs[@]}" <<'PY'
import json, math, os, sys

tmp, x_mode, log_y, title, runs = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4], sys.argv[5:]

def die(message):
    sys.stderr.write(f"plot_loss.sh: {message}\n")
    sys.exit(1)

def quoted(text):  # a gnuplot double-quoted string; the terminal is noenhanced
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'

def number(value):  # a loss: a number, or null (nlohmann's NaN/inf), which is not drawn
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))

def tokens_per_step(run_dir):
    path = os.path.join(run_dir, "config.json")
    try:
        with open(path, encoding="utf-8") as f:
            train = json.load(f)["train"]
        per_step = int(train["batch_size"]) * int(train["seq_len"])
    except OSError as e:
        die(f"--x tokens: cannot read {path}: {e.strerror}")
    except (ValueError, KeyError, TypeError):
        die(f"--x tokens: {path} holds no train.batch_size and train.seq_len (expected pope-train's resolved config)")
    return per_step

def read_run(spec):
    is_file = os.path.basename(spec) == "metrics.jsonl" and not os.path.isdir(spec)
    path = spec if is_file else os.path.join(spec, "metrics.jsonl")
    run_dir = os.path.dirname(os.path.abspath(path))
    if not os.path.lexists(path):
        die(f"{path}: no such file (expected a pope-train run directory or its metrics.jsonl)")
    if not os.path.isfile(path):  # a FIFO or a device would block or never end
        die(f"{path}: not a regular file (expected a pope-train run directory or its metrics.jsonl)")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        die(f"cannot read {path}: {e.strerror}")
    if not data.strip():
        die(f"{path} is empty: the run logged nothing yet")
    lines = data.split(b"\n")
    torn = lines[-1] != b""  # the file does not end in a newline
    if not torn:
        lines.pop()
    train, val = [], []
    for line_number, raw in enumerate(lines, 1):
        try:
            record = json.loads(raw.decode("utf-8", errors="replace"))
            if not isinstance(record, dict):
                raise ValueError("not an object")
        except ValueError:
            if torn and line_number == len(lines):
                sys.stderr.write(f"plot_loss.sh: warning: {path}:{line_number}: skipping the torn last line (the run "
                                 "stopped mid-write)\n")
                continue
            die(f"{path}:{line_number}: not a JSON object: {raw[:80].decode('utf-8', errors='replace')!r}")
        event = record.get("event")
        key = {"train": "loss", "eval": "val_loss"}.get(event)
        if key is None:
            continue  # sample, skip and summary records
        step = record.get("step")
        if not isinstance(step, int) or isinstance(step, bool) or step < 0 or not number(record.get(key, "")):
            die(f"{path}:{line_number}: a \"{event}\" record needs an integer step >= 0 and a numeric {key}")
        if record[key] is not None and math.isfinite(record[key]):
            (train if event == "train" else val).append((step, record[key]))
    if not train and not val:
        die(f"{path} holds no \"train\" or \"eval\" record with a finite loss")
    scale = tokens_per_step(run_dir) if x_mode == "tokens" else 1
    return os.path.basename(run_dir), [(s * scale, v) for s, v in train], [(s * scale, v) for s, v in val]

curves = [read_run(spec) for spec in runs]
names = [c[0] for c in curves]
# Two runs of one name (runs/a/rope, runs/b/rope) are told apart by the path given.
labels = [spec.rstrip("/") if names.count(c[0]) > 1 else c[0] for spec, c in zip(runs, curves)]

out = ['set terminal pngcairo size 1000,650 noenhanced font ",11"', f"set output {quoted(tmp)}",
       "set grid xtics ytics mytics", "set key top right box opaque",
       "set xlabel " + quoted("training step" if x_mode == "step" else "training tokens"),
       "set ylabel " + quoted("loss (nats/token, log scale)" if log_y else "loss (nats/token)"),
       "set title " + quoted(title or "Training (lines) and validation (dashed, markers) loss")]
if log_y:
    out.append("set logscale y")
if x_mode == "tokens":
    out.append("set format x '%.1s%c'")
plots = []
for i, ((_, train, val), label) in enumerate(zip(curves, labels)):
    for kind, points, style in (("train", train, "lines linewidth 2"),
                                ("val", val, "linespoints dashtype 2 pointtype 7 pointsize 0.8 linewidth 2")):
        if not points:
            continue
        out.append(f"${kind}{i} << EOD")
        out.extend(f"{s} {v!r}" for s, v in sorted(points))
        out.append("EOD")
        plots.append(f"${kind}{i} using 1:2 with {style} linecolor {i + 1} title {quoted(label + ' ' + kind)}")
out.append("plot " + ", ".join(plots))
print("\n".join(out))
PY
)" || exit 1

command -v gnuplot >/dev/null 2>&1 ||
  { echo "$me: gnuplot is not installed (Debian: apt-get install gnuplot-nox, see scripts/setup.sh)" >&2; exit 1; }
# gnuplot writes a temporary file renamed over PNG: a reader never sees a half-written plot.
trap 'rm -f "$tmp"' EXIT
if ! messages="$(gnuplot <<<"$program" 2>&1)" || [ ! -s "$tmp" ]; then
  echo "$me: gnuplot failed writing $png: $messages" >&2
  exit 1
fi
mv "$tmp" "$png"
trap - EXIT
echo "wrote $png (${#runs[@]} run(s), x = $x)"
