"""Execution on Ray: training and inference workers, checkpoints, preemption handling."""
