"""The shell scripts the `modal-sandbox` provider runs inside a sandbox, with `bash -c`.

Each takes one argument and is idempotent: a re-run create runs it again and it skips the work a
run before it finished. Nothing secret is passed as an argument: what is secret arrives on stdin.
"""

# $1 is the target directory; the clone URL arrives on stdin. The lock makes a re-run wait for a
# clone an interrupted create left running; the rename makes a half-finished clone invisible.
CLONE_SCRIPT = """set -euo pipefail
exec 2>&1
target=$1
mkdir -p "$(dirname "$target")"
exec 9>"$target.lock"
flock 9
if [ -d "$target/.git" ]; then echo "The project is already cloned"; exit 0; fi
rm -rf "$target.partial"
IFS= read -r url
git clone --no-progress -- "$url" "$target.partial"
mv "$target.partial" "$target"
"""

# $1 is the clone. The marker lives in .git so it never shows as an untracked file.
SETUP_SCRIPT = """set -euo pipefail
exec 2>&1
cd "$1"
exec 9>.git/bb-setup.lock
flock 9
if [ -e .git/bb-setup-done ]; then echo ".bb-env-setup.sh already ran"; exit 0; fi
if [ ! -f .bb-env-setup.sh ]; then echo "No .bb-env-setup.sh"; exit 0; fi
bash ./.bb-env-setup.sh </dev/null
touch .git/bb-setup-done
"""
