"""The scheduling loop: admit, place, run, follow, fall back, change over, charge."""
