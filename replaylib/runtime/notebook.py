"""Executing a stage's notebook headless (papermill)."""
from __future__ import annotations

import json
import os
from pathlib import Path

from ..core.files import _no_space
from ..core.paths import REPO


def execute_notebook(notebook: Path, output: Path, parameters: dict) -> None:
    """Execute a notebook with papermill into ``output``, which holds a whole notebook or is left as it
    was: papermill writes a hidden copy beside it as the cells run, and that copy replaces ``output`` (a
    link there included) once it reads back as JSON, whether the notebook failed or not."""
    import papermill
    running = output.with_name(f".{output.stem}.running.ipynb")
    running.unlink(missing_ok=True)
    try:
        papermill.execute_notebook(str(notebook), str(running), parameters=parameters, cwd=str(REPO),
                                   kernel_name="python3", progress_bar=False, log_output=False,
                                   kernel_manager_class=_kernel_manager())
    except OSError as e:
        if e.filename is not None:
            raise
        raise _no_space(output, e, running) from None  # papermill's own write of the notebook names no file
    finally:
        try:
            json.loads(running.read_text())
            os.replace(running, output)
        except (OSError, ValueError):
            running.unlink(missing_ok=True)


def _kernel_manager():
    """nbclient's kernel manager, without the interrupt (SIGINT) it sends a kernel before shutting it down.
    Papermill shuts the kernel down as soon as the reply to its last request (kernel_info) arrives, while the
    kernel may still be finishing that request, with Python's SIGINT handler in place (ipykernel sets it for
    every request): the interrupt then lands in the request and the kernel logs "KeyboardInterrupt caught in
    kernel." By then every cell has finished, so there is nothing to interrupt; the shutdown request follows
    as before (SIGTERM, then SIGKILL, if the kernel does not stop)."""
    from jupyter_client import AsyncKernelManager

    class FinishedNotebookKernel(AsyncKernelManager):
        async def _async_interrupt_kernel(self) -> None:
            if not self.shutting_down:
                await super()._async_interrupt_kernel()

    return FinishedNotebookKernel
