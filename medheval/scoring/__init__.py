"""Scoring helpers the metrics share: answer parsing, text cues, the NLTK 3.9 reproduction and its data, metric input and option checks."""
