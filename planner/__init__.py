"""Pure planning core: JobSpec + catalog -> estimates -> candidates -> ranked plan. No I/O."""
