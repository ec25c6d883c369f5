"""Draft configs by family: one module per family with its frozen config class, config parser and tensor-name tables
(`CheckpointLayout`s). Which family reads which layouts is declared once, in `ovbuild.families`."""
