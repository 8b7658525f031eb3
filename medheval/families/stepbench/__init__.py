"""Med-StepBench (arXiv 2605.10002): statements over PET/CT studies, the volumes and their views, a synthetic fixture folder."""
