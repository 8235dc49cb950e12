"""Cost of collectives on the links their groups span."""
