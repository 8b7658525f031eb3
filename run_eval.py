#!/usr/bin/env python
"""Run benchmarks × model → predictions → metrics → tables (same as ``medheval run``).

    python run_eval.py --benchmark cxr_vishal --model llava-hf/llava-1.5-7b-hf \
        --image-root mimic_cxr=/data/mimic-cxr-jpg/2.1.0/files --image-root iu_xray=/data/iu_xray/images \
        --output runs/llava15
    python run_eval.py --benchmark mm_vishal --predictions my_outputs.jsonl --output runs/mine
"""

import sys

from medheval.cli import entry_point

if __name__ == "__main__":
    sys.exit(entry_point(["run", *sys.argv[1:]]))
