"""The simulator: spot traces and job arrivals replayed through the policy on a simulated clock."""
