"""What to draft and how much: the draft-length planner, call costs, calibration, the lattice walks and the drafters."""
