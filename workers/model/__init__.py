"""The model a job runs: built from the catalog's shape and the plan, isolated per job, exported."""
