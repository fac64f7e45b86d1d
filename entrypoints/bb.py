"""The `bb` console script: entrypoints/cli/'s command line, with the garbage collector kept out
of the imports and of the exit.

A `bb` command that sends one request spends most of its life importing (click, msgspec, the
commands' definitions) and then exiting. The collector would scan the young objects of those
imports over and over while nothing cyclic is freed (about a twentieth of such a command's
instructions), and again as the interpreter shuts down (another tenth). So the imports run with it
off, and what they made is frozen (gc.freeze: never scanned again) before the command runs with it
on; what the command itself made is frozen at exit, when the process is about to end anyway.
The few cycles the imports leave as garbage (some 460 objects) are frozen with the rest and kept:
once, and bounded, also for `bb serve`, whose own modules are imported by its command, with the
collector on. Objects in cycles at exit are not finalized (`__del__`, a suspended generator's
`finally`): what must happen at exit is closed explicitly, or registered with weakref.finalize or
atexit, as everything in this package is.
"""

from __future__ import annotations

import gc


def main() -> None:
    """A process's entry only: what it freezes is never collected again."""
    gc.disable()
    try:
        from bb_environments.entrypoints.cli import main as run
    finally:
        gc.freeze()
        gc.enable()
    try:
        run()
    finally:
        gc.freeze()


if __name__ == "__main__":
    main()
