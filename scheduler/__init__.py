"""State and control: job store, REST API, scheduling loop, spot policy, simulation, reports."""
