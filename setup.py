"""The compiled build: with PAIRMQ_MYPYC=1, the per-message path is compiled by mypyc into
extension modules that Python imports instead of the sources beside them.

The metadata is in pyproject.toml; this file only adds those modules. Without the
variable (`pip install pairmq`, the editable install of the virtualenv) nothing is
compiled and pairmq is the pure-Python package. `make compiled` builds it into
build/compiled with the virtualenv's mypyc (the `dev` extra) and a C compiler;
docs/operations.md, "The compiled build", says what it gains and how to run it.
"""

import os
from pathlib import Path

from setuptools import setup

# What a message passes through (docs/benchmarks.md, "mypyc, end to end"): protocol/,
# core/ (the Broker and its parts), the STOMP connection and its parts, its frame encoding,
# the journal's records, store and writer, the role that applies frames and flushes, the
# clock, the loop's lag watch and the stepped garbage collector.
COMPILED = ("pairmq/protocol/*.py", "pairmq/core/*.py", "pairmq/core/broker/*.py",
            "pairmq/server/stomp/connection.py", "pairmq/server/stomp/connection_state.py",
            "pairmq/server/stomp/connect.py", "pairmq/server/stomp/commands.py",
            "pairmq/server/stomp/sliced_frames.py", "pairmq/server/stomp/wire.py",
            "pairmq/server/stomp/session.py", "pairmq/server/stomp/held_output.py",
            "pairmq/server/stomp/unfinished_frame.py", "pairmq/store/store.py",
            "pairmq/store/store_state.py", "pairmq/store/recovery.py",
            "pairmq/store/compaction.py", "pairmq/store/mirror.py", "pairmq/store/records.py",
            "pairmq/store/record_decoding.py",
            "pairmq/store/writer.py", "pairmq/store/writer_thread.py",
            "pairmq/store/gcpause.py", "pairmq/server/role/*.py",
            "pairmq/server/clock.py", "pairmq/server/loop_lag.py")


def compiled_sources() -> list[str]:
    src = Path(__file__).resolve().parent / "src"
    return sorted({str(p.relative_to(src.parent)) for pattern in COMPILED
                   for p in src.glob(pattern) if p.name != "__init__.py"})


if os.environ.get("PAIRMQ_MYPYC") == "1":
    from mypyc.build import mypycify

    setup(ext_modules=mypycify(compiled_sources(), opt_level="3"))
else:
    setup()
