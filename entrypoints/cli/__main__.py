"""`python -m bb_environments.entrypoints.cli`, as `bb` was started before entrypoints/bb.py."""

from bb_environments.entrypoints.cli import main

main()
