"""replaylib: re-feeding vs replaying in counterfactual token-credit estimation."""
import logging
import os
import sys
import warnings

__version__ = "0.1.0"

if os.environ.get("REPLAYLIB_RUNNER"):  # a headless kernel of replaylib.run: no widget front end to install
    warnings.filterwarnings("ignore", message="IProgress not found")


def log_to_stdout(level: int = logging.INFO) -> None:
    """Show the package's progress messages (config, stage, engine) in a notebook or terminal."""
    logger = logging.getLogger("replaylib")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("[replaylib] %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(level)
