"""Spot vs on-demand under a deadline: the policy, the slack's value, the omniscient bound."""
