"""Training: the loop that runs bare or under Ray Train, what it is built from, its state and data."""
