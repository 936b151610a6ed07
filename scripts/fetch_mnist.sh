#!/usr/bin/env bash
# Gets the four MNIST IDX files (gzipped) into DEST (default data/mnist) and
# verifies the SHA-256 of each file's contents. Sources, in order: DEST itself
# (nothing to do), a local copy ($MNIST_SOURCE_DIR, default ../shared/data/mnist
# beside the checkout), then the public mirrors ($MNIST_MIRRORS, space-separated).
# Each file lands under a temporary name and is renamed only once verified.
# Usage: scripts/fetch_mnist.sh [DEST]
set -euo pipefail
cd "$(dirname "$0")/.."
dest="${1:-data/mnist}"
source_dir="${MNIST_SOURCE_DIR:-../shared/data/mnist}"
read -r -a mirrors <<< "${MNIST_MIRRORS-https://ossci-datasets.s3.amazonaws.com/mnist https://storage.googleapis.com/cvdf-datasets/mnist}"
# SHA-256 of the decompressed IDX files (the gzip wrapping differs between mirrors).
declare -A sha=(
  [train-images-idx3-ubyte]=ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db
  [train-labels-idx1-ubyte]=65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5
  [t10k-images-idx3-ubyte]=0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7
  [t10k-labels-idx1-ubyte]=ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2
)

verified() {  # verified FILE SHA: the gzip's contents have that SHA-256
  [ -f "$1" ] && [ "$(gunzip -c "$1" 2>/dev/null | sha256sum | cut -d' ' -f1)" = "$2" ]
}

mkdir -p "$dest"
for name in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
  file="$dest/$name.gz"
  want="${sha[$name]}"
  verified "$file" "$want" && continue
  tmp="$file.part.$$"
  trap 'rm -f "$tmp"' EXIT
  got=""
  if [ -f "$source_dir/$name.gz" ] && cp "$source_dir/$name.gz" "$tmp" && verified "$tmp" "$want"; then
    got="$source_dir"
  else
    for mirror in "${mirrors[@]}"; do
      if curl -fsSL --connect-timeout 10 --max-time 300 --retry 2 -o "$tmp" "$mirror/$name.gz" && verified "$tmp" "$want"; then
        got="$mirror"
        break
      fi
    done
  fi
  if [ -z "$got" ]; then
    echo "fetch_mnist: could not get $name.gz with contents of SHA-256 $want (tried $source_dir and: ${mirrors[*]:-no mirrors})" >&2
    exit 1
  fi
  mv "$tmp" "$file"
  trap - EXIT
  echo "fetch_mnist: $file from $got (SHA-256 verified)"
done
echo "fetch_mnist: the four MNIST files in $dest are verified"
