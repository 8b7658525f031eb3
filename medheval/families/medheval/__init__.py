"""MedHEval (Chang et al. 2025, arXiv 2503.02157): its released annotation files, the S_h judge prompt, the embedded fixture benchmark."""
