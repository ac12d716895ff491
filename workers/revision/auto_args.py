"""The ``--policy auto`` options of ``ampci convert``, declared with the standard library only.

``workers.revision.autoconvert`` (which imports onnx, numpy and onnxruntime) and ``ampci convert``'s parser (whose
``--help`` loads no model stack) both add them with :func:`add_auto_arguments`.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_auto_arguments(parser: argparse.ArgumentParser) -> None:
    """Add --tolerance, --calibration-data, --max-steps and --overflow-margin to ``parser``."""
    parser.add_argument("--tolerance", default=None,
                        help="policy auto: accuracy to meet, e.g. cosine=0.9995[,max_abs=..,snr_db=..,max_rel=..] "
                             "(default cosine=0.9995 for fp16, 0.995 for bf16)")
    parser.add_argument("--calibration-data", "--inputs", dest="calibration_data", type=Path, default=None,
                        help=".npz of model inputs (one array per input, optionally a leading sample axis): "
                             "what policy auto measures on, and calibration (keep nodes fp32 whose observed "
                             "values overflow/underflow)")
    parser.add_argument("--inputs-source", default=None, help=argparse.SUPPRESS)  # the job: where its npz came from
    parser.add_argument("--max-steps", type=int, default=16, help="policy auto: most candidate evaluations")
    parser.add_argument("--overflow-margin", type=float, default=0.5,
                        help="keep fp32 when observed |x| exceeds this fraction of the dtype's max")
    parser.add_argument("--max-reduction", type=int, default=32768,
                        help="keep fp32 when a node sums more terms than this per output element")
