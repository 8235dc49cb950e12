"""The baseline footprint of one unsplit model replica: parameters, FLOPs,
and the activations it saves for backward. Strategies divide it up."""
