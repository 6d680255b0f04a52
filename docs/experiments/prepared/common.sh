# Sourced by the prepared device scripts (run.sh, run_mask_causal.sh, run_rows.sh) from the
# repository root: their settings (P: this folder; OUT: where results go; sha: the commit, from
# .git-sha) and copy_tree DIR, which makes DIR a fresh copy of the working tree without its build
# outputs, .git or the scratch trees these scripts make (top-level names starting with "_").
set -uo pipefail
P=docs/experiments/prepared
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
sha=$(cat .git-sha 2>/dev/null || echo unknown)
copy_tree() {
  rm -rf "$1" && mkdir "$1" &&
    tar --exclude='./_*' --exclude=./build --exclude=./build-probe --exclude=./.git --exclude=./gpu-out -cf - . |
    tar -xf - -C "$1"
}
