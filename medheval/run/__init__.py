"""Running an evaluation: the runner, the split protocol interface, generation settings, prompt templates, data parallel, outputs, the predictions log, YAML grids."""
