"""Run the policylab CLI with one injected fault (for tests of what a user sees when the
machine misbehaves). Usage: python fault_cli.py FAULT ARGS...

    enospc-at:step_000002   the checkpoint write of that step fails with "No space left on
                            device" after part of a file is written (as safetensors reports it)
    disk-free:BYTES         the disk reports BYTES free
"""

import sys

from safetensors import SafetensorError


def main() -> int:
    fault, argv = sys.argv[1], sys.argv[2:]
    kind, _, arg = fault.partition(":")
    if kind == "enospc-at":
        import safetensors.torch as st

        real = st.save_file

        def save_file(tensors, filename, metadata=None):
            if f".tmp-{arg}-" in str(filename):
                with open(filename, "wb") as fh:
                    fh.write(b"\0" * 1000)
                raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
            return real(tensors, filename, metadata=metadata)

        st.save_file = save_file
    elif kind == "disk-free":
        import policylab.trainer.run_dir as ck

        ck._free_bytes = lambda path: int(arg)
    else:
        raise SystemExit(f"unknown fault {fault}")
    from policylab.cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
