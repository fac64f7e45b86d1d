#!/usr/bin/env bash
# The main job on the embedded default: spawn a worktree environment for a throwaway repository,
# show it ready, archive its thread, show it removed, and print the event log. Everything it makes
# lives in one temporary directory, removed at the end with the `bb serve` it started (and that
# service's nats-server), however the script ends.
set -euo pipefail

work=$(mktemp -d)
service=
cleanup() {
  if [ -n "$service" ]; then
    kill "$service" 2>/dev/null || true  # SIGTERM: bb serve stops its nats-server with it
    wait "$service" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
# A grace of 0 ms: an environment whose last thread leaves is removed at once (the providers'
# own grace is minutes); `environment providers` shows the grace in force.
export BB_DATA_DIR="$work/data" BB_RETIRE_GRACE_MS=0
repo="$work/repo"

git init --quiet --initial-branch=main "$repo"
printf 'echo "installing dependencies for $(basename "$PWD")"\n' > "$repo/.bb-env-setup.sh"
printf 'echo "tearing down"\n' > "$repo/.bb-env-teardown.sh"
git -C "$repo" add -A
git -C "$repo" -c user.name=demo -c user.email=demo@example.com commit --quiet -m "a project with hooks"

bb serve 2> "$work/serve.log" &
service=$!
until [ -s "$BB_DATA_DIR/server.json" ]; do
  if ! kill -0 "$service" 2>/dev/null; then echo "bb serve did not start:" >&2; cat "$work/serve.log" >&2; exit 1; fi
  sleep 0.1
done

echo "== providers (BB_RETIRE_GRACE_MS=0: the retire grace in force is 0 ms)"; bb environment providers
echo "== spawn (progress streams to stderr)"
environment=$(bb thread spawn --environment-provider git-worktree --project "$repo" --thread-id demo \
  --wait --json | python3 -c 'import json, sys; print(json.load(sys.stdin)["environmentId"])')
echo "== ready"; bb environment show "$environment"
echo "== archive (its environment retires at once, its grace being 0 ms)"
bb thread archive demo --wait --timeout 120
echo "== removed"; bb environment show "$environment"
echo "== its transcript"; bb environment logs "$environment"
echo "== worktrees left in the repository"; git -C "$repo" worktree list
echo "== event log"; bb events export
