# Sourced by the prepared device scripts (run.sh, run_mask_causal.sh, run_rows.sh), from the
# repository root: copy_tree DIR makes DIR a fresh copy of the working tree without its build
# outputs, .git or the scratch trees these scripts make (top-level names starting with "_").
copy_tree() {
  rm -rf "$1" && mkdir "$1" &&
    tar --exclude='./_*' --exclude=./build --exclude=./build-probe --exclude=./.git --exclude=./gpu-out -cf - . |
    tar -xf - -C "$1"
}
