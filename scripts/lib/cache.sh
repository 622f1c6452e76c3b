# Sourced by the test and build scripts: where caches that outlive a
# checkout live, and a content hash to key them by.
#
# RESHARD_CACHE defaults to /var/cache/reshard (CI runs as root), or
# ~/.cache/reshard where that cannot be written.
if [ -z "${RESHARD_CACHE:-}" ]; then
  if mkdir -p /var/cache/reshard 2>/dev/null && [ -w /var/cache/reshard ]; then
    RESHARD_CACHE=/var/cache/reshard
  else
    RESHARD_CACHE="$HOME/.cache/reshard"
  fi
fi
mkdir -p "$RESHARD_CACHE"
export RESHARD_CACHE

# hash_of FILE...: the first 16 hex digits of the sha256 of the files' contents.
hash_of() {
  cat "$@" | sha256sum | cut -c1-16
}
