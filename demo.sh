#!/usr/bin/env bash
# The main job on the embedded default: spawn a worktree environment for a throwaway repository,
# show it ready, archive its thread, show it removed, and print the event log.
set -euo pipefail

work=$(mktemp -d)
export BB_DATA_DIR="$work/data" BB_RETIRE_GRACE_MS=0
repo="$work/repo"

git init --quiet --initial-branch=main "$repo"
printf 'echo "installing dependencies for $(basename "$PWD")"\n' > "$repo/.bb-env-setup.sh"
printf 'echo "tearing down"\n' > "$repo/.bb-env-teardown.sh"
git -C "$repo" add -A
git -C "$repo" -c user.name=demo -c user.email=demo@example.com commit --quiet -m "a project with hooks"

bb serve 2> "$work/serve.log" &
service=$!
trap 'kill $service 2>/dev/null; wait $service 2>/dev/null; rm -rf "$work"' EXIT
until [ -s "$BB_DATA_DIR/server.json" ]; do sleep 0.1; done

echo "== providers"; bb environment providers
echo "== spawn (progress streams to stderr)"
environment=$(bb thread spawn --environment-provider git-worktree --project "$repo" --thread-id demo \
  --wait --json | python3 -c 'import json, sys; print(json.load(sys.stdin)["environmentId"])')
echo "== ready"; bb environment show "$environment"
echo "== archive"; bb thread archive demo
until bb environment show "$environment" --json | grep -q '"status": "removed"'; do sleep 0.2; done
echo "== removed"; bb environment show "$environment"
echo "== worktrees left in the repository"; git -C "$repo" worktree list
echo "== event log"; bb events export
