# Sourced by the scripts that run what cargo built: cargo_target_dir prints
# cargo's target folder for this checkout as cargo itself reports it
# (CARGO_TARGET_DIR, a config's build.target-dir, else target/), so a
# shared target folder works as well as the default.
cargo_target_dir() {
  cargo metadata --format-version 1 --no-deps \
    | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])'
}
